"""Try ONNX graphs on the TFLite-family runtimes, as edgeflow's backends would build them.

For each graph: onnx2tf converts it (float32; full-integer int8 per channel for tflite and
tflite_micro, per tensor for armnn, calibrated on shuffled copies of the graph's own feeds),
then each artifact runs in the real runtime (LiteRT, the TFLite Micro interpreter, Arm NN on
CpuRef) and its outputs are compared with onnxruntime's; int8 results of TFLite Micro and Arm
NN are also compared with LiteRT's on the same .tflite. The verdict says whether the target
takes the graph, and if not, where it failed: convert, load, run, compare (a wrong result) or
crash. This is the measurement behind the tflite, tflite_micro and armnn operator lists
(`python -m edgeflow.targets.derive tflite_family --write`) and behind the agreement tests;
`python -m edgeflow.targets.trial model.onnx` tries one file.

The graphs run in one worker process (TensorFlow is imported once: about 0.2 s per float and
1.2 s per int8 conversion instead of 5 s each); when native code kills the worker, the step
it was on (the conversion, or one target and mode) is reported as a crash and a new worker
goes on with the rest.
"""

from __future__ import annotations

import multiprocessing
import tempfile
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeflow.core.progress import task

MODES = ("none", "int8")
# The largest output error, relative to the output's magnitude, that still counts as right.
TOLERANCE = {"none": 1e-3, "int8": 0.1}
# int8 on TFLite Micro and Arm NN: the most output steps they may differ from LiteRT's kernels
# on the same .tflite (correct kernels differ by a step per rounding; chains add up).
INT8_STEPS = 4.0
CALIBRATION_SAMPLES = 8


@dataclass(frozen=True)
class Trial:
    name: str
    model: bytes  # a serialized ONNX model
    feeds: dict[str, np.ndarray]  # one input batch, in the ONNX layout


@dataclass
class Verdict:
    runs: bool
    stage: str = ""  # where it failed: convert, load, run, compare, crash; "" when it runs
    reason: str = ""
    builtins: list[str] = field(default_factory=list)  # the TFLite operators of the artifact
    error: float | None = None  # max abs output diff / max abs reference output

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


Verdicts = dict[str, Verdict]  # "target/mode" -> verdict
Plan = tuple[str, str, bool]  # one onnx2tf call: as for target, in mode, per channel


def run_trials(
    trials: Sequence[Trial],
    targets: Sequence[str] | None = None,
    modes: Sequence[str] = MODES,
    progress: Callable[[str, Verdicts], None] | None = None,
) -> dict[str, Verdicts]:
    """{trial name: {"target/mode": verdict}} for every trial; int8 only for float32 graphs.
    `targets`: the .tflite runtimes to try (default: every one probes measure).

    The worker announces each step ("convert", then each "target/mode") before it takes it;
    when the worker dies, the step it announced last is the one that killed it: that step
    (every step, for "convert") is a crash, and a new worker redoes the graph without it.
    """
    with task("graph trials", total=len(trials), unit="graphs") as tried:

        def record(name: str, verdicts: Verdicts) -> None:
            tried.advance(detail=name)
            if progress is not None:
                progress(name, verdicts)

        if targets is None:
            from edgeflow.targets.registry import measured_tflite

            targets = measured_tflite()
        return _run_trials(trials, targets, modes, record)


def _run_trials(
    trials: Sequence[Trial],
    targets: Sequence[str],
    modes: Sequence[str],
    progress: Callable[[str, Verdicts], None],
) -> dict[str, Verdicts]:
    context = multiprocessing.get_context("spawn")
    results: dict[str, Verdicts] = {}
    start = 0
    crashed: Verdicts = {}  # steps of trials[start] that killed a worker
    while start < len(trials):
        parent, child = context.Pipe(duplex=False)
        args = (child, list(trials[start:]), list(targets), list(modes), crashed)
        worker = context.Process(target=_serve, args=args)
        worker.start()
        child.close()
        # The steps of trials[first] that killed earlier workers: kept with the next crash, or
        # two crashing steps would each be retaken by turns, forever.
        known, first = crashed, start
        crashed, step = {}, ""
        while start < len(trials):
            try:
                kind, value = parent.recv()
            except EOFError:  # the worker died during `step` of trials[start]
                worker.join()
                reason = f"the process died (exit code {worker.exitcode}) here"
                keys = [f"{t}/{m}" for t in targets for m in _modes(trials[start], modes)]
                crashed = {k: Verdict(False, "crash", f"{reason} ({step})") for k in keys}
                if step not in ("", "convert"):  # "": it died before its first step
                    crashed = {step: crashed[step]}
                if start == first:
                    crashed = {**known, **crashed}
                if set(crashed) >= set(keys):  # nothing left to measure for this graph
                    _record(results, trials[start], crashed, progress)
                    start, crashed = start + 1, {}
                break
            if kind == "step":
                step = value
                continue
            _record(results, trials[start], value, progress)
            start, step = start + 1, ""
        parent.close()
        worker.join()
    return results


