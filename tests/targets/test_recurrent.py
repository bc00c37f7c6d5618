"""Recurrent layers end to end: a PyTorch LSTM over the 8 rows of a digit, built for each
target (tflite and tflite_micro as one UNIDIRECTIONAL_SEQUENCE_LSTM, armnn unrolled in
TensorFlow, onnxruntime_micro with its native LSTM kernel) and verified against PyTorch; and
LSTMs and GRUs at real lengths (160 steps), as the runtime's sequence operator where it has
one, else a WHILE loop where the runtime runs one, else unrolled, each weight stored once."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from edgeflow.cli import main
from tests.targets.conftest import needs_tflite
from tests.targets.test_armnn import needs_armnn
from tests.targets.test_emitted import stage_record

MODEL = '''
import torch
from torch import nn


class RowLSTM(nn.Module):
    """An LSTM reading the digit's 8 rows; the head reads the last hidden state."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lstm = nn.LSTM(8, 16, batch_first=True)
        self.head = nn.Linear(16, 10)

    def forward(self, image):
        _, (h, _) = self.lstm(image.reshape(1, 8, 8))
        return self.head(h.reshape(1, 16))
'''
RECIPE = """
    source:
      kind: pytorch
      model: lstm.py:RowLSTM
      inputs: [{name: image, shape: [1, 1, 8, 8], dtype: float32}]
    calibration: {dataset: "edgeflow.datasets:sklearn_digits", split: calibration, samples: 64}
    evaluation: {dataset: "edgeflow.datasets:sklearn_digits", split: test, metric: agreement}
    quantization: {mode: MODE}
    target: TARGET
    verify: {max_relative_diff: TOLERANCE}
"""


def build(tmp_path: Path, cache: Path, target: str, mode: str, tolerance: float) -> dict:
    (tmp_path / "lstm.py").write_text(MODEL)
    recipe = tmp_path / "recipe.yaml"
    text = textwrap.dedent(RECIPE).replace("TARGET", target).replace("MODE", mode)
    recipe.write_text(text.replace("TOLERANCE", str(tolerance)))
    args = ["run", f"recipe={recipe}", f"cache_dir={cache}", f"build_dir={tmp_path}/b"]
    assert main(args) == 0
    out = tmp_path / "b" / "recipe" / f"{target}-{mode}"
    return json.loads((out / "metrics.json").read_text())


@pytest.mark.slow
@needs_tflite
@needs_armnn
@pytest.mark.parametrize("target", ["tflite", "tflite_micro", "armnn", "onnxruntime_micro"])
def test_an_lstm_builds_and_verifies_in_float32(
    target: str, tmp_path: Path, shared_cache: Path
) -> None:
    """Measured: max relative diff 2.0e-7 to 3.5e-7 (docs/coverage.md)."""
    metrics = build(tmp_path, shared_cache, target, "none", 1e-3)
    assert metrics["verified"] is True and metrics["agreement"]["max_relative_diff"] <= 1e-3
    if target == "onnxruntime_micro":  # a native LSTM kernel
        return
    convert = stage_record(tmp_path / "recipe.yaml", shared_cache, tmp_path / "b", "convert")
    # the head reads h, not the final cell state: the sequence operator where there is one;
    # Arm NN's parser has no recurrent operator: unrolled
    fused = "UNIDIRECTIONAL_SEQUENCE_LSTM" in convert["operators"]
    assert fused == (target != "armnn")
    assert ("LOGISTIC" in convert["operators"]) == (target == "armnn")


LONG = '''
import torch
from torch import nn


class Long(nn.Module):
    """LSTM (or GRU) layers over 160 steps of 40 features; a head on the mean of the steps."""

    def __init__(self, layers=3, bidirectional=False, state=False, kind="LSTM"):
        super().__init__()
        torch.manual_seed(0)
        self.lstm = getattr(nn, kind)(40, 64, num_layers=layers, batch_first=True,
                                      bidirectional=bidirectional)
        self.head = nn.Linear(64 * (2 if bidirectional else 1), 10)
        self.state = state

    def forward(self, x, h=None):
        if self.state:  # the first hidden state comes in, [batch, layers, hidden]
            h = h.transpose(0, 1).contiguous()
            y, _ = self.lstm(x, (h, torch.zeros_like(h)))
        else:
            y, _ = self.lstm(x)
        return self.head(y.mean(dim=1))
