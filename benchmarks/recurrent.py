"""Recurrent models at real lengths on every target: the route each build takes, what it costs
and how close it is.

    python benchmarks/recurrent.py [--models lstm3,gru2] [--targets tflite,armnn]
                                   [--modes none,int8] [--timeout 900] [--out recurrent.json]

Per development model (PyTorch, made in code with seeded random weights: the sizes of widely
used speech and text models), per trained recurrent model shipped in a wheel (TRAINED, from
shared/DEVSET.md: installed with pip beforehand, nothing is downloaded here) and target, one
`edgeflow run` of a generated recipe, with random normal inputs (8 samples, also the int8
calibration set), printing:

- route: `sequence op` (the .tflite holds UNIDIRECTIONAL_SEQUENCE_LSTM), `loop` (WHILE),
  `unrolled` (a cell per step: edgeflow.frameworks.tf_recurrent), `native` (an ONNX runtime's
  own LSTM/GRU kernel; a Keras model's GRUs reach the TFLite family as loops:
  edgeflow.frameworks._keras_recurrent);
- conversion CPU: the CPU seconds of the stages that turn the ONNX model into the artifact
  (rewrite_target, precheck, quantize, convert; a Keras model on the native path:
  tf_convert), from benchmarks/_stage_cpu.py;
- weights: the artifact's constant bytes (a .tflite's buffers; an .ort file's size) against
  the source's (its parameters, float32); the file itself adds each operator's record;
- float32: the largest difference relative to the reference's range (max_relative_diff);
- int8: the lowest output SQNR and top-1 agreement of the 10-class head.

Goals (issue 32): every build converts in <= 60 s CPU, the artifact within 1.1x the source's
weights, float32 within 1e-4. Each build is forced past a failed precheck
(`precheck.continue_on_failure`: the larger models fit no TFLite Micro board's memory), so a
row is what the converter and runtime do. A build past --timeout is reported as such.
Nothing is downloaded: the models are made here.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
CONVERSION = ("rewrite_target", "precheck", "quantize", "convert", "tf_convert")

MODELS = '''
import torch
from torch import nn


class Sequence(nn.Module):
    """A recurrent stack over [batch, steps, features] and a 10-class head."""

    def __init__(self, kind="LSTM", features=40, hidden=256, layers=1, bidirectional=False,
                 reads="last"):
        super().__init__()
        torch.manual_seed(0)
        self.rnn = getattr(nn, kind)(features, hidden, num_layers=layers, batch_first=True,
                                     bidirectional=bidirectional)
        self.head = nn.Linear(hidden * (2 if bidirectional else 1), 10)
        self.reads = reads

    def forward(self, x):
        y, _ = self.rnn(x)
        y = y[:, -1] if self.reads == "last" else y.mean(dim=1)
        return self.head(y)


class StatefulLSTM(nn.Module):
    """A streaming LSTM: the state [batch, layers, hidden] comes in and goes out."""

    def __init__(self, features=40, hidden=128, layers=2):
        super().__init__()
        torch.manual_seed(0)
        self.rnn = nn.LSTM(features, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, 10)

    def forward(self, x, h, c):
        state = (h.transpose(0, 1).contiguous(), c.transpose(0, 1).contiguous())
        y, (h, c) = self.rnn(x, state)
        return self.head(y[:, -1]), h.transpose(0, 1), c.transpose(0, 1)

'''

# beatnet's module, written beside the recipes for its rows only (it imports BeatNet)
BEATNET = '''
import torch
from BeatNet.model import BDA


class BeatNetOffline(BDA):
    """BeatNet's BDA as its offline mode runs it, one whole sequence from a zero state: BDA
    keeps its LSTM state between calls (self.hidden, self.cell), so a second call on the same
    input answers differently from the exported graph, which starts at zero."""

    def forward(self, data):
        self.hidden, self.cell = torch.zeros_like(self.hidden), torch.zeros_like(self.cell)
        return super().forward(data)
'''

# g2pM's tagger (its weights are NumPy arrays named like a torch state dict, run by NumPy
# code): a bidirectional LSTM of 32 over the embedded characters of a sentence, then
# Linear-ReLU-Linear to 876 pronunciations at every character. The embedding lookup is the
# host's (token ids are the transformer issue's): the model takes the embedded sentence.
G2PM = """
from torch import nn


