"""Static-shape versions of data-dependent ops: NMS, batched NMS, nonzero, masked_select.

Each function returns outputs whose shapes depend only on its input shapes and Python
arguments, plus a boolean `valid` mask. They are built from fixed-shape tensor ops only (a
greedy loop unrolled `max_detections` times, TopK with a static k, Gather, Where), so
`torch.export` and `torch.onnx.export` produce graphs without NonZero, Loop, If or
NonMaxSuppression. Python branches here test shapes and arguments, never tensor values.
"""

from __future__ import annotations

import warnings
from typing import Literal

import torch
from torch import Tensor

__all__ = [
    "batched_nms_fixed",
    "masked_select_padded",
    "nms_fixed",
    "nonzero_fixed",
    "strict_threshold",
]


def strict_threshold(threshold: float, dtype: torch.dtype) -> float:
    """The largest value of `dtype` that is <= `threshold`, as a Python float.

    For every value v of `dtype`, `v > strict_threshold(t, dtype)` holds exactly when
    `float(v) > t` does, so a comparison done in `dtype` (as in an exported graph) decides
    like torchvision's kernels, which compare the IoU with a double threshold.
    """
    if dtype == torch.float64:
        return float(threshold)
    with warnings.catch_warnings():
        # A pure function of Python numbers: nothing here belongs in a traced graph.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        value = torch.tensor(float(threshold), dtype=torch.float64).to(dtype)
        if value.item() > threshold:
            value = torch.nextafter(value, torch.tensor(float("-inf"), dtype=dtype))
        return float(value.item())


def _check_boxes(boxes: Tensor, scores: Tensor, max_detections: int) -> None:
    if boxes.dim() != 2 or boxes.shape[-1] != 4:
        raise ValueError(f"boxes must have shape [N, 4] (got {list(boxes.shape)})")
    if scores.dim() != 1 or scores.shape[0] != boxes.shape[0]:
        raise ValueError(
            f"scores must have shape [N] with N = boxes.shape[0] (got {list(scores.shape)} "
            f"for boxes {list(boxes.shape)})"
        )
    if not boxes.is_floating_point():
        raise TypeError(f"boxes must be a floating-point tensor (got {boxes.dtype})")
    if max_detections < 0:
        raise ValueError(f"max_detections must be >= 0 (got {max_detections})")


def _empty_result(boxes: Tensor, max_detections: int) -> tuple[Tensor, Tensor]:
    keep = torch.full((max_detections,), -1, dtype=torch.int64, device=boxes.device)
    valid = torch.zeros((max_detections,), dtype=torch.bool, device=boxes.device)
    return keep, valid


def _positions(like: Tensor) -> Tensor:
    """0, 1, ..., N-1 for a [N] tensor, computed from it: a constant arange would be copied
    into the TorchScript-exported ONNX graph once per use (once per unrolled step)."""
    return torch.ones_like(like, dtype=torch.int64).cumsum(0) - 1


