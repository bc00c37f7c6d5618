"""int8 weights with float activations (quantization.mode: int8_weights) against float32 and
full int8, per model and target: size, latency, and how close each build stays to the source.

    python benchmarks/int8_weights.py [--models digits_cnn,conv_mlp,...] [--targets ...]
                                      [--modes none,int8,int8_weights] [--diff]

Models: the trained recipes digits_cnn, digits_mobilenet and keyword_spotter (real labels;
keyword_spotter needs espeak-ng for its data), and two made here with seeded random weights,
compared with the source only (evaluation.metric: agreement, random normal inputs): conv_mlp
(two convolutions and two fully-connected layers, 151k weights, most of them in the first
Linear) and encoder (a 2-layer transformer encoder, 64 wide, 4 heads, 32 int64 token ids
through an embedding of 1,000, LayerNorm, GELU, mean pooling; onnxruntime_micro only: the
TFLite family refuses it at the precheck, issue 35).

Printed per build: the artifact's bytes (and against the float32 build's), p50 latency in the
target's runtime on this machine (verify's, 200 runs), the lowest output SQNR against the
source (dB), top-1 agreement and accuracy drop where the recipe has labels. Latency against
float ("x float") is measured apart, interleaved: the three builds' runners open side by side,
ROUNDS rounds of RUNS inferences of the first evaluation sample each, in turn; the ratio of
the medians of each build's round medians. On a shared machine one build's p50 moves by up to
2x between runs; the interleaved ratio holds to a few percent. With --diff, for int8_weights
builds also the lowest SQNR of any tensor of the per-layer diff (`edgeflow diff`), which
DIVERGENCE_DB's default for the mode comes from. Thresholds are switched off: every build is
measured, none judged. Takes about a minute per model and target.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

RECIPES = ("digits_cnn", "digits_mobilenet", "keyword_spotter")
MODELS = (*RECIPES, "conv_mlp", "encoder")
TARGETS = ("onnxruntime_micro", "tflite")
MODES = ("none", "int8", "int8_weights")
ONLY_ON = {"encoder": ("onnxruntime_micro",)}
ROUNDS, RUNS = 9, 50  # interleaved latency: rounds of single inferences per build

MODELS_PY = """
import torch
from torch import nn


class ConvMLP(nn.Module):
    def __init__(self):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.conv = nn.Sequential(
                nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, 2, 1), nn.ReLU()
            )
            self.head = nn.Sequential(nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, image):
        return self.head(self.conv(image).flatten(1))


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.ff = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-1, -2) / (c // self.heads) ** 0.5, -1)
        x = self.norm1(x + self.out((att @ v).transpose(1, 2).reshape(b, t, c)))
        return self.norm2(x + self.ff(x))


class Encoder(nn.Module):
    def __init__(self, vocab=1000, width=64, layers=2, heads=4, tokens=32):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.embed = nn.Embedding(vocab, width)
            self.position = nn.Parameter(torch.randn(1, tokens, width) * 0.1)
            self.blocks = nn.Sequential(*[Block(width, heads) for _ in range(layers)])

    def forward(self, ids):
        return self.blocks(self.embed(ids) + self.position).mean(1)
"""

RECIPE = """
name: {name}
source:
  kind: pytorch
  model: models.py:{cls}
  inputs: [{{name: {input}, shape: {shape}, dtype: {dtype}}}]
evaluation: {{dataset: eval.npz, metric: agreement}}
calibration: {{dataset: calib.npz}}
target: onnxruntime_micro
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--diff", action="store_true", help="the per-layer diff's lowest SQNR")
    parser.add_argument("--cache", type=Path, help="a stage cache to reuse")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="edgeflow-int8w-") as tmp:
        work = Path(tmp)
        cache = args.cache or work / "cache"
        for model in args.models.split(","):
            recipe = _recipe(model, work)
            for target in args.targets.split(","):
                if target not in ONLY_ON.get(model, (target,)):
                    continue
                found = [
                    _build(model, recipe, target, mode, cache, work, args.diff)
                    for mode in args.modes.split(",")
                ]
                _against_float(found, cache)
                _print(found, header=not rows)
                rows.extend(found)
    print(json.dumps(rows, indent=1, default=str))
    return 0


def _recipe(model: str, work: Path) -> Path:
    """The recipe of a trained model, or one written here for a model made in code."""
    from edgeflow.recipe import find_recipe

    if model in RECIPES:
        return find_recipe(model)
    folder = work / model
    folder.mkdir()
    (folder / "models.py").write_text(MODELS_PY)
    rng = np.random.default_rng(0)
    if model == "conv_mlp":
        spec = {"cls": "ConvMLP", "input": "image", "shape": [1, 3, 8, 8], "dtype": "float32"}
        data = [rng.standard_normal((n, 3, 8, 8)).astype(np.float32) for n in (64, 128)]
    else:
        spec = {"cls": "Encoder", "input": "ids", "shape": [1, 32], "dtype": "int64"}
        data = [rng.integers(0, 1000, (n, 32)).astype(np.int64) for n in (64, 128)]
    np.savez(folder / "calib.npz", **{spec["input"]: data[0]})
    np.savez(folder / "eval.npz", **{spec["input"]: data[1]})
    path = folder / f"{model}.yaml"
    path.write_text(textwrap.dedent(RECIPE.format(name=model, **spec)))
    return path


