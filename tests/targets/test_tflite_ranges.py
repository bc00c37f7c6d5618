"""quantization.method percentile and mse for the TFLite family
(edgeflow/targets/_tflite_ranges.py): the ranges chosen from a histogram, the recipe checks,
and builds of the digits demo."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgeflow.core.errors import RecipeError
from edgeflow.engine.cache import Cache
from edgeflow.engine.runner import run_build
from edgeflow.recipe import find_recipe, load_recipe
from edgeflow.targets import _tflite_ranges
from tests.conftest import DEMO_RECIPE
from tests.targets.conftest import needs_tflite


def _outliers() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A million normal values and two outliers (40, -30): the values, the histogram."""
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.normal(size=1_000_000), [40.0, -30.0]]).astype(np.float32)
    counts, edges = np.histogram(values, _tflite_ranges.BINS, (-30.0, 40.0))
    return values, counts, edges


def _exact_error(values: np.ndarray, low: float, high: float) -> float:
    """The squared error of the values themselves on TFLite's int8 grid for [low, high]."""
    low, high = min(low, 0.0), max(high, 0.0)
    scale = (high - low) / 255
    zero = np.clip(np.round(-128 - low / scale), -128, 127)
    levels = np.clip(np.round(values / scale) + zero, -128, 127)
    return float(np.sum((values - (levels - zero) * scale) ** 2))


def test_percentile_and_mse_ranges_of_a_histogram_with_outliers() -> None:
    values, counts, edges = _outliers()
    low, high = _tflite_ranges.choose(counts, edges, "percentile")
    assert low == pytest.approx(-4.37, abs=0.05) and high == pytest.approx(4.32, abs=0.05)
    mse = _tflite_ranges.choose(counts, edges, "mse")
    assert mse == pytest.approx((-8.7, 11.6), abs=0.05)  # 0.29 of min/max: tails clipped
    errors = {
        "minmax": _exact_error(values, -30.0, 40.0),
        "percentile": _exact_error(values, low, high),
        "mse": _exact_error(values, *mse),
    }
    # minmax rounds everything coarsely, percentile clips the outliers hard, mse trades both
    assert errors["mse"] < errors["percentile"] < errors["minmax"] / 3
    for (lo, hi), exact in zip(((-30.0, 40.0), (low, high), mse), errors.values(), strict=True):
        estimate = _tflite_ranges.squared_error(counts, edges, lo, hi)
        assert estimate == pytest.approx(exact, rel=0.01)  # the histogram's estimate


def test_a_range_after_a_relu_keeps_zero_at_its_low_end() -> None:
    values = np.maximum(_outliers()[0], 0)
    counts, edges = np.histogram(values, _tflite_ranges.BINS, (0.0, 40.0))
    assert _tflite_ranges.choose(counts, edges, "percentile")[0] == 0.0
    assert _tflite_ranges.choose(counts, edges, "mse")[0] == 0.0


@needs_tflite
def test_a_tensor_whose_range_is_a_few_float32_steps_keeps_its_min_and_max() -> None:
    """onnx.sqrt_newton's tangents on Arm NN's ViT: x * 5e-20 + 5e18, a range of a few float32
    steps. Before, numpy's histogram raised ("Too many bins for data range"), an internal
    error of the build with quantization.method mse or percentile."""
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32)])
    def tangent(x: tf.Tensor) -> tf.Tensor:
        return x * 5e-20 + 5e18

    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [tangent.get_concrete_function()], tangent
    )
    model = converter.convert()
    from ai_edge_litert.interpreter import Interpreter

    (output,) = Interpreter(model_content=model).get_output_details()
    low, high = 5e18, 5e18 + 2**41  # float32 steps of 2**40 there: two of them
    assert not _tflite_ranges.resolvable(low, high)
    assert _tflite_ranges.resolvable(0.0, 1.0) and _tflite_ranges.resolvable(-3e-6, 2e-6)
    x = np.linspace(-1, 1, 4, dtype=np.float32)[None]
    found = _tflite_ranges.histograms(model, [[x]], {output["name"]: (low, high)})
    assert found == {}  # left at its recorded range


