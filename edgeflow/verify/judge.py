"""How a build is judged: its outputs compared with the source model's, and the recipe's verify
thresholds for its quantization mode checked against the figures.

One code path for every judge: the report stage's verdict on the evaluation samples and the
quantization.fallback: auto search's on the calibration samples compare with `Comparison`
and check with `quality_checks`, so a mix the search accepts is one verify would accept on
the same samples.

Thresholds come per quantization mode (`thresholds`): verify.by_mode.<mode>.<key> where the
recipe sets it, else verify.<key>, else the schema's default for that mode; each limit keeps
where it came from, and a failed check says so ("0.08 is above the threshold 0.001, from
verify.max_relative_diff, which holds for every mode: ...").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgeflow.core.errors import EdgeflowError
from edgeflow.schema.sections import (
    DEFAULT_MIN_SQNR_DB,
    QUALITY_THRESHOLDS,
    DetectionChecks,
    OutputSpec,
    TaskMetric,
    Verify,
)

if TYPE_CHECKING:  # imported where used: the recipe checks read thresholds without numpy
    import numpy as np

# Every threshold of verify and whether the figure must stay at most ("max") or at least it.
KINDS = {
    "max_abs_diff": "max",
    "max_relative_diff": "max",
    "max_accuracy_drop": "max",
    "min_top1_agreement": "min",
    "min_sqnr_db": "min",
    "min_decision_agreement": "min",
    "min_sequence_agreement": "min",
    "min_cosine_similarity": "min",
    "max_latency_ms": "max",
    "max_size_bytes": "max",
}
# Per-output thresholds: (verify key, the kinds it reads, the figure, what it is called).
PER_OUTPUT = (
    ("min_top1_agreement", ("classes",), "top1", "a class vector"),
    ("min_sequence_agreement", ("classes",), "sequence", "a class vector per position"),
    ("min_decision_agreement", ("probability",), "decision", "a probability"),
    ("min_cosine_similarity", ("embedding",), "cosine_min", "an embedding"),
)


@dataclass(frozen=True)
class Limit:
    """One threshold of a build: its value and where it came from (`origin`: the recipe key
    that set it, or "default")."""

    key: str
    value: float
    origin: str
    mode: str
    per_mode: bool = True  # whether verify.by_mode can set it

    @property
    def kind(self) -> str:
        return KINDS.get(self.key, "min")

    def note(self, passed: bool) -> str:
        """Where the limit came from, for a check's message; for a failed one, where a value
        for this mode alone goes."""
        if not self.per_mode:
            return ""
        own = f"verify.by_mode.{self.mode}.{self.key}"
        if self.origin == "default":
            return f" (the {self.mode} default; set {own} to change it)"
        if self.origin.startswith("verify.by_mode."):
            return f" (from {self.origin})"
        if passed:
            return ""
        return (
            f" (from {self.origin}, which holds for every mode; set {own} for {self.mode} builds)"
        )


@dataclass(frozen=True)
class Thresholds:
    """The thresholds a build of quantization `mode` is held to."""

    mode: str
    limits: dict[str, Limit]
    detections: DetectionChecks = field(default_factory=DetectionChecks)
    task: TaskMetric | None = None
    task_limit: Limit | None = None

    def quality(self, labelled: bool) -> Thresholds:
        """Those the outputs alone decide (not latency or size), measurable on samples with
        labels (`labelled`: accuracy) or without: the fallback search's budget."""
        keep = set(QUALITY_THRESHOLDS) - (set() if labelled else {"max_accuracy_drop"})
        limits = {k: v for k, v in self.limits.items() if k in keep}
        return Thresholds(self.mode, limits, self.detections, self.task, self.task_limit)

    def record(self) -> dict[str, float]:
        found = {k: v.value for k, v in self.limits.items()}
        if self.task_limit is not None:
            found["task_metric"] = self.task_limit.value
        return found

    def __bool__(self) -> bool:
        return bool(self.limits) or self.task_limit is not None


