"""Accuracy-budget mixed precision (quantization.fallback: auto): which layers stay float.

The budget is the recipe's thresholds on the outputs for int8 builds (edgeflow.verify.judge:
verify.by_mode.int8, verify, the int8 defaults: SQNR and relative error per output, top-1,
sequence and decision agreement by output kind, matched detections, the recipe's own task
metric), measured on the calibration samples against the float32 model being quantized, so
the evaluation split that verify reports stays out of the search. Each mix is judged by
judge.quality_checks, the function the report stage judges the build with.

Sensitivity comes from one run of the all-int8 model with every tensor read (the per-layer
diff's figures, edgeflow.verify.layers): a layer's SQNR drop, the lowest SQNR of the tensors
it reads minus the SQNR of the tensor it writes, is the error it adds itself. The search then
builds real mixes, each checked against the budget in the target's own runtime: the most
sensitive 1, 2, 4, ... layers float until the budget holds, bisection down to the fewest in
that order, then each kept layer dropped again where the budget holds without it.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeflow.core import progress
from edgeflow.core.errors import EdgeflowError
from edgeflow.schema.sections import QUALITY_THRESHOLDS
from edgeflow.verify import judge
from edgeflow.verify.kinds import power_db

MAX_TRIALS = 32  # mixes built and run per search; each is a quantization and a full run
MAX_SECONDS = 900.0  # and the seconds it may take (no new mix is started after them)
LATENCY_RUNS = 30  # timed runs of each mix, for its cost
CAP_DB = 120.0  # an exact tensor's SQNR, for differences (float rounding is ~140 dB)


@dataclass(frozen=True)
class Budget:
    """What a mix must meet, and how its outputs are compared: the int8 thresholds the
    calibration samples can measure (accuracy needs their labels) and verify's comparison."""

    limits: judge.Thresholds
    comparison: judge.Comparison

    @classmethod
    def of(cls, recipe: Any, names: list[str], labelled: bool) -> tuple[Budget, str]:
        """The recipe's budget and a warning when a threshold had to be left out ("" when
        none was); an error when nothing is left to measure."""
        limits = judge.thresholds(recipe.verify, "int8", QUALITY_THRESHOLDS)
        budget = limits.quality(labelled and recipe.evaluation.metric == "top1")
        note = ""
        dropped = "max_accuracy_drop" in limits.limits and "max_accuracy_drop" not in budget.limits
        if dropped and recipe.evaluation.metric == "top1":
            note = (
                "quantization.fallback: the calibration samples have no labels, so "
                "verify.max_accuracy_drop is not part of the search's budget (verify still "
                "checks it on the evaluation samples)"
            )
        if not budget:
            raise EdgeflowError(
                "quantization.fallback: no threshold of the budget can be measured on the "
                "calibration samples (they have no labels; only verify.max_accuracy_drop is set)",
                "set verify.min_top1_agreement or verify.max_relative_diff, or give the "
                "calibration dataset a 'label' array",
            )
        comparison = judge.Comparison.of(
            recipe.evaluation, recipe.verify, recipe.source.inputs, names
        )
        return cls(budget, comparison), note

    def measurable(self, reference: list[np.ndarray]) -> None:
        """An error, before any mix is built, naming each threshold nothing of this model can
        measure (the float model's outputs compared with themselves fail it)."""
        failed = judge.unmeasurable(self.limits, self.comparison.agreement(reference, reference))
        if failed:
            raise EdgeflowError(
                "quantization.fallback: the budget has thresholds this model's outputs cannot "
                "measure:\n" + "\n".join(f"  {c['message']}" for c in failed),
                "remove those thresholds, or declare the outputs' kinds in evaluation.outputs "
                "(docs/recipe.md#evaluation)",
            )

    def judge(
        self,
        float_layers: Sequence[str],
        reference: list[np.ndarray],
        outputs: list[np.ndarray],
        labels: np.ndarray | None,
        cost: dict[str, Any] | None = None,
    ) -> Trial:
        """A Trial of this mix's outputs against the float model's, with the budget's checks."""
        agreement = self.comparison.agreement(reference, outputs)
        accuracy = None
        if labels is not None and "max_accuracy_drop" in self.limits.limits:
            accuracy = judge.accuracy_of(agreement, reference, outputs, labels)
        return trial_of(float_layers, judge.quality_checks(self.limits, agreement, accuracy), cost)


def trial_of(
    float_layers: Sequence[str], checks: list[dict[str, Any]], cost: dict[str, Any] | None = None
) -> Trial:
    """A Trial of these checks: what it misses and how far (each threshold's excess over its
    value, relative; 1 for a figure that could not be measured)."""
    missed, shortfall, figures = [], 0.0, {}
    for c in checks:
        name = c["metric"] + (f" ({c['output']})" if "output" in c else "")
        figures[name] = c["value"]
        if c["passed"]:
            continue
        missed.append(name)
        value, limit = c["value"], c["threshold"]
        if value is None or not isinstance(limit, int | float) or c["metric"] == "finite_outputs":
            shortfall += 1.0
        else:
            shortfall += abs(value - limit) / max(abs(limit), 1e-12)
    return Trial(tuple(float_layers), figures, tuple(missed), shortfall, cost or {})


