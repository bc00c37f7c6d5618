"""SavedModel -> ONNX with tf2onnx: Keras models built here, run in onnxruntime, compared."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from edgeflow.core.errors import EdgeflowError, MissingDependency
from edgeflow.frameworks.tensorflow import from_keras, save_canonical
from edgeflow.frameworks.tf2onnx import export_onnx, require
from edgeflow.schema.signatures import TensorSpec
from tests import needs

tf = needs.module("tensorflow")
keras = needs.module("keras")
needs.require("tf2onnx")


def save_signature(model: Any, inputs: list[TensorSpec], outputs: list[str], path: Path) -> Path:
    """The SavedModel tf_load writes for a Keras model built here."""
    save_canonical(from_keras(model), inputs, outputs, path)
    return path


layers = keras.layers
TOLERANCE = 1e-5


def _randomize_batchnorm(model: Any, rng: np.random.Generator) -> None:
    """Non-trivial BatchNorm statistics, so that folding them is tested."""
    for layer in model.layers:
        if isinstance(layer, layers.BatchNormalization):
            gamma, beta, mean, var = (w.shape for w in layer.get_weights())
            layer.set_weights(
                [
                    rng.uniform(0.5, 1.5, gamma).astype(np.float32),
                    rng.normal(0, 0.1, beta).astype(np.float32),
                    rng.normal(0, 0.1, mean).astype(np.float32),
                    rng.uniform(0.5, 1.5, var).astype(np.float32),
                ]
            )


def digits_cnn() -> Any:
    keras.utils.set_random_seed(0)
    image = keras.Input((8, 8, 1), batch_size=1, name="image")
    x = image
    for _ in range(2):
        x = layers.Conv2D(8, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.ReLU()(x)
    x = layers.MaxPooling2D(2)(x)
    x = layers.Conv2D(16, 3, padding="same")(x)
    x = layers.GlobalAveragePooling2D()(x)
    model = keras.Model(image, layers.Dense(10)(x))
    _randomize_batchnorm(model, np.random.default_rng(0))
    return model


def mobile_block() -> Any:
    """Depthwise conv, hard_swish / hard_sigmoid, squeeze-excite Multiply, residual Add; two
    outputs declared out of alphabetical order."""
    keras.utils.set_random_seed(1)
    image = keras.Input((16, 16, 3), batch_size=1, name="image")
    x = layers.Activation("hard_swish")(layers.Conv2D(8, 1)(image))
    y = layers.DepthwiseConv2D(3, padding="same")(x)
    y = layers.Activation("hard_swish")(layers.BatchNormalization()(y))
    se = layers.GlobalAveragePooling2D(keepdims=True)(y)
    se = layers.Conv2D(4, 1, activation="relu")(se)
    se = layers.Conv2D(8, 1, activation="hard_sigmoid")(se)
    x = layers.Add()([x, layers.Multiply()([y, se])])
    features = layers.GlobalAveragePooling2D()(x)
    model = keras.Model(image, [layers.Dense(5)(features), features])
    _randomize_batchnorm(model, np.random.default_rng(1))
    return model


def lgamma_model() -> Any:
    """tf.math.lgamma: a TensorFlow op (Lgamma) tf2onnx 1.17.0 has no handler for."""
    x = keras.Input((4,), batch_size=1, name="x")
    return keras.Model(x, layers.Lambda(lambda v: tf.math.lgamma(tf.abs(v) + 1.0))(x))


def _no_double(model: Any) -> bool:
    double = onnx.TensorProto.DOUBLE
    graph = model.graph
    values = [*graph.input, *graph.output, *graph.value_info]
    return (
        all(v.type.tensor_type.elem_type != double for v in values)
        and all(t.data_type != double for t in graph.initializer)
        and all(
            not (a.name in ("to", "dtype") and a.i == double) and a.t.data_type != double
            for n in graph.node
            for a in n.attribute
        )
    )


def _convert_and_compare(
    model: Any, shape: list[int], outputs: list[str], tmp_path: Path, opset: int = 13
) -> tuple[dict[str, Any], float]:
    saved = save_signature(model, [TensorSpec(name="image", shape=shape)], outputs, tmp_path / "sm")
    out = tmp_path / "model.onnx"
    info = export_onnx(saved, ["image"], outputs, opset, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "sm"]  # no external data
    converted = onnx.load(str(out))
    assert [v.name for v in converted.graph.input] == ["image"]
    assert [v.name for v in converted.graph.output] == outputs
    dims = [d.dim_value for d in converted.graph.input[0].type.tensor_type.shape.dim]
    assert dims == shape  # static and NHWC, as in the signature
    assert converted.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert _no_double(converted)
    assert [op.domain for op in converted.opset_import] == [""]
    assert info["opset"] == opset and info["converter"].startswith("tf2onnx 1.17.0, tensorflow")
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    worst = 0.0
    for seed in range(3):
        x = np.random.default_rng(seed).normal(size=shape).astype(np.float32)
        expected = model(x, training=False)
        expected = expected if isinstance(expected, list) else [expected]
        got = session.run(outputs, {"image": x})
        for e, g in zip(expected, got, strict=True):
            assert g.dtype == np.float32 and g.shape == tuple(e.shape)
            worst = max(worst, float(np.abs(np.asarray(e) - g).max()))
    return info, worst


@pytest.mark.slow
def test_digits_cnn_converts_exactly(tmp_path: Path) -> None:
    info, worst = _convert_and_compare(digits_cnn(), [1, 8, 8, 1], ["logits"], tmp_path)
    assert worst < TOLERANCE, worst
    assert info["ops"]["Conv"] == 3 and "BatchNormalization" not in info["ops"]
    assert info["warnings"] == []


@pytest.mark.slow
def test_mobile_block_keeps_declared_output_order(tmp_path: Path) -> None:
    outputs = ["logits", "features"]
    info, worst = _convert_and_compare(mobile_block(), [1, 16, 16, 3], outputs, tmp_path, 18)
    assert worst < TOLERANCE, worst
    assert info["ops"]["Mul"] >= 1 and info["ops"]["Add"] >= 1
    # hard_swish's Conv -> Add(3.0) broke tf2onnx's transpose optimizer: 8 Transposes were left
    assert info["warnings"] == [] and info["ops"].get("Transpose", 0) <= 2, info


@pytest.mark.slow
def test_unsupported_op_is_named(tmp_path: Path) -> None:
    saved = save_signature(lgamma_model(), [TensorSpec(name="x", shape=[1, 4])], ["y"], tmp_path)
    with pytest.raises(EdgeflowError, match=r"TensorFlow op\(s\) Lgamma") as caught:
        export_onnx(saved, ["x"], ["y"], 13, tmp_path / "model.onnx")
    assert caught.value.hint and not (tmp_path / "model.onnx").exists()


def test_declared_names_must_match_the_signature(tmp_path: Path) -> None:
    saved = save_signature(lgamma_model(), [TensorSpec(name="x", shape=[1, 4])], ["y"], tmp_path)
    with pytest.raises(EdgeflowError, match=r"inputs are \['x'\], the recipe declares \['image'\]"):
        export_onnx(saved, ["image"], ["y"], 13, tmp_path / "model.onnx")
    with pytest.raises(EdgeflowError, match="writes ONNX opsets up to 18"):
        export_onnx(saved, ["x"], ["y"], 19, tmp_path / "model.onnx")


def test_missing_tool_names_the_extra() -> None:
    with pytest.raises(MissingDependency, match=r"edgeflow\[tflite\]"):
        require("edgeflow_no_such_tool")
