"""fx.remove_dropout: every dropout form removed, on both kinds of graph."""

from __future__ import annotations

import operator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from edgeflow.rules.fx.dropout import RemoveDropout
from tests.rules.fx.helpers import (
    apply,
    check_rule,
    ctx_for,
    gate,
    is_export_graph,
    onnx_export,
    ops,
)
from tests.rules.sites import outcomes

CTX = ctx_for([2, 4, 6])


class DropoutNet(nn.Module):
    def __init__(self, untraceable: bool = False) -> None:
        super().__init__()
        self.untraceable = untraceable
        self.fc = nn.Linear(6, 6)
        self.drop = nn.Dropout(0.5)
        self.drop1d = nn.Dropout1d(0.2)
        self.alpha = nn.AlphaDropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.untraceable:
            x = gate(x)
        h = self.drop(torch.relu(self.fc(x)))
        h = F.dropout(h, 0.3, training=self.training) + self.drop1d(h)
        return self.alpha(h) + torch.dropout(x, 0.1, False)


@pytest.mark.parametrize("untraceable", [False, True], ids=["symbolic_trace", "torch.export"])
def test_removes_every_dropout(untraceable: bool) -> None:
    model = DropoutNet(untraceable).eval()
    result = check_rule(RemoveDropout, {}, model, CTX, atol=0, rtol=0)
    assert result.matches == 5
    assert is_export_graph(result) == untraceable
    assert [status for status, _ in outcomes(result)] == ["changed"] * 5
    assert not [k for k in ops(result.model) if "dropout" in k.lower()]
    assert not any("drop" in name for name, _ in result.model.named_modules())


def test_active_dropout_is_removed_and_said() -> None:
    class Active(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.dropout(x, 0.5) * 2  # training=True by default: random at inference

    result = apply(RemoveDropout, {}, Active().eval(), CTX)
    assert outcomes(result) == [("changed", "dropout (dropout)")]  # its message: training mode
    x = torch.randn(2, 4, 6)
    torch.testing.assert_close(result.model(x), x * 2)


def test_native_dropout_from_a_decomposed_graph() -> None:
    graph = fx.Graph()
    x = graph.placeholder("x")
    pair = graph.call_function(torch.ops.aten.native_dropout.default, (x, 0.5, False))
    out = graph.call_function(operator.getitem, (pair, 0))
    graph.output(graph.call_function(torch.ops.aten.relu.default, (out,)))
    gm = fx.GraphModule(nn.Module(), graph)
    result = check_rule(RemoveDropout, {}, gm, CTX, atol=0, rtol=0)
    assert ops(result.model) == {"aten.relu.default": 1}


def test_nothing_to_remove() -> None:
    result = apply(RemoveDropout, {}, nn.Linear(6, 6).eval(), CTX)
    assert not result.changed and outcomes(result) == [("not_applicable", "")]


def test_onnx_export_after_removal(tmp_path: Path) -> None:
    result = apply(RemoveDropout, {}, DropoutNet(untraceable=True).eval(), CTX)
    found = onnx_export(result.model, CTX, tmp_path / "model.onnx")
    assert "Dropout" not in found