@dataclass(frozen=True)
class Trial:
    """One mix: the layers kept float, its figures (each check's, by name) and the thresholds
    it misses."""

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


def inherited(
    db: dict[str, float], ops: Sequence[tuple[Sequence[str], Sequence[str]]]
) -> dict[str, float]:
    """`db` with each tensor it lacks that an operator of `ops` (inputs, outputs; in the
    graph's order) writes given the lowest figure of that operator's inputs: a tensor the
    runtime does not expose (a SPLIT's later outputs, a QUANTIZE's) carries the error of what
    it was made from. Without it, a layer reading one ranks as if its input were exact, the
    whole error charged to it (measured: the ViT's query Reshapes after their SPLIT, a drop
    of 97 dB each, ahead of the GELU that lost the most)."""
    known = dict(db)
    for inputs, outputs in ops:
        before = [known[t] for t in inputs if t in known]
        for name in outputs:
            if name not in known and before:
                known[name] = min(before)
    return known


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
    seconds: float = 0.0  # the search's wall time, sensitivity included
    stopped: str | None = None  # "trials" or "time": a bound ended it before it was done
    blocks: int | None = None  # the blocks it ranked first, where the model has many layers

    @property
    def met(self) -> bool:
        return self.chosen.passed


@dataclass(frozen=True)
class Bounds:
    """What one search may spend: mixes built and run, and seconds (checked before each)."""

    trials: int = MAX_TRIALS
    seconds: float = MAX_SECONDS

    @classmethod
    def of(cls, quantization: Any) -> Bounds:
        return cls(quantization.fallback_max_trials, quantization.fallback_max_seconds)


def search(
    ranked: Sequence[str],
    evaluate: Callable[[tuple[str, ...]], Trial],
    bounds: Bounds = Bounds(),
    blocks: Sequence[Sequence[str]] | None = None,
) -> Outcome:
    """The fewest layers of `ranked` (most sensitive first) to keep float for the budget.
    With `blocks` (groups of layers, most sensitive first: a model with many layers), whole
    blocks are searched first and then the layers of the blocks kept float, so the trials
    grow with the log of the model's size."""
    started = time.monotonic()
    trials: dict[tuple[str, ...], Trial] = {}
    stopped: list[str] = []
    order = {name: i for i, name in enumerate(ranked)}

    with progress.task("fallback search", total=bounds.trials, unit="mixes") as shown:

        def trial(layers: Sequence[str]) -> Trial:
            key = tuple(sorted(set(layers), key=order.__getitem__))
            if key not in trials:
                trials[key] = evaluate(key)
                got = trials[key]
                verdict = "meets the budget" if got.passed else f"misses {len(got.missed)}"
                shown.advance(detail=f"{len(key)} layers float: {verdict}")
            return trials[key]

        def budget_left() -> bool:
            if len(trials) >= bounds.trials:
                stopped[:] = ["trials"]
            elif time.monotonic() - started >= bounds.seconds:
                stopped[:] = ["time"]
            return not stopped

        full = trial(())
        chosen: list[str] | None = None
        if not full.passed and ranked:
            if blocks:
                units = [list(b) for b in blocks]
                found = _fewest(units, trial, budget_left)
                if found is not None:  # then the fewest layers of the blocks kept float
                    inside = sorted((n for b in found for n in b), key=order.__getitem__)
                    fewest = _fewest([[n] for n in inside], trial, budget_left)
                    chosen = [n for b in fewest for n in b] if fewest is not None else inside
            else:
                found = _fewest([[n] for n in ranked], trial, budget_left)
                chosen = [n for b in found for n in b] if found is not None else None
    if chosen is None:
        best = min(trials.values(), key=lambda t: (t.shortfall, len(t.float_layers)))
        picked = best if not full.passed else full
    else:
        picked = trial(chosen)
    return Outcome(
        picked,
        full,
        list(trials.values()),
        time.monotonic() - started,
        stopped[0] if stopped else None,
        len(blocks) if blocks else None,
    )


def _fewest(
    units: list[list[str]],
    trial: Callable[[Sequence[str]], Trial],
    budget_left: Callable[[], bool],
) -> list[list[str]] | None:
    """The fewest of `units` (most sensitive first) whose layers kept float meet the budget:
    the first 1, 2, 4, ... until it holds, bisection down to the fewest in that order, then
    each kept unit dropped again where the budget holds without it; None when even all of
    them miss it (or the bounds end the search first)."""

    def layers(chosen: Sequence[list[str]]) -> list[str]:
        return [n for unit in chosen for n in unit]

    low, high, k = 0, 0, 1  # units[:low] misses the budget, units[:high] meets it
    while budget_left():
        k = min(k, len(units))
        if trial(layers(units[:k])).passed:
            high = k
            break
        low = k
        if k == len(units):
            break
        k *= 2
    if not high:
        return None
    while high - low > 1 and budget_left():
        mid = (low + high) // 2
        if trial(layers(units[:mid])).passed:
            high = mid
        else:
            low = mid
    chosen = list(units[:high])
    for unit in reversed(chosen[:-1]):  # the least sensitive first; the last one is needed
        if not budget_left() or len(chosen) == 1:
            break
        without = [u for u in chosen if u is not unit]
        if trial(layers(without)).passed:
            chosen = without
    return chosen