@needs_tflite
def test_observed_ranges_mend_a_mean_that_tensorflows_calibrator_records_wrong() -> None:
    """A masked mean pooling as Arm NN builds it (onnx.sum_as_mean): mean(x * m) * T divided
    by mean(m) * T. TensorFlow's calibrator (2.21) records the MEAN with the MUL's range, T
    times its own, and the int8 MEAN lost 5 bits: 8.7 dB on the development encoder on Arm
    NN. Its observed range is the values' own, and the int8 pooling keeps its input's
    decibels."""
    import tensorflow as tf
    from tensorflow.lite.python.optimize import calibrator

    from edgeflow.targets._tflite_graph import tflite_graph
    from edgeflow.targets._tflite_quant import quantize

    tokens, width = 32, 16

    @tf.function(
        input_signature=[
            tf.TensorSpec([1, tokens, width], tf.float32),
            tf.TensorSpec([1, tokens], tf.float32),
        ]
    )
    def pooled(x: tf.Tensor, m: tf.Tensor) -> tf.Tensor:
        total = tf.reduce_mean(x * tf.reshape(m, [1, tokens, 1]), axis=1) * float(tokens)
        count = tf.reduce_mean(m, axis=1, keepdims=True) * float(tokens)
        return total / tf.maximum(count, 1.0)

    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [pooled.get_concrete_function()], pooled
    )
    float32 = converter.convert()
    rng = np.random.default_rng(0)
    kept = np.arange(tokens)[None] < rng.integers(8, tokens + 1, (64, 1))
    batches = [
        [rng.normal(0, 2, (1, tokens, width)).astype(np.float32), k[None].astype(np.float32)]
        for k in kept
    ]
    recorded = calibrator.Calibrator(float32).calibrate(lambda: iter(batches))
    mended = _tflite_ranges.observed(recorded, batches)
    graph = tflite_graph(float32, "tflite")
    [mean] = [
        op.outputs[0]
        for op in graph.ops
        if op.name == "MEAN" and graph.shapes[op.inputs[0]] == (1, tokens, width)
    ]
    name = graph.written_name(mean)
    true = max(abs(float((b[0] * b[1][..., None]).mean(axis=1).min())) for b in batches)

    def span(model: bytes) -> float:  # of the recorded range of the MEAN's output
        from ai_edge_litert import schema_py_generated as schema

        tree = schema.ModelT.InitFromPackedBuf(bytearray(model), 0)
        [q] = [t.quantization for t in tree.subgraphs[0].tensors if t.name.decode() == name]
        return float(q.max[0] - q.min[0])

    assert span(recorded) > 10 * span(mended)  # the calibrator's MEAN range: the MUL's
    assert span(mended) < 4 * true
    int8 = quantize(mended, True, [], float_io=True)
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=int8)
    interp.allocate_tensors()
    reference = Interpreter(model_content=float32)
    reference.allocate_tensors()
    want, got = [], []
    for runner, into in ((reference, want), (interp, got)):
        for batch in batches:
            for detail, value in zip(runner.get_input_details(), batch, strict=True):
                runner.set_tensor(detail["index"], value)
            runner.invoke()
            into.append(runner.get_tensor(runner.get_output_details()[0]["index"]))
    error = np.array(got) - np.array(want)
    sqnr = 10 * np.log10(np.sum(np.square(want)) / np.sum(np.square(error)))
    assert sqnr > 30  # measured 37.7 dB; with the calibrator's ranges, 10.9 dB


def _problems(overrides: dict[str, str], recipe: Path = DEMO_RECIPE) -> list[str]:
    with pytest.raises(RecipeError) as info:
        load_recipe(recipe, {"quantization.mode": "int8", **overrides})
    return [p.render() for p in info.value.problems]


