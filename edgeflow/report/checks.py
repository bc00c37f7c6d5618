"""The recipe's verify thresholds, checked against measured figures."""

from __future__ import annotations

from typing import Any

from edgeflow.recipe.schema import Verify


def check_thresholds(verify: Verify, metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per threshold set in the recipe: metric, value, threshold, passed, message."""
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
    checks = []
    for name, value, limit, kind in rows:
        if limit is None:
            continue
        passed = value <= limit if kind == "max" else value >= limit
        relation = ("is above" if kind == "max" else "is below") if not passed else "is within"
        checks.append(
            {
                "metric": f"verify.{name}",
                "value": value,
                "threshold": limit,
                "passed": bool(passed),
                "message": f"verify.{name}: {value:.6g} {relation} the threshold {limit:.6g}",
            }
        )
    return checks