def _greedy_nms(
    boxes: Tensor,
    scores: Tensor,
    labels: Tensor | None,
    iou_threshold: float,
    max_detections: int,
) -> tuple[Tensor, Tensor]:
    """Greedy NMS unrolled max_detections times; boxes of different labels never suppress."""
    # Decisions on shapes name the shape on their own line: `edgeflow explain` tells them
    # from decisions on values by their text.
    n = boxes.shape[0]
    if boxes.shape[0] == 0 or max_detections == 0:
        return _empty_result(boxes, max_detections)
    threshold = strict_threshold(iou_threshold, boxes.dtype)
    # Coordinates as [2, N] rows (x, y): the per-step arithmetic then broadcasts a [2, 1]
    # column, which ONNX Runtime runs ~15x faster than a [1, 2] row against [N, 2].
    lo = boxes[:, :2].t().contiguous()
    hi = boxes[:, 2:].t().contiguous()
    # The same float operations, in the same order, as torchvision's nms kernel:
    # area = (x2 - x1) * (y2 - y1); inter = max(0, xx2 - xx1) * max(0, yy2 - yy1);
    # iou = inter / (area_kept + area - inter).
    size = hi - lo
    areas = size[0] * size[1]
    positions = _positions(scores)
    remaining = torch.ones(n, dtype=torch.bool, device=boxes.device)
    lowest = torch.full((), float("-inf"), dtype=scores.dtype, device=scores.device)
    keep: list[Tensor] = []
    valid: list[Tensor] = []
    for _ in range(min(max_detections, boxes.shape[0])):
        # The next kept box: the highest remaining score, the lowest index among ties (what a
        # stable descending sort visits first). Comparing with `best` keeps -inf scores.
        best = torch.where(remaining, scores, lowest).max()
        candidates = remaining & (scores == best)
        pick = torch.argmax(candidates.to(scores.dtype), dim=0, keepdim=True)
        # With nothing left, argmax is 0 and remaining[0] is False.
        valid.append(remaining.index_select(0, pick))
        keep.append(pick)
        overlap = torch.minimum(hi.index_select(1, pick), hi) - torch.maximum(
            lo.index_select(1, pick), lo
        )
        overlap = torch.relu(overlap)
        inter = overlap[0] * overlap[1]
        iou = inter / (areas.index_select(0, pick) + areas - inter)
        suppressed = iou > threshold
        if labels is not None:
            suppressed = suppressed & (labels == labels.index_select(0, pick))
        remaining = remaining & ~suppressed & (positions != pick)
    keep_t = torch.cat(keep)
    valid_t = torch.cat(valid)
    keep_t = torch.where(valid_t, keep_t, torch.full_like(keep_t, -1))
    if keep_t.shape[0] < max_detections:
        pad = max_detections - keep_t.shape[0]
        keep_t = torch.cat([keep_t, keep_t.new_full((pad,), -1)])
        valid_t = torch.cat([valid_t, valid_t.new_zeros(pad)])
    return keep_t, valid_t


def nms_fixed(
    boxes: Tensor, scores: Tensor, iou_threshold: float, max_detections: int
) -> tuple[Tensor, Tensor]:
    """Greedy non-maximum suppression with fixed-size outputs.

    Contract: `boxes` is [N, 4] floating (x1, y1, x2, y2 with x1 <= x2, y1 <= y2), `scores`
    is [N] of the same dtype, without NaN. Returns `(keep, valid)`, `keep` int64
    [max_detections] and `valid` bool [max_detections]. With `k = torchvision.ops.nms(boxes,
    scores, iou_threshold)`, `keep[:m]` equals `k[:max_detections]` (m its length), in the
    same order (decreasing score, lower index first among equal scores), `valid[:m]` is True,
    and the rest of `keep` is -1 with `valid` False. A box is suppressed when its IoU with a
    kept, higher-ranked box is strictly greater than `iou_threshold`; IoU is computed with
    torchvision's float operations, so decisions match it bit for bit.

    Cost: min(max_detections, N) unrolled steps of ~30 elementwise/reduce ops over N values
    (no N x N matrix). At SSD scale (N = 27,000 candidates, 300 steps): ~9,400 ONNX nodes,
    0.1-0.4 s per image in onnxruntime on 2 CPU cores.
    """
    _check_boxes(boxes, scores, max_detections)
    return _greedy_nms(boxes, scores, None, iou_threshold, max_detections)


def batched_nms_fixed(
    boxes: Tensor,
    scores: Tensor,
    labels: Tensor,
    iou_threshold: float,
    max_detections: int,
    *,
    strategy: Literal["offset", "per_class"] = "offset",
) -> tuple[Tensor, Tensor]:
    """Per-class greedy NMS with fixed-size outputs, like `torchvision.ops.batched_nms`.

    Contract: as `nms_fixed`, plus `labels` int [N]; boxes with different labels never
    suppress each other. `keep` holds the first max_detections kept indices in decreasing
    score order (lower index first among equal scores), padded with -1 / `valid` False.

    `strategy="offset"` is torchvision's coordinate trick, which it uses under tracing and for
    small inputs: each box is shifted by `label * (boxes.max() + 1)` and one NMS runs on the
    shifted boxes; the result equals `torchvision.ops.boxes._batched_nms_coordinate_trick`.
    `strategy="per_class"` computes IoU on the unshifted boxes and suppresses only within a
    label, as torchvision's per-class path (`_batched_nms_vanilla`, taken on CPU above 1,000
    boxes) does; its kept set equals that path's, and it avoids the precision the shift loses
    when coordinates times labels are large. (That path's final sort is not stable, so among
    equal scores its order may differ from this one's.)
    """
    _check_boxes(boxes, scores, max_detections)
    if labels.shape != scores.shape:
        raise ValueError(
            f"labels must have shape [N] like scores (got {list(labels.shape)}, "
            f"scores {list(scores.shape)})"
        )
    if strategy == "per_class":
        return _greedy_nms(boxes, scores, labels, iou_threshold, max_detections)
    if strategy != "offset":
        raise ValueError(f"strategy must be 'offset' or 'per_class' (got {strategy!r})")
    if boxes.shape[0] == 0:
        return _empty_result(boxes, max_detections)
    max_coordinate = boxes.max()
    offsets = labels.to(boxes) * (max_coordinate + torch.tensor(1).to(boxes))
    return _greedy_nms(boxes + offsets[:, None], scores, None, iou_threshold, max_detections)


