"""The per-layer diff: pairing tensors across a conversion, the figures, the first divergence,
and on every CPU target: an artifact built from a model with one node's weights perturbed is
diffed against the unperturbed model, and the diff names that node."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from edgeflow.verify.layers import (
    ArtifactTensor,
    Pair,
    SourceGraph,
    SourceTensor,
    compare,
    first_divergence,
    match_by_value,
    match_near,
)
from tests.targets.conftest import needs_tflite
from tests.targets.test_armnn import needs_armnn


def _chain() -> SourceGraph:
    """x -> Conv -> c -> Relu -> r -> Reshape -> flat: values for two batches."""
    rng = np.random.default_rng(0)
    graph = SourceGraph(
        [
            SourceTensor("x", "input", "x", ()),
            SourceTensor("c", "Conv", "conv", ("x", "w")),
            SourceTensor("r", "Relu", "relu", ("c",)),
            SourceTensor("flat", "Reshape", "reshape", ("r", "shape")),
        ]
    )
    for _ in range(2):
        x = rng.normal(size=(1, 3, 4, 4)).astype(np.float32)
        c = rng.normal(size=(1, 2, 4, 4)).astype(np.float32)
        r = np.maximum(c, 0)
        for name, value in (("x", x), ("c", c), ("r", r), ("flat", r.reshape(1, -1))):
            graph.values.setdefault(name, []).append(value)
    return graph


def test_a_channel_last_tensor_pairs_with_its_source_and_a_fused_inner_tensor_has_none() -> None:
    graph = _chain()
    artifact = [
        ArtifactTensor("in", "input", -1),
        ArtifactTensor("conv_relu", "CONV_2D", 0),  # the Conv with its ReLU fused
        ArtifactTensor("flat", "RESHAPE", 1),
        ArtifactTensor("zeros", "MUL", 2),
    ]
    values = [
        {
            "in": graph.values["x"][b].transpose(0, 2, 3, 1),
            "conv_relu": graph.values["r"][b].transpose(0, 2, 3, 1) + 1e-6,
            "flat": graph.values["flat"][b],
            "zeros": np.zeros((1, 4, 4, 2), np.float32),  # constant: it would equal anything
        }
        for b in range(2)
    ]
    pairing = match_by_value(graph, artifact, values)
    assert pairing == {
        "in": ("x", "channel_last"),
        "conv_relu": ("r", "channel_last"),
        "flat": ("flat", "same"),
    }
    pairs = compare(graph, {t.name: t for t in artifact}, values, pairing)
    assert [p.source.name for p in pairs] == ["x", "r", "flat"]
    assert math.isinf(pairs[0].sqnr_db) and pairs[0].max_abs_diff == 0
    assert pairs[1].max_abs_diff == pytest.approx(1e-6, rel=0.1)
    assert pairs[1].sqnr_db > 100


def test_the_first_divergence_names_the_tensor_its_fused_nodes_and_the_sqnr_before() -> None:
    graph = _chain()
    tensors = {"x": ArtifactTensor("x", "input", -1), "r": ArtifactTensor("r", "CONV_2D", 0)}
    noise = np.random.default_rng(1)
    values = []
    for b in range(2):
        x, r = graph.values["x"][b], graph.values["r"][b]
        values.append(
            {
                "x": x + 0.001 * noise.normal(size=x.shape).astype(np.float32),
                "r": r + 0.5 * noise.normal(size=r.shape).astype(np.float32),
            }
        )
    pairs = compare(graph, tensors, values, {"x": ("x", "same"), "r": ("r", "same")})
    assert pairs[0].sqnr_db == pytest.approx(60, abs=2)  # 0.1 % noise on unit values
    assert pairs[1].sqnr_db < 6
    found = first_divergence(graph, pairs, below_db=15)
    assert found is not None and found.pair.source.name == "r"
    assert [t.node for t in found.fused] == ["conv"] and found.nodes == ["conv", "relu"]
    assert found.before_db == pytest.approx(pairs[0].sqnr_db)
    exact = first_divergence(graph, pairs[1:], below_db=15)  # x not compared: nothing before
    assert exact is not None and exact.before_db is None
    assert "(nothing compared before it) -> " in exact.line()
    assert found.line() == (
        f"first divergence: r (Relu, node relu; with Conv node conv), "
        f"SQNR {pairs[0].sqnr_db:.0f} dB -> {pairs[1].sqnr_db:.0f} dB"
    )
    assert first_divergence(graph, pairs, below_db=3) is None


def test_an_int8_tensor_pairs_by_value_with_the_source_tensor_it_holds_up_to_rounding() -> None:
    """Rounding to 255 steps over its range leaves a tensor ~53 dB from its source (int8
    tensors of a real build: 20-45 dB); the Conv before a ReLU holds the ReLU's output far
    less closely, and random values pair with nothing."""
    graph = _chain()
    step = [float(np.ptp(r)) / 254 for r in graph.values["r"]]
    rounded = [np.round(r / s) * s for r, s in zip(graph.values["r"], step, strict=True)]
    artifact = [
        ArtifactTensor("relu", "CONV_2D", 0),
        ArtifactTensor("noise", "CONV_2D", 1),
        ArtifactTensor("flat", "RESHAPE", 2),
    ]
    noise = np.random.default_rng(2)
    values = [
        {
            "relu": rounded[b].transpose(0, 2, 3, 1),
            "noise": noise.normal(size=(1, 4, 4, 2)).astype(np.float32),
            "flat": rounded[b].reshape(1, -1),
        }
        for b in range(2)
    ]
    taken = {"x"}
    pairing = match_near(graph, artifact, values, taken, floor_db=15)
    # the Reshape's output holds the same values as the ReLU's: the one in its own shape
    assert pairing == {"relu": ("r", "channel_last"), "flat": ("flat", "same")}
    assert taken == {"x", "r", "flat"}
    pairs = compare(graph, {t.name: t for t in artifact}, values, pairing)
    assert 50 < pairs[0].sqnr_db < 56
    # a floor above what rounding leaves: nothing pairs
    assert match_near(graph, artifact, values, {"x"}, floor_db=60) == {}


def test_sqnr_and_relative_error_of_a_pair() -> None:
    source = SourceTensor("t", "Conv", "n", ())
    pair = Pair(source, ArtifactTensor("t", "CONV_2D", 0), "same", (4,))
    pair.add(np.array([1.0, -1.0, 2.0, 0.0]), np.array([1.1, -1.0, 2.0, 0.0], np.float32))
    assert pair.sqnr_db == pytest.approx(10 * math.log10(6 / 0.01), abs=1e-3)
    assert pair.rel_to_range == pytest.approx(0.1 / 3, rel=1e-5)


# --- every CPU target: the diff names the node whose weights the artifact has wrong ------------

PERTURBED = 1  # the second convolution of the digits CNN


@pytest.fixture(scope="module")
def digits_onnx(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The trained digits CNN as an ONNX source, and the name of its second Conv node."""
    import onnx

    from tests.conftest import demo_onnx

    folder = tmp_path_factory.mktemp("layers")
    demo_onnx(folder)
    convs = [n for n in onnx.load(str(folder / "digits.onnx")).graph.node if n.op_type == "Conv"]
    return folder, convs[PERTURBED].name