def thresholds(verify: Verify, mode: str, keys: Sequence[str] = tuple(KINDS)) -> Thresholds:
    """The thresholds of verify for a build of quantization `mode` (of `keys` only: those on
    the outputs, QUALITY_THRESHOLDS, for a stage that reads no others)."""
    own = verify.by_mode.get(mode)  # type: ignore[call-overload]
    limits: dict[str, Limit] = {}
    for key in keys:
        if own is not None and own.given(key):
            value, origin = getattr(own, key), f"verify.by_mode.{mode}.{key}"
        else:  # the schema's default value reads as the default, wherever it was written
            value = getattr(verify, key)
            default = Verify.model_fields[key].default
            origin = "default" if value == default else f"verify.{key}"
            if key == "min_sqnr_db" and value == "auto":
                value, origin = DEFAULT_MIN_SQNR_DB.get(mode), "default"
        if value is not None:
            limits[key] = Limit(key, float(value), origin, mode)
    task, task_limit = verify.task_metric, None
    if task is not None:
        if own is not None and own.given("task_metric"):
            bound, origin = own.task_metric, f"verify.by_mode.{mode}.task_metric"
        else:
            bound, origin = task.bound, f"verify.task_metric.{task.kind}"
        if bound is not None:
            task_limit = Limit("task_metric", float(bound), origin, mode)
    return Thresholds(mode, limits, verify.detections, task, task_limit)


@dataclass(frozen=True)
class Comparison:
    """How a build's outputs are compared with the source's, on batch-first arrays: the
    output names, their declared kinds (evaluation.outputs), the whole-model detections form
    (evaluation.metric: detections), a raw detector head's image size and tolerances, and the
    recipe's task metric, loaded."""

    names: list[str]
    declared: Mapping[str, OutputSpec]
    metric: str = "agreement"
    image_size: tuple[int, int] | None = None
    detections: DetectionChecks = field(default_factory=DetectionChecks)
    task: TaskMetric | None = None

    @classmethod
    def of(cls, evaluation: Any, verify: Verify, inputs: list[Any], names: list[str]) -> Comparison:
        """As the recipe says: its evaluation section, verify's detections and task metric,
        the first input's last two axes as the image size (a detector's)."""
        shape = list(inputs[0].shape) if inputs else []
        image = (int(shape[-2]), int(shape[-1])) if len(shape) >= 2 else None
        return cls(
            names,
            evaluation.outputs,
            evaluation.metric,
            image,
            verify.detections,
            verify.task_metric,
        )

    def agreement(self, reference: list[np.ndarray], outputs: list[np.ndarray]) -> dict[str, Any]:
        """verify.json's `agreement`: per output and overall; ValueError when the outputs do
        not match the source's in number or shape."""
        if self.metric == "detections":
            from edgeflow.verify.detections import compare, from_arrays

            c = self.detections
            assert self.image_size is not None  # the whole-model form needs the image size
            found = compare(
                reference,
                from_arrays(outputs, c.max_detections),
                self.image_size,
                c.box_atol,
                c.box_units,
                c.score_atol,
            )
        else:
            from edgeflow.verify.compare import compare_outputs
            from edgeflow.verify.kinds import BoxMatching

            boxes = BoxMatching(self.image_size, self.detections) if self.image_size else None
            found = compare_outputs(reference, outputs, self.names, self.declared, boxes)
        if self.task is not None:
            found["task_metric"] = {
                "name": self.task.name,
                "value": task_value(self.task, self.names, reference, outputs),
            }
        return found


def task_value(
    task: TaskMetric, names: list[str], reference: list[np.ndarray], outputs: list[np.ndarray]
) -> float:
    """The recipe's task metric of these outputs; an error naming the function when it raises
    or returns no finite number (the user's code: its traceback stays on the error)."""
    function = task.function.load()
    try:
        value = function(
            dict(zip(names, reference, strict=True)), dict(zip(names, outputs, strict=True))
        )
    except Exception as exc:
        raise EdgeflowError(
            f"verify.task_metric.function: {task.function} raised {type(exc).__name__}: {exc}",
            "fix the function: it takes two dicts of output name -> array (batch-first), the "
            "source model's and the artifact's, and returns a number",
        ) from exc
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number):
        raise EdgeflowError(
            f"verify.task_metric.function: {task.function} returned {value!r:.60}, not a "
            "finite number",
            "return one number: the score (with min:) or the error (with max:) of the outputs",
        )
    return number


