"""ast.static_item: .item(), int(t), float(t) with fixed values become constants."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgeflow.core.errors import EdgeflowError
from edgeflow.rules.ast.item import StaticItem
from tests.rules.ast._helpers import apply, check, inputs, specs
from tests.rules.sites import line_of, outcomes

SPECS = specs((2, 4))


class Anchors(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("num_anchors", torch.tensor(3))
        self.register_buffer("stride", torch.tensor(8.0))
        self.proj = nn.Linear(4, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = int(self.num_anchors)
        width = torch.tensor(x.shape[1:]).prod().item()
        y = self.proj(x).view(-1, n, 2)[:, :, : width - 2]
        return y * float(self.stride) + y.new_zeros(1, n, self.num_anchors.item() - 1)


AFTER = """\
def forward(self, x: torch.Tensor) -> torch.Tensor:
    n = 3
    width = 4
    y = self.proj(x).view(-1, n, 2)[:, :, :width - 2]
    return y * 8.0 + y.new_zeros(1, n, 2)
"""


def test_source_before_after_and_numbers() -> None:
    torch.manual_seed(0)
    result = check(StaticItem, Anchors(), SPECS)
    assert result.sources == {"Anchors.forward": AFTER}
    assert result.matches == 4


@pytest.mark.filterwarnings("ignore")
def test_export_fails_before_and_passes_after() -> None:
    torch.manual_seed(0)
    model = Anchors().eval()
    with pytest.raises(Exception, match="data-dependent"):
        torch.export.export(model, inputs(SPECS))
    program = torch.export.export(apply(StaticItem, model, SPECS).model, inputs(SPECS))
    args = inputs(SPECS, seed=4)
    torch.testing.assert_close(program.module()(*args), model(*args))


class Peak(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        peak = x.abs().max().item()
        return x / peak


def test_data_dependent_value_not_used_for_a_shape_is_kept() -> None:
    result = apply(StaticItem, Peak(), SPECS)
    assert not result.changed
    assert outcomes(result) == [("kept", line_of(Peak, ".item()")), ("not_applicable", "")]


class Count(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = int((x > 0).sum())
        return torch.zeros(n)


def test_data_dependent_shape_is_an_error_at_the_line() -> None:
    with pytest.raises(EdgeflowError) as info:
        apply(StaticItem, Count(), SPECS)
    line = Count.forward.__code__.co_firstlineno + 1
    assert info.value.message == (
        f"{__file__}:{line}: Count.forward: int((x > 0).sum()) is used to build a shape, "
        "but it depends on the values of forward's inputs"
    )
    assert info.value.hint