class G2pMTagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(64, 32, batch_first=True, bidirectional=True)
        self.logit_layer = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 876))

    def forward(self, chars):
        y, _ = self.lstm(chars)
        return self.logit_layer(y)
"""

# name: (class, init, steps, features, extra inputs: name -> shape)
DEV: dict[str, tuple[str, dict[str, Any], int, int, dict[str, list[int]]]] = {
    # a 3-layer LSTM of 256 over 160 frames of 40 features (a speaker encoder's size)
    "lstm3": ("Sequence", {"kind": "LSTM", "layers": 3}, 160, 40, {}),
    "gru2": ("Sequence", {"kind": "GRU", "layers": 2}, 200, 40, {}),
    "bilstm": (
        "Sequence",
        {"kind": "LSTM", "hidden": 128, "bidirectional": True, "reads": "mean"},
        128,
        40,
        {},
    ),
    "lstm_state": ("StatefulLSTM", {}, 50, 40, {"h": [1, 2, 128], "c": [1, 2, 128]}),
}
TARGETS = ("onnxruntime_micro", "tflite", "tflite_micro", "armnn")

# Trained recurrent models shipped inside wheels (shared/DEVSET.md; `pip install` them, as
# printed when one is missing): name -> (distribution, package, source keys with the file
# relative to the package, inputs (random normal data; `value` ones zero, as the package
# feeds them), outputs and their kinds).
TRAINED: dict[str, tuple[str, str, dict[str, Any], list[dict[str, Any]], dict[str, str]]] = {
    # AECMOS (speechmos): two bidirectional GRUs of 64 over 300 mel frames (about 5 s),
    # exported by PyTorch at opset 9, the initial state an input the package feeds zeros
    "aecmos": (
        "speechmos==0.0.1.1",
        "speechmos",
        {"kind": "onnx", "model": "aecmos_models/Run_1663829550_Stage_0.onnx"},
        [
            {"name": "input", "shape": [1, 3, 300, 160]},
            {"name": "h0", "shape": [4, 1, 64], "value": "zeros"},
        ],
        {"output": "values"},
    ),
    # PLCMOS v2 (speechmos): convolutions over a magnitude STFT, then two bidirectional GRUs
    # of 32 over 625 frames (10 s at 16 kHz, hop 256), exported at opset 11; a rater
    # embedding the package draws at random; one score (a 0-D output)
    "plcmos": (
        "speechmos==0.0.1.1",
        "speechmos",
        {"kind": "onnx", "model": "plcmos_models/plcmos_v2.onnx"},
        [
            {"name": "degraded_audio", "shape": [1, 1, 625, 257]},
            {"name": "rater_embed", "shape": [1, 64]},
        ],
        {"plcmos": "values"},
    ),
    # BeatNet: Conv1d, then a 2-layer LSTM of 150 over 400 frames (8 s at 50 fps), run as
    # its offline mode does (BEATNET)
    "beatnet": (
        "BeatNet==1.1.3",
        "BeatNet",
        {
            "kind": "pytorch",
            "model": "beatnet_offline.py:BeatNetOffline",
            "weights": "models/model_1_weights.pt",
            "init": {"dim_in": 272, "num_cells": 150, "num_layers": 2, "device": "cpu"},
        },
        [{"name": "features", "shape": [1, 400, 272]}],
        {"activations": "values"},
    ),
    # sleepecg: its wake/REM/NREM classifier (a Keras file inside a zip in the package:
    # Masking, Dense, two bidirectional GRUs of 8), over 960 epochs of 36 heart-rate features
    # (8 hours of 30 s epochs); nights of different lengths padded with its mask value -1
    # (`write_sleepecg`), the native path (TensorFlow's own converter)
    "sleepecg": (
        "sleepecg==0.6.0",
        "sleepecg",
        {"kind": "tensorflow", "model": "sleepecg.keras"},
        [{"name": "input_layer", "shape": [1, 960, 36]}],
        {"stages": "values"},
    ),
    # g2pM: its tagger (G2PM) over a 64-character sentence, the weights from its NumPy
    # arrays (`write_g2pm`: a state dict beside the recipes), the input its embedding of
    # random character ids
    "g2pm": (
        "g2pM==0.1.2.5",
        "g2pM",
        {"kind": "pytorch", "model": "g2pm_tagger.py:G2pMTagger", "weights": "./g2pm.pt"},
        [{"name": "chars", "shape": [1, 64, 64]}],
        {"logits": "values"},
    ),
}


def recipe(name: str, target: str, mode: str) -> str:
    if name in TRAINED:
        head = trained_source(name)
    else:
        cls, init, steps, features, extra = DEV[name]
        inputs = [{"name": "x", "shape": [1, steps, features], "dtype": "float32"}]
        inputs += [{"name": k, "shape": v, "dtype": "float32"} for k, v in extra.items()]
        outputs = "[logits, h_out, c_out]" if extra else "[logits]"
        head = textwrap.dedent(
            f"""\
            source:
              kind: pytorch
              model: models.py:{cls}
              init: {json.dumps(init)}
              inputs: {json.dumps(inputs)}
              outputs: {outputs}
            evaluation: {{dataset: data_{name}.npz, metric: agreement}}
            """
        )
    return head + textwrap.dedent(
        f"""\
        calibration: {{dataset: data_{name}.npz}}
        quantization: {{mode: {mode}}}
        precheck: {{continue_on_failure: true}}
        target: {target}
        verify: {{max_relative_diff: {1e-4 if mode == "none" else 1.0}, latency_runs: 2,
                 warmup_runs: 0}}
        """
    )


def trained_source(name: str) -> str:
    """The source and evaluation keys of a trained model's recipe (the file in the installed
    package; its zero inputs as .npy files beside the recipe)."""
    _, _, source, inputs, outputs = TRAINED[name]
    folder = installed(name)
    keys = dict(source)
    if keys["kind"] == "onnx":
        keys["model"] = str(folder / keys["model"])
    if "weights" in keys:
        keys["weights"] = str(weights_file(name, folder))
    declared = []
    for spec in inputs:
        spec = {**spec, "dtype": "float32"}
        if spec.get("value") == "zeros":
            spec["value"] = f"zeros_{name}_{spec['name']}.npy"
        declared.append(spec)
    keys |= {"inputs": declared, "outputs": list(outputs)}
    kinds = {k: {"kind": v} for k, v in outputs.items()}
    evaluation = {"dataset": f"data_{name}.npz", "metric": "agreement", "outputs": kinds}
    return f"source: {json.dumps(keys)}\nevaluation: {json.dumps(evaluation)}\n"


def weights_file(name: str, folder: Path, work: Path | None = None) -> Path:
    """A trained model's weights: in its package's folder, or ./NAME beside the recipes
    (written by the benchmark, as `write_g2pm` does; relative to the recipe without work)."""
    given = TRAINED[name][2]["weights"]
    if given.startswith("./"):
        return work / given if work is not None else Path(given)
    return folder / given


def installed(name: str) -> Path:
    """The folder of a trained model's package, or SystemExit saying how to install it."""
    import importlib.util

    distribution, package, *_ = TRAINED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{name}: install {package} with `pip install --no-deps {distribution}`")
    return Path(next(iter(spec.submodule_search_locations)))


