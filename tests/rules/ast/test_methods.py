"""ast.replace_method: every instance of a class gets a method written for export."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn

from edgeflow.core.errors import EdgeflowError
from edgeflow.rules.ast.methods import Replacement, ReplaceMethod, source_sha256
from edgeflow.rules.base import RewriteContext
from tests.rules.ast._helpers import apply, check, inputs, specs
from tests.rules.sites import outcomes

SPECS = specs((2, 6))
HERE = "tests.rules.ast.test_methods"


class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        if y.sum() > 0:  # a Python branch on data: torch.export cannot capture it
            return y.relu()
        return -y


def gate_static(self: Gate, x: torch.Tensor) -> torch.Tensor:
    y = self.linear(x)
    return torch.where(y.sum() > 0, y.relu(), -y)


def hardswish_decomposed(self: nn.Hardswish, x: torch.Tensor) -> torch.Tensor:
    return x * torch.clamp(x + 3.0, 0.0, 6.0) / 6.0


GATE = {"method": f"{HERE}.Gate.forward", "with": f"{HERE}:gate_static"}


def test_source_before_after_numbers_and_idempotence() -> None:
    torch.manual_seed(0)
    result = check(ReplaceMethod, Gate(), SPECS, **GATE)
    assert result.matches == 1
    assert result.sources == {
        "Gate.forward": (
            "def gate_static(self: Gate, x: torch.Tensor) -> torch.Tensor:\n"
            "    y = self.linear(x)\n"
            "    return torch.where(y.sum() > 0, y.relu(), -y)\n"
        )
    }
    assert outcomes(result) == [("changed", "")]  # the model itself


@pytest.mark.filterwarnings("ignore")
def test_export_fails_before_and_passes_after() -> None:
    torch.manual_seed(0)
    model = Gate().eval()
    with pytest.raises(Exception, match=r"(?i)data-dependent|control flow"):
        torch.export.export(model, inputs(SPECS))
    rewritten = apply(ReplaceMethod, model, SPECS, **GATE).model
    program = torch.export.export(rewritten, inputs(SPECS))
    for seed in range(4):
        x = inputs(SPECS, seed=seed)
        torch.testing.assert_close(program.module()(*x), model(*x))


def test_library_class_inside_a_container(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """torch's own classes are replaced too; the exported graph loses the HardSwish op."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.Hardswish(), nn.Linear(6, 3), nn.Hardswish())
    options = {"method": "torch.nn.Hardswish.forward", "with": f"{HERE}:hardswish_decomposed"}
    result = check(ReplaceMethod, model, SPECS, **options)
    assert result.matches == 2
    assert outcomes(result) == [("changed", "1"), ("changed", "3")]

    def ops(module: nn.Module) -> Counter[str]:
        import onnx

        path = tmp_path / "m.onnx"
        torch.onnx.export(module, inputs(SPECS), str(path), dynamo=False)
        return Counter(n.op_type for n in onnx.load(str(path)).graph.node)

    assert ops(model)["HardSwish"] == 2
    after = ops(result.model)
    assert after["HardSwish"] == 0 and after["Clip"] == 2


def test_changed_library_source_is_refused() -> None:
    options = {**GATE, "source_sha256": "0" * 64}
    with pytest.raises(EdgeflowError, match=r"is not the one its replacement was written") as info:
        apply(ReplaceMethod, Gate(), SPECS, **options)
    assert source_sha256(Gate.forward) in (info.value.hint or "")
    exact = {**GATE, "source_sha256": source_sha256(Gate.forward)}
    assert apply(ReplaceMethod, Gate(), SPECS, **exact).changed


def refuse(module: nn.Module, ctx: RewriteContext) -> list[str]:
    return [f"declared input {ctx.inputs[0].shape} is not what this replacement handles"]


GATE_REFUSED = Replacement(gate_static, check=refuse)


def test_a_replacement_refuses_what_it_does_not_reproduce() -> None:
    options = {"method": GATE["method"], "with": f"{HERE}:GATE_REFUSED"}
    with pytest.raises(EdgeflowError, match=r"cannot replace .*Gate\.forward in the model: "):
        apply(ReplaceMethod, Gate(), SPECS, **options)


def test_no_instance_and_no_builtin() -> None:
    result = apply(ReplaceMethod, nn.Linear(6, 6), SPECS, **GATE)
    assert not result.changed
    assert outcomes(result) == [("not_applicable", "")]
    with pytest.raises(EdgeflowError, match=r"no built-in replacement for .*Gate\.forward") as info:
        apply(ReplaceMethod, Gate(), SPECS, method=GATE["method"])
    assert "torchvision.models.detection.ssd.SSD.forward" in (info.value.hint or "")


@pytest.mark.parametrize(
    ("method", "message"),
    [
        (f"{HERE}.Gate.backward", "Gate has no method 'backward'"),
        (
            f"{HERE}.gate_static.forward",
            "'tests.rules.ast.test_methods.gate_static' is not a class",
        ),
        ("nowhere.Gate.forward", "cannot import method 'nowhere.Gate'"),
    ],
)
def test_bad_method_paths(method: str, message: str) -> None:
    with pytest.raises(EdgeflowError, match=message):
        apply(ReplaceMethod, Gate(), SPECS, method=method, **{"with": GATE["with"]})
