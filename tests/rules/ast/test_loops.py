"""ast.unroll_loops: loops over constant ranges and module lists become straight-line code."""

from __future__ import annotations

import pytest
import torch
import torch.fx
from torch import nn

from edgeflow.rules.ast.loops import UnrollLoops
from edgeflow.rules.base import Status
from tests.rules.ast._helpers import apply, check, inputs, specs
from tests.rules.sites import line_of, wheres

SPECS = specs((2, 4))
DEPTH = 3


class Tower(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(4, 8)
        self.blocks = nn.ModuleList([nn.Linear(8, 8) for _ in range(DEPTH)])
        self.norms = nn.ModuleList([nn.LayerNorm(8) for _ in range(DEPTH)])
        self.heads = nn.ModuleDict({"cls": nn.Linear(8, 3), "box": nn.Linear(8, 3)})
        self.scales = (1.0, 0.5, 0.25)
        self.last = DEPTH - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for i in range(DEPTH):
            y = self.blocks[i](x)
            if i > 0:
                y = y + x
            x = self.scales[i] * y
        for block, norm in zip(self.blocks, self.norms, strict=True):
            x = norm(block(x))
        for k in range(len(self.blocks)):
            k = k * 2
            x = x + k
        out = self.blocks[self.last](x)
        for head in self.heads.values():
            out = out + head(x).sum()
        return self.finish(out)

    def finish(self, out: torch.Tensor) -> torch.Tensor:
        for t in out.unbind(0):
            out = out + t.sum()
        return out


AFTER = """\
def forward(self, x: torch.Tensor) -> torch.Tensor:
    x = self.stem(x)
    y = self.blocks[0](x)
    x = self.scales[0] * y
    y = self.blocks[1](x)
    y = y + x
    x = self.scales[1] * y
    y = self.blocks[2](x)
    y = y + x
    x = self.scales[2] * y
    x = self.norms[0](self.blocks[0](x))
    x = self.norms[1](self.blocks[1](x))
    x = self.norms[2](self.blocks[2](x))
    k = 0
    k = k * 2
    x = x + k
    k = 1
    k = k * 2
    x = x + k
    k = 2
    k = k * 2
    x = x + k
    out = self.blocks[2](x)
    out = out + self.heads['cls'](x).sum()
    out = out + self.heads['box'](x).sum()
    return self.finish(out)
"""


def test_source_before_after_and_numbers() -> None:
    torch.manual_seed(0)
    result = check(UnrollLoops, Tower(), SPECS)
    assert result.sources == {"Tower.forward": AFTER}
    assert result.matches == 5  # four loops, one constant index
    assert line_of(Tower, "for t in out.unbind(0)") in wheres(result, Status.KEPT)


def test_max_iterations_leaves_long_loops() -> None:
    result = apply(UnrollLoops, Tower(), SPECS, max_iterations=2)
    assert "for i in range(DEPTH)" in result.sources["Tower.forward"]
    assert line_of(Tower, "for i in range(DEPTH)") in wheres(result, Status.KEPT)


class Indexed(nn.Module):
    """TorchScript indexes a ModuleList only with integer literals."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(DEPTH)])
        self.depth = DEPTH

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.depth):
            x = torch.relu(self.blocks[i](x)) + i
        return x


@pytest.mark.filterwarnings("ignore")
def test_torchscript_fails_before_and_passes_after() -> None:
    torch.manual_seed(0)
    model = Indexed().eval()
    with pytest.raises(RuntimeError, match="ModuleList/Sequential indexing is only supported"):
        torch.jit.script(model)
    rewritten = check(UnrollLoops, model, SPECS).model
    scripted = torch.jit.script(rewritten)
    args = inputs(SPECS, seed=2)
    torch.testing.assert_close(scripted(*args), model(*args))


class Pyramid(nn.Module):
    """torch.fx cannot iterate the Proxy that x.chunk(...) gives while tracing."""

    def __init__(self) -> None:
        super().__init__()
        self.heads = nn.ModuleList([nn.Linear(2, 3) for _ in range(DEPTH)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = x.chunk(DEPTH, dim=1)
        outs = []
        for head, feature in zip(self.heads, features, strict=True):
            outs.append(head(feature))
        return torch.cat(outs, 1)


PYRAMID = """\
def forward(self, x: torch.Tensor) -> torch.Tensor:
    features = x.chunk(DEPTH, dim=1)
    outs = []
    outs.append(self.heads[0](features[0]))
    outs.append(self.heads[1](features[1]))
    outs.append(self.heads[2](features[2]))
    return torch.cat(outs, 1)
"""


def test_fx_fails_before_and_passes_after() -> None:
    torch.manual_seed(0)
    model = Pyramid().eval()
    spec_list = specs((2, 6))
    with pytest.raises(torch.fx.proxy.TraceError, match="cannot be iterated"):
        torch.fx.symbolic_trace(model)
    result = check(UnrollLoops, model, spec_list)
    assert result.sources == {"Pyramid.forward": PYRAMID}
    graph = torch.fx.symbolic_trace(result.model)
    args = inputs(spec_list, seed=1)
    torch.testing.assert_close(graph(*args), model(*args))