def _negate_onnx_conv(path: Path, out: Path) -> None:
    """A test-only rewrite of the artifact side: the second Conv's weights negated (int8
    weights of a QDQ model through their DequantizeLinear)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    conv = [n for n in model.graph.node if n.op_type == "Conv"][PERTURBED]
    producers = {o: n for n in model.graph.node for o in n.output}
    name = conv.input[1]
    if name in producers and producers[name].op_type == "DequantizeLinear":
        name = producers[name].input[0]
    weight = next(t for t in model.graph.initializer if t.name == name)
    value = numpy_helper.to_array(weight)
    negated = np.clip(-value.astype(np.int32), -127, 127).astype(value.dtype)
    weight.CopyFrom(numpy_helper.from_array(negated if value.dtype != np.float32 else -value, name))
    onnx.save(model, str(out))


def _negate_tflite_conv(path: Path, out: Path) -> None:
    """The same in a .tflite: the second CONV_2D's weight buffer negated."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    from edgeflow.targets import emitted

    tree = schema.ModelT.InitFromPackedBuf(bytearray(path.read_bytes()), 0)
    names = emitted.operators_by_code(schema.Model.GetRootAs(path.read_bytes(), 0), schema)
    graph = tree.subgraphs[0]
    conv = [op for op in graph.operators if names[op.opcodeIndex] == "CONV_2D"][PERTURBED]
    tensor = graph.tensors[conv.inputs[1]]
    buffer = tree.buffers[tensor.buffer]
    dtype = np.int8 if tensor.type == schema.TensorType.INT8 else np.float32
    value = np.frombuffer(bytes(bytearray(buffer.data)), dtype)
    negated = np.clip(-value.astype(np.int32), -127, 127) if dtype == np.int8 else -value
    buffer.data = np.frombuffer(negated.astype(dtype).tobytes(), np.uint8)
    builder = flatbuffers.Builder(1024)
    builder.Finish(tree.Pack(builder), file_identifier=b"TFL3")
    out.write_bytes(bytes(builder.Output()))


