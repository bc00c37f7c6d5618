"""ast.nonzero_to_mask: data-dependent selections become fixed-size mask arithmetic."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgeflow.rules.ast._source import rewritten_sources
from edgeflow.rules.ast.nonzero import NonzeroToMask
from tests.rules.ast._helpers import apply, check, inputs, specs
from tests.rules.sites import line_of, outcomes

SCORES = specs((2, 8))
BOXES = specs((10,), (10, 4))


class Scores(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.fc(x).sigmoid()
        keep = s > 0.5
        positive = s[keep]
        count = len(torch.nonzero(keep))
        rows = x[keep.any(1)].amax()
        total = positive.sum() + positive.max() + s[s > 0.1].mean()
        return s * count + total + rows + x.masked_select(x > 0).sum()


AFTER = """\
def forward(self, x: torch.Tensor) -> torch.Tensor:
    s = self.fc(x).sigmoid()
    keep = s > 0.5
    count = _edgeflow_rt.count_nonzero(keep)
    rows = _edgeflow_rt.masked_amax(x, keep.any(1))
    total = _edgeflow_rt.masked_sum(s, keep) + _edgeflow_rt.masked_amax(s, keep) + \
_edgeflow_rt.masked_mean(s, s > 0.1)
    return s * count + total + rows + _edgeflow_rt.masked_sum(x, x > 0, broadcast=True)
"""


def test_exact_rewrites_source_and_numbers() -> None:
    torch.manual_seed(0)
    result = check(NonzeroToMask, Scores(), SCORES, seeds=10)
    assert result.sources == {"Scores.forward": AFTER}
    assert result.matches == 6
    assert NonzeroToMask().tolerance(NonzeroToMask.Options()) == 1e-5


@pytest.mark.filterwarnings("ignore")
def test_export_fails_before_and_passes_after() -> None:
    torch.manual_seed(0)
    model = Scores().eval()
    with pytest.raises(Exception, match="data-dependent"):
        torch.export.export(model, inputs(SCORES))
    program = torch.export.export(apply(NonzeroToMask, model, SCORES).model, inputs(SCORES))
    args = inputs(SCORES, seed=5)
    torch.testing.assert_close(program.module()(*args), model(*args))


class Boxes(nn.Module):
    def forward(self, scores: torch.Tensor, boxes: torch.Tensor) -> tuple[torch.Tensor, ...]:
        keep = scores > 0.5
        idx = torch.nonzero(keep)
        (rows,) = torch.where(keep)
        return boxes[keep], idx, rows, boxes[:, keep[:4]]


PADDED = """\
def forward(self, scores: torch.Tensor, boxes: torch.Tensor) -> tuple[torch.Tensor, ...]:
    keep = scores > 0.5
    idx = _edgeflow_rt.nonzero_padded(keep, 6, -1)
    rows, = _edgeflow_rt.nonzero_padded(keep, 6, -1).unbind(1)
    return (_edgeflow_rt.masked_select_padded(boxes, keep, 6, 0.0), idx, rows, boxes[:, keep[:4]])
"""


def test_without_max_size_every_site_is_kept() -> None:
    result = apply(NonzeroToMask, Boxes(), BOXES)
    assert not result.changed
    returned = line_of(Boxes, "return boxes[keep]")
    assert outcomes(result) == [
        ("kept", line_of(Boxes, "torch.nonzero(keep)")),  # data-dependent size: set max_size
        ("kept", line_of(Boxes, "torch.where(keep)")),
        ("kept", returned),  # boxes[keep]
        ("kept", returned),  # boxes[:, keep[:4]]: a mask in a multi-axis index
        ("not_applicable", ""),
    ]


def test_padded_rewrites_keep_the_selected_rows_then_padding() -> None:
    model = Boxes()
    result = apply(NonzeroToMask, model, BOXES, max_size=6)
    assert result.sources == {"Boxes.forward": PADDED}
    assert NonzeroToMask().tolerance(NonzeroToMask.Options(max_size=6)) is None
    again = apply(NonzeroToMask, result.model, BOXES, max_size=6)
    assert not again.changed
    assert rewritten_sources(again.model) == rewritten_sources(result.model)
    for seed in range(10):
        scores, boxes = inputs(BOXES, seed)
        n = int((scores > 0.5).sum())
        assert n <= 6
        selected, idx, rows, _ = result.model(scores, boxes)
        ref_selected, ref_idx, ref_rows, _ = model(scores, boxes)
        assert selected.shape == (6, 4) and idx.shape == (6, 1) and rows.shape == (6,)
        torch.testing.assert_close(selected[:n], ref_selected, atol=0, rtol=0)
        assert torch.equal(idx[:n], ref_idx) and torch.equal(rows[:n], ref_rows)
        assert (selected[n:] == 0).all() and (idx[n:] == -1).all() and (rows[n:] == -1).all()
        for a, b in zip(again.model(scores, boxes), (selected, idx, rows), strict=False):
            assert torch.equal(a, b)


def _output_sizes(model: nn.Module) -> list[tuple[object, ...]]:
    program = torch.export.export(model, inputs(BOXES))
    output = next(n for n in program.graph.nodes if n.op == "output")
    return [tuple(arg.meta["val"].shape) for arg in output.args[0]]


@pytest.mark.filterwarnings("ignore")
def test_padded_outputs_have_static_sizes_after() -> None:
    model = Boxes()
    before = _output_sizes(model)
    assert not all(isinstance(d, int) for shape in before[:3] for d in shape)  # u0, u1, ...
    after = _output_sizes(apply(NonzeroToMask, model, BOXES, max_size=6).model)
    assert after[:3] == [(6, 4), (6, 1), (6,)]
