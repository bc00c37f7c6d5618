"""Ingest normalises ONNX files as older and other exporters write them (IR 3, opsets below
what onnxruntime and the targets take, stale declared shapes, weights built in the graph,
an If on a constant input, files quantized already), says what it did, and the build then
verifies: files made here with onnx.helper, built for onnxruntime_micro."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeflow.core.errors import EdgeflowError
from edgeflow.core.onnxsession import checking_session
from edgeflow.engine.cache import Cache
from edgeflow.engine.runner import run_build
from edgeflow.recipe import load_recipe
from edgeflow.stages import _normalise

pytestmark = pytest.mark.slow

RNG = np.random.default_rng(0)
F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits, opset: int, ir: int, **kw) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits, **kw)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir
    return model


def _ir3_opset6() -> onnx.ModelProto:
    """An early PyTorch export: AveragePool-1 (no onnxruntime kernel any more), Mul and Add
    with the `broadcast` attribute, each weight also a graph input (IR 3)."""
    w = RNG.standard_normal((1, 3, 1, 1)).astype(np.float32)
    b = RNG.standard_normal((1, 3, 1, 1)).astype(np.float32)
    nodes = [
        helper.make_node("AveragePool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Mul", ["p", "w"], ["m"], broadcast=1),
        helper.make_node("Add", ["m", "b"], ["y"], broadcast=1),
    ]
    inputs = [
        helper.make_tensor_value_info("x", F, [1, 3, 8, 8]),
        helper.make_tensor_value_info("w", F, [1, 3, 1, 1]),
        helper.make_tensor_value_info("b", F, [1, 3, 1, 1]),
    ]
    out = [helper.make_tensor_value_info("y", F, [1, 3, 4, 4])]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    return _model(nodes, inputs, out, inits, opset=6, ir=3)


def _build(tmp_path: Path, write_recipe, model: onnx.ModelProto, inputs: str, data: dict):
    onnx.save(model, str(tmp_path / "m.onnx"))
    np.savez(tmp_path / "data.npz", **data)
    recipe = write_recipe(
        f"""
        source:
          kind: onnx
          model: m.onnx
          inputs: {inputs}
        evaluation: {{dataset: data.npz, metric: agreement}}
        quantization: {{mode: none}}
        target: onnxruntime_micro
        verify: {{max_abs_diff: 1.0e-5}}
        """
    )
    cache, build = Cache(tmp_path / "cache"), tmp_path / "build"
    result = run_build(load_recipe(recipe), cache, build, print)
    return result, *_ingested(tmp_path)


def _ingested(tmp_path: Path) -> tuple[dict, Path]:
    """ingest's source.json and its folder in the stage cache (model.onnx, reference.npz)."""
    found = next((tmp_path / "cache").glob("ingest/*/*/source.json"))
    return json.loads(found.read_text()), found.parent


def _reference(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model).run(None, feeds)