def _first_true(flat_mask: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """Flat indices of the first `size` True entries in order, padded; and their validity."""
    count = flat_mask.shape[0]
    k = min(size, flat_mask.shape[0])
    positions = torch.arange(count, device=flat_mask.device)
    # True entries keep their position as key, False ones sort after every True one.
    keys = torch.where(flat_mask, positions, positions + count)
    smallest = torch.topk(keys, k, largest=False, sorted=True).indices
    valid = flat_mask.index_select(0, smallest)
    if flat_mask.shape[0] < size:
        pad = size - k
        smallest = torch.cat([smallest, smallest.new_zeros(pad)])
        valid = torch.cat([valid, valid.new_zeros(pad)])
    return smallest, valid


def nonzero_fixed(x: Tensor, size: int, fill_value: int = -1) -> tuple[Tensor, Tensor]:
    """`torch.nonzero(x)` with a fixed number of rows.

    Contract: returns `(indices, valid)`, `indices` int64 [size, x.dim()] and `valid` bool
    [size]. With `nz = torch.nonzero(x)` (row-major order), `indices[:m]` equals `nz[:size]`
    (m its length), `valid[:m]` is True, and the remaining rows are `fill_value` with `valid`
    False, as `torch.nonzero_static(x, size=size, fill_value=fill_value)`.
    """
    if size < 0:
        raise ValueError(f"size must be >= 0 (got {size})")
    shape = list(x.shape)
    flat_mask = x.reshape(-1) != 0
    if flat_mask.shape[0] == 0:
        indices = torch.full((size, len(shape)), fill_value, dtype=torch.int64, device=x.device)
        return indices, torch.zeros((size,), dtype=torch.bool, device=x.device)
    flat, valid = _first_true(flat_mask, size)
    columns = []
    stride = 1
    for extent in reversed(shape):
        columns.append((flat // stride) % extent)
        stride *= extent
    indices = torch.stack(columns[::-1], dim=1) if columns else flat.new_zeros((size, 0))
    indices = torch.where(valid[:, None], indices, torch.full_like(indices, fill_value))
    return indices, valid


def masked_select_padded(
    x: Tensor, mask: Tensor, size: int, fill: float = 0
) -> tuple[Tensor, Tensor]:
    """`torch.masked_select(x, mask)` with a fixed number of values.

    Contract: `x` and `mask` (bool) broadcast together as in `torch.masked_select`. Returns
    `(values, valid)`, `values` [size] of x's dtype and `valid` bool [size]. With
    `sel = torch.masked_select(x, mask)`, `values[:m]` equals `sel[:size]` (m its length),
    `valid[:m]` is True, and the remaining values are `fill` with `valid` False.
    """
    if size < 0:
        raise ValueError(f"size must be >= 0 (got {size})")
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor (got {mask.dtype})")
    x_b, mask_b = torch.broadcast_tensors(x, mask)
    flat_x = x_b.reshape(-1)
    flat_mask = mask_b.reshape(-1)
    if flat_mask.shape[0] == 0:
        values = torch.full((size,), fill, dtype=x.dtype, device=x.device)
        return values, torch.zeros((size,), dtype=torch.bool, device=x.device)
    flat, valid = _first_true(flat_mask, size)
    values = flat_x.index_select(0, flat)
    values = torch.where(valid, values, torch.full_like(values, fill))
    return values, valid