def _diff_with_a_perturbed_artifact(folder: Path, cache_root: Path, target: str, mode: str) -> dict:
    """Build the digits CNN for `target` with the real pipeline, negate one convolution's
    weights in the artifact, and run the diff stage on that artifact."""
    import shutil

    from edgeflow.engine.cache import Cache
    from edgeflow.engine.runner import execute, run_build
    from edgeflow.recipe import load_recipe
    from edgeflow.stages import STAGES

    recipe = folder / f"{target}-{mode}.yaml"
    recipe.write_text(
        "source:\n"
        "  kind: onnx\n"
        "  model: digits.onnx\n"
        "  inputs: [{name: image, shape: [1, 1, 8, 8]}]\n"
        "calibration: {dataset: calib.npz}\n"
        "evaluation: {dataset: 'edgeflow.datasets:sklearn_digits', split: test}\n"
        f"quantization: {{mode: {mode}}}\n"
        f"target: {target}\n"
        "verify: {max_accuracy_drop: 0.05}\n"
        "diff: {samples: 8}\n"
    )
    loaded = load_recipe(recipe)
    cache = Cache(cache_root)
    result = run_build(loaded, cache, folder / "build", print)
    assert not result.failed_checks  # the artifact as built is right
    entry = {o.stage: cache.entry(o.stage, o.key) for o in result.outcomes}
    work = folder / f"perturbed-{target}-{mode}"
    shutil.copytree(entry["convert"] / "artifact", work / "artifact")
    inputs = {
        "artifact": work / "artifact",
        "convert": entry["convert"] / "convert.json",
        "onnx": entry["quantize"] / "model.onnx",
        "float_onnx": entry["optimize"] / "model.onnx",
        "source_onnx": entry["rewrite_target"] / "model.onnx",
    }
    if target == "onnxruntime_micro":  # the diff reads the model the .ort file was made from
        inputs["onnx"] = work / "model.onnx"
        _negate_onnx_conv(entry["quantize"] / "model.onnx", inputs["onnx"])
    else:
        tflite = work / "artifact" / "model.tflite"
        _negate_tflite_conv(tflite, tflite)
    (work / "diff").mkdir()
    execute(STAGES["diff"], loaded, inputs, work / "diff")
    return json.loads((work / "diff" / "diff.json").read_text())