def test_an_opset_6_ir_3_file_is_upgraded_and_verifies(tmp_path: Path, write_recipe) -> None:
    model = _ir3_opset6()
    x = RNG.standard_normal((5, 3, 8, 8)).astype(np.float32)
    result, source, folder = _build(
        tmp_path, write_recipe, model, "[{name: x, shape: [1, 3, 8, 8]}]", {"x": x}
    )
    assert result.failed_checks == []
    assert result.metrics["agreement"]["max_abs_diff"] <= 1e-6
    notes = source["normalised"]
    assert "2 initializer(s) the file also lists as graph inputs are constants" in notes
    assert "IR version 3 -> 4" in notes
    upgraded = [n for n in notes if n.startswith("opset 6 -> ")]
    assert upgraded and "at ingest" in upgraded[0]
    assert result.metrics["ingest"] == notes  # metrics.json says it too
    report = tmp_path / "build" / "recipe" / "onnxruntime_micro-none" / "report.md"
    assert "- ingest: opset 6 -> " in report.read_text()
    # the file's own numbers, by onnx's reference evaluator on the opset-6 file
    want = _reference(model, {"x": x[:1]})[0]
    ingested = onnx.load(str(folder / "model.onnx"))
    assert onnx.defs.onnx_opset_version() >= ingested.opset_import[0].version > 6
    assert [i.name for i in ingested.graph.input] == ["x"]
    got = checking_session(ingested).run(None, {"x": x[:1]})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_an_initializer_input_may_be_declared_and_fed(tmp_path: Path, write_recipe) -> None:
    """Both ways: `w`, a weight the IR-3 file lists as an input, declared in source.inputs
    is fed from the data (its stored value dropped); `b`, not declared, is a constant."""
    model = _ir3_opset6()
    x = RNG.standard_normal((4, 3, 8, 8)).astype(np.float32)
    w = RNG.standard_normal((4, 3, 1, 1)).astype(np.float32)
    inputs = "[{name: x, shape: [1, 3, 8, 8]}, {name: w, shape: [1, 3, 1, 1]}]"
    result, source, folder = _build(tmp_path, write_recipe, model, inputs, {"x": x, "w": w})
    assert result.failed_checks == []
    assert "fed as declared, not the file's stored values: w" in source["normalised"]
    ingested = onnx.load(str(folder / "model.onnx"))
    assert sorted(i.name for i in ingested.graph.input) == ["w", "x"]
    assert [t.name for t in ingested.graph.initializer] == ["b"]
    reference = np.load(folder / "reference.npz")["arr_0"]
    want = _reference(model, {"x": x[1:2], "w": w[1:2]})[0]
    np.testing.assert_allclose(reference[1:2], want, rtol=1e-6, atol=1e-6)


def test_declared_shapes_that_contradict_inference_are_inferred_again(
    tmp_path: Path, write_recipe
) -> None:
    """A declared output of the wrong rank and a stale intermediate: the precheck's strict
    shape inference refused such a file, and onnx.fix_shapes failed the same way."""
    w = RNG.standard_normal((6, 4)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"]),
        helper.make_node("Relu", ["h"], ["y"]),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", F, [1, 6])],
        [helper.make_tensor_value_info("y", F, [1, 4, 1])],  # rank 3: wrong
        [numpy_helper.from_array(w, "W")],
        opset=13,
        ir=7,
        value_info=[helper.make_tensor_value_info("h", F, [7])],  # stale
    )
    x = RNG.standard_normal((4, 6)).astype(np.float32)
    result, source, folder = _build(
        tmp_path, write_recipe, model, "[{name: x, shape: [1, 6]}]", {"x": x}
    )
    assert result.failed_checks == []
    (note,) = [n for n in source["normalised"] if n.startswith("declared shapes")]
    assert "h float[7] (inferred float[1, 4])" in note
    assert "y float[1, 4, 1] (inferred float[1, 4])" in note
    ingested = onnx.load(str(folder / "model.onnx"))
    onnx.shape_inference.infer_shapes(ingested, strict_mode=True)  # no contradiction left
    dims = [d.dim_value for d in ingested.graph.output[0].type.tensor_type.shape.dim]
    assert dims == [1, 4]


def _constant_weights_cnn() -> onnx.ModelProto:
    """An opset-9 classic CNN as some exporters write it: the conv weight and the bias built
    in the graph (ConstantOfShape, Mul by a scale; Range, Tile), the flatten size from
    Shape/Gather of a static tensor."""
    i64 = TensorProto.INT64
    inits = [
        numpy_helper.from_array(np.array([4, 3, 3, 3], np.int64), "wshape"),
        numpy_helper.from_array(RNG.standard_normal((4, 3, 3, 3)).astype(np.float32), "scale"),
        numpy_helper.from_array(np.array(0.0, np.float32), "start"),
        numpy_helper.from_array(np.array(4.0, np.float32), "limit"),
        numpy_helper.from_array(np.array(1.0, np.float32), "delta"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
    ]
    one = helper.make_tensor("one", F, [1], [1.0])
    nodes = [
        helper.make_node("ConstantOfShape", ["wshape"], ["ones"], value=one),
        helper.make_node("Mul", ["ones", "scale"], ["W"]),
        helper.make_node("Range", ["start", "limit", "delta"], ["B"]),
        helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Shape", ["r"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Concat", ["n", "minus1"], ["flat"], axis=0),
        helper.make_node("Reshape", ["r", "flat"], ["y"]),
    ]
    del i64
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", F, [1, 3, 6, 6])],
        [helper.make_tensor_value_info("y", F, [1, 144])],
        inits,
        opset=11,
        ir=6,
    )


