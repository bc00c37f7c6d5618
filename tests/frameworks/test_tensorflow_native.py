"""Keras models and SavedModels built in code, converted by TensorFlow's own TFLite converter
(convert.via: native) and run in the real runtimes; the precheck of the builtins it wrote."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests import needs

needs.require("tensorflow")

from edgeflow.core.errors import EXIT_USER, StageFailed  # noqa: E402
from edgeflow.engine.cache import Cache  # noqa: E402
from edgeflow.engine.runner import run_build  # noqa: E402
from edgeflow.recipe import load_recipe  # noqa: E402
from edgeflow.targets import load_profile  # noqa: E402
from edgeflow.targets.precheck import check_builtins  # noqa: E402

pytestmark = pytest.mark.slow

MODELS = """
import keras
import tensorflow as tf


class Log(keras.layers.Layer):
    def call(self, x):
        return keras.ops.log(x + 1.5)


class Erfinv(keras.layers.Layer):
    def call(self, x):
        return tf.math.erfinv(tf.tanh(x))


class Tile(keras.layers.Layer):
    def call(self, x):
        return tf.tile(x, [1, 1, 2, 1])


def build(op: str = "none"):
    keras.utils.set_random_seed(0)
    image = keras.Input((8, 8, 1), name="image")
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(image)
    x = {"none": lambda t: t, "log": Log(), "erfinv": Erfinv(), "tile": Tile()}[op](x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(image, keras.layers.Dense(10, name="logits")(x))
"""

RECIPE = """
source:
  kind: tensorflow
  model: {model}
  inputs: [{{name: image, shape: [1, 8, 8, 1]}}]
  outputs: [logits]
calibration: {{dataset: "edgeflow.zoo.digits_keras:digits_nhwc", split: calibration, samples: 32}}
evaluation: {{dataset: "edgeflow.zoo.digits_keras:digits_nhwc", split: test, samples: 48,
              metric: agreement}}
quantization: {{mode: none}}
target: tflite
verify: {{max_abs_diff: 1.0e-5, latency_runs: 2, warmup_runs: 1}}
"""


@pytest.fixture
def build(tmp_path: Path, write_recipe, shared_cache: Path):
    (tmp_path / "model.py").write_text(MODELS, encoding="utf-8")

    def run(overrides: dict | None = None, model: str = "model.py:build", diff: str | None = None):
        path = write_recipe(RECIPE.format(model=model))
        loaded = load_recipe(path, overrides)
        return run_build(loaded, Cache(shared_cache), tmp_path / "build", print, diff)

    return run


def test_the_layer_diff_needs_the_onnx_path(build) -> None:
    from edgeflow.core.errors import EdgeflowError

    with pytest.raises(EdgeflowError, match="this build made none") as info:
        build(diff="layers")
    assert "convert.via=onnx" in (info.value.hint or "")
    via_onnx = build({"convert.via": "onnx"}, diff="layers")
    assert (via_onnx.build_dir / "layers_diff.csv").is_file()


def test_builtins_against_the_measured_lists() -> None:
    micro = load_profile("tflite_micro")
    found = {
        f.operator: f
        for f in check_builtins({"CONV_2D": 2, "LOG": 1, "TILE": 1, "NEW_OP": 1}, micro, "int8")
    }
    # CONV_2D ran in the probes; LOG has no int8 kernel but runs float, as the build keeps it
    assert set(found) == {"TILE", "NEW_OP"}
    assert found["TILE"].severity == "error" and "TILE" in found["TILE"].reason
    assert found["NEW_OP"].severity == "warning" and "not measured" in found["NEW_OP"].reason
    assert check_builtins({"LOG": 1}, micro, "none") == []  # float LOG runs on TFLM
    assert check_builtins({"ABS": 1}, load_profile("armnn"), "none")[0].severity == "error"
    assert check_builtins({"ABS": 1}, load_profile("onnxruntime_micro"), "none") == []
    sixteen = check_builtins({"LOG": 1}, micro, "int8", "int16")
    assert sixteen[0].severity == "warning"  # 16x8 is not measured: verify decides


def test_a_builtin_measured_to_fail_stops_the_build(build) -> None:
    """TFLite Micro has no TILE (measured): the precheck says so before TFLM first loads the
    file, with the exit status of a problem for the user. Its int8 LOG fails to invoke too,
    but it runs LOG in float32: the int8 build keeps that LOG float and verifies."""
    with pytest.raises(StageFailed) as info:
        build(
            {"source.init": {"op": "tile"}, "target": "tflite_micro", "quantization.mode": "int8"}
        )
    assert info.value.stage == "tf_convert" and info.value.exit_code == EXIT_USER
    assert "does not pass the tflite_micro precheck" in info.value.reason
    assert "| TILE | 1 | measured to fail on tflite_micro int8" in info.value.reason
    int8 = {"source.init": {"op": "log"}, "target": "tflite_micro", "quantization.mode": "int8"}
    logged = build({**int8, "verify.max_abs_diff": None, "verify.min_sqnr_db": 25})
    assert logged.metrics["verified"] is True  # measured 44.1 dB
    float32 = build({"source.init": {"op": "log"}, "target": "tflite_micro"})
    assert float32.metrics["agreement"]["max_abs_diff"] < 1e-5


def test_tensorflow_ops_without_a_builtin_are_named(build) -> None:
    with pytest.raises(StageFailed) as info:
        build({"source.init": {"op": "erfinv"}})
    assert info.value.exit_code == EXIT_USER
    assert "| tf.Erfinv | 1 | TensorFlow op without a TFLite builtin" in info.value.reason
    assert "| functional/erfinv/erfinv/Erfinv |" in info.value.reason.replace("_1", "")


def test_explain_names_the_ops_each_path_cannot_take(tmp_path: Path, write_recipe) -> None:
    from edgeflow.explain import explain_tensorflow, render_table

    (tmp_path / "model.py").write_text(MODELS, encoding="utf-8")
    path = write_recipe(RECIPE.format(model="model.py:build"))
    fine = explain_tensorflow(load_recipe(path, {"source.init": {"op": "log"}}).recipe)
    assert [(a.method, a.ok) for a in fine] == [
        ("TFLiteConverter (convert.via: native)", True),
        ("tf2onnx (convert.via: onnx)", True),
    ]
    failing = explain_tensorflow(load_recipe(path, {"source.init": {"op": "erfinv"}}).recipe)
    native, via_onnx = failing
    assert not native.ok and native.cause == "TensorFlow ops without a TFLite builtin"
    assert native.location.startswith("Erfinv (functional") and "erfinv" in native.location
    assert not via_onnx.ok and "Erfinv" in via_onnx.error
    assert native.rules == []  # tf2onnx has no conversion either: nothing to suggest
    assert "Erfinv" in render_table(failing)


def test_a_saved_model_folder_and_a_keras_file(tmp_path: Path, build) -> None:
    """The same network as a SavedModel (tf.saved_model.save of a tf.Module) and as a
    .keras file: loaded, re-signed and converted; the .tflite within 1e-5 of TensorFlow."""
    import importlib.util

    import keras
    import tensorflow as tf

    spec = importlib.util.spec_from_file_location("models_under_test", tmp_path / "model.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.build()
    model.save(tmp_path / "net.keras")

    class Served(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 1], tf.float32, name="image")])
        def serve(self, image):
            return {"logits": self.model(image, training=False)}

    served = Served()
    tf.saved_model.save(
        served, str(tmp_path / "saved"), signatures={"serving_default": served.serve}
    )
    for source in ("saved", "net.keras"):
        result = build(model=source)
        assert result.metrics["verified"], source
        assert result.metrics["agreement"]["max_abs_diff"] < 1e-5
        assert result.metrics["conversion"]["path"] == "native"
    x = np.zeros((1, 8, 8, 1), np.float32)
    assert np.allclose(keras.saving.load_model(tmp_path / "net.keras")(x), model(x))


STATEFUL = """
import keras


def build():
    keras.utils.set_random_seed(0)
    x = keras.Input((16,), batch_size=1, name="x")
    state = keras.Input((16,), batch_size=1, name="state")
    joined = keras.layers.Concatenate()([x, state])
    new_state = keras.layers.Dense(16, activation="tanh", name="new_state")(joined)
    return keras.Model([x, state], [keras.layers.Dense(4, name="y")(new_state), new_state])
"""


def test_a_stateful_keras_model_streams_through_onnx(
    tmp_path: Path, write_recipe, shared_cache: Path
) -> None:
    """source.state on a Keras model: the reference and the artifact run every sequence
    step by step, the state fed back; the native path refuses it (its calibration could not
    follow the state)."""
    (tmp_path / "stateful.py").write_text(STATEFUL, encoding="utf-8")
    x = np.random.default_rng(0).standard_normal((4, 12, 16)).astype(np.float32)
    np.savez(tmp_path / "seq.npz", x=x)
    path = write_recipe(
        """
        source:
          kind: tensorflow
          model: stateful.py:build
          inputs: [{name: x, shape: [1, 16]}, {name: state, shape: [1, 16]}]
          outputs: [y, new_state]
          state: [{input: state, output: new_state}]
        convert: {via: onnx}
        evaluation: {dataset: seq.npz, metric: agreement}
        target: tflite
        verify: {max_abs_diff: 1.0e-5, latency_runs: 2, warmup_runs: 1}
        """
    )
    result = run_build(load_recipe(path), Cache(shared_cache), tmp_path / "build", print)
    assert result.metrics["verified"]
    assert result.metrics["stream"]["steps"] == 12
    assert result.metrics["conversion"]["source_to_onnx"] < 1e-5
    from edgeflow.core.errors import RecipeError

    with pytest.raises(RecipeError, match="streamed through the ONNX path only"):
        load_recipe(path, {"convert.via": "native"})
