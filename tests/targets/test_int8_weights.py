"""quantization.mode int8_weights: int8 weights with float activations, on the targets whose
runtime runs it (onnxruntime_micro: onnxruntime's dynamic quantization; tflite: TensorFlow's
dynamic-range quantization), refused with the reason on the others (tflite_micro, armnn,
tensorrt), and the keys that set the activations' grid refused in this mode."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeflow.core.errors import EdgeflowError, RecipeError
from edgeflow.engine.cache import Cache
from edgeflow.engine.runner import run_build
from edgeflow.recipe import load_recipe
from edgeflow.stages import _ort_quant
from edgeflow.stages.quantize import _name_nodes, kept_float
from tests import needs
from tests.conftest import DEMO_RECIPE
from tests.targets.conftest import needs_tflite

# Two convolutions and two fully-connected layers, seeded random weights: 151,306 weights,
# 131,072 of them in the first Linear (TFLite leaves the first Conv, 864 weights, float: its
# dynamic-range converter quantizes tensors of 1,024 elements or more).
MODEL = """
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
"""
RECIPE = """
source:
  kind: pytorch
  model: model.py:ConvMLP
  inputs: [{name: image, shape: [1, 3, 8, 8], dtype: float32}]
  outputs: [logits]
evaluation: {dataset: eval.npz, metric: agreement}
target: onnxruntime_micro
verify: {latency_runs: 50}
"""
# Output SQNR against the PyTorch model on 64 random normal images, measured 2026-12:
# onnxruntime_micro 48.0 dB, tflite 48.0 dB (full int8 of the same model: about 40 dB).
MIN_SQNR_DB = 40.0


def _problems(overrides: dict[str, Any]) -> list[str]:
    with pytest.raises(RecipeError) as info:
        load_recipe(DEMO_RECIPE, overrides)
    return [p.render() for p in info.value.problems]


@pytest.mark.parametrize(
    ("key", "value"), [("method", "entropy"), ("symmetric", True), ("activations", "int16")]
)
def test_keys_of_the_activations_grid_are_refused_not_ignored(key: str, value: object) -> None:
    found = _problems({"quantization.mode": "int8_weights", f"quantization.{key}": value})
    assert len(found) == 1
    assert (
        f"quantization.{key}: " in found[0] and "int8_weights keeps activations float" in found[0]
    )
    assert f"hint: remove quantization.{key}, or set quantization.mode: int8" in found[0]


def test_the_demo_recipe_takes_int8_weights_as_it_is() -> None:
    """Keys written at the values that leave the activations' grid unset (the demo writes
    method: minmax, symmetric: false) are no reason to refuse the mode."""
    loaded = load_recipe(DEMO_RECIPE, {"quantization.mode": "int8_weights"})
    assert loaded.build_name == "onnxruntime_micro-int8_weights"
    tflite = load_recipe(DEMO_RECIPE, {"quantization.mode": "int8_weights", "target": "tflite"})
    assert tflite.recipe.quantization.per_channel is True


@pytest.mark.parametrize(
    ("target", "why", "offered"),
    [
        ("tflite_micro", "TFLite Micro has no hybrid kernels", "int8, none"),
        ("armnn", "input and weights types mismatched", "none, int8"),
        ("tensorrt", "no DynamicQuantizeLinear", "none, fp16, int8"),
    ],
)
def test_targets_without_its_kernels_refuse_it_with_the_reason(
    target: str, why: str, offered: str
) -> None:
    (found,) = _problems({"quantization.mode": "int8_weights", "target": target})
    assert f"quantization.mode: target '{target}' does not support mode 'int8_weights'" in found
    shown = " or ".join(f"quantization.mode={m}" for m in offered.split(", "))
    assert why in found and f"hint: choose one: {shown}" in found


def test_its_verify_and_diff_defaults() -> None:
    """25 dB on the outputs and 20 dB per tensor unless the recipe says (docs/recipe.md: its
    healthy builds measured 34.8-51.4 dB at the output, 26.9-42.9 dB at their lowest tensor);
    verify.by_mode takes the mode."""
    from edgeflow.schema.sections import Verify
    from edgeflow.verify.judge import thresholds
    from edgeflow.verify.layers import DIVERGENCE_DB

    limit = thresholds(Verify(), "int8_weights").limits["min_sqnr_db"]
    assert (limit.value, limit.origin) == (25.0, "default")
    assert DIVERGENCE_DB["int8_weights"] == 20.0
    own = Verify.model_validate({"by_mode": {"int8_weights": {"min_sqnr_db": 30}}})
    assert thresholds(own, "int8_weights").limits["min_sqnr_db"].value == 30.0


def test_seven_bit_weights_are_onnxruntimes_only() -> None:
    overrides = {"quantization.mode": "int8_weights", "quantization.reduce_range": True}
    (found,) = _problems({**overrides, "target": "tflite"})
    assert "quantization.reduce_range: 7-bit weights are onnxruntime's" in found
    assert load_recipe(DEMO_RECIPE, overrides).recipe.quantization.reduce_range is True


def _weight_graph(path: Path) -> Path:
    """x[1, 4, 6, 6] -> Conv(4->32, 3x3) -> Conv(32->32 in 2 groups, 3x3, pad 1) -> flatten
    -> MatMul [512, 16] -> MatMul [16, 8]: seeded weights, unnamed nodes."""
    rng = np.random.default_rng(0)

    def weight(name: str, *shape: int) -> Any:
        return numpy_helper.from_array(rng.normal(size=shape).astype(np.float32), name)

    weights = [
        weight("w_conv", 32, 4, 3, 3),  # 1,152 elements
        weight("w_grouped", 32, 16, 3, 3),  # 4,608 elements, 2 groups
        weight("w_mm", 512, 16),
        weight("w_small", 16, 8),  # 128 elements
        numpy_helper.from_array(np.array([1, 512], np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w_conv"], ["c"]),
        helper.make_node("Conv", ["c", "w_grouped"], ["d"], group=2, pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["d", "shape"], ["f"]),
        helper.make_node("MatMul", ["f", "w_mm"], ["m"]),
        helper.make_node("MatMul", ["m", "w_small"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        weights,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_small_weights_and_grouped_convolutions_stay_float(tmp_path: Path) -> None:
    """onnxruntime_micro's int8_weights keeps float what costs more than it saves (weights
    under 1,024 elements) and what one per-tensor scale starves (a grouped convolution);
    unnamed nodes get names, by which onnxruntime's quantizer excludes them."""
    path = _weight_graph(tmp_path / "m.onnx")
    model = onnx.load(str(path))
    assert _name_nodes(model) == 5 and _name_nodes(model) == 0
    assert kept_float(model) == {"small": ["MatMul_1"], "grouped": ["Conv_1"]}