def _build(
    model: str, recipe: Path, target: str, mode: str, cache: Path, work: Path, diff: bool
) -> dict[str, Any]:
    from edgeflow.core.errors import EdgeflowError, InternalError
    from edgeflow.engine.cache import Cache
    from edgeflow.engine.runner import run_build
    from edgeflow.recipe import load_recipe

    overrides: dict[str, Any] = {
        "target": target,
        "quantization.mode": mode,
        "verify.latency_runs": 200,
        "verify.min_sqnr_db": None,
        "verify.max_accuracy_drop": None,
        "verify.min_top1_agreement": None,
    }
    if mode == "int8_weights":  # the recipes' int8 settings that do not apply
        overrides |= {"quantization.method": "minmax", "quantization.symmetric": False}
    row: dict[str, Any] = {"model": model, "target": target, "mode": mode}
    try:
        loaded = load_recipe(recipe, overrides)
        result = run_build(loaded, Cache(cache), work / "build", lambda line: None)
    except (EdgeflowError, InternalError) as exc:
        row["failed"] = exc.render().splitlines()[0][:100]
        return row
    m = result.metrics
    row |= {
        "bytes": m["size_bytes"],
        "p50_ms": m["latency_ms"]["p50"],
        "sqnr_db": m["agreement"].get("min_sqnr_db"),
        "top1": m["agreement"].get("top1"),
        "drop": (m.get("accuracy") or {}).get("drop"),
    }
    if diff and mode == "int8_weights":
        row["diff_min_db"] = _diff(recipe, target, mode, cache, work)
    row["_built"] = (loaded, result)  # for the interleaved latency; not printed
    return row


def _diff(recipe: Path, target: str, mode: str, cache: Path, work: Path) -> float | None:
    """The lowest SQNR of any tensor the per-layer diff paired (`edgeflow diff`)."""
    import contextlib
    import csv
    import io

    from edgeflow.cli import main as cli

    out = work / "diff"
    args = ["diff", str(recipe), f"target={target}", f"quantization.mode={mode}"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        cli([*args, f"cache_dir={cache}", f"build_dir={out}", "--quiet"])
    found = out / recipe.stem / f"{target}-{mode}" / "layers_diff.csv"
    if not found.is_file():
        return None
    with found.open() as f:
        values = [float(r["sqnr_db"]) for r in csv.DictReader(f) if r["sqnr_db"] not in ("", "inf")]
    return round(min(values), 1) if values else None


def _against_float(rows: list[dict[str, Any]], cache: Path) -> None:
    """Each build's size and latency as a share of the float32 build's (latency interleaved:
    see the module docstring)."""
    base = next((r for r in rows if r["mode"] == "none" and "bytes" in r), None)
    built = [r for r in rows if "bytes" in r]
    medians = _interleaved([r.pop("_built") for r in built], cache)
    for row, median in zip(built, medians, strict=True):
        if base is not None:
            row["size_vs_float"] = round(row["bytes"] / base["bytes"], 3)
            row["latency_vs_float"] = round(median / medians[built.index(base)], 2)


def _interleaved(builds: list[tuple[Any, Any]], cache: Path) -> list[float]:
    """Per build, the median over ROUNDS of its median single-inference milliseconds, the
    builds timed in turn within each round."""
    import time

    from edgeflow.data import load_samples
    from edgeflow.engine.cache import Cache
    from edgeflow.targets import backend

    runners, feeds = [], None
    for loaded, result in builds:
        outcome = next(o for o in result.outcomes if o.stage in ("convert", "tf_convert"))
        entry = Cache(cache).entry(outcome.stage, outcome.key)
        info = json.loads((entry / "convert.json").read_text())
        runners.append(backend(loaded.profile).open_runner(entry / "artifact", info))
        if feeds is None:
            recipe = loaded.recipe
            samples = load_samples(recipe.evaluation, recipe.source.inputs, "evaluation")
            feeds = {name: array[:1] for name, array in samples.inputs.items()}
    rounds: list[list[float]] = [[] for _ in runners]
    for _ in range(ROUNDS):
        for runner, times in zip(runners, rounds, strict=True):
            runner.run(feeds)  # warm
            taken = []
            for _ in range(RUNS):
                start = time.perf_counter()
                runner.run(feeds)
                taken.append(time.perf_counter() - start)
            times.append(float(np.median(taken)) * 1e3)
    return [float(np.median(times)) for times in rounds]


def _print(rows: list[dict[str, Any]], header: bool) -> None:
    if header:
        print(
            f"{'model':18} {'target':18} {'mode':13} {'bytes':>10} {'x float':>8} "
            f"{'p50 ms':>8} {'x float':>8} {'SQNR dB':>8} {'top-1':>7} {'drop':>6} {'diff dB':>8}"
        )

    def show(value: Any, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    for r in rows:
        if "failed" in r:
            print(f"{r['model']:18} {r['target']:18} {r['mode']:13} failed: {r['failed']}")
            continue
        print(
            f"{r['model']:18} {r['target']:18} {r['mode']:13} {r['bytes']:>10,} "
            f"{show(r.get('size_vs_float'), '.3f'):>8} {r['p50_ms']:>8.4f} "
            f"{show(r.get('latency_vs_float'), '.2f'):>8} {show(r['sqnr_db'], '.1f'):>8} "
            f"{show(r['top1'], '.4f'):>7} {show(r['drop'], '+.3f'):>6} "
            f"{show(r.get('diff_min_db'), '.1f'):>8}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