def accuracy_of(
    agreement: dict[str, Any],
    reference: list[np.ndarray],
    outputs: list[np.ndarray],
    labels: np.ndarray,
) -> dict[str, float]:
    """Top-1 accuracy of the source and the artifact on `labels`, scored on the first output
    holding one class vector per sample."""
    from edgeflow.verify.compare import top1_accuracy

    scored = class_vector(agreement)
    source, artifact = (
        top1_accuracy(reference[scored], labels),
        top1_accuracy(outputs[scored], labels),
    )
    return {"source": source, "artifact": artifact, "drop": source - artifact}


def class_vector(agreement: dict[str, Any]) -> int:
    """The first output holding one class vector per sample: what top-1 accuracy scores."""
    for o in agreement["outputs"]:
        if o["kind"] == "classes" and o.get("positions") == 1:
            return int(o["index"])
    shapes = ", ".join(f"'{o['name']}' {o['shape']} ({o['kind']})" for o in agreement["outputs"])
    raise EdgeflowError(
        f"evaluation.metric: top1 scores a class vector per sample, and no output is one: {shapes}",
        "set evaluation.metric: agreement and remove verify.max_accuracy_drop, or declare the "
        "class output in evaluation.outputs (kind: classes)",
    )


def build_checks(
    limits: Thresholds,
    agreement: dict[str, Any],
    accuracy: dict[str, Any] | None,
    latency_ms: float | None = None,
    size_bytes: int | None = None,
) -> list[dict[str, Any]]:
    """Every check of a build: its outputs' (quality_checks), then latency and size."""
    checks = quality_checks(limits, agreement, accuracy)
    for key, value in (("max_latency_ms", latency_ms), ("max_size_bytes", size_bytes)):
        if key in limits.limits:
            checks.append(_measured(limits.limits[key], value))
    return checks