@pytest.mark.parametrize("per_channel", [True, False])
def test_onnxruntime_stores_int8_weights_per_channel_where_it_can(
    per_channel: bool, tmp_path: Path
) -> None:
    """MatMul: one scale per output column when per_channel; Conv: per tensor either way
    (onnxruntime's ConvInteger quantizer has no per-channel form). The model runs in
    onnxruntime within 30 dB of the float one."""
    import onnxruntime as ort

    src, dst = _weight_graph(tmp_path / "m.onnx"), tmp_path / "q.onnx"
    model = onnx.load(str(src))
    _name_nodes(model)
    onnx.save(model, str(src))
    refused: list[dict[str, str]] = []
    kept = kept_float(model)
    excluded = [*kept["small"], *kept["grouped"]]
    _ort_quant.quantize_weights(
        src, dst, refused, nodes_to_exclude=excluded, per_channel=per_channel
    )
    assert refused == []
    model = onnx.load(str(dst))
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("MatMulInteger") == ops.count("ConvInteger") == 1
    assert ops.count("MatMul") == ops.count("Conv") == 1  # the small one, the grouped one
    stored = {t.name: t for t in model.graph.initializer}
    int8 = {n for n, t in stored.items() if t.data_type == TensorProto.INT8 and len(t.dims) > 1}
    assert int8 == {"w_conv_quantized", "w_mm_quantized"}
    scales = {n: list(t.dims) for n, t in stored.items() if n.endswith("_scale")}
    assert scales == {"w_conv_scale": [], "w_mm_scale": [16] if per_channel else []}
    x = np.random.default_rng(1).normal(size=(1, 4, 6, 6)).astype(np.float32)
    want = ort.InferenceSession(str(src)).run(None, {"x": x})[0]
    got = ort.InferenceSession(str(dst)).run(None, {"x": x})[0]
    assert 10 * np.log10((want**2).sum() / ((want - got) ** 2).sum()) > 30


def _ort_initializers(path: Path) -> dict[str, tuple[str, list[int]]]:
    """An .ort file's initializers: name -> (element type, dims)."""
    from onnxruntime.tools.ort_format_model import ort_flatbuffers_py  # noqa: F401  (its path)
    from onnxruntime.tools.ort_format_model.ort_flatbuffers_py.fbs import (
        InferenceSession,
        TensorDataType,
    )

    names = {v: k for k, v in vars(TensorDataType.TensorDataType).items() if k.isupper()}
    data = path.read_bytes()
    graph = InferenceSession.InferenceSession.GetRootAsInferenceSession(data, 0).Model().Graph()
    found = {}
    for i in range(graph.InitializersLength()):
        t = graph.Initializers(i)
        found[t.Name().decode()] = (names[t.DataType()], t.DimsAsNumpy().tolist())
    return found


