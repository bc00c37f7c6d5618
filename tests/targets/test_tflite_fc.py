"""targets._tflite_fc: a FULLY_CONNECTED with keep_num_dims (TensorFlow's converter makes one
of a Linear over a 3-D tensor) as RESHAPE + 2-D FULLY_CONNECTED + RESHAPE for Arm NN 22, which
rejects the kept dims at load; the same outputs in LiteRT, and a build that verifies on armnn."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests import needs
from tests.targets.conftest import build_on_armnn, needs_tflite
from tests.targets.test_armnn import needs_armnn

needs.require("tensorflow")

from edgeflow.targets import emitted  # noqa: E402
from edgeflow.targets._tflite_fc import flatten  # noqa: E402


def kept_dims_model() -> bytes:
    import tensorflow as tf

    w = tf.constant(np.random.default_rng(0).standard_normal((16, 12)).astype(np.float32))

    def linear(x: object) -> object:
        return tf.nn.relu(tf.tensordot(x, w, axes=1) + 0.5)

    concrete = tf.function(linear).get_concrete_function(tf.TensorSpec([5, 1, 16]))
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete], linear)
    return bytes(converter.convert())


def keep_num_dims(model: bytes) -> list[bool]:
    from ai_edge_litert import schema_py_generated as schema

    tree = schema.ModelT.InitFromPackedBuf(bytearray(model), 0)
    return [
        bool(op.builtinOptions.keepNumDims)
        for op in tree.subgraphs[0].operators
        if isinstance(op.builtinOptions, schema.FullyConnectedOptionsT)
    ]


def test_kept_dims_become_reshapes_around_a_2d_fully_connected(tmp_path: Path) -> None:
    from ai_edge_litert.interpreter import Interpreter

    model = kept_dims_model()
    assert keep_num_dims(model) == [True]  # what TensorFlow's converter writes
    flat, count = flatten(model, "armnn")
    assert count == 1 and keep_num_dims(flat) == [False]
    (tmp_path / "flat.tflite").write_bytes(flat)
    assert emitted.counts(tmp_path / "flat.tflite", "armnn")["RESHAPE"] >= 2
    x = np.random.default_rng(1).standard_normal((5, 1, 16)).astype(np.float32)
    outputs = []
    for content in (model, flat):
        interpreter = Interpreter(model_content=content)
        interpreter.allocate_tensors()
        interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
        interpreter.invoke()
        outputs.append(interpreter.get_tensor(interpreter.get_output_details()[0]["index"]))
    assert outputs[0].shape == outputs[1].shape == (5, 1, 12)
    np.testing.assert_array_equal(outputs[1], outputs[0])
    assert flatten(flat, "armnn") == (flat, 0)  # nothing left to do


@pytest.mark.slow
@needs_tflite
@needs_armnn
@pytest.mark.parametrize("mode", ["none", "int8"])
def test_a_linear_over_steps_verifies_on_armnn(
    mode: str, tmp_path: Path, shared_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A classifier over every step of a sequence ([steps, batch, features] @ W + b, as
    ddddocr's CRNN ends): Arm NN failed at load on its kept-dims FULLY_CONNECTED."""
    from onnx import TensorProto as T
    from onnx import helper

    from tests.rules.onnx.helpers import model

    rng = np.random.default_rng(0)
    m = model(  # torch's nn.Linear over [steps, batch, features]: Reshape, Gemm, Reshape
        [
            helper.make_node("Reshape", ["x", "rows"], ["r"]),
            helper.make_node("Gemm", ["r", "w", "b"], ["h"], transB=1),
            helper.make_node("Reshape", ["h", "steps"], ["y"]),
        ],
        [("x", T.FLOAT, [7, 1, 16])],
        [("y", T.FLOAT, [7, 1, 12])],
        {
            "rows": np.array([7, 16], np.int64),
            "w": rng.standard_normal((12, 16)).astype(np.float32),
            "b": rng.standard_normal(12).astype(np.float32),
            "steps": np.array([7, 1, 12], np.int64),
        },
        opset=17,
    )
    data = rng.standard_normal((112, 1, 16)).astype(np.float32)
    out = build_on_armnn(m, data, mode, tmp_path, shared_cache, lambda: capsys.readouterr().err)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["verified"] is True
    assert keep_num_dims((out / "model.tflite").read_bytes()) == [False]
