"""fx.wrap_leaf: helpers symbolic_trace cannot trace become leaf calls."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from torch import fx, nn

from edgeflow.core.errors import EdgeflowError
from edgeflow.core.refs import ImportRef
from edgeflow.rules.fx.fuse import FuseConvBn
from edgeflow.rules.fx.wrap import WrapLeaf
from tests.rules.fx.helpers import (
    apply,
    assert_same_outputs,
    check_rule,
    ctx_for,
    gate,
    onnx_export,
    ops,
    randomize_batchnorms,
)
from tests.rules.sites import outcomes

CTX = ctx_for([2, 3, 8, 8])
HERE = "tests.rules.fx.test_wrap"
this_module = sys.modules[__name__]


def pad_to_even(x: torch.Tensor) -> torch.Tensor:
    """Untraceable by symbolic_trace: control flow on a shape."""
    if x.shape[-1] % 2:
        return torch.nn.functional.pad(x, (0, 1))
    return x


class Net(nn.Module):
    """conv -> bn -> a helper symbolic_trace cannot trace through, called two ways."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 2)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = pad_to_even(self.bn(self.conv(x)))  # a global
        return this_module.pad_to_even(y * 2)  # an attribute of the helper's module


def test_symbolic_trace_fails_without_it() -> None:
    with pytest.raises(fx.proxy.TraceError):
        fx.symbolic_trace(Net())
    torch.export.export(Net().eval(), CTX.example_inputs())  # torch.export copes


@pytest.mark.parametrize("spec", [f"{HERE}:pad_to_even", f"{HERE}.pad_to_even"])
def test_helpers_become_leaf_calls(spec: str) -> None:
    model = randomize_batchnorms(Net()).eval()
    result = check_rule(WrapLeaf, {"functions": [spec]}, model, CTX, atol=0, rtol=0)
    assert result.matches == 2
    assert result.graph is not None and result.graph.kind == "symbolic_trace"
    assert outcomes(result) == [("changed", "pad_to_even"), ("changed", "pad_to_even_1")]
    assert ops(result.model)["pad_to_even"] == 2 and ops(result.model)["Conv2d"] == 1


def test_later_rules_rewrite_its_graph(tmp_path: Path) -> None:
    model = randomize_batchnorms(Net()).eval()
    wrapped = apply(WrapLeaf, {"functions": [f"{HERE}:pad_to_even"]}, model, CTX).model
    fused = apply(FuseConvBn, {}, wrapped, CTX)
    assert fused.graph is not None and fused.graph.kind == "GraphModule" and fused.matches == 1
    assert ops(fused.model)["BatchNorm2d"] == 0
    assert_same_outputs(model, fused.model, CTX, atol=1e-5, rtol=1e-5)
    found = onnx_export(fused.model, CTX, tmp_path / "model.onnx")
    assert "BatchNormalization" not in found and "Pad" in found


def test_file_path_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "model.py").write_text(
        textwrap.dedent(
            """
            import torch

            def halve_if_wide(x):
                return x / 2 if x.shape[-1] > 4 else x

            class Net(torch.nn.Module):
                def forward(self, x):
                    return halve_if_wide(torch.relu(x))
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    model = ImportRef.parse("model.py:Net", tmp_path).load()()
    result = check_rule(WrapLeaf, {"functions": ["model.py:halve_if_wide"]}, model, CTX)
    assert ops(result.model) == {"relu": 1, "halve_if_wide": 1}


def test_not_called() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 1))
    result = apply(WrapLeaf, {"functions": [f"{HERE}:pad_to_even"]}, model, CTX)
    assert not result.changed and result.model is model
    assert outcomes(result) == [("not_applicable", "")]


def test_still_untraceable_is_a_user_error() -> None:
    class Branchy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return pad_to_even(gate(x))  # gate is not wrapped

    with pytest.raises(EdgeflowError, match="symbolic_trace still fails") as info:
        apply(WrapLeaf, {"functions": [f"{HERE}:pad_to_even"]}, Branchy(), CTX)
    assert "torch.export" in (info.value.hint or "")


def test_options() -> None:
    with pytest.raises(ValidationError, match=r"expected 'package\.module:function'"):
        WrapLeaf.Options.model_validate({"functions": ["pad_to_even"]})
    with pytest.raises(ValidationError):
        WrapLeaf.Options.model_validate({"functions": []})
    with pytest.raises(EdgeflowError, match="has no attribute 'nope'"):
        apply(WrapLeaf, {"functions": [f"{HERE}.nope"]}, Net(), CTX)