def _tflite_weights(path: Path) -> list[tuple[str, list[int], int]]:
    """A .tflite's constant tensors: (type, shape, number of scales)."""
    from ai_edge_litert import schema_py_generated as schema

    names = {v: k for k, v in vars(schema.TensorType).items() if k.isupper()}
    model = schema.Model.GetRootAs(path.read_bytes(), 0)
    graph = model.Subgraphs(0)
    found = []
    for i in range(graph.TensorsLength()):
        t = graph.Tensors(i)
        if model.Buffers(t.Buffer()).DataLength() == 0:
            continue
        scales = t.Quantization().ScaleLength() if t.Quantization() else 0
        found.append((names[t.Type()], t.ShapeAsNumpy().tolist(), scales))
    return found


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> dict[str, Any]:
    """ConvMLP built float32 and int8_weights for onnxruntime_micro and tflite."""
    root = tmp_path_factory.mktemp("int8w")
    (root / "model.py").write_text(MODEL)
    rng = np.random.default_rng(0)
    np.savez(root / "eval.npz", image=rng.standard_normal((64, 3, 8, 8)).astype(np.float32))
    (root / "convmlp.yaml").write_text(textwrap.dedent(RECIPE))
    found = {}
    for target in ("onnxruntime_micro", "tflite"):
        for mode in ("none", "int8_weights"):
            loaded = load_recipe(
                root / "convmlp.yaml", {"target": target, "quantization.mode": mode}
            )
            result = run_build(loaded, Cache(shared_cache), root / "build", lambda line: None)
            assert result.failed_checks == [], result.failed_checks
            convert = next(o for o in result.outcomes if o.stage == "convert")
            entry = Cache(shared_cache).entry("convert", convert.key)
            found[f"{target}-{mode}"] = {
                "metrics": result.metrics,
                "out": root / "build" / "convmlp" / f"{target}-{mode}",
                "convert": json.loads((entry / "convert.json").read_text()),
            }
    return found


@pytest.mark.slow
@needs_tflite
@pytest.mark.usefixtures("offline_env")
def test_onnxruntime_micro_stores_int8_weights_and_stays_close(builds: dict[str, Any]) -> None:
    full, weights = builds["onnxruntime_micro-none"], builds["onnxruntime_micro-int8_weights"]
    m = weights["metrics"]
    assert m["verified"] is True and m["quantization"] == "int8_weights"
    # the weights in 1 byte: 614,120 -> 168,552 bytes measured (0.27)
    assert m["size_bytes"] < 0.3 * full["metrics"]["size_bytes"]
    assert m["agreement"]["min_sqnr_db"] >= MIN_SQNR_DB
    assert m["agreement"]["top1"] >= 0.95
    stored = _ort_initializers(weights["out"] / "model.ort")
    int8 = sorted(dims for kind, dims in stored.values() if kind == "INT8" and len(dims) > 1)
    # the second convolution and both Linears (as [in, out] for MatMulInteger); the first
    # Conv's 864 weights stay float (kept_float), as on tflite
    assert int8 == [[64, 32, 3, 3], [128, 10], [1024, 128]]
    assert [d for kind, d in stored.values() if kind == "FLOAT" and np.prod(d) > 128] == [
        [32, 3, 3, 3]
    ]
    config = (weights["out"] / "required_operators_and_types.config").read_text()
    assert "DynamicQuantizeLinear" in config and "ConvInteger" in config
    assert "com.microsoft;1;DynamicQuantizeMatMul" in config
    checks = json.loads((weights["out"] / "checks.json").read_text())
    floor = next(c for c in checks if c["metric"] == "verify.min_sqnr_db")
    assert (floor["threshold"], floor["origin"], floor["passed"]) == (25.0, "default", True)
    report = (weights["out"] / "report.md").read_text()
    assert "quantization `int8_weights`" in report
    # measured: 607,544 -> 155,919 bytes (26%)
    assert _weights_share(report, "by onnxruntime: 3 int8 tensors") < 0.27
    assert "float: 1 operators with weights under 1,024 elements, 0 grouped" in report


