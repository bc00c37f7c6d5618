"""fx.replace_pattern: user pattern / replacement functions, by module path or file path."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from edgeflow.core.errors import EdgeflowError
from edgeflow.rules.fx.pattern import ReplacePattern
from tests.rules.fx.helpers import apply, check_rule, ctx_for, gate, onnx_export, ops
from tests.rules.sites import outcomes

CTX = ctx_for([2, 6])
HERE = "tests.rules.fx.test_pattern"


def double_relu(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x) * 2.0


def relu_of_sum(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x + x)  # 2 relu(x) == relu(2x), exactly in floating point


def aten_double_relu(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten.mul.Tensor(torch.ops.aten.relu.default(x), 2.0)


def aten_relu_of_sum(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten.relu.default(torch.ops.aten.add.Tensor(x, x))


class Net(nn.Module):
    def __init__(self, untraceable: bool = False) -> None:
        super().__init__()
        self.untraceable = untraceable
        self.fc = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.untraceable:
            x = gate(x)
        h = torch.relu(self.fc(x)) * 2.0
        return torch.relu(self.fc(h)) * 2.0 + h


def test_replaces_every_match_by_module_path() -> None:
    options = {"pattern": f"{HERE}:double_relu", "replacement": f"{HERE}:relu_of_sum"}
    result = check_rule(ReplacePattern, options, Net().eval(), CTX, atol=0, rtol=0)
    assert result.matches == 2
    assert ops(result.model)["mul"] == 0 and ops(result.model)["add"] == 3
    assert outcomes(result) == [("changed", "mul"), ("changed", "mul_1")]  # the matches' outputs


def test_export_graph_needs_an_aten_pattern() -> None:
    model = Net(untraceable=True).eval()
    plain = {"pattern": f"{HERE}:double_relu", "replacement": f"{HERE}:relu_of_sum"}
    missed = apply(ReplacePattern, plain, model, CTX)
    assert not missed.changed and outcomes(missed) == [("not_applicable", "")]  # write aten ops
    aten = {"pattern": f"{HERE}:aten_double_relu", "replacement": f"{HERE}:aten_relu_of_sum"}
    result = check_rule(ReplacePattern, aten, model, CTX, atol=0, rtol=0)
    assert result.matches == 2 and ops(result.model)["aten.mul.Tensor"] == 1  # gate's


def test_file_paths_resolve_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "patterns.py").write_text(
        textwrap.dedent(
            """
            import torch

            def pattern(x):
                return torch.relu(x) * 2.0

            def replacement(x):
                return torch.relu(x + x)
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    options = {"pattern": "patterns.py:pattern", "replacement": "patterns.py:replacement"}
    result = apply(ReplacePattern, options, Net().eval(), CTX)
    assert result.matches == 2
    found = onnx_export(result.model, CTX, tmp_path / "model.onnx")
    assert "Mul" not in found and found.count("Relu") == 2


def test_tolerance_is_an_option() -> None:
    options = {"pattern": "a:b", "replacement": "a:c"}
    assert ReplacePattern().tolerance(ReplacePattern.Options.model_validate(options)) == 1e-5
    loose = ReplacePattern.Options.model_validate({**options, "tolerance": None})
    assert ReplacePattern().tolerance(loose) is None


def test_options_need_import_paths() -> None:
    with pytest.raises(ValidationError, match=r"expected 'package\.module:function'"):
        ReplacePattern.Options.model_validate({"pattern": "patterns.py", "replacement": "a:b"})


def test_missing_function_is_a_user_error() -> None:
    options = {"pattern": f"{HERE}:nope", "replacement": f"{HERE}:relu_of_sum"}
    with pytest.raises(EdgeflowError, match="has no attribute 'nope'"):
        apply(ReplacePattern, options, Net().eval(), CTX)
