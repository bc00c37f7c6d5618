"""Plain-Python references for the static ops: torchvision's greedy NMS, step by step.

torchvision is not installed in this environment; these follow its CPU kernel
(`torchvision/csrc/ops/cpu/nms_kernel.cpp`): a stable descending sort of the scores, float32
arithmetic for areas and IoU, and suppression when the IoU, promoted to double, is strictly
greater than the threshold.
"""

from __future__ import annotations

import numpy as np
import torch


def greedy_nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> list[int]:
    """torchvision.ops.nms: kept indices in decreasing score order (stable among ties)."""
    dtype = np.float64 if boxes.dtype == torch.float64 else np.float32
    b = boxes.numpy().astype(dtype)
    s = scores.tolist()
    order = sorted(range(len(s)), key=lambda i: -s[i])  # sorted() is stable
    areas = [(b[i, 2] - b[i, 0]) * (b[i, 3] - b[i, 1]) for i in range(len(s))]
    suppressed = [False] * len(s)
    keep: list[int] = []
    zero = dtype(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        for rank, i in enumerate(order):
            if suppressed[i]:
                continue
            keep.append(i)
            for j in order[rank + 1 :]:
                if suppressed[j]:
                    continue
                w = max(zero, min(b[i, 2], b[j, 2]) - max(b[i, 0], b[j, 0]))
                h = max(zero, min(b[i, 3], b[j, 3]) - max(b[i, 1], b[j, 1]))
                inter = w * h
                iou = inter / (areas[i] + areas[j] - inter)
                if float(iou) > iou_threshold:
                    suppressed[j] = True
    return keep


def batched_nms_offset(
    boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, iou_threshold: float
) -> list[int]:
    """torchvision's `_batched_nms_coordinate_trick`: shift each class apart, then one NMS."""
    if boxes.numel() == 0:
        return []
    max_coordinate = boxes.max()
    offsets = labels.to(boxes) * (max_coordinate + torch.tensor(1).to(boxes))
    return greedy_nms(boxes + offsets[:, None], scores, iou_threshold)


def batched_nms_per_class(
    boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, iou_threshold: float
) -> list[int]:
    """torchvision's `_batched_nms_vanilla`: NMS per class, merged in decreasing score order
    (stable: lower index first among equal scores)."""
    kept: list[int] = []
    for label in sorted(set(labels.tolist())):
        members = [i for i, v in enumerate(labels.tolist()) if v == label]
        local = greedy_nms(boxes[members], scores[members], iou_threshold)
        kept.extend(members[k] for k in local)
    s = scores.tolist()
    return sorted(sorted(kept), key=lambda i: -s[i])