@pytest.mark.slow
@needs_tflite
@pytest.mark.usefixtures("offline_env")
def test_tflite_stores_int8_weights_and_stays_close(builds: dict[str, Any]) -> None:
    full, weights = builds["tflite-none"], builds["tflite-int8_weights"]
    m = weights["metrics"]
    assert m["verified"] is True and m["quantization"] == "int8_weights"
    # measured: 610,852 -> 161,024 bytes (0.26)
    assert m["size_bytes"] < 0.3 * full["metrics"]["size_bytes"]
    assert m["agreement"]["min_sqnr_db"] >= MIN_SQNR_DB
    assert m["agreement"]["top1"] >= 0.95
    constants = _tflite_weights(weights["out"] / "model.tflite")
    int8 = sorted((shape, scales) for kind, shape, scales in constants if kind == "INT8")
    # per output channel; the first Conv's 864 weights stay float
    assert int8 == [([10, 128], 10), ([64, 3, 3, 32], 64), ([128, 1024], 128)]
    floats = [shape for kind, shape, _ in constants if kind == "FLOAT32"]
    assert [32, 3, 3, 3] in floats
    assert not [o for o in _operators(weights["out"]) if o.startswith(("QUANTIZE", "DEQUANTIZE"))]
    report = (weights["out"] / "report.md").read_text()
    # measured: 607,704 -> 155,352 bytes (26%)
    assert _weights_share(report, "by the converter: 3 int8 tensors") < 0.27
    assert "TFLite dynamic range: symmetric int8 weights per output channel" in report


def _weights_share(report: str, line: str) -> float:
    """The report's int8 weights line: the constants' bytes against the float model's."""
    found = re.search(rf"int8 weights {line}, constants ([\d,]+) -> ([\d,]+) bytes", report)
    assert found is not None, report
    before, after = (int(g.replace(",", "")) for g in found.groups())
    return after / before


def _operators(out: Path) -> list[str]:
    from edgeflow.targets import emitted

    return emitted.operators(out / "model.tflite", "tflite")


@pytest.mark.slow
@needs_tflite
@pytest.mark.usefixtures("offline_env")
def test_tflite_micro_has_no_hybrid_kernels(builds: dict[str, Any]) -> None:
    """What the recipe check says, measured: TFLM refuses the dynamic-range file."""
    from edgeflow.targets.tflite_micro.backend import measure_arena

    artifact = builds["tflite-int8_weights"]["out"] / "model.tflite"
    with pytest.raises(EdgeflowError, match="Hybrid models are not supported on TFLite Micro"):
        measure_arena(artifact.read_bytes())


@pytest.mark.slow
@needs_tflite
@needs.mark("armnn")
@pytest.mark.usefixtures("offline_env")
def test_armnn_refuses_the_dynamic_range_file(builds: dict[str, Any]) -> None:
    """What the recipe check says, measured: Arm NN 22's CpuRef takes no hybrid layer (the
    per-channel FULLY_CONNECTED aborts the worker; a convolution is "not supported")."""
    from edgeflow.targets.armnn.backend import ArmnnRunner

    build = builds["tflite-int8_weights"]
    with pytest.raises(EdgeflowError) as failed:
        runner = ArmnnRunner(build["out"] / "model.tflite", build["convert"]["io"])
        runner.run({"image": np.zeros((1, 3, 8, 8), np.float32)})
    text = failed.value.message
    assert "not supported on any preferred backend" in text or "SIGABRT" in text, text


@pytest.mark.slow
@needs_tflite
@pytest.mark.usefixtures("offline_env")
def test_a_keras_model_takes_the_native_path_per_tensor(tmp_path: Path, shared_cache: Path) -> None:
    """TensorFlow's own converter (convert.via: native, the default for a tensorflow source on
    tflite) in dynamic range, per_channel false: one scale per int8 tensor."""
    from edgeflow.recipe import find_recipe

    overrides = {
        "target": "tflite",
        "quantization.mode": "int8_weights",
        "quantization.per_channel": False,
        "verify.latency_runs": 20,
    }
    loaded = load_recipe(find_recipe("digits_keras"), overrides)
    assert loaded.build_name == "tflite-int8_weights-per_tensor"
    result = run_build(loaded, Cache(shared_cache), tmp_path, lambda line: None)
    assert result.failed_checks == []
    m = result.metrics
    assert m["verified"] is True and m["accuracy"]["drop"] <= 0.005
    assert m["agreement"]["min_sqnr_db"] >= MIN_SQNR_DB  # measured 47.3 dB (per channel 48.1)
    convert = next(o for o in result.outcomes if o.stage == "tf_convert")
    info = json.loads(
        (Cache(shared_cache).entry("tf_convert", convert.key) / "convert.json").read_text()
    )
    assert info["path"] == "native"
    record = info["int8_weights"]
    assert (record["int8_tensors"], record["per_channel_tensors"]) == (2, 0)
    assert record["weights"]["bytes"] < 0.3 * record["weights"]["float_bytes"]