BLOCKS_ABOVE = 48  # candidate layers above which the search ranks blocks first
MAX_BLOCKS = 16


def blocks(
    layers: Sequence[Layer], most: int = MAX_BLOCKS, values: Collection[str] | None = None
) -> list[list[Layer]]:
    """The layers (in the graph's order) cut into at most `most` consecutive blocks at the
    points where one tensor alone carries everything on (the end of a residual block, of an
    attention block, of a recurrent layer), then neighbouring blocks merged, the smallest
    pair first, until `most` are left. Found from the graph alone: no names are read.
    `values`: the tensors that hold activations (written or measured); a tensor read but in
    neither is a constant and carries nothing (a coefficient the converter shares between
    the GELUs of every layer would otherwise join them all into one block)."""
    first: dict[str, int] = {}  # where each tensor starts to be carried: its writer, else
    last: dict[str, int] = {}  # its first reader (a graph input); until its last reader
    written = {layer.output for layer in layers}
    for i, layer in enumerate(layers):
        for name in layer.inputs:
            if values is not None and name not in written and name not in values:
                continue
            first.setdefault(name, i)
            last[name] = i
        first.setdefault(layer.output, i)
    opened, closed = [0] * len(layers), [0] * len(layers)  # tensors carried on from i
    for tensor, end in last.items():
        if first[tensor] < end:
            opened[first[tensor]] += 1
            closed[end] += 1
    cuts, live = [], 0
    for i in range(len(layers)):
        live += opened[i] - closed[i]  # carried past layer i: from first[t] <= i to end > i
        if live <= 1:
            cuts.append(i + 1)
    found, begin = [], 0
    for end in cuts:
        if end > begin:
            found.append(list(layers[begin:end]))
            begin = end
    if begin < len(layers):
        found.append(list(layers[begin:]))
    while len(found) > most:
        sizes = [len(a) + len(b) for a, b in itertools.pairwise(found)]
        k = sizes.index(min(sizes))
        found[k : k + 2] = [found[k] + found[k + 1]]
    return found


def rank_blocks(groups: Sequence[Sequence[Layer]], db: dict[str, float]) -> list[list[str]]:
    """The blocks' layer names, the block that adds the most error first: the lowest SQNR of
    the tensors entering it minus the lowest of those it writes."""
    scored = []
    for group in groups:
        inside = {layer.output for layer in group}
        entering = [t for layer in group for t in layer.inputs if t not in inside and t in db]
        written = [db[layer.output] for layer in group if layer.output in db]
        if not written:
            continue
        drop = min((db[t] for t in entering), default=CAP_DB) - min(written)
        scored.append((drop, [layer.name for layer in group]))
    return [names for _, names in sorted(scored, key=lambda s: -s[0])]


def plan(
    layers: Sequence[Layer], db: dict[str, float]
) -> tuple[list[Sensitivity], list[list[str]] | None]:
    """The layers ranked, and for a model with more than BLOCKS_ABOVE of them its blocks
    ranked (search's `blocks`)."""
    ranking = rank(layers, db)
    if len(ranking) <= BLOCKS_ABOVE:
        return ranking, None
    ranked = {s.layer.name for s in ranking}
    kept = [layer for layer in layers if layer.name in ranked]
    return ranking, rank_blocks(blocks(kept, values=db), db)


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
    budget: Budget,
    ranking: Sequence[Sensitivity],
    measured_on: str,
    size_of: str,
    int8_io: bool = False,
) -> dict[str, Any]:
    """quantize.json's / convert.json's `fallback` record; `size_of` names the file whose
    size the trials' size_bytes are; `int8_io`: every mix has int8 inputs and outputs."""
    ops = {s.layer.name: s.layer.op for s in ranking}
    return {
        "int8_io": int8_io,
        "candidates": len(ranking),
        "budget": budget.limits.record(),
        "measured_on": measured_on,
        "size_of": size_of,
        "met": outcome.met,
        "float_layers": [
            {"layer": name, "op": ops.get(name, "")} for name in outcome.chosen.float_layers
        ],
        "int8": outcome.full_int8.record(),
        "chosen": outcome.chosen.record(),
        "trials": [t.record() for t in outcome.trials],
        "seconds": round(outcome.seconds, 1),
        "stopped_by": outcome.stopped,  # "trials" or "time" when a bound ended the search
        "blocks": outcome.blocks,
        "sensitivity": [s.record() for s in ranking[:20]],  # the most sensitive first
    }