def _record(
    results: dict[str, Verdicts],
    trial: Trial,
    verdicts: Verdicts,
    progress: Callable[[str, Verdicts], None],
) -> None:
    results[trial.name] = verdicts
    progress(trial.name, verdicts)


def _modes(trial: Trial, modes: Sequence[str]) -> list[str]:
    """int8 calibration needs float32 inputs; other graphs are tried in float only."""
    floats = all(v.dtype == np.float32 for v in trial.feeds.values())
    return [m for m in modes if m == "none" or floats]


def _serve(
    conn: Any, trials: list[Trial], targets: list[str], modes: list[str], crashed: Verdicts
) -> None:
    """Try each graph and send ("step", name) before each step, ("verdicts", {...}) after the
    graph; `crashed`: steps of the first graph that killed an earlier worker (not retaken)."""
    for trial in trials:
        try:
            verdicts = try_graph(
                trial, targets, _modes(trial, modes), lambda s: conn.send(("step", s)), crashed
            )
        except Exception as exc:  # a bug here must not pass for the runtime's verdict
            text = "".join(traceback.format_exception_only(exc)).strip()
            verdicts = {f"{t}/{m}": Verdict(False, "error", text) for t in targets for m in modes}
        conn.send(("verdicts", verdicts))
        crashed = {}
    conn.close()


def try_graph(
    trial: Trial,
    targets: Sequence[str],
    modes: Sequence[str],
    announce: Callable[[str], None] | None = None,
    known: Verdicts | None = None,
) -> Verdicts:
    """Convert and run one graph on each target in each mode (in this process). `announce`
    hears each step before it is taken; `known` verdicts are not measured again."""
    import onnx

    from edgeflow.core.errors import EdgeflowError
    from edgeflow.targets import load_profile
    from edgeflow.targets._onnx2tf_recurrent import holds_sequence_ops
    from edgeflow.targets.registry import reference_tflite

    litert = reference_tflite()  # the route of a graph converted once for every runtime
    announce = announce or (lambda step: None)
    verdicts: Verdicts = dict(known or {})
    with tempfile.TemporaryDirectory(prefix="edgeflow-trial-") as tmp:
        work = Path(tmp)
        source = work / "model.onnx"
        source.write_bytes(trial.model)
        reference = _reference(trial)
        model = onnx.load_from_string(trial.model)
        names = _fed(model)
        # One onnx2tf call gives float32 and int8: per channel, or per tensor for a runtime
        # whose int8 fully-connected kernels take no per-channel weights (the profile's
        # per_channel_dense: armnn). A failed int8 call is retried in float32 alone. LSTM and
        # GRU convert by target and mode (edgeflow.targets._onnx2tf_recurrent), so a graph
        # with one is converted for each target and mode on its own.
        announce("convert")
        recurrent = holds_sequence_ops(model)
        both = "int8" if "int8" in modes else "none"
        channel = {t: load_profile(t).per_channel_dense for t in targets}
        plans = {
            (t, m): (t, m, channel[t]) if recurrent else (litert, both, channel[t])
            for t in targets
            for m in modes
        }
        builds: dict[tuple[Plan, str], Path | str] = {}
        for plan in sorted(set(plans.values()), key=lambda p: (not p[2], p)):
            route, wanted, per_channel = plan
            for mode in ("int8", "none") if wanted == "int8" else ("none",):
                try:
                    files = _convert(trial, names, source, work, mode, per_channel, route)
                except EdgeflowError as exc:
                    builds.setdefault((plan, "int8"), first_lines(str(exc)))
                    builds.setdefault((plan, "none"), first_lines(str(exc)))
                    continue
                builds.update({(plan, m): f for m, f in files.items()})
                break
        for target in targets:
            for mode in modes:
                key = f"{target}/{mode}"
                if key in verdicts:
                    continue
                built = builds[(plans[(target, mode)], mode)]
                if isinstance(built, str):
                    verdicts[key] = Verdict(False, "convert", built)
                    continue
                announce(key)
                verdicts[key] = _run(target, mode, built, trial, reference)
    return verdicts


