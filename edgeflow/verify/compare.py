"""Numbers that say whether an artifact still computes what the source model computes."""

from __future__ import annotations

from typing import Any

import numpy as np


def compare_outputs(reference: list[np.ndarray], actual: list[np.ndarray]) -> dict[str, Any]:
    """Max abs diff per output and overall, and top-1 agreement on the first output.

    Samples on which the artifact outputs NaN or Inf are counted per output
    (`non_finite_samples`) and left out of the differences, which are then over the finite
    samples only (None when there are none): a NaN never hides in a figure."""
    if len(reference) != len(actual):
        raise ValueError(f"the artifact has {len(actual)} outputs, the source {len(reference)}")
    per_output: list[dict[str, Any]] = []
    for i, (ref, out) in enumerate(zip(reference, actual, strict=True)):
        if ref.shape != out.shape:
            raise ValueError(f"output {i}: artifact shape {out.shape} != source {ref.shape}")
        bad = non_finite_samples(out)
        finite = ~bad
        diff = np.abs(ref[finite].astype(np.float64) - out[finite].astype(np.float64))
        scale = float(np.max(np.abs(ref))) or 1.0
        measured = diff.size > 0
        per_output.append(
            {
                "index": i,
                "shape": list(ref.shape[1:]),
                "max_abs_diff": float(diff.max()) if measured else None,
                "mean_abs_diff": float(diff.mean()) if measured else None,
                "max_rel_to_range": float(diff.max() / scale) if measured else None,
                "non_finite_samples": int(bad.sum()),
            }
        )
    first_ref, first_out = reference[0], actual[0]
    top1 = float(np.mean(first_ref.argmax(-1) == first_out.argmax(-1)))
    diffs = [o["max_abs_diff"] for o in per_output]
    return {
        "max_abs_diff": None if None in diffs else max(diffs),
        "top1": top1,
        "non_finite_samples": max(o["non_finite_samples"] for o in per_output),
        "outputs": per_output,
    }


def non_finite_samples(output: np.ndarray) -> np.ndarray:
    """A boolean per sample (axis 0): whether any of its values is NaN or Inf."""
    if not np.issubdtype(output.dtype, np.floating) or output.ndim == 0:
        return np.zeros(len(output) if output.ndim else 1, dtype=bool)
    return ~np.isfinite(output.reshape(len(output), -1)).all(axis=1)


def top1_accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(logits.reshape(len(labels), -1).argmax(-1) == labels))


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))