def write_g2pm(work: Path) -> None:
    """g2pM's tagger weights as a torch state dict, and its data: the embedding of random
    character ids (from the arrays the package ships)."""
    import pickle

    import torch

    with (installed("g2pm") / "np_ckpt.pkl").open("rb") as f:
        arrays = pickle.load(f)  # the installed package's own file
    embedding = arrays.pop("embedding.weight")
    torch.save({k: torch.from_numpy(v) for k, v in arrays.items()}, work / "g2pm.pt")
    ids = np.random.default_rng(0).integers(1, len(embedding), (8, 64))
    np.savez(work / "data_g2pm.npz", chars=embedding[ids].astype(np.float32))


def write_sleepecg(work: Path) -> None:
    """sleepecg's classifier file out of its zip, and random features for 8 nights of 960 to
    540 epochs, padded with the mask value to 960."""
    import zipfile

    with zipfile.ZipFile(installed("sleepecg") / "classifiers" / "wrn-gru-mesa.zip") as z:
        (work / "sleepecg.keras").write_bytes(z.read("classifier.keras"))
    x = np.random.default_rng(0).standard_normal((8, 960, 36)).astype(np.float32)
    for k in range(8):
        x[k, 960 - 60 * k :] = -1.0
    np.savez(work / "data_sleepecg.npz", input_layer=x)


