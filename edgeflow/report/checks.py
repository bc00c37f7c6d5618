"""The recipe's verify thresholds, checked against measured figures."""

from __future__ import annotations

from typing import Any

from edgeflow.core.specs import DEFAULT_MIN_SQNR_DB, Verify


def check_thresholds(
    verify: Verify,
    metrics: dict[str, Any],
    outputs: list[dict[str, Any]] | None = None,
    mode: str = "none",
) -> list[dict[str, Any]]:
    """One entry per threshold that applies (metric, value, threshold, passed, message; and
    the output, for per-output thresholds), after the check that the artifact's `outputs`
    (verify's per-output figures) are finite. A build of quantization `mode` int8 gets
    verify.min_sqnr_db's default where the recipe does not set it."""
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
        ]
    rows += [
        ("max_latency_ms", metrics["latency_ms"]["p50"], verify.max_latency_ms, "max"),
        ("max_size_bytes", metrics["size_bytes"], verify.max_size_bytes, "max"),
    ]
    checks = _finite_outputs(outputs or [])
    for name, value, limit, kind in rows:
        if limit is None:
            continue
        checks.append(_measured(name, value, limit, kind))
    if "match_rate" not in agreement:
        checks += per_output_checks(verify, outputs or [], mode)
    return checks


# Per-output thresholds: (verify key, the kinds it reads, the figure, what it is called).
PER_OUTPUT = (
    ("min_top1_agreement", ("classes",), "top1", "a class vector"),
    ("min_sequence_agreement", ("classes",), "sequence", "a class vector per position"),
    ("min_decision_agreement", ("probability",), "decision", "a probability"),
)


def min_sqnr_db(verify: Verify, mode: str) -> tuple[float | None, bool]:
    """(the SQNR floor of a build, whether it is the default): the recipe's verify.min_sqnr_db
    where it sets the key (null: none), else the default for the quantization mode."""
    if verify.min_sqnr_db != "auto":
        return verify.min_sqnr_db, False
    default = DEFAULT_MIN_SQNR_DB.get(mode)
    return default, default is not None


def per_output_checks(
    verify: Verify, outputs: list[dict[str, Any]], mode: str
) -> list[dict[str, Any]]:
    """Each per-output threshold on every output it applies to; one that applies to none
    fails and says why (a figure that means nothing is never reported as met)."""
    checks = []
    floor, by_default = min_sqnr_db(verify, mode)
    if floor is not None:
        note = f" (the {mode} default; set verify.min_sqnr_db to change it)" if by_default else ""
        for o in outputs:
            checks.append(_measured("min_sqnr_db", o.get("sqnr_db"), floor, "min", o, note))
    for key, kinds, figure, what in PER_OUTPUT:
        limit = getattr(verify, key)
        if limit is None:
            continue
        measured = [o for o in outputs if o.get("kind") in kinds and figure in o]
        checks += [_measured(key, o[figure], limit, "min", o) for o in measured]
        if not measured and outputs:
            checks.append(_applies_to_none(key, limit, what, outputs))
    for o in outputs:
        if o.get("kind") == "detections" and "detections" in o:
            rate, limit = o["detections"]["match_rate"], verify.detections.min_match_rate
            checks.append(_measured("detections.min_match_rate", rate, limit, "min", o))
    return checks


def _applies_to_none(
    key: str, limit: float, what: str, outputs: list[dict[str, Any]]
) -> dict[str, Any]:
    judged = ", ".join(
        f"'{o.get('name', o['index'])}' {o.get('shape')} is {o.get('kind')}"
        + (" by its shape" if o.get("kind_from") == "shape" else "")
        for o in outputs
    )
    fix = {
        "min_top1_agreement": "declare evaluation.outputs.<name>.kind: classes for a class output",
        "min_sequence_agreement": "declare evaluation.outputs.<name>: {kind: classes} for an "
        "output with a class vector at each position ([batch, T, C])",
        "min_decision_agreement": "declare evaluation.outputs.<name>: {kind: probability, "
        "threshold: ...}",
    }[key]
    message = (
        f"verify.{key}: no output is {what}, so there is nothing it can measure ({judged}); "
        f"{fix}, or use verify.min_sqnr_db"
    )
    return _check(key, None, limit, False, message)


def _measured(
    name: str,
    value: Any,
    limit: float,
    kind: str,
    output: dict[str, Any] | None = None,
    note: str = "",
) -> dict[str, Any]:
    which = f"output '{output.get('name', output['index'])}': " if output else ""
    if value is None:  # no finite output to measure: the threshold cannot hold
        message = f"verify.{name}: {which}cannot be measured (the artifact's outputs are NaN/Inf)"
        return _check(name, value, limit, False, message, output=output)
    passed = value <= limit if kind == "max" else value >= limit
    relation = ("is above" if kind == "max" else "is below") if not passed else "is within"
    message = f"verify.{name}: {which}{value:.6g} {relation} the threshold {limit:.6g}{note}"
    return _check(name, value, limit, bool(passed), message, output=output)


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
    name: str,
    value: Any,
    limit: Any,
    passed: bool,
    message: str,
    prefix: str = "verify.",
    output: dict[str, Any] | None = None,
) -> dict[str, Any]:
    found = {
        "metric": f"{prefix}{name}",
        "value": value,
        "threshold": limit,
        "passed": passed,
        "message": message,
    }
    if output is not None:
        found["output"] = output.get("name", output["index"])
    return found


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
