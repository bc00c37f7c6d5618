"""ast.specialize_shapes: shape queries on forward's inputs fold to the declared shapes."""

from __future__ import annotations

import pytest
import torch
import torch.fx
from torch import nn

from edgeflow.core.errors import EdgeflowError
from edgeflow.rules.ast.shapes import SpecializeShapes
from edgeflow.rules.base import Status
from tests.rules.ast._helpers import apply, check, inputs, specs
from tests.rules.sites import line_of, outcomes, wheres

SPECS = specs((1, 3, 8, 8), (5,))


class Flex(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 8 * 8, 5)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Accepts CHW or NCHW images."""
        if x.dim() == 3:
            x = x.unsqueeze(0)
        n, _c, h, w = x.shape
        if h != w:
            raise ValueError("square images only")
        y = self.conv(x).reshape(n, -1) if x.size(0) > 1 else self.conv(x).flatten(1)
        y = self.fc(y)
        return y.view(y.size(0), -1) + bias[: len(bias)] * x.numel() / (h * w * x.shape[1])


AFTER = """\
def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    \"\"\"Accepts CHW or NCHW images.\"\"\"
    _edgeflow_rt.check_shapes('Flex.forward', ('x', 'bias'), (x, bias), ((1, 3, 8, 8), (5,)))
    n, _c, h, w = (1, 3, 8, 8)
    y = self.conv(x).flatten(1)
    y = self.fc(y)
    return y.view(y.size(0), -1) + bias[:5] * 192 / 192
"""
AFTER_DYNAMIC_BATCH = """\
def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    \"\"\"Accepts CHW or NCHW images.\"\"\"
    _edgeflow_rt.check_shapes('Flex.forward', ('x', 'bias'), (x, bias), ((None, 3, 8, 8), (None,)))
    n, _c, h, w = x.shape
    if h != w:
        raise ValueError('square images only')
    y = self.conv(x).reshape(n, -1) if x.size(0) > 1 else self.conv(x).flatten(1)
    y = self.fc(y)
    return y.view(y.size(0), -1) + bias[:len(bias)] * x.numel() / (h * w * 3)
"""


def test_source_before_after_and_numbers() -> None:
    torch.manual_seed(0)
    result = check(SpecializeShapes, Flex(), SPECS, atol=1e-6)
    assert result.sources == {"Flex.forward": AFTER}
    assert result.matches == 6  # x.dim(), x.shape, x.size(0), len(bias), x.numel(), x.shape[1]


def test_guard_rejects_other_shapes() -> None:
    model = apply(SpecializeShapes, Flex(), SPECS).model
    with pytest.raises(EdgeflowError, match=r"specialised .* for x of shape \(1, 3, 8, 8\); "):
        model(torch.zeros(2, 3, 8, 8), torch.zeros(5))


def test_fx_trace_fails_before_and_passes_after() -> None:
    torch.manual_seed(0)
    model = Flex().eval()
    with pytest.raises(torch.fx.proxy.TraceError, match="control flow"):
        torch.fx.symbolic_trace(model)
    graph = torch.fx.symbolic_trace(apply(SpecializeShapes, model, SPECS).model)
    args = inputs(SPECS, seed=1)
    torch.testing.assert_close(graph(*args), model(*args))


def test_dynamic_batch_leaves_dim_0_alone() -> None:
    torch.manual_seed(0)
    model = Flex().eval()
    result = check(SpecializeShapes, model, SPECS, dynamic_batch=True)
    assert result.sources == {"Flex.forward": AFTER_DYNAMIC_BATCH}
    assert line_of(Flex, "len(bias)") in wheres(result, Status.KEPT)
    x, bias = torch.randn(3, 3, 8, 8), torch.randn(5)
    torch.testing.assert_close(result.model(x, bias), model(x, bias))


class Rebound(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        return x.view(x.size(0), -1)


def test_queries_after_rebinding_are_kept() -> None:
    result = apply(SpecializeShapes, Rebound(), specs((2, 3, 4)))
    assert not result.changed
    assert outcomes(result) == [("kept", line_of(Rebound, "x.size(0)")), ("not_applicable", "")]


def test_more_inputs_than_arguments_is_an_error() -> None:
    with pytest.raises(EdgeflowError, match="takes 1 positional arguments after self"):
        apply(SpecializeShapes, Rebound(), specs((2, 3), (4,)))
