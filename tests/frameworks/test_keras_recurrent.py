"""Keras recurrent layers with masks on the native path: the canonical SavedModel's
`serving_loops` (frameworks._keras_recurrent) computes what Keras does, converts to ops TFLite
Micro runs, and verifies on tflite_micro in float32 and int8."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests import needs

needs.require("tensorflow")

from edgeflow.engine.cache import Cache  # noqa: E402
from edgeflow.engine.runner import run_build  # noqa: E402
from edgeflow.recipe import load_recipe  # noqa: E402

pytestmark = pytest.mark.slow

MODELS = """
import keras


def build():
    keras.utils.set_random_seed(0)
    x = keras.Input((40, 6), name="x")
    h = keras.layers.Masking(mask_value=-1.0)(x)
    h = keras.layers.Bidirectional(keras.layers.GRU(8, return_sequences=True))(h)
    h = keras.layers.GRU(8, return_sequences=True, reset_after=False, go_backwards=True)(h)
    h = keras.layers.LSTM(8, return_sequences=True, zero_output_for_mask=False)(h)
    last = keras.layers.LSTM(8, go_backwards=True)(h)
    steps = keras.layers.Dense(3, name="steps")(h)
    return keras.Model(x, [steps, keras.layers.Dense(4, name="last")(last)])
"""

RECIPE = """
source:
  kind: tensorflow
  model: model.py:build
  inputs: [{name: x, shape: [1, 40, 6]}]
  outputs: [steps, last]
calibration: {dataset: data.npz}
evaluation: {dataset: data.npz, metric: agreement,
             outputs: {steps: {kind: values}, last: {kind: values}}}
quantization: {mode: none}
target: tflite_micro
verify: {max_relative_diff: 1.0e-4, latency_runs: 1, warmup_runs: 0}
"""


def masked_data(path: Path) -> np.ndarray:
    """Sequences padded with the mask value at the end, as Keras users pad them; one also
    masked at its start."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 40, 6)).astype(np.float32)
    for k in range(8):
        x[k, 40 - 4 * k :] = -1.0
    x[3, :5] = -1.0
    np.savez(path, x=x)
    return x


@pytest.fixture
def build(tmp_path: Path, write_recipe, shared_cache: Path):
    (tmp_path / "model.py").write_text(MODELS, encoding="utf-8")
    masked_data(tmp_path / "data.npz")

    def run(overrides: dict | None = None):
        loaded = load_recipe(write_recipe(RECIPE), overrides)
        return run_build(loaded, Cache(shared_cache), tmp_path / "build", print)

    return run


def test_the_loops_compute_what_keras_does(tmp_path: Path) -> None:
    """Both signatures of the canonical SavedModel against the Keras model, on masked
    sequences; the loops' file has none of the ops TFLite Micro lacks."""
    import importlib.util

    from edgeflow.frameworks import tensorflow as tfw
    from edgeflow.schema.sections import TensorSpec
    from edgeflow.targets import emitted

    (tmp_path / "model.py").write_text(MODELS, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("keras_rnn_model", tmp_path / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = tfw.from_keras(module.build())
    x = masked_data(tmp_path / "data.npz")
    saved = tmp_path / "saved_model"
    specs = [TensorSpec(name="x", shape=[8, 40, 6])]
    tfw.save_canonical(model, specs, ["steps", "last"], saved)
    assert {tfw.SIGNATURE, tfw.LOOPS} <= set(tfw.signatures(saved))
    want = tfw.TfRunner(model).run({"x": x})
    unmasked = tfw.TfRunner(model).run({"x": np.where(x == -1.0, -1.001, x)})
    assert np.abs(want[1] - unmasked[1])[1:].min() > 1e-3  # the masks change every result
    for signature in (tfw.SIGNATURE, tfw.LOOPS):
        got = tfw.SavedModelRunner(saved, ["steps", "last"], signature).run({"x": x})
        for w, g in zip(want, got, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)

    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_saved_model(str(saved), [tfw.LOOPS])
    (tmp_path / "loops.tflite").write_bytes(converter.convert())
    ops = emitted.counts(tmp_path / "loops.tflite", "tflite_micro")
    assert ops["WHILE"] == 5  # one per layer and direction
    lacking = {"GATHER", "REDUCE_ANY", "NOT_EQUAL", "REVERSE_V2", "TENSOR_LIST_GET_ITEM"}
    assert not lacking & set(ops), ops


def test_masked_recurrent_layers_verify_on_tflite_micro(build) -> None:
    float32 = build()
    assert float32.metrics["verified"] and not float32.failed_checks
    for name in ("steps", "last"):
        assert float32.metrics["agreement"]["outputs"][name]["relative_error"] < 1e-5
    int8 = build({"quantization.mode": "int8", "verify.max_relative_diff": 1.0})
    assert int8.metrics["verified"] and not int8.failed_checks
    # kept float: the loops, and the mask's comparison with float I/O (int8 input moves
    # the mask value off its grid: no step was masked, 7.7 dB on sleepecg's classifier)
    assert min(o["sqnr_db"] for o in int8.metrics["agreement"]["outputs"].values()) > 20
    report = (int8.build_dir / "report.md").read_text(encoding="utf-8")
    assert "the operators inside its 5 loops float" in report
    assert "float32 I/O, an input compared for equality" in report