def test_constant_subgraphs_are_folded_whatever_op_makes_them(tmp_path: Path, write_recipe) -> None:
    model = _constant_weights_cnn()
    x = RNG.standard_normal((3, 3, 6, 6)).astype(np.float32)
    result, source, folder = _build(
        tmp_path, write_recipe, model, "[{name: x, shape: [1, 3, 6, 6]}]", {"x": x}
    )
    assert result.failed_checks == []
    ingested = onnx.load(str(folder / "model.onnx"))
    assert sorted(n.op_type for n in ingested.graph.node) == ["Conv", "Relu", "Reshape"]
    (note,) = [n for n in source["normalised"] if n.startswith("constant nodes folded")]
    for op in ("ConstantOfShape x1", "Range x1", "Shape x1", "Gather x1", "Concat x1"):
        assert op in note
    # what the TFLite family's precheck judged: ConstantOfShape, Range are gone before it
    from edgeflow.targets import load_profile
    from edgeflow.targets.precheck import _check

    ops = {f.op for f in _check(ingested, load_profile("tflite"))}
    assert not ops & {"ConstantOfShape", "Range", "Shape", "Gather"}


def _streaming_with_sample_rate(ir: int = 8) -> onnx.ModelProto:
    """A streaming audio model: a 0-D int64 sample rate that an If branches on (16 kHz: one
    gain, else another), a state carried from step to step."""
    then_graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "g16"], ["z"])],
        "then",
        [],
        [helper.make_tensor_value_info("z", F, [1, 4])],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "g8"], ["z8"])],
        "else",
        [],
        [helper.make_tensor_value_info("z8", F, [1, 4])],
    )
    nodes = [
        helper.make_node("Equal", ["sr", "k16"], ["is16"]),
        helper.make_node(
            "If", ["is16"], ["scaled"], then_branch=then_graph, else_branch=else_graph
        ),
        helper.make_node("Add", ["scaled", "state"], ["sum"]),
        helper.make_node("Tanh", ["sum"], ["new_state"]),
        helper.make_node("ReduceMean", ["new_state"], ["prob"], axes=[1], keepdims=0),
    ]
    inits = [
        numpy_helper.from_array(np.array(16000, np.int64), "k16"),
        numpy_helper.from_array(np.full((1, 4), 0.5, np.float32), "g16"),
        numpy_helper.from_array(np.full((1, 4), 2.0, np.float32), "g8"),
    ]
    return _model(
        nodes,
        [
            helper.make_tensor_value_info("x", F, ["batch", 4]),
            helper.make_tensor_value_info("state", F, ["batch", 4]),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
        ],
        [
            helper.make_tensor_value_info("prob", F, ["batch"]),
            helper.make_tensor_value_info("new_state", F, ["batch", 4]),
        ],
        inits,
        opset=13,
        ir=ir,
    )


