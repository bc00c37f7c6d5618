"""The shared helpers: which graph a rule works on, and the fx rule catalogue."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import fx, nn

from edgeflow.core.errors import EdgeflowError
from edgeflow.rules import builtin_rules
from edgeflow.rules.base import FxRule, RuleOptions
from edgeflow.rules.fx import RULES
from edgeflow.rules.fx._graph import tidy, to_graph_module
from tests.rules.fx.helpers import ctx_for, gate, ops

CTX = ctx_for([2, 6])


class Gated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(gate(x)))


def test_symbolic_trace_first() -> None:
    model = nn.Sequential(nn.Linear(6, 6), nn.ReLU())
    gm, how = to_graph_module(model, CTX)
    assert how.kind == "symbolic_trace" and ops(gm) == {"Linear": 1, "ReLU": 1}
    assert gm.get_submodule("0") is not model[0]  # a copy


def test_a_graph_module_is_copied_as_is() -> None:
    traced = fx.symbolic_trace(nn.Sequential(nn.Linear(6, 6)))
    gm, how = to_graph_module(traced, CTX)
    assert how.kind == "GraphModule" and gm is not traced and gm.code == traced.code


def test_torch_export_when_symbolic_trace_fails() -> None:
    model = Gated().eval()
    gm, how = to_graph_module(model, CTX)
    assert how.kind == "torch.export"
    assert "TraceError" in how.note  # it names symbolic_trace's error
    assert ops(gm)["aten.linear.default"] == 1 and ops(gm)["aten.relu.default"] == 1
    assert not gm.training  # the module's mode, so exporters do not warn
    x = torch.randn(2, 6)
    torch.testing.assert_close(gm(x), model(x))


def test_neither_works() -> None:
    class DataDependent(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 if x.sum() > 0 else x

    with pytest.raises(EdgeflowError) as info:
        to_graph_module(DataDependent(), CTX)
    message = info.value.message
    assert "symbolic_trace failed (TraceError" in message and "torch.export failed (" in message
    assert "fx.wrap_leaf" in (info.value.hint or "")


def test_catalogue() -> None:
    names = [rule.name for rule in RULES]
    assert names == [
        "fx.wrap_leaf",
        "fx.fuse_conv_bn",
        "fx.remove_batchnorm",
        "fx.remove_dropout",
        "fx.replace_activation",
        "fx.replace_pattern",
    ]
    known = builtin_rules()
    for rule in RULES:
        assert issubclass(rule, FxRule) and known[rule.name] is rule
        assert rule.description.endswith(".") and "\n" not in rule.description
        assert issubclass(rule.Options, RuleOptions) and rule.Options is not RuleOptions
        assert rule.example is not None and all(isinstance(s, str) for s in rule.example)


def test_rule_modules_do_not_import_torch() -> None:
    code = "import sys, edgeflow.rules.fx; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[3])


def test_tidy_drops_only_what_nothing_reads() -> None:
    """A module reachable under two names keeps the tensors read under either of them."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    weight = graph.get_attr("b.weight")
    graph.get_attr("unused")  # read by nothing
    graph.output(graph.call_function(torch.nn.functional.linear, (x, weight)))
    gm = fx.GraphModule({"b.weight": torch.ones(2, 2), "unused": torch.zeros(1)}, graph)
    shared = nn.Linear(2, 2)
    gm.a = gm.b = shared  # named_modules() lists it as "a" only
    tidy(gm)
    assert [n.target for n in gm.graph.nodes if n.op == "get_attr"] == ["b.weight"]
    assert not hasattr(gm, "unused") and not hasattr(shared, "bias")
    assert gm.b.weight is shared.weight
