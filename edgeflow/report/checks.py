"""The recipe's verify thresholds, checked against measured figures."""

from __future__ import annotations

from typing import Any

from edgeflow.core.specs import Verify


def check_thresholds(
    verify: Verify, metrics: dict[str, Any], outputs: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """One entry per threshold set in the recipe (metric, value, threshold, passed, message),
    after the check that the artifact's `outputs` (verify's per-output figures) are finite."""
    agreement, accuracy = metrics["agreement"], metrics["accuracy"]
    if "match_rate" in agreement:  # evaluation.metric: detections
        rate = verify.detections.min_match_rate
        rows: list[tuple[str, Any, float | None, str]] = [
            ("detections.min_match_rate", agreement["match_rate"], rate, "min")
        ]
    else:
        rows = [
            ("max_abs_diff", agreement["max_abs_diff"], verify.max_abs_diff, "max"),
            (
                "max_relative_diff",
                agreement.get("max_relative_diff"),
                verify.max_relative_diff,
                "max",
            ),
            (
                "max_accuracy_drop",
                accuracy and accuracy["drop"],
                verify.max_accuracy_drop if accuracy else None,  # no labels: no accuracy
                "max",
            ),
            ("min_top1_agreement", agreement["top1"], verify.min_top1_agreement, "min"),
        ]
    rows += [
        ("max_latency_ms", metrics["latency_ms"]["p50"], verify.max_latency_ms, "max"),
        ("max_size_bytes", metrics["size_bytes"], verify.max_size_bytes, "max"),
    ]
    checks = _finite_outputs(outputs or [])
    for name, value, limit, kind in rows:
        if limit is None:
            continue
        if value is None:  # no finite output to measure: the threshold cannot hold
            message = f"verify.{name}: cannot be measured (the artifact's outputs are NaN/Inf)"
            checks.append(_check(name, value, limit, False, message))
            continue
        passed = value <= limit if kind == "max" else value >= limit
        relation = ("is above" if kind == "max" else "is below") if not passed else "is within"
        message = f"verify.{name}: {value:.6g} {relation} the threshold {limit:.6g}"
        checks.append(_check(name, value, limit, bool(passed), message))
    return checks


def _finite_outputs(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Always checked: an artifact that outputs NaN or Inf (the source never does: the load
    stage refuses such a source) fails."""
    bad = [o for o in outputs if o.get("non_finite_samples")]
    if not bad:
        return []
    where = "; ".join(f"output {o['index']} on {o['non_finite_samples']} samples" for o in bad)
    message = f"the artifact outputs NaN or Inf where the source model does not: {where}"
    return [_check("finite_outputs", len(bad), 0, False, message, prefix="")]


def _check(
    name: str, value: Any, limit: Any, passed: bool, message: str, prefix: str = "verify."
) -> dict[str, Any]:
    return {
        "metric": f"{prefix}{name}",
        "value": value,
        "threshold": limit,
        "passed": passed,
        "message": message,
    }


def fallback_checks(record: dict[str, Any]) -> list[dict[str, Any]]:
    """quantization.fallback: a search that found no mix within the budget fails the build
    (the closest mix it found is kept)."""
    if record["met"]:
        return []
    chosen = record["chosen"]
    message = (
        f"quantization.fallback: no mix of int8 and float layers met the budget on the "
        f"{record['measured_on']} (missed {', '.join(chosen['missed'])} with "
        f"{len(chosen['float_layers'])} layers float, the closest of {len(record['trials'])} "
        "tried); that build is kept"
    )
    return [_check("fallback", len(chosen["missed"]), 0, False, message, prefix="quantization.")]