'''
LONG_RECIPE = """
    source:
      kind: pytorch
      model: long.py:Long
      init: INIT
      inputs: INPUTS
    evaluation: {dataset: data.npz, metric: agreement}
    quantization: {mode: none}
    target: TARGET
    verify: {max_relative_diff: 1.0e-4, latency_runs: 2, warmup_runs: 0}
"""


STACKED, GRU = {"layers": 3}, {"layers": 2, "kind": "GRU"}
BIDIRECTIONAL, STATE = {"layers": 1, "bidirectional": True}, {"layers": 2, "state": True}


@pytest.mark.slow
@needs_tflite
@needs_armnn
@pytest.mark.parametrize(
    ("target", "init"),
    [
        *((t, i) for t in ("tflite", "tflite_micro") for i in (STACKED, BIDIRECTIONAL, STATE)),
        *((t, GRU) for t in ("tflite", "tflite_micro", "armnn")),
        ("armnn", STACKED),
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}={x}" for k, x in v.items()),
)
def test_a_recurrent_layer_at_a_real_length_converts_with_its_weights_once(
    target: str, init: dict, tmp_path: Path, shared_cache: Path
) -> None:
    """160 steps, float32 within 1e-4 of PyTorch (measured: 1e-6 and below), the artifact's
    constants within 1.1x the source's weights: an LSTM as one UNIDIRECTIONAL_SEQUENCE_LSTM
    per layer and direction on tflite and tflite_micro (its initial state an input too); a
    GRU (no TFLite operator) as one WHILE loop per layer there; every layer on armnn (no
    recurrent operator and no WHILE in its parser) unrolled."""
    import numpy as np

    from edgeflow.targets import emitted

    (tmp_path / "long.py").write_text(LONG)
    inputs = [{"name": "x", "shape": [1, 160, 40]}]
    rng = np.random.default_rng(0)
    data = {"x": rng.standard_normal((4, 160, 40)).astype(np.float32)}
    if init.get("state"):
        inputs.append({"name": "h", "shape": [1, 2, 64]})
        data["h"] = (rng.standard_normal((4, 2, 64)) * 0.5).astype(np.float32)
    np.savez(tmp_path / "data.npz", **data)
    text = textwrap.dedent(LONG_RECIPE).replace("TARGET", target)
    text = text.replace("INIT", json.dumps(init)).replace("INPUTS", json.dumps(inputs))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    args = ["run", f"recipe={recipe}", f"cache_dir={shared_cache}", f"build_dir={tmp_path}/b"]
    assert main(args) == 0
    out = tmp_path / "b" / "recipe" / f"{target}-none"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["verified"] is True and metrics["agreement"]["max_relative_diff"] <= 1e-4
    ops = {emitted.base(k): n for k, n in emitted.counts(out / "model.tflite", target).items()}
    loops = init["layers"] * (2 if init.get("bidirectional") else 1)
    if target == "armnn":
        assert "WHILE" not in ops and "UNIDIRECTIONAL_SEQUENCE_LSTM" not in ops
        assert ops["LOGISTIC"] >= 2 * 160 * loops  # every step's gates
    elif init.get("kind") == "GRU":
        assert ops["WHILE"] == loops and "UNIDIRECTIONAL_SEQUENCE_LSTM" not in ops
        assert ops["LOGISTIC"] == 2 * loops  # z and r, in each loop's body
    else:
        assert ops["UNIDIRECTIONAL_SEQUENCE_LSTM"] == loops
        assert "LOGISTIC" not in ops and "WHILE" not in ops
    import importlib.util

    spec = importlib.util.spec_from_file_location("long", tmp_path / "long.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    weights = sum(p.numel() for p in module.Long(**init).parameters()) * 4
    assert emitted.constant_bytes(out / "model.tflite", target) <= 1.1 * weights


@pytest.mark.slow
@needs_tflite
@needs_armnn
@pytest.mark.parametrize("target", ["tflite", "tflite_micro", "armnn", "onnxruntime_micro"])
def test_an_lstm_builds_in_int8(target: str, tmp_path: Path, shared_cache: Path) -> None:
    """Measured: top-1 agreement 0.964-0.972, SQNR 40.3-45.4 dB (docs/coverage.md). In int8,
    tflite loops over the LSTM's steps (LiteRT's int8 sequence operator gets stacked layers
    wrong); tflite_micro keeps it as UNIDIRECTIONAL_SEQUENCE_LSTM; armnn loops over them,
    then unrolls the loop in the file (no WHILE left, nor the operators only the loop used)."""
    metrics = build(tmp_path, shared_cache, target, "int8", 0.1)
    assert metrics["verified"] is True
    assert metrics["agreement"]["top1"] >= 0.9
    if target != "onnxruntime_micro":
        convert = stage_record(tmp_path / "recipe.yaml", shared_cache, tmp_path / "b", "convert")
        fused = "UNIDIRECTIONAL_SEQUENCE_LSTM" in convert["operators"]
        assert fused == (target == "tflite_micro")
        assert ("WHILE" in convert["operators"]) == (target == "tflite")


@pytest.mark.slow
@needs_tflite
@needs_armnn
@pytest.mark.parametrize(("target", "mode"), [("tflite", "int8"), ("armnn", "none")])
def test_an_lstm_whose_outputs_are_all_read_keeps_them_apart(
    target: str, mode: str, tmp_path: Path, shared_cache: Path
) -> None:
    """A bare LSTM node whose Y, Y_h and Y_c are all graph outputs converts without the
    sequence operator (Y_c is read: looped on tflite, unrolled on armnn) and verifies each of
    them: float32 on armnn, int8 on tflite."""
    import numpy as np
    import onnx

    from tests.rules.onnx.test_recurrent import recurrent

    onnx.save(recurrent("LSTM"), tmp_path / "lstm.onnx")
    x = np.random.default_rng(0).standard_normal((8, 16, 5)).astype(np.float32)
    np.savez(tmp_path / "data.npz", x=x)  # 16 sequences, time-major: batched on axis 1
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        textwrap.dedent(
            f"""
            source:
              kind: onnx
              model: lstm.onnx
              inputs: [{{name: x, shape: [8, 2, 5], batch_axis: 1}}]
            calibration: {{dataset: data.npz}}
            evaluation:
              dataset: data.npz
              metric: agreement
              outputs:
                Y: {{kind: values, batch_axis: 2}}
                Y_h: {{kind: values, batch_axis: 1}}
                Y_c: {{kind: values, batch_axis: 1}}
            quantization: {{mode: {mode}}}
            target: {target}
            verify: {{max_relative_diff: {0.1 if mode == "int8" else 1e-4}}}
            """
        )
    )
    args = ["run", f"recipe={recipe}", f"cache_dir={shared_cache}", f"build_dir={tmp_path}/b"]
    assert main(args) == 0
    out = tmp_path / "b" / "recipe" / f"{target}-{mode}"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["verified"] is True


@needs_tflite
def test_an_unrolled_nodes_outputs_keep_their_names_in_the_saved_model(tmp_path: Path) -> None:
    """Where an LSTM takes the sequence-op route, the float files are converted from a
    SavedModel of onnx2tf's model (float_files), whose signature names each output after its
    Keras layer, and the outputs are found by those names: an unrolled node's Y, Y_h and Y_c
    in the same model come from layers of their own, so the keys are the ONNX names (from one
    layer they were Y_c, Y_c_1, Y_c_2, in no known order)."""
    import onnx
    import tensorflow as tf

    from edgeflow.targets import _onnx2tf
    from edgeflow.targets._onnx2tf_recurrent import sequence_layers
    from tests.rules.onnx.test_recurrent import recurrent

    onnx.save(recurrent("LSTM"), tmp_path / "lstm.onnx")

    def saved_model(model: object, out: Path) -> None:
        tf.saved_model.save(model, str(out))

    # unrolled in TensorFlow: 16x8 (its quantizer cannot calibrate a WHILE)
    with _onnx2tf._contained(), sequence_layers("armnn", "int8", sixteen=True) as routes:
        _onnx2tf._run_onnx2tf(tmp_path / "lstm.onnx", tmp_path / "out", {}, "armnn", saved_model)
    assert set(routes.values()) == {"unrolled"}
    signature = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    assert set(signature.structured_outputs) == {"Y", "Y_h", "Y_c"}


def saturating_lstm() -> tuple[bytes, dict]:
    """One LSTM unit whose input, forget and output gates are open (bias 10) and whose cell
    input is tanh(10 x): 20 steps of x = 1 carry the cell state to 20, 15 steps of x = -1
    bring it back to 5. Clipped at 10, it would end at -5: the last output flips sign."""
    import numpy as np
    import onnx
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    w = np.array([[[0.0], [0.0], [0.0], [10.0]]], np.float32)  # gates i, o, f, c
    r = np.zeros((1, 4, 1), np.float32)
    b = np.array([[10.0, 10.0, 10.0, 0.0, 0, 0, 0, 0]], np.float32)
    node = helper.make_node("LSTM", ["x", "W", "R", "B"], ["y", "y_h"], hidden_size=1)
    graph = helper.make_graph(
        [node],
        "saturating",
        [helper.make_tensor_value_info("x", T.FLOAT, [35, 1, 1])],
        [
            helper.make_tensor_value_info("y", T.FLOAT, [35, 1, 1, 1]),
            helper.make_tensor_value_info("y_h", T.FLOAT, [1, 1, 1]),
        ],
        [numpy_helper.from_array(a, n) for a, n in ((w, "W"), (r, "R"), (b, "B"))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.concatenate([np.ones(20), -np.ones(15)]).astype(np.float32).reshape(35, 1, 1)
    return onnx.shape_inference.infer_shapes(model).SerializeToString(), {"x": x}


@needs_tflite
def test_the_sequence_operator_does_not_clip_the_cell_state() -> None:
    """TensorFlow's converter writes cell_clip 10 into the LSTM it fuses; an ONNX LSTM has
    none, and a trained one's cell state can pass 10 (BeatNet's did: 0.13 off). Unclipped,
    LiteRT and TFLite Micro match onnxruntime (measured: 4.0e-5; clipped, the error was 2)."""
    from edgeflow.targets.trial import Trial, run_trials

    model, feeds = saturating_lstm()
    verdicts = run_trials([Trial("saturating", model, feeds)], ["tflite", "tflite_micro"], ["none"])
    for key, verdict in verdicts["saturating"].items():
        assert verdict.runs, (key, verdict)
        assert "UNIDIRECTIONAL_SEQUENCE_LSTM(TANH)" in verdict.builtins, (key, verdict)
        assert verdict.error is not None and verdict.error < 1e-4
