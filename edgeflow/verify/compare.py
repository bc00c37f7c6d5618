"""Numbers that say whether an artifact still computes what the source model computes."""

from __future__ import annotations

from typing import Any

import numpy as np


def compare_outputs(reference: list[np.ndarray], actual: list[np.ndarray]) -> dict[str, Any]:
    """Max abs diff per output and overall, and top-1 agreement on the first output."""
    if len(reference) != len(actual):
        raise ValueError(f"the artifact has {len(actual)} outputs, the source {len(reference)}")
    per_output: list[dict[str, Any]] = []
    for i, (ref, out) in enumerate(zip(reference, actual, strict=True)):
        if ref.shape != out.shape:
            raise ValueError(f"output {i}: artifact shape {out.shape} != source {ref.shape}")
        diff = np.abs(ref.astype(np.float64) - out.astype(np.float64))
        scale = float(np.max(np.abs(ref))) or 1.0
        per_output.append(
            {
                "index": i,
                "shape": list(ref.shape[1:]),
                "max_abs_diff": float(diff.max()),
                "mean_abs_diff": float(diff.mean()),
                "max_rel_to_range": float(diff.max() / scale),
            }
        )
    first_ref, first_out = reference[0], actual[0]
    top1 = float(np.mean(first_ref.argmax(-1) == first_out.argmax(-1)))
    return {
        "max_abs_diff": max(o["max_abs_diff"] for o in per_output),
        "top1": top1,
        "outputs": per_output,
    }


def top1_accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(logits.reshape(len(labels), -1).argmax(-1) == labels))


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))