def test_the_recipe_refuses_a_method_its_path_cannot_take() -> None:
    (entropy,) = _problems({"target": "tflite", "quantization.method": "entropy"})
    assert "target 'tflite' calibrates with minmax, percentile or mse, not entropy" in entropy
    assert entropy.endswith("hint: set quantization.method: percentile")
    (mse,) = _problems({"target": "onnxruntime_micro", "quantization.method": "mse"})
    assert (
        "target 'onnxruntime_micro' calibrates with minmax, entropy or percentile, not mse "
        "(mse ranges are set for armnn, ethos_u, tflite, tflite_micro)" in mse
    )
    (sixteen,) = _problems(
        {"target": "tflite", "quantization.method": "mse", "quantization.activations": "int16"}
    )
    assert "mse ranges are set for int8 activations; 16x8 takes min/max" in sixteen
    (native,) = _problems(
        {"target": "tflite_micro", "quantization.method": "percentile", "convert.via": "native"},
        find_recipe("digits_keras"),
    )
    assert "TensorFlow's own converter takes min/max" in native
    assert native.endswith("hint: set convert.via: onnx")
    for target, method in (("armnn", "mse"), ("tflite_micro", "percentile")):
        overrides = {"quantization.mode": "int8", "target": target, "quantization.method": method}
        assert load_recipe(DEMO_RECIPE, overrides).recipe.quantization.method == method
    none = {"target": "onnxruntime_micro", "quantization.method": "mse"}
    assert load_recipe(DEMO_RECIPE, {**none, "quantization.mode": "none"})  # not calibrated


def _scales(model: Path) -> list[float]:
    """The int8 output scale of each operator, in the model's order (the builds of one
    model by onnx2tf and by edgeflow's quantizer name their tensors differently)."""
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=str(model))
    details = interp.get_tensor_details()
    ops = [op for op in interp._get_ops_details() if op["op_name"] != "DELEGATE"]
    return [float(details[op["outputs"][0]]["quantization"][0]) for op in ops]


# Measured 2026-12 (360 test samples; source accuracy 0.9889), tflite int8:
#   minmax 0.9889, SQNR 34.8 dB; percentile 0.9889, 35.3 dB; mse 0.9861, 35.3 dB
@needs_tflite
@pytest.mark.parametrize("method", ["percentile", "mse"])
def test_percentile_and_mse_build_the_digits_demo_with_narrower_ranges(
    method: str, tmp_path: Path, shared_cache: Path
) -> None:
    built = {}
    for name in ("minmax", method):
        overrides = {"quantization.mode": "int8", "quantization.method": name, "target": "tflite"}
        loaded = load_recipe(DEMO_RECIPE, overrides)
        built[name] = run_build(loaded, Cache(shared_cache), tmp_path / name, print)
    result = built[method]
    assert result.metrics["verified"] is True
    assert result.metrics["accuracy"]["drop"] <= 0.003  # at most 1 of 360 samples
    sqnr = {k: r.metrics["agreement"]["min_sqnr_db"] for k, r in built.items()}
    assert sqnr[method] == pytest.approx(35.3, abs=0.3)
    assert sqnr[method] > sqnr["minmax"]
    report = (result.build_dir / "report.md").read_text()
    assert f"method={method}" in report
    before, after = (_scales(built[k].build_dir / "model.tflite") for k in ("minmax", method))
    assert len(before) == len(after) == 6  # CONV_2D x2, MAX_POOL_2D, CONV_2D, MEAN, FC
    ratios = [round(a / b, 2) for a, b in zip(after, before, strict=True)]
    # 99.999th percentile: below the maximum only where a tensor has >= 100,000 values
    expected = {
        "percentile": [0.96, 0.93, 0.93, 1.0, 1.0, 1.0],
        "mse": [0.94, 0.9, 0.9, 0.91, 0.99, 0.99],
    }
    assert ratios == expected[method]