def build_tflite(trial: Trial, work: Path, target: str, per_channel: bool = True) -> Path:
    """The full-integer int8 model.tflite a `target` build makes of the trial's graph, kept in
    `work` (what a compiler for the target, Vela, takes; try_graph discards its files)."""
    import onnx

    source = work / "model.onnx"
    source.write_bytes(trial.model)
    names = _fed(onnx.load_from_string(trial.model))
    return (
        _convert(trial, names, source, work, "int8", per_channel, target)["int8"] / "model.tflite"
    )


def _fed(model: Any) -> list[str]:
    """The graph's inputs that a run feeds (not the weights some files list as inputs)."""
    weights = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in weights]


def _convert(
    trial: Trial,
    names: list[str],
    source: Path,
    work: Path,
    mode: str,
    per_channel: bool,
    target: str,
) -> dict[str, Path]:
    """onnx2tf in `mode`, as for `target`: {mode: folder with model.tflite and io.json}
    (int8 gives both)."""
    import json
    import shutil

    from edgeflow.schema.sections import Quantization, TensorSpec
    from edgeflow.targets import _onnx2tf, _tflite_layout
    from edgeflow.targets._tflite_quant import own_int8
    from edgeflow.targets.base import ConvertJob

    specs = [
        TensorSpec.model_validate(
            {"name": n, "shape": list(trial.feeds[n].shape), "dtype": str(trial.feeds[n].dtype)}
        )
        for n in names
    ]
    quantization = Quantization.model_validate({"mode": mode, "per_channel": per_channel})
    job = ConvertJob(source, work, None, quantization, specs, _calibration(trial))  # type: ignore[arg-type]
    files = {}
    # int8 calibrated by edgeflow where a build would be (a recurrent layer: its loops float)
    with _onnx2tf.outputs(job, target, own_int8) as (out, _):
        float32 = out / "model_float32.tflite"
        for m in ("none", mode):
            folder = work / f"{target}-{mode}-{m}-{'pc' if per_channel else 'pt'}"
            folder.mkdir(exist_ok=True)
            shutil.copyfile(out / f"model_{_onnx2tf.SUFFIX[m]}.tflite", folder / "model.tflite")
            _onnx2tf.for_runtime(folder / "model.tflite", target)  # as a build hands it over
            layout = _tflite_layout.io_layout(source, folder / "model.tflite", float32, target)
            (folder / "io.json").write_text(json.dumps(layout))
            files[m] = folder
    return files


def _calibration(trial: Trial) -> Any:
    """CALIBRATION_SAMPLES batches: the feeds, then copies with their elements shuffled (the
    same values, so the same range and domain: no negative input for a Log or a Sqrt)."""
    from edgeflow.data import Samples

    rng = np.random.default_rng(0)
    inputs = {}
    for name, value in trial.feeds.items():
        copies = [value]
        for _ in range(CALIBRATION_SAMPLES - 1):
            copies.append(rng.permutation(value.ravel()).reshape(value.shape))
        inputs[name] = np.concatenate(copies)
    return Samples(inputs, None)


def _reference(trial: Trial) -> list[np.ndarray] | None:
    """onnxruntime's outputs, or None when onnxruntime cannot run the graph either."""
    from edgeflow.core.onnxsession import checking_session

    try:
        session = checking_session(trial.model, log_severity=4)
        return [np.asarray(o) for o in session.run(None, trial.feeds)]
    except Exception:  # no reference: the verdict is whether it runs
        return None


