"""Numbers that say whether an artifact still computes what the source model computes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from edgeflow.schema.sections import OutputSpec, default_output_names
from edgeflow.verify.kinds import BoxMatching, agreement, judged, sqnr_db


def compare_outputs(
    reference: list[np.ndarray],
    actual: list[np.ndarray],
    names: list[str] | None = None,
    declared: Mapping[str, OutputSpec] | None = None,
    boxes: BoxMatching | None = None,
) -> dict[str, Any]:
    """Per output: max abs diff, relative error, SQNR, and the figure its kind calls for
    (edgeflow.verify.kinds); overall: the largest diff, the lowest SQNR and top-1 agreement
    where some output is a class vector.

    Samples on which the artifact outputs NaN or Inf are counted per output
    (`non_finite_samples`) and left out of the differences, which are then over the finite
    samples only (None when there are none): a NaN never hides in a figure."""
    if len(reference) != len(actual):
        raise ValueError(f"the artifact has {len(actual)} outputs, the source {len(reference)}")
    names = names or default_output_names(len(reference))
    declared = declared or {}
    per_output: list[dict[str, Any]] = []
    for i, (ref, out) in enumerate(zip(reference, actual, strict=True)):
        if ref.shape != out.shape:
            raise ValueError(f"output {i}: artifact shape {out.shape} != source {ref.shape}")
        bad = non_finite_samples(out)
        finite = ~bad
        diff = np.abs(ref[finite].astype(np.float64) - out[finite].astype(np.float64))
        scale = float(np.max(np.abs(ref))) or 1.0
        measured = diff.size > 0
        spec, decided = judged(ref, declared.get(names[i]))
        skipped = {}
        if bad.any() and getattr(spec, "pairs", None):  # sample indices no longer hold
            spec = spec.model_copy(update={"pairs": []})
            skipped["retrieval_skipped"] = (
                f"not measured: the artifact outputs NaN or Inf on {int(bad.sum())} samples, "
                "so the pairs' sample indices do not hold"
            )
        per_output.append(
            {
                "index": i,
                "name": names[i],
                "shape": list(ref.shape[1:]),
                "kind": spec.kind,
                "kind_from": decided,
                # where the samples are in the model's own layout (the arrays are batch-first)
                **({"batch_axis": spec.batch_axis} if spec.batch_axis else {}),
                "max_abs_diff": float(diff.max()) if measured else None,
                "mean_abs_diff": float(diff.mean()) if measured else None,
                "max_rel_to_range": float(diff.max() / scale) if measured else None,
                "sqnr_db": sqnr_db(ref[finite], out[finite]) if measured else None,
                "non_finite_samples": int(bad.sum()),
                **(agreement(names[i], spec, ref[finite], out[finite], boxes) if measured else {}),
                **skipped,
            }
        )
    diffs = [o["max_abs_diff"] for o in per_output]
    sqnrs = [o["sqnr_db"] for o in per_output]
    top1 = [o["top1"] for o in per_output if o["kind"] == "classes" and "top1" in o]
    return {
        "max_abs_diff": None if None in diffs else max(diffs),
        "min_sqnr_db": None if None in sqnrs else min(sqnrs),
        **({"top1": None if None in top1 else min(top1)} if top1 else {}),
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


def step_errors(
    reference: list[np.ndarray], outputs: list[np.ndarray], names: list[str]
) -> list[dict[str, Any]]:
    """What one conversion step changed, per output: the largest |after - before| and that
    relative to the output's range over the samples (the loss matrix and the report's
    "error each step added")."""
    found = []
    for name, want, got in zip(names, reference, outputs, strict=True):
        want, got = np.asarray(want, np.float64), np.asarray(got, np.float64)
        diff = float(np.max(np.abs(want - got))) if want.size else 0.0
        span = float(want.max() - want.min()) if want.size else 0.0
        found.append(
            {"name": name, "max_abs_diff": diff, "max_rel_to_range": diff / span if span else None}
        )
    return found