def test_an_if_on_a_constant_input_is_folded_before_any_session_opens(
    tmp_path: Path, write_recipe
) -> None:
    model = _streaming_with_sample_rate()
    x = RNG.standard_normal((3, 5, 4)).astype(np.float32)  # 3 sequences of 5 steps
    onnx.save(model, str(tmp_path / "m.onnx"))
    np.savez(tmp_path / "data.npz", x=x)
    recipe = write_recipe(
        """
        source:
          kind: onnx
          model: m.onnx
          inputs:
            - {name: x, shape: [1, 4]}
            - {name: state, shape: [1, 4]}
            - {name: sr, shape: [], dtype: int64, value: 16000}
          outputs: [prob, new_state]
          state: [{input: state, output: new_state}]
        evaluation: {dataset: data.npz, metric: agreement}
        quantization: {mode: none}
        target: onnxruntime_micro
        verify: {max_abs_diff: 1.0e-5}
        """
    )
    build = tmp_path / "build"
    result = run_build(load_recipe(recipe), Cache(tmp_path / "cache"), build, print)
    assert result.failed_checks == []
    source, folder = _ingested(tmp_path)
    ingested = onnx.load(str(folder / "model.onnx"))
    assert "If" not in {n.op_type for n in ingested.graph.node}
    notes = source["normalised"]
    assert "If with a constant condition replaced by its branch: 1" in notes


def test_a_quantized_file_is_recognised(tmp_path: Path, write_recipe) -> None:
    w = RNG.integers(-8, 8, (2, 1, 3, 3)).astype(np.int8)
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        helper.make_node("ConvInteger", ["xq", "W", "xz"], ["acc"]),
        helper.make_node("Cast", ["acc"], ["accf"], to=F),
        helper.make_node("Mul", ["accf", "xs"], ["y"]),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", F, [1, 1, 5, 5])],
        [helper.make_tensor_value_info("y", F, [1, 2, 3, 3])],
        [numpy_helper.from_array(w, "W")],
        opset=13,
        ir=7,
    )
    x = RNG.standard_normal((3, 1, 5, 5)).astype(np.float32)
    result, source, _ = _build(
        tmp_path, write_recipe, model, "[{name: x, shape: [1, 1, 5, 5]}]", {"x": x}
    )
    assert source["quantized_ops"] == {"ConvInteger": 1, "DynamicQuantizeLinear": 1}
    assert (
        "the file is quantized already (ConvInteger x1, DynamicQuantizeLinear x1)"
        in (source["normalised"])
    )
    assert result.failed_checks == []


def _per_element_batchnorm(opset: int) -> onnx.ModelProto:
    """BatchNormalization with spatial=0 (statistics per element, not per channel)."""
    inits = [numpy_helper.from_array(np.ones((2, 2), np.float32), n) for n in "sbmv"]
    nodes = [helper.make_node("BatchNormalization", ["x", *"sbmv"], ["y"], spatial=0)]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", F, [1, 2, 2])],
        [helper.make_tensor_value_info("y", F, [1, 2, 2])],
        inits,
        opset=opset,
        ir=4,
    )


def test_an_upgrade_the_converter_cannot_make_names_the_op() -> None:
    """BatchNormalization-6 with spatial=0 (per-element statistics): onnx's version converter
    has no adapter for it to opset 9 and later, onnxruntime no kernel at opset 6."""
    model = _per_element_batchnorm(opset=6)
    with pytest.raises(EdgeflowError) as caught:
        _normalise.upgrade_opset(model, "old.onnx", _normalise.loads(model))
    message = str(caught.value)
    assert message.startswith("old.onnx: onnx's version converter cannot move the file from")
    assert "spatial" in message and "BatchNormalization (opset 6)" in message
    assert caught.value.hint.startswith("export the model again at opset 13 or later")


