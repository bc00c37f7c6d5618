"""The machinery under every ast.* rule: which methods are rewritten, how, and what stays."""

from __future__ import annotations

import copy
import functools
import inspect

import torch
from torch import nn

from edgeflow.rules.ast._source import rewritten_sources
from edgeflow.rules.ast.float64 import Float64ToFloat32
from edgeflow.rules.ast.loops import UnrollLoops
from tests.rules.ast._helpers import apply, check, inputs, specs
from tests.rules.sites import outcomes

SPECS = specs((2, 4))


class Block(nn.Module):
    def __init__(self, depth: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(depth)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class Base(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class Net(Base):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = Block(2), Block(2), Block(3)
        self.act = nn.Sequential(nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.c(self.b(self.a(x)))).double()
        return super().forward(x).float()


def test_instances_share_code_per_distinct_rewrite() -> None:
    torch.manual_seed(0)
    result = check(UnrollLoops, Net(), SPECS)
    model = result.model
    assert type(model.a) is type(model.b)  # same rewrite: one generated class
    assert type(model.a) is not type(model.c)  # three layers: other code
    assert type(model.a).__name__ == "Block" and isinstance(model.a, Block)
    assert type(model) is Net and type(model.act) is nn.Sequential  # nothing to rewrite
    assert set(result.sources) == {"Block.forward", "Block.forward@c"}
    assert "self.layers[2](x)" in result.sources["Block.forward@c"]
    assert result.matches == 2


def test_rules_chain_and_keep_super_working() -> None:
    torch.manual_seed(0)
    model = Net().eval()
    first = apply(Float64ToFloat32, model, SPECS).model
    second = check(UnrollLoops, first, SPECS).model
    forward = type(second).forward
    assert forward.__edgeflow_rules__ == ("ast.float64_to_float32",)
    assert type(second.a).forward.__edgeflow_rules__ == ("ast.unroll_loops",)
    assert rewritten_sources(second)["Net.forward"] == (
        "def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
        "    x = self.act(self.c(self.b(self.a(x)))).float()\n"
        "    return super().forward(x).float()\n"
    )
    x = inputs(SPECS)[0]
    torch.testing.assert_close(second(x), model(x), atol=1e-6, rtol=1e-5)


def test_rewritten_code_is_inspectable_and_survives_deepcopy() -> None:
    model = apply(UnrollLoops, Net(), SPECS).model
    forward = type(model.a).forward
    assert inspect.getsource(forward).strip() == rewritten_sources(model)["Block.forward"].strip()
    assert forward.__code__.co_filename.startswith("<edgeflow ast.unroll_loops: Block.forward ")
    twin = copy.deepcopy(model)
    assert type(twin.a) is type(model.a)
    x = inputs(SPECS)[0]
    torch.testing.assert_close(twin(x), model(x))


def traced(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    return wrapper


class Decorated(nn.Module):
    @traced
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.double()


def test_decorated_and_library_methods_are_kept() -> None:
    result = apply(Float64ToFloat32, Decorated(), SPECS)
    assert not result.changed
    assert outcomes(result) == [("kept", "Decorated.forward"), ("not_applicable", "")]