def write_data(work: Path, name: str) -> None:
    if name == "g2pm":
        write_g2pm(work)
        return
    if name == "sleepecg":
        write_sleepecg(work)
        return
    if name in TRAINED:
        rng = np.random.default_rng(0)
        data = {}
        for spec in TRAINED[name][3]:
            if spec.get("value") == "zeros":
                np.save(work / f"zeros_{name}_{spec['name']}.npy", np.zeros(spec["shape"], "f4"))
            else:
                data[spec["name"]] = rng.standard_normal((8, *spec["shape"][1:])).astype("f4")
        np.savez(work / f"data_{name}.npz", **data)
        return
    _, _, steps, features, extra = DEV[name]
    rng = np.random.default_rng(0)
    data = {"x": rng.standard_normal((8, steps, features)).astype(np.float32)}
    for k, shape in extra.items():
        data[k] = (rng.standard_normal((8, *shape[1:])) * 0.1).astype(np.float32)
    np.savez(work / f"data_{name}.npz", **data)


def run_one(work: Path, name: str, target: str, mode: str, timeout: float) -> dict[str, Any]:
    path = work / f"{name}-{target}-{mode}.yaml"
    path.write_text(recipe(name, target, mode))
    build = work / "builds"
    args = [
        sys.executable,
        str(HERE / "_stage_cpu.py"),
        "run",
        f"recipe={path}",
        f"cache_dir={work / 'cache' / path.stem}",  # its own: nothing cached from another
        f"build_dir={build}",
    ]
    row: dict[str, Any] = {"model": name, "target": target, "mode": mode}
    start = time.perf_counter()
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=work)
    except subprocess.TimeoutExpired:
        return {**row, "result": f"timed out after {timeout:.0f} s"}
    row["wall_s"] = round(time.perf_counter() - start, 1)
    marked = [ln for ln in done.stdout.splitlines() if ln.startswith("STAGE-CPU ")]
    stages = json.loads(marked[-1].removeprefix("STAGE-CPU "))["stages"] if marked else []
    row["conversion_cpu_s"] = round(
        sum(s["parent"] + s["worker"] for s in stages if s["stage"] in CONVERSION), 1
    )
    out = build / path.stem / f"{target}-{mode}"
    if not (out / "metrics.json").is_file():  # a build that did not reach verify
        lines = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("error:")] or lines[-1:]
        # the runtime's own words, where the error quotes them (e.g. Arm NN's parser)
        cause = [ln for ln in lines if "Error: " in ln and not ln.startswith("error:")]
        found = (errors[-1][:160] if errors else "?") + (f" ({cause[-1][:200]})" if cause else "")
        return {**row, "result": "failed: " + found}
    metrics = json.loads((out / "metrics.json").read_text())
    agreement = metrics.get("agreement", {})
    artifact = next((p for p in out.iterdir() if p.suffix in (".tflite", ".ort")), None)
    row.update(
        result="verified" if metrics.get("verified") else "not verified",
        route=route(out, target),
        size_bytes=artifact.stat().st_size if artifact else None,
        weight_bytes=constant_bytes(artifact, target) if artifact else None,
        source_weight_bytes=source_weights(work, name),
        max_relative_diff=agreement.get("max_relative_diff"),
        min_sqnr_db=agreement.get("min_sqnr_db"),
        top1=agreement.get("top1"),
    )
    return row


