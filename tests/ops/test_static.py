"""The static ops against plain references: equal results on random inputs, ties and empty
inputs included, and output shapes that depend only on the arguments."""

from __future__ import annotations

import math

import pytest
import torch

from edgeflow.ops.static import (
    batched_nms_fixed,
    masked_select_padded,
    nms_fixed,
    nonzero_fixed,
    strict_threshold,
)
from tests.ops.reference import batched_nms_offset, batched_nms_per_class, greedy_nms

THRESHOLDS = [0.0, 0.3, 0.5, 0.55, 0.7, 1.0]


def random_detections(
    seed: int, n: int, *, grid: bool, tied_scores: bool, classes: int = 3
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Boxes (x1, y1, x2, y2), scores and labels. On a small integer grid IoUs hit round
    values such as 0.5 exactly and some boxes have zero area; tied scores repeat a few values."""
    gen = torch.Generator().manual_seed(seed)
    if grid:
        xy = torch.randint(0, 8, (n, 2), generator=gen).float()
        wh = torch.randint(0, 5, (n, 2), generator=gen).float()
    else:
        xy = torch.rand(n, 2, generator=gen) * 100
        wh = torch.rand(n, 2, generator=gen) * 40
    boxes = torch.cat([xy, xy + wh], dim=1)
    if tied_scores:
        scores = torch.randint(0, 4, (n,), generator=gen).float() / 4
    else:
        scores = torch.rand(n, generator=gen)
    labels = torch.randint(0, classes, (n,), generator=gen)
    return boxes, scores, labels


def expected(kept: list[int], size: int) -> tuple[list[int], list[bool]]:
    head = kept[:size]
    pad = size - len(head)
    return head + [-1] * pad, [True] * len(head) + [False] * pad


CASES = [
    (seed, n, grid, tied)
    for seed, (n, grid, tied) in enumerate(
        [(n, g, t) for n in (1, 2, 7, 40) for g in (True, False) for t in (True, False)]
    )
]


@pytest.mark.parametrize(("seed", "n", "grid", "tied"), CASES)
def test_nms_fixed_equals_greedy_reference(seed: int, n: int, grid: bool, tied: bool) -> None:
    boxes, scores, _ = random_detections(seed, n, grid=grid, tied_scores=tied)
    for threshold in THRESHOLDS:
        kept = greedy_nms(boxes, scores, threshold)
        for size in (1, 5, n + 3):
            keep, valid = nms_fixed(boxes, scores, threshold, size)
            assert keep.dtype == torch.int64 and valid.dtype == torch.bool
            assert (keep.tolist(), valid.tolist()) == expected(kept, size), (threshold, size)


def test_nms_fixed_keeps_ties_in_index_order() -> None:
    # Four identical boxes with equal scores: the lowest index wins and suppresses the rest;
    # disjoint boxes with equal scores come out in index order.
    same = torch.tensor([[0.0, 0.0, 2.0, 2.0]] * 4)
    keep, valid = nms_fixed(same, torch.ones(4), 0.5, 3)
    assert keep.tolist() == [0, -1, -1] and valid.tolist() == [True, False, False]
    apart = torch.tensor([[10.0 * i, 0.0, 10.0 * i + 1, 1.0] for i in range(4)])
    keep, _ = nms_fixed(apart, torch.tensor([0.5, 0.9, 0.5, 0.9]), 0.5, 4)
    assert keep.tolist() == [1, 3, 0, 2]


def test_nms_fixed_suppresses_only_above_the_threshold() -> None:
    # IoU of these two boxes is exactly 0.5: kept at threshold 0.5, suppressed below it.
    boxes = torch.tensor([[0.0, 0.0, 2.0, 1.0], [0.0, 0.0, 1.0, 1.0]])
    scores = torch.tensor([0.9, 0.8])
    assert nms_fixed(boxes, scores, 0.5, 2)[0].tolist() == [0, 1]
    assert nms_fixed(boxes, scores, 0.4999, 2)[0].tolist() == [0, -1]


def test_nms_fixed_handles_infinite_scores_and_empty_boxes() -> None:
    boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0], [5.0, 5.0, 5.0, 5.0], [5.0, 5.0, 5.0, 5.0]])
    scores = torch.tensor([float("-inf"), float("-inf"), 0.1])
    # Zero-area boxes have IoU 0/0 = NaN with each other, which suppresses nothing.
    keep, valid = nms_fixed(boxes, scores, 0.5, 4)
    assert keep.tolist() == [*greedy_nms(boxes, scores, 0.5), -1] == [2, 0, 1, -1]
    assert valid.tolist() == [True, True, True, False]


def test_nms_fixed_on_no_boxes() -> None:
    keep, valid = nms_fixed(torch.zeros(0, 4), torch.zeros(0), 0.5, 3)
    assert keep.tolist() == [-1, -1, -1] and valid.tolist() == [False] * 3
    keep, valid = nms_fixed(torch.rand(4, 4), torch.rand(4), 0.5, 0)
    assert keep.shape == (0,) and valid.shape == (0,)


def test_nms_fixed_in_float64() -> None:
    boxes, scores, _ = random_detections(3, 30, grid=False, tied_scores=False)
    boxes, scores = boxes.double(), scores.double()
    keep, _ = nms_fixed(boxes, scores, 0.3, 40)
    assert keep.tolist() == expected(greedy_nms(boxes, scores, 0.3), 40)[0]


def test_nms_fixed_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match=r"boxes must have shape \[N, 4\]"):
        nms_fixed(torch.zeros(3, 5), torch.zeros(3), 0.5, 2)
    with pytest.raises(ValueError, match="scores must have shape"):
        nms_fixed(torch.zeros(3, 4), torch.zeros(2), 0.5, 2)


@pytest.mark.parametrize(("seed", "n", "grid", "tied"), CASES)
def test_batched_nms_fixed_equals_references(seed: int, n: int, grid: bool, tied: bool) -> None:
    boxes, scores, labels = random_detections(seed + 100, n, grid=grid, tied_scores=tied)
    for threshold in (0.3, 0.5, 0.55):
        offset = batched_nms_offset(boxes, scores, labels, threshold)
        per_class = batched_nms_per_class(boxes, scores, labels, threshold)
        for size in (3, n + 2):
            got = batched_nms_fixed(boxes, scores, labels, threshold, size)
            assert (got[0].tolist(), got[1].tolist()) == expected(offset, size)
            got = batched_nms_fixed(boxes, scores, labels, threshold, size, strategy="per_class")
            assert (got[0].tolist(), got[1].tolist()) == expected(per_class, size)


def test_batched_nms_fixed_never_suppresses_across_labels() -> None:
    boxes = torch.tensor([[0.0, 0.0, 4.0, 4.0]] * 3)
    scores = torch.tensor([0.9, 0.8, 0.7])
    labels = torch.tensor([0, 1, 0])
    for strategy in ("offset", "per_class"):
        keep, _ = batched_nms_fixed(boxes, scores, labels, 0.5, 3, strategy=strategy)
        assert keep.tolist() == [0, 1, -1]


def test_batched_nms_fixed_on_no_boxes_and_bad_strategy() -> None:
    empty = torch.zeros(0, 4), torch.zeros(0), torch.zeros(0, dtype=torch.int64)
    for strategy in ("offset", "per_class"):
        keep, valid = batched_nms_fixed(*empty, 0.5, 2, strategy=strategy)
        assert keep.tolist() == [-1, -1] and valid.tolist() == [False, False]
    with pytest.raises(ValueError, match="strategy must be"):
        batched_nms_fixed(*empty, 0.5, 2, strategy="vanilla")  # type: ignore[arg-type]


@pytest.mark.parametrize("threshold", [0.1, 0.45, 0.5, 0.55, 0.7, 1 / 3])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_strict_threshold_decides_like_a_double_comparison(
    threshold: float, dtype: torch.dtype
) -> None:
    t = torch.tensor(strict_threshold(threshold, dtype), dtype=dtype)
    assert t.item() == strict_threshold(threshold, dtype)  # representable exactly
    neighbours = [
        torch.nextafter(t, torch.tensor(math.inf, dtype=dtype)),
        t,
        torch.nextafter(t, torch.tensor(-math.inf, dtype=dtype)),
    ]
    for v in neighbours:
        assert bool(v > t) == (v.item() > threshold)
    assert strict_threshold(0.55, torch.float64) == 0.55


NONZERO_SHAPES = [(), (0,), (7,), (3, 4), (2, 3, 4), (2, 0, 3)]


@pytest.mark.parametrize("shape", NONZERO_SHAPES)
def test_nonzero_fixed_equals_nonzero(shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(len(shape))
    for density in (0.0, 0.3, 1.0):
        x = (torch.rand(shape, generator=gen) < density).float() * 3
        nz = torch.nonzero(x)
        for size in (0, 1, 5, 30):
            indices, valid = nonzero_fixed(x, size)
            assert indices.shape == (size, len(shape)) and indices.dtype == torch.int64
            m = min(size, nz.shape[0])
            assert torch.equal(indices[:m], nz[:m])
            assert (indices[m:] == -1).all()
            assert valid.tolist() == [True] * m + [False] * (size - m)
            if hasattr(torch, "nonzero_static"):
                assert torch.equal(indices, torch.nonzero_static(x, size=size, fill_value=-1))


def test_nonzero_fixed_fill_value_and_bool_input() -> None:
    x = torch.tensor([[False, True], [True, False]])
    indices, valid = nonzero_fixed(x, 3, fill_value=0)
    assert indices.tolist() == [[0, 1], [1, 0], [0, 0]] and valid.tolist() == [True, True, False]


@pytest.mark.parametrize(
    ("x_shape", "mask_shape"), [((7,), (7,)), ((3, 4), (3, 4)), ((3, 4), (4,)), ((1, 4), (3, 1))]
)
def test_masked_select_padded_equals_masked_select(
    x_shape: tuple[int, ...], mask_shape: tuple[int, ...]
) -> None:
    gen = torch.Generator().manual_seed(sum(x_shape) + sum(mask_shape))
    x = torch.randn(x_shape, generator=gen)
    for density in (0.0, 0.5, 1.0):
        mask = torch.rand(mask_shape, generator=gen) < density
        selected = torch.masked_select(x, mask)
        for size in (0, 2, 20):
            values, valid = masked_select_padded(x, mask, size, fill=-7.0)
            m = min(size, selected.shape[0])
            assert values.shape == (size,) and values.dtype == x.dtype
            assert torch.equal(values[:m], selected[:m])
            assert (values[m:] == -7.0).all()
            assert valid.tolist() == [True] * m + [False] * (size - m)


def test_masked_select_padded_on_empty_input_and_integers() -> None:
    values, valid = masked_select_padded(torch.zeros(0), torch.zeros(0, dtype=torch.bool), 2)
    assert values.tolist() == [0.0, 0.0] and valid.tolist() == [False, False]
    x = torch.arange(6).reshape(2, 3)
    values, _ = masked_select_padded(x, x % 2 == 1, 4, fill=-1)
    assert values.tolist() == [1, 3, 5, -1] and values.dtype == torch.int64
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        masked_select_padded(x, x, 2)


def test_output_shapes_do_not_depend_on_values() -> None:
    for seed in range(3):
        boxes, scores, labels = random_detections(seed, 20, grid=True, tied_scores=True)
        assert nms_fixed(boxes, scores, 0.5, 8)[0].shape == (8,)
        assert batched_nms_fixed(boxes, scores, labels, 0.5, 8)[1].shape == (8,)
        assert nonzero_fixed(scores > 0.5, 6)[0].shape == (6, 1)
        assert masked_select_padded(scores, scores > 0.5, 6)[0].shape == (6,)