def _run(
    target: str, mode: str, folder: Path, trial: Trial, reference: list[np.ndarray] | None
) -> Verdict:
    import json

    from edgeflow.targets import emitted
    from edgeflow.targets.registry import reference_tflite
    from edgeflow.targets.taps import open_tflite

    artifact = folder / "model.tflite"
    builtins = list(emitted.counts(artifact, target))
    layout = json.loads((folder / "io.json").read_text())
    try:
        runner = open_tflite(target, artifact, layout)
    except Exception as exc:  # each runtime's load error is the "does not take it" verdict
        return Verdict(False, "load", first_lines(str(exc)), builtins)
    try:
        got = runner.run(trial.feeds)
    except Exception as exc:
        return Verdict(False, "run", first_lines(str(exc)), builtins)
    steps = [q.scale for q in runner.outputs]
    del runner
    litert = reference_tflite()
    if mode == "int8" and target != litert:
        # The same .tflite in LiteRT, the reference TFLite runtime: another runtime's int8
        # kernels must agree with it to within INT8_STEPS output quantization steps.
        drift = _int8_drift(got, open_tflite(litert, artifact, layout).run(trial.feeds), steps)
        if drift > INT8_STEPS:
            why = f"{drift:.1f} int8 steps from LiteRT's result on the same .tflite"
            return Verdict(False, "compare", why, builtins, _error(got, reference or got))
    if reference is None:
        return Verdict(True, "", "no onnxruntime reference to compare with", builtins)
    error = _error(got, reference)
    if error is None or error > TOLERANCE[mode]:
        what = "wrong shape or type" if error is None else f"relative error {error:.3g}"
        why = f"{what} (tolerance {TOLERANCE[mode]:g})"
        return Verdict(False, "compare", why, builtins, error)
    return Verdict(True, "", "", builtins, error)


def _int8_drift(got: list[np.ndarray], litert: list[np.ndarray], steps: list[float]) -> float:
    """The largest difference between two runtimes' dequantized outputs, in output steps."""
    worst = 0.0
    for g, ref, step in zip(got, litert, steps, strict=True):
        if g.shape != ref.shape:
            return float("inf")
        diff = np.abs(g.astype(np.float64) - ref.astype(np.float64))
        scale = step if step > 0 else 1.0  # unquantized (e.g. bool) outputs: absolute
        worst = max(worst, float(diff.max()) / scale if diff.size else 0.0)
    return worst


def _error(got: list[np.ndarray], reference: list[np.ndarray]) -> float | None:
    """Max abs diff over the outputs relative to the reference's magnitude (integer and bool
    outputs: the share of elements that differ); None when shapes differ."""
    worst = 0.0
    if len(got) != len(reference):
        return None
    for g, r in zip(got, reference, strict=True):
        if g.shape != r.shape:
            return None
        if np.issubdtype(r.dtype, np.integer) or r.dtype == np.bool_:
            # the share of elements that differ: int8 may flip a comparison near equality
            worst = max(worst, float(np.mean(g.astype(r.dtype) != r)) if r.size else 0.0)
            continue
        diff = np.abs(g.astype(np.float64) - r.astype(np.float64))
        if not np.all(np.isfinite(diff)):
            return float("inf")
        scale = max(float(np.abs(r).max()) if r.size else 0.0, 1e-6)
        worst = max(worst, float(diff.max()) / scale if diff.size else 0.0)
    return worst


def first_lines(text: str) -> str:
    """An error in one line: its first line, and its last (where native tools say why)."""
    kept = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if len(kept) > 2:
        kept = [kept[0], "...", kept[-1]]
    return " ".join(kept)[:400]


def main(argv: list[str] | None = None) -> int:
    """`python -m edgeflow.targets.trial model.onnx [--targets tflite,armnn]`: try one ONNX
    file (static input shapes, random normal inputs) on the TFLite-family runtimes."""
    import argparse

    import onnx

    from edgeflow.targets.probes import NP
    from edgeflow.targets.registry import measured_tflite

    parser = argparse.ArgumentParser(prog="python -m edgeflow.targets.trial")
    parser.add_argument("model", type=Path)
    parser.add_argument("--targets", default=",".join(measured_tflite()))
    args = parser.parse_args(argv)
    model = onnx.load(str(args.model))
    weights = {t.name for t in model.graph.initializer}
    rng = np.random.default_rng(0)
    feeds = {}
    for value in (i for i in model.graph.input if i.name not in weights):
        tensor = value.type.tensor_type
        shape = [d.dim_value for d in tensor.shape.dim]
        if any(d <= 0 for d in shape):
            raise SystemExit(f"input '{value.name}' has a dynamic shape {shape}: fix it first")
        feeds[value.name] = rng.standard_normal(shape).astype(NP.get(tensor.elem_type, np.float32))
    trial = Trial(args.model.name, model.SerializeToString(), feeds)
    found = run_trials([trial], args.targets.split(","))[trial.name]
    for key, verdict in found.items():
        state = "runs" if verdict.runs else f"FAILS at {verdict.stage}"
        error = f"error {verdict.error:.3g}" if verdict.error is not None else ""
        print(f"{key:18} {state:20} {' '.join(verdict.builtins)} {error} {verdict.reason}")
    return 0 if all(v.runs for v in found.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
