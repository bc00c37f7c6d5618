"""fx.replace_activation: each supported pair, module / function / method forms, both graphs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from torch import fx, nn

from edgeflow.rules.fx.activation import GELU_TANH_MAX_ABS_ERROR, PAIRS, ReplaceActivation
from tests.rules.fx.helpers import (
    apply,
    assert_same_outputs,
    check_rule,
    ctx_for,
    gate,
    is_export_graph,
    onnx_export,
    ops,
)
from tests.rules.sites import outcomes

CTX = ctx_for([3, 8])
MODULES = {
    "silu": nn.SiLU,
    "gelu": nn.GELU,
    "relu": nn.ReLU,
    "hardswish": nn.Hardswish,
    "hardsigmoid": nn.Hardsigmoid,
    "relu6": nn.ReLU6,  # the reference for relu -> relu6
}


class ActNet(nn.Module):
    """The activation as a module (in place where it can be) and as a function call."""

    def __init__(self, kind: str, untraceable: bool = False) -> None:
        super().__init__()
        self.untraceable = untraceable
        self.fc = nn.Linear(8, 8)
        self.act = MODULES[kind]() if kind == "gelu" else MODULES[kind](inplace=True)
        self.function = getattr(F, kind)
        self.out = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.untraceable:
            x = gate(x)
        h = 4 * self.fc(x)  # spread: relu6 clips, hardswish's corners are reached
        return self.out(self.function(h) + self.act(self.fc(x)))


# The rewrite's own error bound on these inputs (documented in activation.py).
ATOL = {"silu": 1e-6, "gelu": 1e-3, "relu": 0.0, "hardswish": 1e-6, "hardsigmoid": 1e-6}
FORMULA_OPS = {
    "x_sigmoid": {"sigmoid", "aten.sigmoid.default"},
    "gelu_tanh": {"gelu", "aten.gelu.default"},
    "relu6": {"relu6", "aten.hardtanh.default"},
    "x_relu6": {"relu6", "aten.hardtanh.default"},
}


@pytest.mark.parametrize("untraceable", [False, True], ids=["symbolic_trace", "torch.export"])
@pytest.mark.parametrize("pair", list(PAIRS), ids=[f"{a}-{b}" for a, b in PAIRS])
def test_replaces_every_site(pair: tuple[str, str], untraceable: bool) -> None:
    kind, to = pair
    options = {"from": kind, "to": to}
    model = ActNet(kind, untraceable).eval()
    if kind == "relu":
        result = apply(ReplaceActivation, options, model, CTX)
        reference = ActNet("relu6", untraceable).eval()  # the same model with relu6
        reference.load_state_dict(model.state_dict())
        assert_same_outputs(reference, result.model, CTX, atol=1e-6, rtol=1e-6)
        assert apply(ReplaceActivation, options, result.model, CTX).changed is False
    else:
        result = check_rule(ReplaceActivation, options, model, CTX, atol=ATOL[kind], rtol=0)
    assert result.matches == 2
    assert is_export_graph(result) == untraceable
    assert _sites(result.model, kind) == 0 < _sites(fx_graph(model), kind)
    assert set(ops(result.model)) & FORMULA_OPS[to]


def fx_graph(model: nn.Module) -> fx.GraphModule:
    if model.untraceable:
        return torch.export.export(model, CTX.example_inputs()).module()
    return fx.symbolic_trace(model)


def _sites(gm: fx.GraphModule, kind: str) -> int:
    """Nodes computing the activation `kind` (exact GELU only), however written."""
    found = 0
    for node in gm.graph.nodes:
        if node.op == "call_module":
            found += type(gm.get_submodule(node.target)) is MODULES[kind]
        elif node.op in ("call_function", "call_method"):
            target = node.target
            name = target if isinstance(target, str) else target.__name__.split(".")[0]
            exact = node.kwargs.get("approximate", "none") == "none"
            found += name.rstrip("_") == kind and exact
    return found


def test_gelu_tanh_error_is_as_documented() -> None:
    x = torch.linspace(-10, 10, 2_000_001, dtype=torch.float64)
    error = (F.gelu(x) - F.gelu(x, approximate="tanh")).abs()
    assert float(error.max()) == pytest.approx(GELU_TANH_MAX_ABS_ERROR, abs=5e-7)
    assert float(x[error.argmax()].abs()) == pytest.approx(2.70, abs=0.01)
    assert ReplaceActivation().tolerance(_opts("gelu", "gelu_tanh")) > GELU_TANH_MAX_ABS_ERROR


def test_relu6_differs_only_above_six() -> None:
    result = apply(ReplaceActivation, {"from": "relu", "to": "relu6"}, nn.ReLU(), CTX)
    x = torch.linspace(-10, 10, 24).view(3, 8)
    torch.testing.assert_close(result.model(x), x.clamp(0, 6))
    assert ReplaceActivation().tolerance(_opts("relu", "relu6")) is None


class InPlace(nn.Module):
    """relu_ on a tensor read again later must stay as it is; x.relu() is replaced."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        r = F.relu(h, inplace=True)
        return r + h + self.fc(x).relu()


def test_in_place_on_a_tensor_read_later_is_kept() -> None:
    result = check_rule(ReplaceActivation, {"from": "relu", "to": "relu6"}, InPlace(), CTX)
    assert result.matches == 1 and ops(result.model)["relu"] == 1
    assert outcomes(result) == [("kept", "relu (relu)"), ("changed", "relu_1 (relu)")]


def test_exact_gelu_only() -> None:
    model = nn.GELU(approximate="tanh")
    result = apply(ReplaceActivation, {"from": "gelu", "to": "gelu_tanh"}, model, CTX)
    assert not result.changed and outcomes(result) == [("not_applicable", "")]


def _opts(kind: str, to: str) -> ReplaceActivation.Options:
    return ReplaceActivation.Options.model_validate({"from": kind, "to": to})


def test_options_validate_the_pair() -> None:
    assert _opts("silu", "x_sigmoid").from_ == "silu"
    assert ReplaceActivation.Options.model_validate({"from_": "relu", "to": "relu6"}).to == "relu6"
    with pytest.raises(ValidationError) as info:
        _opts("silu", "relu6")
    assert "cannot replace silu with 'relu6' (supported: silu -> x_sigmoid, gelu -> gelu_tanh" in (
        str(info.value)
    )
    with pytest.raises(ValidationError):
        _opts("tanh", "x_sigmoid")


def test_onnx_export_after_replacement(tmp_path: Path) -> None:
    model = ActNet("silu", untraceable=True).eval()
    result = apply(ReplaceActivation, {"from": "silu", "to": "x_sigmoid"}, model, CTX)
    found = onnx_export(result.model, CTX, tmp_path / "model.onnx")
    assert "Sigmoid" in found and "Mul" in found