def test_old_broadcasting_on_an_axis_survives_the_upgrade() -> None:
    """Add(A, b, broadcast=1, axis=1), a bias [C] on an NCHW tensor, as opset-6 exporters
    wrote it: onnx's version converter alone unsqueezes b to [C, 1, 1, 1] (a [C, C, H, W]
    result) and leaves the new tensor untyped; ingest writes the alignment itself."""
    bias = RNG.standard_normal(3).astype(np.float32)
    nodes = [
        helper.make_node("AveragePool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Add", ["p", "bias"], ["y"], broadcast=1, axis=1),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", F, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("y", F, [1, 3, 2, 2])],
        [numpy_helper.from_array(bias, "bias")],
        opset=6,
        ir=4,
    )
    x = RNG.standard_normal((1, 3, 4, 4)).astype(np.float32)
    want = x.reshape(1, 3, 2, 2, 2, 2).mean((3, 5)) + bias[None, :, None, None]
    upgraded, notes = _normalise.upgrade_opset(model, "old.onnx", _normalise.loads(model))
    assert notes == ["opset 6 -> 11 at ingest (onnx's version converter)"]
    (got,) = checking_session(upgraded).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    (evaluated,) = _normalise.evaluated(model, {"x": x}) or [None]
    np.testing.assert_allclose(evaluated, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_an_upsample_keeps_its_coordinates_at_opset_11(mode: str) -> None:
    """Upsample-9 maps output pixel x to x / scale; Resize-11's defaults (half_pixel) do not,
    and onnx's version converter leaves them: ingest says 'asymmetric' and 'floor'."""
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    nodes = [helper.make_node("Upsample", ["x", "scales"], ["y"], mode=mode)]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", F, [1, 2, 3, 3])],
        [helper.make_tensor_value_info("y", F, [1, 2, 6, 6])],
        [scales],
        opset=9,
        ir=4,
    )
    x = RNG.standard_normal((1, 2, 3, 3)).astype(np.float32)
    (want,) = checking_session(model).run(None, {"x": x})  # onnxruntime's Upsample-9
    upgraded, notes = _normalise.upgrade_opset(model, "up.onnx", _normalise.loads(model))
    assert notes == ["opset 9 -> 11 at ingest (onnx's version converter)"]
    (got,) = checking_session(upgraded).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_file_onnxruntime_loads_stays_where_the_converter_cannot_move_it() -> None:
    """The same BatchNormalization at opset 7: onnxruntime runs it, so ingest keeps the file
    at its opset, says why, and leaves the targets' opset ranges to the precheck."""
    model = _per_element_batchnorm(opset=7)
    kept, notes = _normalise.upgrade_opset(model, "bn.onnx", _normalise.loads(model))
    assert kept is model
    assert notes == [
        "kept at opset 7: onnx's version converter cannot move the file from opset 7 to 11: "
        "Attribute spatial must have value 1 (the file's ops: BatchNormalization (opset 7))"
    ]


def test_a_file_onnxruntime_and_every_target_take_is_left_as_it_is() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", F, [1, 4])],
        [helper.make_tensor_value_info("y", F, [1, 4])],
        [],
        opset=17,
        ir=8,
    )
    same, notes = _normalise.upgrade_opset(model, "m.onnx", _normalise.loads(model))
    assert notes == [] and same is model
    assert _normalise.initializer_inputs(model, {"x"}) == []
    assert _normalise.reinfer_shapes(model) == []


def test_an_op_version_no_target_measured_to_run_is_moved_to_one_that_did() -> None:
    """Softmax-11 over axis 1 of a 3-D input flattens from that axis on; onnx2tf converts it
    as opset 13's softmax over the one axis (measured by the probes: 4.85 of the output off),
    so the TFLite-family profiles list Softmax `kernels: [{since: 13}]` and ingest moves the
    file to opset 13, where the version converter writes the flattening out."""
    nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=1)]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", F, [2, 5, 12])],
        [helper.make_tensor_value_info("y", F, [2, 5, 12])],
        [],
        opset=11,
        ir=6,
    )
    x = RNG.standard_normal((2, 5, 12)).astype(np.float32)
    flat = np.exp(x.reshape(2, 60))
    want = (flat / flat.sum(1, keepdims=True)).reshape(2, 5, 12)
    upgraded, notes = _normalise.upgrade_opset(model, "sm.onnx", _normalise.loads(model))
    assert notes == ["opset 11 -> 13 at ingest (onnx's version converter)"]
    (got,) = checking_session(upgraded).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
