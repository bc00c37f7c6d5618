"""int8 as a user would get it from the converter alone, and from edgeflow.

    python benchmarks/int8.py [--recipes digits_cnn,digits_mobilenet,keyword_spotter]
                              [--targets ...] [--cache .edgeflow/cache]

For each trained recipe (real labels) and int8 target, three builds of the same exported
model, on the recipe's own calibration and evaluation data:

- plain: the converter called as its documentation shows, on the model as exported (no
  rewrite rule, no target default): onnxruntime's `quantize_static(model, out, reader)` with
  its defaults (QDQ, per-tensor, MinMax) for onnxruntime_micro; onnx2tf's full-integer int8
  (its default per-channel weights, the recipe's calibration samples) for tflite,
  tflite_micro and armnn, run in that target's runtime;
- edgeflow: `edgeflow run recipe=R target=T quantization=int8` (the recipe's rules, the
  target's defaults and int8 settings);
- fallback: the same with `quantization.fallback=auto` and the goal of issue 17 as its budget
  (`verify.max_accuracy_drop=0.005`: at most half a percentage point; the recipes' own 0.01
  already holds for plain int8, and fallback would then keep nothing float).

Printed per build: accuracy drop against the float source (percentage points), top-1
agreement with it, the output's SQNR (dB), the artifact's size, for fallback the layers kept
in float, and against plain: the test samples only plain gets right / only this build gets
right, with the exact McNemar test's two-sided p-value. "worse" means significantly worse
(more samples lost than won, p < 0.05): a difference of a few samples either way is what
any two int8 builds of one model differ by. A build that fails (a converter error, a runtime
abort) says so. Takes a few minutes per recipe (each target converts three times); uses its
own cache in a temporary folder unless --cache is given.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

RECIPES = ("digits_cnn", "digits_mobilenet", "keyword_spotter")
GOAL_DROP = 0.005  # the fallback build's budget: at most 0.5 percentage points
TARGETS = ("onnxruntime_micro", "tflite", "tflite_micro", "armnn")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--cache", type=Path, help="a stage cache to reuse")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgeflow-int8-") as tmp:
        cache = args.cache or Path(tmp) / "cache"
        for recipe in args.recipes.split(","):
            for target in args.targets.split(","):
                found = measure(recipe, target, cache, Path(tmp))
                print_table(found, header=not rows)
                rows.extend(found)
    print()
    print_table(rows, header=True)
    return 0


def measure(recipe: str, target: str, cache: Path, work: Path) -> list[dict[str, Any]]:
    """The plain, edgeflow and fallback rows of one recipe and target."""
    built = _edgeflow(recipe, target, cache, work, {})
    plain = _plain(recipe, target, built, work, cache)
    rows = [plain, built["row"]]
    if _has_fallback():
        fallback = {"quantization.fallback": "auto", "verify.max_accuracy_drop": GOAL_DROP}
        rows.append(_edgeflow(recipe, target, cache, work, fallback)["row"])
    for row in rows[1:]:
        if "correct" in row and "correct" in plain:
            row["vs_plain"] = mcnemar(plain["correct"], row["correct"])
    return rows


def mcnemar(plain: list[bool], other: list[bool]) -> tuple[int, int, float]:
    """(samples only plain gets right, samples only the other build gets right, the exact
    two-sided McNemar p-value: a binomial test of the discordant pairs at one half)."""
    lost = sum(p and not o for p, o in zip(plain, other, strict=True))
    won = sum(o and not p for p, o in zip(plain, other, strict=True))
    n = lost + won
    tail = sum(math.comb(n, k) for k in range(min(lost, won) + 1)) / 2**n if n else 1.0
    return lost, won, min(1.0, 2 * tail)


def _has_fallback() -> bool:
    from edgeflow.schema.sections import Quantization

    return "fallback" in Quantization.model_fields


def _edgeflow(
    recipe: str, target: str, cache: Path, work: Path, extra: dict[str, Any]
) -> dict[str, Any]:
    from edgeflow.core.errors import EdgeflowError, InternalError
    from edgeflow.engine.cache import Cache
    from edgeflow.engine.runner import run_build
    from edgeflow.recipe import find_recipe, load_recipe

    way = "fallback" if extra else "edgeflow"
    overrides = {"target": target, "quantization.mode": "int8", **extra}
    loaded = load_recipe(find_recipe(recipe), overrides)
    row: dict[str, Any] = {"recipe": recipe, "target": target, "build": way}
    try:
        result = run_build(loaded, Cache(cache), work / "build" / way, lambda line: None)
    except (EdgeflowError, InternalError) as exc:
        row["failed"] = exc.render().splitlines()[0][:90]
        return {"row": row, "loaded": loaded, "result": None}
    m = result.metrics
    row.update(
        drop=m["accuracy"]["drop"] if m.get("accuracy") else None,
        agreement=m["agreement"].get("top1"),
        sqnr=m["agreement"].get("min_sqnr_db"),
        size=m["size_bytes"],
        verified=m["verified"],
        float_layers=m.get("float_layers", 0) if extra else None,
        correct=_correct(loaded, result, Cache(cache)),
    )
    return {"row": row, "loaded": loaded, "result": result}


def _correct(loaded: Any, result: Any, cache: Any) -> list[bool]:
    """Per evaluation sample, whether the built artifact's top-1 is the label: the artifact
    run again in its runtime, as verify runs it."""
    import json

    from edgeflow.data import load_samples
    from edgeflow.targets import backend
    from edgeflow.verify.runners import batching, run_all

    recipe = loaded.recipe
    outcome = next(o for o in result.outcomes if o.stage == "convert")
    entry = cache.entry("convert", outcome.key)
    info = json.loads((entry / "convert.json").read_text())
    runner = backend(loaded.profile).open_runner(entry / "artifact", info)
    samples = load_samples(recipe.evaluation, recipe.source.inputs, "evaluation")
    got = run_all(runner, samples, *batching(recipe.source))[0]
    return [bool(c) for c in got.reshape(len(got), -1).argmax(-1) == samples.labels]


def _plain(
    recipe: str, target: str, built: dict[str, Any], work: Path, cache: Path
) -> dict[str, Any]:
    """The converter alone on the exported model, in a child process (a runtime may abort)."""
    row: dict[str, Any] = {"recipe": recipe, "target": target, "build": "plain"}
    result = built["result"]
    if result is None:
        row["failed"] = "no exported model (the edgeflow build failed first)"
        return row
    from edgeflow.data import load_samples
    from edgeflow.engine.cache import Cache

    loaded = built["loaded"]
    recipe_ = loaded.recipe
    stage = "export" if recipe_.source.kind == "pytorch" else "ingest"
    outcome = next(o for o in result.outcomes if o.stage == stage)
    exported = Cache(cache).entry(stage, outcome.key) / "model.onnx"
    job = {
        "target": target,
        "profile": loaded.profile,
        "onnx": exported,
        "inputs": list(recipe_.source.inputs),
        "calibration": load_samples(recipe_.calibration, recipe_.source.inputs, "calibration"),
        "evaluation": load_samples(recipe_.evaluation, recipe_.source.inputs, "evaluation"),
        "work": work / f"plain-{recipe}-{target}",
    }
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe(duplex=False)
    process = context.Process(target=_plain_child, args=(child, job))
    process.start()
    child.close()
    try:
        row.update(parent.recv())
    except EOFError:
        process.join()
        row["failed"] = f"crash: the process died (exit code {process.exitcode})"
    process.join()
    return row


def _plain_child(conn: Any, job: dict[str, Any]) -> None:
    try:
        conn.send(_plain_build(job))
    except Exception as exc:  # the verdict of this build, in one line
        first = (str(exc).strip().splitlines() or [""])[0]
        conn.send({"failed": f"{type(exc).__name__}: {first}"[:100]})
    conn.close()


def _plain_build(job: dict[str, Any]) -> dict[str, Any]:
    import onnxruntime as ort

    work: Path = job["work"]
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    samples = job["evaluation"]
    names = [s.name for s in job["inputs"]]
    batch = job["inputs"][0].shape[0]
    source = ort.InferenceSession(str(job["onnx"]), providers=["CPUExecutionProvider"])
    feeds = [f for f, _ in samples.batches(batch, fixed=True)]
    reference = np.concatenate([source.run(None, f)[0] for f in feeds])[: len(samples)]
    if job["target"] == "onnxruntime_micro":
        artifact, run = _plain_ort(job, names, batch, work)
    else:
        artifact, run = _plain_onnx2tf(job, work)
    got = np.concatenate([run(f) for f in feeds])[: len(samples)]
    labels = samples.labels
    source_acc = float(np.mean(reference.argmax(-1) == labels))
    artifact_acc = float(np.mean(got.argmax(-1) == labels))
    error = float(np.sum((got - reference) ** 2))
    signal = float(np.sum(reference.astype(np.float64) ** 2))
    return {
        "drop": source_acc - artifact_acc,
        "correct": [bool(c) for c in got.argmax(-1) == labels],
        "agreement": float(np.mean(got.argmax(-1) == reference.argmax(-1))),
        "sqnr": 10 * math.log10(signal / error) if error else math.inf,
        "size": artifact.stat().st_size,
    }


def _plain_ort(job: dict[str, Any], names: list[str], batch: int, work: Path) -> Any:
    """quantize_static with its defaults, as its documentation calls it."""
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationDataReader, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = job["calibration"].batches(batch, fixed=True)

        def get_next(self) -> dict | None:
            return next((f for f, _ in self.batches), None)

    out = work / "model.int8.onnx"
    quantize_static(str(job["onnx"]), str(out), Reader())
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    return out, lambda feeds: session.run(None, feeds)[0]


def _plain_onnx2tf(job: dict[str, Any], work: Path) -> Any:
    """onnx2tf's full-integer int8 with its default per-channel weights, in the target's
    own runtime (edgeflow's onnx2tf call only keeps it offline: the same options)."""
    from edgeflow.schema.sections import Quantization
    from edgeflow.targets import _onnx2tf, _tflite_layout
    from edgeflow.targets.base import ConvertJob
    from edgeflow.targets.taps import open_tflite

    quantization = Quantization.model_validate({"mode": "int8", "per_channel": True})
    convert = ConvertJob(
        job["onnx"], work, job["profile"], quantization, job["inputs"], job["calibration"]
    )
    artifact = work / "model.tflite"
    with _onnx2tf.outputs(convert, job["target"]) as (out, _):
        shutil.copyfile(out / "model_full_integer_quant.tflite", artifact)
        io = _tflite_layout.io_layout(job["onnx"], artifact, out / "model_float32.tflite", "tflite")
    runner = open_tflite(job["target"], artifact, io)
    return artifact, lambda feeds: runner.run(feeds)[0]


def print_table(rows: list[dict[str, Any]], header: bool) -> None:
    if header:
        print(
            f"{'recipe':18} {'target':18} {'build':9} {'drop pp':>8} {'agreement':>9} "
            f"{'SQNR dB':>8} {'size B':>9} {'float layers':>12} verified  vs plain"
        )
    for r in rows:
        start = f"{r['recipe']:18} {r['target']:18} {r['build']:9}"
        if "failed" in r:
            print(f"{start} FAILED: {r['failed']}")
            continue
        drop = "" if r.get("drop") is None else f"{100 * r['drop']:.2f}"
        agree = "" if r.get("agreement") is None else f"{r['agreement']:.4f}"
        sqnr = "" if r.get("sqnr") is None else f"{r['sqnr']:.1f}"
        layers = "" if r.get("float_layers") is None else str(r["float_layers"])
        verified = {True: "yes", False: "NO"}.get(r.get("verified"), "")
        versus = ""
        if "vs_plain" in r:
            lost, won, p = r["vs_plain"]
            worse = " worse" if lost > won and p < 0.05 else ""
            versus = f"-{lost}/+{won} p={p:.2f}{worse}"
        print(
            f"{start} {drop:>8} {agree:>9} {sqnr:>8} {r['size']:>9,} {layers:>12} "
            f"{verified:8}  {versus}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
