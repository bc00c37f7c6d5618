"""Object detections: one padded array form for every model, and a set comparison.

Detectors return either torchvision's eager form (a list with one dict per image, holding
`boxes` [n, 4], `scores` [n] and `labels` [n] of a data-dependent length n) or the static
form a deployable graph needs (`boxes` [B, D, 4], `scores` [B, D], `labels` [B, D],
`valid` [B, D] where rows with valid=False are padding). `padded` turns both into the static
form with D = `max_detections`, so that the reference outputs of the eager model and the
artifact's outputs line up, and `compare` pairs detections as sets: the order of detections
with near-equal scores is not stable under float rounding, and NMS keeps the same boxes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

FIELDS = ("boxes", "scores", "labels", "valid")


def padded(result: Any, max_detections: int) -> list[np.ndarray]:
    """[boxes [B, D, 4] float32, scores [B, D] float32, labels [B, D] int64, valid [B, D]]."""
    import torch

    if isinstance(result, list | tuple) and result and all(isinstance(r, dict) for r in result):
        rows = [{k: r[k].detach().cpu().numpy() for k in FIELDS[:3]} for r in result]
        batch = len(rows)
        out = _empty(batch, max_detections)
        for b, row in enumerate(rows):
            n = len(row["scores"])
            if n > max_detections:
                raise ValueError(
                    f"image {b}: {n} detections, more than verify.detections.max_detections "
                    f"= {max_detections}"
                )
            out[0][b, :n], out[1][b, :n], out[2][b, :n] = row["boxes"], row["scores"], row["labels"]
            out[3][b, :n] = True
        return out
    if isinstance(result, list | tuple) and len(result) == 4:
        arrays = [t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else t for t in result]
        return from_arrays(arrays, max_detections)
    raise ValueError(
        "a detection model must return a list of {boxes, scores, labels} dicts (torchvision) "
        f"or (boxes, scores, labels, valid); got {type(result).__name__}"
    )


def from_arrays(arrays: list[np.ndarray], max_detections: int) -> list[np.ndarray]:
    """The static form from four arrays (boxes, scores, labels, valid), padded or checked to D."""
    if len(arrays) != 4:
        raise ValueError(f"expected 4 outputs (boxes, scores, labels, valid), got {len(arrays)}")
    boxes, scores, labels, valid = (np.asarray(a) for a in arrays)
    if boxes.ndim != 3 or boxes.shape[-1] != 4 or scores.shape != boxes.shape[:2]:
        raise ValueError(
            f"expected boxes [B, D, 4] and scores [B, D]; got {boxes.shape} and {scores.shape}"
        )
    batch, d = scores.shape
    if d > max_detections and valid[:, max_detections:].any():
        raise ValueError(f"{d} detection slots, more than max_detections = {max_detections}")
    out = _empty(batch, max_detections)
    n = min(d, max_detections)
    out[0][:, :n], out[1][:, :n], out[2][:, :n] = boxes[:, :n], scores[:, :n], labels[:, :n]
    out[3][:, :n] = valid[:, :n].astype(bool)
    return out


def _empty(batch: int, d: int) -> list[np.ndarray]:
    return [
        np.zeros((batch, d, 4), np.float32),
        np.zeros((batch, d), np.float32),
        np.zeros((batch, d), np.int64),
        np.zeros((batch, d), bool),
    ]


def compare(
    reference: list[np.ndarray],
    actual: list[np.ndarray],
    image_size: tuple[int, int],
    box_atol: float,
    box_units: str,
    score_atol: float,
) -> dict[str, Any]:
    """Pair reference and artifact detections of the same label, closest boxes first (each
    detection in at most one pair); count the pairs within `box_atol` (pixels, or a fraction of the
    image side when `box_units` is "relative") and `score_atol`. match_rate is the matched
    pairs over max(reference, artifact) detections, summed over images."""
    if len(reference) != 4 or len(actual) != 4:
        raise ValueError("detections are compared as (boxes, scores, labels, valid)")
    height, width = image_size
    side = np.array([width, height, width, height], np.float64)
    images = []
    for b in range(len(reference[0])):
        ref = _rows(reference, b)
        got = _rows(actual, b)
        images.append(_match(ref, got, side, box_atol, box_units, score_atol))
    total = sum(i["reference"] for i in images)
    matched = sum(i["matched"] for i in images)
    # Extra artifact detections count against the rate as much as missed ones.
    slots = sum(max(i["reference"], i["artifact"]) for i in images)
    return {
        "images": len(images),
        "reference_detections": total,
        "artifact_detections": sum(i["artifact"] for i in images),
        "matched": matched,
        "match_rate": matched / slots if slots else 1.0,
        "missed": sum(i["missed"] for i in images),
        "count_mismatch_images": sum(i["reference"] != i["artifact"] for i in images),
        "max_box_diff_px": max((i["max_box_diff_px"] for i in images), default=0.0),
        "max_box_diff_relative": max((i["max_box_diff_relative"] for i in images), default=0.0),
        "max_score_diff": max((i["max_score_diff"] for i in images), default=0.0),
        "box_atol": box_atol,
        "box_units": box_units,
        "score_atol": score_atol,
        "per_image": images,
    }


def _rows(arrays: list[np.ndarray], b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    keep = np.asarray(arrays[3][b]).astype(bool)
    boxes = np.asarray(arrays[0][b], np.float64)[keep]
    return boxes, np.asarray(arrays[1][b], np.float64)[keep], np.asarray(arrays[2][b])[keep]


def _match(
    ref: tuple[np.ndarray, np.ndarray, np.ndarray],
    got: tuple[np.ndarray, np.ndarray, np.ndarray],
    side: np.ndarray,
    box_atol: float,
    box_units: str,
    score_atol: float,
) -> dict[str, Any]:
    (r_boxes, r_scores, r_labels), (g_boxes, g_scores, g_labels) = ref, got
    diff = np.abs(r_boxes[:, None, :] - g_boxes[None, :, :])  # [R, G, 4]
    dist = diff.max(-1, initial=0.0)
    rel = (diff / side).max(-1, initial=0.0)
    # Pairs of the same label, closest first: an exact partner is never taken by another.
    rows, cols = np.nonzero(r_labels[:, None] == g_labels[None, :])
    order = np.argsort(dist[rows, cols], kind="stable")
    ref_used = np.zeros(len(r_labels), bool)
    got_used = np.zeros(len(g_labels), bool)
    matched, box_px, box_rel, score = 0, 0.0, 0.0, 0.0
    for i, j in zip(rows[order], cols[order], strict=True):
        if ref_used[i] or got_used[j]:
            continue
        ref_used[i] = got_used[j] = True
        d_score = abs(r_scores[i] - g_scores[j])
        box_px, box_rel = max(box_px, float(dist[i, j])), max(box_rel, float(rel[i, j]))
        score = max(score, float(d_score))
        within = rel[i, j] if box_units == "relative" else dist[i, j]
        matched += bool(within <= box_atol and d_score <= score_atol)
    missed = int((~ref_used).sum())  # no artifact detection of the label was left
    return {
        "reference": len(r_labels),
        "artifact": len(g_labels),
        "matched": matched,
        "missed": missed,
        "max_box_diff_px": box_px,
        "max_box_diff_relative": box_rel,
        "max_score_diff": score,
    }