def route(out: Path, target: str) -> str:
    if target in ("onnxruntime_micro", "tensorrt"):
        return "native"
    from edgeflow.targets import emitted

    ops = {emitted.base(k) for k in emitted.counts(out / "model.tflite", target)}
    if "UNIDIRECTIONAL_SEQUENCE_LSTM" in ops:
        return "sequence op"
    return "loop" if "WHILE" in ops else "unrolled"


def constant_bytes(artifact: Path, target: str) -> int:
    """An artifact's constant bytes: a .tflite's buffers; an .ort file's size."""
    if artifact.suffix != ".tflite":
        return artifact.stat().st_size
    from edgeflow.targets import emitted

    return emitted.constant_bytes(artifact, target)


def source_weights(work: Path, name: str) -> int:
    """The bytes of the source's weights: its parameters (a trained ONNX file's float
    initializers), float32."""
    import importlib.util

    if name in TRAINED:
        source = TRAINED[name][2]
        if source["kind"] == "onnx":
            import onnx

            model = onnx.load(str(installed(name) / source["model"]))
            floats = [t for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
            return sum(int(np.prod(t.dims)) * 4 for t in floats)
        if source["kind"] == "tensorflow":
            import keras

            model = keras.saving.load_model(str(work / source["model"]), compile=False)
            return int(model.count_params() * 4)
        import torch

        state = torch.load(weights_file(name, installed(name), work), weights_only=True)
        return int(sum(t.numel() for t in state.values()) * 4)

    spec = importlib.util.spec_from_file_location("bench_models", work / "models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cls, init, *_ = DEV[name]
    model = getattr(module, cls)(**init)
    return int(sum(p.numel() for p in model.parameters()) * 4)


def render(rows: list[dict[str, Any]]) -> str:
    columns = ["model", "target", "mode", "result", "route", "conversion CPU s"]
    columns += ["weights / source's", "file / source's weights", "float32 max rel"]
    columns += ["int8 SQNR dB", "top-1"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        size, weights = (
            f"{r[key] / r['source_weight_bytes']:.2f}x"
            if r.get(key) and r.get("source_weight_bytes")
            else ""
            for key in ("size_bytes", "weight_bytes")
        )
        rel = f"{r['max_relative_diff']:.2g}" if r.get("max_relative_diff") is not None else ""
        sqnr = f"{r['min_sqnr_db']:.1f}" if r.get("min_sqnr_db") is not None else ""
        top1 = f"{r['top1']:.3f}" if r.get("top1") is not None else ""
        lines.append(
            f"| {r['model']} | {r['target']} | {r['mode']} | {r['result']} | "
            f"{r.get('route', '')} | {r.get('conversion_cpu_s', '')} | {weights} | {size} | "
            f"{rel} | "
            f"{sqnr if r['mode'] == 'int8' else ''} | {top1 if r['mode'] == 'int8' else ''} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join([*DEV, *TRAINED]))
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--modes", default="none,int8")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--work", type=Path, default=Path(".edgeflow/recurrent"))
    parser.add_argument("--out", type=Path, default=Path("recurrent.json"))
    args = parser.parse_args(argv)
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    (work / "models.py").write_text(MODELS)
    (work / "beatnet_offline.py").write_text(BEATNET)
    (work / "g2pm_tagger.py").write_text(G2PM)
    rows = []
    for name in args.models.split(","):
        try:
            write_data(work, name)
            if name in TRAINED:
                installed(name)
        except SystemExit as missing:
            print(missing, flush=True)
            rows.append({"model": name, "target": "", "mode": "", "result": str(missing)})
            continue
        for target in args.targets.split(","):
            for mode in args.modes.split(","):
                row = run_one(work, name, target, mode, args.timeout)
                print(json.dumps(row), flush=True)
                rows.append(row)
                args.out.write_text(json.dumps(rows, indent=1) + "\n")
    print(render(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