CASES = [
    pytest.param("onnxruntime_micro", "none", id="onnxruntime_micro-float32"),
    pytest.param("onnxruntime_micro", "int8", id="onnxruntime_micro-int8"),
    pytest.param("tflite", "none", marks=needs_tflite, id="tflite-float32"),
    pytest.param("tflite", "int8", marks=needs_tflite, id="tflite-int8"),
    pytest.param("tflite_micro", "int8", marks=needs_tflite, id="tflite_micro-int8"),
    pytest.param("armnn", "none", marks=[needs_tflite, needs_armnn], id="armnn-float32"),
    pytest.param("armnn", "int8", marks=[needs_tflite, needs_armnn], id="armnn-int8"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("target", "mode"), CASES)
def test_the_diff_names_the_node_whose_weights_the_artifact_has_wrong(
    digits_onnx: tuple[Path, str], shared_cache: Path, target: str, mode: str
) -> None:
    folder, node = digits_onnx
    found = _diff_with_a_perturbed_artifact(folder, shared_cache, target, mode)
    divergence = found["first_divergence"]
    assert divergence is not None, found["line"]
    assert node in [*divergence["fused_nodes"], divergence["node"]], found["line"]
    assert divergence["sqnr_db"] < 3  # negated weights: an error as large as the signal
    # what feeds it is right: float rounding in float32, a few int8 steps in int8
    before = divergence["inputs_sqnr_db"]
    assert before in (None, "inf") or before > (60 if mode == "none" else 20), found["line"]
    assert found["compared"] >= 5, found


# --- one tensor, two ranges: a raw detector head ------------------------------------------------

HEAD = '''
import torch
from torch import nn


class Head(nn.Module):
    """A YOLO-style raw head: boxes in pixels (0..~300) and class scores (0..1) concatenated
    into one output [1, 16, 4 + 3]."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU())
        self.boxes = nn.Conv2d(8, 4, 1)
        self.scores = nn.Conv2d(8, 3, 1)

    def forward(self, image):
        x = self.features(image)
        boxes = 150 + 100 * self.boxes(x)  # pixels
        scores = torch.sigmoid(4 * self.scores(x))
        return torch.cat([boxes, scores], 1).reshape(1, 7, 16).transpose(1, 2)
'''


@pytest.mark.slow
@needs_tflite
def test_the_diff_finds_scores_erased_by_one_scale_and_the_cut_keeps_them(
    tmp_path: Path, shared_cache: Path
) -> None:
    """int8 gives the concatenated output one scale: ~1.2 px steps erase the 0..1 scores,
    though the whole tensor's SQNR (boxes dominate its energy) looks fine. The diff judges a
    Concat by its worst part and names it; cutting the artifact before the Concat
    (`postprocess.cut`) quantizes boxes and scores apart and the scores survive."""
    from edgeflow.cli import main

    (tmp_path / "head.py").write_text(HEAD)
    recipe = tmp_path / "head.yaml"
    body = (
        "source:\n"
        "  kind: pytorch\n"
        "  model: head.py:Head\n"
        "  inputs: [{name: image, shape: [1, 3, 8, 8]}]\n"
        "  outputs: [detections]\n"
        "export: {opset: 17, exporter: torchscript}\n"
        "calibration: {dataset: 'edgeflow.datasets:sample_image_crops', split: calibration,\n"
        "  options: {size: [8, 8], count: 16, input_name: image}}\n"
        "evaluation: {dataset: 'edgeflow.datasets:sample_image_crops', split: test,\n"
        "  options: {size: [8, 8], count: 8, input_name: image}, metric: agreement}\n"
        "quantization: {mode: int8}\n"
        "target: tflite\n"
        "verify: {min_sqnr_db: null, max_accuracy_drop: null}\n"
    )
    recipe.write_text(body)
    common = [f"cache_dir={shared_cache}", f"build_dir={tmp_path}/b"]
    assert main(["diff", str(recipe), *common]) == 0
    found = json.loads((tmp_path / "b" / "head" / "tflite-int8" / "diff.json").read_text())
    divergence = found["first_divergence"]
    assert divergence is not None and divergence["op"] == "Concat", found["line"]
    with (tmp_path / "b" / "head" / "tflite-int8" / "layers_diff.csv").open() as f:
        concat = next(r for r in csv.DictReader(f) if r["tensor"] == divergence["tensor"])
    assert concat["worst_part"] == divergence["worst_part"] != ""  # the scores' input
    assert divergence["sqnr_db"] < 10 and divergence["inputs_sqnr_db"] > 20

    cut = body.replace(
        "quantization:", f"postprocess: {{cut: {divergence['parts']}}}\nquantization:"
    )
    recipe.write_text(cut)
    assert main(["diff", str(recipe), *common]) == 0
    found = json.loads((tmp_path / "b" / "head" / "tflite-int8" / "diff.json").read_text())
    assert found["first_divergence"] is None, found["line"]


def test_the_source_graph_takes_int64_samples_where_the_graph_was_narrowed_to_int32() -> None:
    """tflite_micro's default narrows token ids to int32 (onnx.int64_to_int32 io: int32); the
    recipe's samples stay int64. Before, the per-layer diff of such a build (and the float
    islands' pairing) stopped with onnxruntime's "expected: (tensor(int32))", an internal
    error."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from edgeflow.verify.layers import source_graph

    table = np.arange(12, dtype=np.float32).reshape(6, 2)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["embedded"])],
        "narrowed",
        [helper.make_tensor_value_info("ids", TensorProto.INT32, [3])],
        [helper.make_tensor_value_info("embedded", TensorProto.FLOAT, [3, 2])],
        [numpy_helper.from_array(table, "table")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model)
    found = source_graph(model, [{"ids": np.array([5, 0, 2], np.int64)}])
    np.testing.assert_array_equal(found.values["embedded"][0], table[[5, 0, 2]])
