"""Accuracy-budget mixed precision (quantization.fallback: auto): which layers stay float.

The budget is the recipe's own thresholds (verify.max_accuracy_drop, min_top1_agreement,
max_relative_diff, max_abs_diff, and min_sqnr_db with its int8 default), measured on the
calibration samples against the float32 model being quantized, so the evaluation split that
verify reports stays out of the search.

Sensitivity comes from one run of the all-int8 model with every tensor read (the per-layer
diff's figures, edgeflow.verify.layers): a layer's SQNR drop, the lowest SQNR of the tensors
it reads minus the SQNR of the tensor it writes, is the error it adds itself. The search then
builds real mixes, each checked against the budget in the target's own runtime: the most
sensitive 1, 2, 4, ... layers float until the budget holds, bisection down to the fewest in
that order, then each kept layer dropped again where the budget holds without it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeflow.core.specs import fallback_budget
from edgeflow.verify.compare import compare_outputs, top1_accuracy
from edgeflow.verify.kinds import power_db

# threshold key -> (the figure it limits, whether the figure must stay below or above it)
LIMITS = {
    "max_accuracy_drop": ("accuracy_drop", "max"),
    "min_top1_agreement": ("top1_agreement", "min"),
    "max_relative_diff": ("max_relative_diff", "max"),
    "max_abs_diff": ("max_abs_diff", "max"),
    "min_sqnr_db": ("min_sqnr_db", "min"),
}
MAX_TRIALS = 32  # mixes built and run per search; each is a quantization and a full run
LATENCY_RUNS = 30  # timed runs of each mix, for its cost
CAP_DB = 120.0  # an exact tensor's SQNR, for differences (float rounding is ~140 dB)


def calibration_budget(verify: Any, metric: str, labelled: bool) -> tuple[dict[str, float], str]:
    """The budget the calibration samples can measure (accuracy needs their labels) and a
    warning when a threshold had to be left out of it ("" when none was)."""
    from edgeflow.core.errors import EdgeflowError

    budget, note = fallback_budget(verify, metric), ""
    if not labelled and budget.pop("max_accuracy_drop", None) is not None:
        note = (
            "quantization.fallback: the calibration samples have no labels, so "
            "verify.max_accuracy_drop is not part of the search's budget (verify still checks "
            "it on the evaluation samples)"
        )
    if not budget:
        raise EdgeflowError(
            "quantization.fallback: no threshold of the budget can be measured on the "
            "calibration samples (they have no labels; only verify.max_accuracy_drop is set)",
            "set verify.min_top1_agreement or verify.max_relative_diff, or give the "
            "calibration dataset a 'label' array",
        )
    return budget, note


def figures(
    reference: list[np.ndarray],
    outputs: list[np.ndarray],
    labels: np.ndarray | None,
    names: Sequence[str] | None = None,
    declared: Mapping[str, Any] | None = None,
) -> dict[str, float | None]:
    """The budget's figures of one build's outputs against the float model's on the same
    samples, batch-first (None where an output is NaN/Inf on every sample); `declared`:
    evaluation.outputs by output name, as verify compares them."""
    agreement = compare_outputs(reference, outputs, list(names) if names else None, declared)
    relative = [o["max_rel_to_range"] for o in agreement["outputs"]]
    found: dict[str, float | None] = {
        "top1_agreement": agreement.get("top1"),
        "max_abs_diff": agreement["max_abs_diff"],
        "max_relative_diff": None if None in relative else max(relative),
        "non_finite_samples": agreement["non_finite_samples"],
        "min_sqnr_db": agreement["min_sqnr_db"],
    }
    if labels is not None:
        accuracy = top1_accuracy(outputs[0], labels)
        found["accuracy"] = accuracy
        found["accuracy_drop"] = top1_accuracy(reference[0], labels) - accuracy
    return found


@dataclass(frozen=True)
class Trial:
    """One mix: the layers kept float, its figures and the thresholds it misses."""

    float_layers: tuple[str, ...]
    figures: dict[str, float | None]
    missed: tuple[str, ...]
    shortfall: float  # how far it is from the budget, summed over thresholds (0: met)
    cost: dict[str, Any] = field(default_factory=dict)  # size_bytes, latency_ms of the build

    @property
    def passed(self) -> bool:
        return not self.missed

    def record(self) -> dict[str, Any]:
        return {
            "float_layers": list(self.float_layers),
            "passed": self.passed,
            "missed": list(self.missed),
            "figures": {k: _round(v) for k, v in self.figures.items()},
            **self.cost,
        }


def judge(
    float_layers: Sequence[str],
    found: dict[str, float | None],
    budget: dict[str, float],
    cost: dict[str, Any] | None = None,
) -> Trial:
    """A Trial of these figures against the budget."""
    missed, shortfall = [], 0.0
    if found.get("non_finite_samples"):
        missed.append("finite_outputs")
        shortfall += 1.0
    for key, limit in budget.items():
        name, kind = LIMITS[key]
        value = found.get(name)
        if value is None:
            missed.append(key)
            shortfall += 1.0
            continue
        excess = value - limit if kind == "max" else limit - value
        if excess > 0:
            missed.append(key)
            shortfall += excess / max(abs(limit), 1e-12)
    return Trial(tuple(float_layers), found, tuple(missed), shortfall, cost or {})


@dataclass(frozen=True)
class Layer:
    """A candidate to keep float: its name, the tensor it writes and the tensors it reads (the
    float model's names), and what the backend excludes from quantization for it (the
    activation onnxruntime folds into a Conv goes with it)."""

    name: str
    op: str
    output: str
    inputs: tuple[str, ...]
    excludes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Sensitivity:
    layer: Layer
    sqnr_db: float  # of its output in the all-int8 model
    inputs_db: float  # the lowest of the tensors it reads (CAP_DB: exact or none compared)

    @property
    def drop_db(self) -> float:
        return self.inputs_db - self.sqnr_db

    def record(self) -> dict[str, Any]:
        return {
            "layer": self.layer.name,
            "op": self.layer.op,
            "sqnr_db": round(self.sqnr_db, 2),
            "inputs_sqnr_db": round(self.inputs_db, 2),
            "drop_db": round(self.drop_db, 2),
        }


def sqnr_db(reference: Sequence[np.ndarray], got: Sequence[np.ndarray]) -> float:
    """10 log10(signal power / error power) over batches, capped at CAP_DB."""
    signal = noise = 0.0
    for ref, out in zip(reference, got, strict=True):
        r = np.asarray(ref, dtype=np.float64).ravel()
        e = np.asarray(out, dtype=np.float64).reshape(r.shape) - r
        signal += float(np.dot(r, r))
        noise += float(np.dot(e, e))
    if not math.isfinite(noise):
        return -CAP_DB
    return max(-CAP_DB, min(CAP_DB, power_db(signal, noise)))


def rank(layers: Sequence[Layer], db: dict[str, float]) -> list[Sensitivity]:
    """The layers whose output has an SQNR in `db` (tensor -> dB in the all-int8 model), most
    sensitive (largest SQNR drop) first; a tensor `db` lacks reads as exact."""
    ranked = []
    for layer in layers:
        if layer.output not in db:
            continue
        before = min((db[t] for t in layer.inputs if t in db), default=CAP_DB)
        ranked.append(Sensitivity(layer, db[layer.output], before))
    return sorted(ranked, key=lambda s: (-s.drop_db, s.sqnr_db))


@dataclass
class Outcome:
    chosen: Trial  # the build to keep: the fewest float layers that meet the budget, or the
    # closest one when none does
    full_int8: Trial
    trials: list[Trial]

    @property
    def met(self) -> bool:
        return self.chosen.passed


def search(
    ranked: Sequence[str],
    evaluate: Callable[[tuple[str, ...]], Trial],
    max_trials: int = MAX_TRIALS,
) -> Outcome:
    """The fewest layers of `ranked` (most sensitive first) to keep float for the budget."""
    trials: dict[tuple[str, ...], Trial] = {}

    def trial(layers: Sequence[str]) -> Trial:
        key = tuple(layers)
        if key not in trials:
            trials[key] = evaluate(key)
        return trials[key]

    def budget_left() -> bool:
        return len(trials) < max_trials

    full = trial(())
    if full.passed or not ranked:
        return Outcome(full, full, list(trials.values()))
    low, high, k = 0, 0, 1  # ranked[:low] misses the budget, ranked[:high] meets it
    while budget_left():
        k = min(k, len(ranked))
        if trial(ranked[:k]).passed:
            high = k
            break
        low = k
        if k == len(ranked):
            break
        k *= 2
    if not high:
        best = min(trials.values(), key=lambda t: (t.shortfall, len(t.float_layers)))
        return Outcome(best, full, list(trials.values()))
    while high - low > 1 and budget_left():
        mid = (low + high) // 2
        if trial(ranked[:mid]).passed:
            high = mid
        else:
            low = mid
    chosen = list(ranked[:high])
    for layer in reversed(chosen[:-1]):  # the least sensitive first; the last one is needed
        if not budget_left() or len(chosen) == 1:
            break
        without = [name for name in chosen if name != layer]
        if trial(without).passed:
            chosen = without
    return Outcome(trial(chosen), full, list(trials.values()))


def cost(runner: Any, feeds: dict[str, Any], path: Path) -> dict[str, Any]:
    """What a mix costs: its file's size, and its p50 latency in its runtime."""
    from edgeflow.verify.compare import percentile
    from edgeflow.verify.runners import latency_ms

    times = latency_ms(runner, feeds, 5, LATENCY_RUNS)
    return {"size_bytes": path.stat().st_size, "latency_ms_p50": round(percentile(times, 50), 4)}


def _round(value: Any) -> Any:
    return round(value, 6) if isinstance(value, float) else value


def summary(
    outcome: Outcome,
    budget: dict[str, float],
    ranking: Sequence[Sensitivity],
    measured_on: str,
    size_of: str,
) -> dict[str, Any]:
    """quantize.json's / convert.json's `fallback` record; `size_of` names the file whose
    size the trials' size_bytes are."""
    ops = {s.layer.name: s.layer.op for s in ranking}
    return {
        "budget": budget,
        "measured_on": measured_on,
        "size_of": size_of,
        "met": outcome.met,
        "float_layers": [
            {"layer": name, "op": ops.get(name, "")} for name in outcome.chosen.float_layers
        ],
        "int8": outcome.full_int8.record(),
        "chosen": outcome.chosen.record(),
        "trials": [t.record() for t in outcome.trials],
        "sensitivity": [s.record() for s in ranking[:20]],  # the most sensitive first
    }