def quality_checks(
    limits: Thresholds, agreement: dict[str, Any], accuracy: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """One entry per threshold on the outputs that applies (metric, value, threshold, passed,
    message, origin; and the output, for per-output ones), after the check that the
    artifact's outputs are finite. `agreement` is Comparison.agreement's; `accuracy` is
    accuracy_of's (None without labels: no accuracy threshold applies)."""
    found = limits.limits
    outputs = agreement.get("outputs") or []
    checks = _finite_outputs(outputs)
    if "match_rate" in agreement:  # evaluation.metric: detections: compared as a whole
        checks.append(_measured(_match_rate(limits), agreement["match_rate"]))
    else:
        relative = [o["max_rel_to_range"] for o in outputs]
        figures = {
            "max_abs_diff": agreement.get("max_abs_diff"),
            "max_relative_diff": None if None in relative or not relative else max(relative),
            "max_accuracy_drop": accuracy and accuracy["drop"],
        }
        for key, value in figures.items():
            if key in found and (key != "max_accuracy_drop" or accuracy is not None):
                checks.append(_measured(found[key], value))
        checks += _per_output(limits, outputs)
    if limits.task_limit is not None and limits.task is not None:
        task = agreement.get("task_metric") or {}
        checks.append(_measured(limits.task_limit, task.get("value"), what=limits.task.name))
    return checks


def _per_output(limits: Thresholds, outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each per-output threshold on every output it applies to; one that applies to none
    fails and says why (a figure that means nothing is never reported as met)."""
    checks = []
    floor = limits.limits.get("min_sqnr_db")
    if floor is not None:
        checks += [_measured(floor, o.get("sqnr_db"), o) for o in outputs]
    for key, kinds, figure, what in PER_OUTPUT:
        limit = limits.limits.get(key)
        if limit is None:
            continue
        measured = [o for o in outputs if o.get("kind") in kinds and figure in o]
        checks += [_measured(limit, o[figure], o) for o in measured]
        if not measured and outputs:
            checks.append(_applies_to_none(limit, what, outputs))
    for o in outputs:
        if o.get("kind") == "detections" and "detections" in o:
            checks.append(_measured(_match_rate(limits), o["detections"]["match_rate"], o))
    return checks


def _match_rate(limits: Thresholds) -> Limit:
    """verify.detections.min_match_rate, as a limit (one for every mode)."""
    key = "detections.min_match_rate"
    default = DetectionChecks.model_fields["min_match_rate"].default
    origin = "default" if limits.detections.min_match_rate == default else f"verify.{key}"
    return Limit(key, limits.detections.min_match_rate, origin, limits.mode, per_mode=False)


def unmeasurable(limits: Thresholds, agreement: dict[str, Any]) -> list[dict[str, Any]]:
    """The checks that fail on the source model's outputs compared with themselves: thresholds
    nothing of this model can measure (a top-1 agreement with no class output)."""
    return [c for c in quality_checks(limits, agreement, None) if not c["passed"]]


def _applies_to_none(limit: Limit, what: str, outputs: list[dict[str, Any]]) -> dict[str, Any]:
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
    }[limit.key]
    message = (
        f"{_name(limit)}: no output is {what}, so there is nothing it can measure ({judged}); "
        f"{fix}, or use verify.min_sqnr_db"
    )
    return _check(limit.key, None, limit.value, False, message, origin=limit.origin)


def _name(limit: Limit) -> str:
    return limit.origin if limit.origin != "default" else f"verify.{limit.key}"


def _measured(
    limit: Limit, value: Any, output: dict[str, Any] | None = None, what: str = ""
) -> dict[str, Any]:
    which = f"output '{output.get('name', output['index'])}': " if output else ""
    which += f"{what}: " if what else ""
    metric = f"verify.{limit.key}"
    if value is None:  # no finite output to measure: the threshold cannot hold
        message = f"{metric}: {which}cannot be measured (the artifact's outputs are NaN/Inf)"
        return _check(limit.key, value, limit.value, False, message, output, limit.origin)
    passed = value <= limit.value if limit.kind == "max" else value >= limit.value
    relation = ("is above" if limit.kind == "max" else "is below") if not passed else "is within"
    message = (
        f"{metric}: {which}{value:.6g} {relation} the threshold {limit.value:.6g}"
        f"{limit.note(bool(passed))}"
    )
    return _check(limit.key, value, limit.value, bool(passed), message, output, limit.origin)


def _check(
    name: str,
    value: Any,
    limit: Any,
    passed: bool,
    message: str,
    output: dict[str, Any] | None = None,
    origin: str | None = None,
    prefix: str = "verify.",
) -> dict[str, Any]:
    found = {
        "metric": f"{prefix}{name}",
        "value": value,
        "threshold": limit,
        "passed": passed,
        "message": message,
    }
    if origin is not None:
        found["origin"] = origin
    if output is not None:
        found["output"] = output.get("name", output["index"])
    return found


def _finite_outputs(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Always checked: an artifact that outputs NaN or Inf (the source never does: the load
    stage refuses such a source) fails."""
    bad = [o for o in outputs if o.get("non_finite_samples")]
    if not bad:
        return []
    where = "; ".join(f"output {o['index']} on {o['non_finite_samples']} samples" for o in bad)
    message = f"the artifact outputs NaN or Inf where the source model does not: {where}"
    return [_check("finite_outputs", len(bad), 0, False, message, prefix="")]


def fallback_checks(record: dict[str, Any]) -> list[dict[str, Any]]:
    """quantization.fallback: a search that found no mix within the budget fails the build
    (the closest mix it found is kept)."""
    if record["met"]:
        return []
    chosen = record["chosen"]
    floated = len(chosen["float_layers"])
    message = (
        f"quantization.fallback: no mix of int8 and float layers met the budget on the "
        f"{record['measured_on']} (missed {', '.join(chosen['missed'])} with "
        f"{floated} layers float, the closest of {len(record['trials'])} tried); that build "
        "is kept"
    )
    if record.get("int8_io"):  # the TFLite family: every mix reads and writes int8
        every = record.get("candidates")
        left = (
            f"with every layer float ({floated} of {every}) what is left is the int8 input "
            "and output"
            if every and floated >= every
            else "every mix keeps the int8 input and output"
        )
        message += (
            f"; {left}: set quantization.float_outputs: true for float32 I/O, which the "
            "search can then keep float"
        )
    return [_check("fallback", len(chosen["missed"]), 0, False, message, prefix="quantization.")]
