"""The precheck's NPU placement for ethos_u: where Vela puts each operator, measured on the
probe graphs (targets/ethos_u.yaml's npu_placement), applied to a model before converting;
and that those measurements still hold for the installed Vela and converter."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgeflow.cli import main
from edgeflow.targets import load_profile
from edgeflow.targets.placement import predict
from edgeflow.targets.precheck import check, to_json
from tests import needs
from tests.targets.conftest import needs_tflite


def _model(
    nodes: list, inputs: list, outputs: list, initializers: list | None = None
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _float(name: str, shape: list[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _conv_then(
    op_nodes: list, out_shape: list[int], initializers: list | None = None
) -> onnx.ModelProto:
    """x -> Conv(4 channels) -> Relu -> `op_nodes` (reading "r", writing "y")."""
    weight = helper.make_tensor(
        "w", TensorProto.FLOAT, [4, 1, 3, 3], np.linspace(-1, 1, 36).astype(np.float32)
    )
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        *op_nodes,
    ]
    return _model(
        nodes,
        [_float("x", [1, 1, 8, 8])],
        [_float("y", out_shape)],
        [weight, *(initializers or [])],
    )


def _findings(model: onnx.ModelProto, target: str = "ethos_u") -> dict[str, dict]:
    found = to_json(check(model, load_profile(target), "int8"))
    return {f["operator"]: f for f in found}


def test_an_operator_vela_leaves_on_the_cpu_is_a_warning_with_vela_s_reason() -> None:
    """Sqrt: measured on the CPU of every generation ("Unsupported opType"; TFLite Micro runs
    it float). onnx.sqrt_newton declares it fixes Sqrt, but it breaks int8 builds: named as
    tried, not suggested."""
    model = _conv_then([helper.make_node("Sqrt", ["r"], ["y"], name="sqrt")], [1, 4, 8, 8])
    found = _findings(model)
    sqrt = found["Sqrt"]
    assert sqrt["severity"] == "warning" and sqrt["nodes"] == ["sqrt"]
    assert sqrt["reason"].startswith("Vela leaves it on the CPU of an Ethos-U55 (")
    assert "SQRT" in sqrt["reason"] and "Sqrt: Unsupported opType" in sqrt["reason"]
    assert sqrt["rule"] == "" and sqrt["tried"] == ["onnx.sqrt_newton (breaks int8 builds)"]
    assert "Conv" not in found and "Relu" not in found  # on the NPU
    predicted = predict(onnx.shape_inference.infer_shapes(model), load_profile("ethos_u"), "int8")
    assert predicted is not None
    assert (predicted["nodes"], predicted["npu"], predicted["cpu"]) == (3, 2, {"Sqrt": 1})
    assert predicted["accelerator"] == "ethos-u55-128" and predicted["generation"] == "u55"


def test_a_rule_is_suggested_where_it_moves_the_operator_to_the_npu() -> None:
    """A Gather of constant, evenly spaced indices: on the U55's CPU (GATHER is not one of its
    operators); onnx.gather_to_slice makes it a Slice, which Vela places on the NPU."""
    indices = helper.make_tensor("i", TensorProto.INT64, [2], [0, 2])
    gather = helper.make_node("Gather", ["r", "i"], ["y"], name="gather", axis=1)
    found = _findings(_conv_then([gather], [1, 2, 8, 8], [indices]))
    assert found["Gather"]["severity"] == "warning"
    assert "GatherV2: Unsupported opType" in found["Gather"]["reason"]
    assert found["Gather"]["rule"] == "onnx.gather_to_slice"


def test_the_transposes_vela_adds_are_a_warning_with_the_rule_that_avoids_them() -> None:
    """ReduceSum: Vela adds a Transpose on the NPU (measured on every generation); written as
    ReduceMean times the count (onnx.sum_as_mean), it adds none."""
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    total = helper.make_node("ReduceSum", ["r", "axes"], ["y"], name="sum", keepdims=1)
    found = _findings(_conv_then([total], [1, 1, 8, 8], [axes]))
    assert found["ReduceSum"]["reason"].startswith("Vela adds 1 Transpose on the NPU to run it")
    assert found["ReduceSum"]["severity"] == "warning"
    assert found["ReduceSum"]["rule"] == "onnx.sum_as_mean"


def test_a_generation_places_what_another_does_not() -> None:
    """A Concat of int32 tensors: an Ethos-U55 takes no 32-bit feature maps (its CPU), an
    Ethos-U85 does (measured); the float Concat is on the NPU of both."""
    ints = helper.make_tensor("k", TensorProto.INT32, [1, 4], [1, 2, 3, 4])
    concat = helper.make_node("Concat", ["x", "k"], ["y"], name="concat", axis=1)
    x, y = (
        helper.make_tensor_value_info(n, TensorProto.INT32, s)
        for n, s in (("x", [1, 4]), ("y", [1, 8]))
    )
    model = _model([concat], [x], [y], [ints])
    u55, u85 = _findings(model), _findings(model, "ethos_u85_256")
    assert u55["Concat"]["reason"].startswith("Vela leaves it on the CPU of an Ethos-U55")
    assert "32-bit feature-maps are not supported" in u55["Concat"]["reason"]
    assert "Concat" not in u85


def test_an_operator_failing_only_at_the_graph_s_edge_is_a_warning_inside_it() -> None:
    """Less: Vela 5.2.0 stopped on the U55 probe, whose output is bool; inside a graph that was
    not measured: a warning that says so. The U85 places it on the NPU."""
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])
    nodes = [
        helper.make_node("Less", ["r", "zero"], ["neg"], name="less"),
        helper.make_node("Cast", ["neg"], ["f"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["r", "f"], ["y"], name="mul"),
    ]
    model = _conv_then(nodes, [1, 4, 8, 8], [zero])
    u55, u85 = _findings(model), _findings(model, "ethos_u85_256")
    assert u55["Less"]["severity"] == "warning"
    assert "inside the graph: not measured" in u55["Less"]["reason"]
    assert "Less" not in u85


def test_a_failure_measured_at_the_graph_s_edge_is_an_error_there_only() -> None:
    """Vela 5.2.0 stops on an Ethos-U55 graph whose output is bool (measured: "Non-passthrough
    operation ... could not run on NPU"): an error where the model's output is bool too."""
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])
    less = helper.make_node("Less", ["r", "zero"], ["y"], name="less")
    model = _conv_then([less], [1, 4, 8, 8], [zero])
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.BOOL
    found = _findings(model)
    assert found["Less"]["severity"] == "error"
    assert "Non-passthrough operation" in found["Less"]["reason"]
    assert "a bool tensor at the graph's edge" in found["Less"]["reason"]


def test_the_precheck_command_prints_the_prediction(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _conv_then([helper.make_node("Sqrt", ["r"], ["y"], name="sqrt")], [1, 4, 8, 8])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    assert main(["precheck", str(path), "--target", "ethos_u"]) == 0
    out = capsys.readouterr().out
    assert (
        "NPU placement predicted for ethos-u55-128 (Vela on the probe graphs): "
        "2 of 3 nodes on the NPU; on the CPU: Sqrt" in out
    )
    assert main(["precheck", str(path), "--target", "ethos_u", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["npu"]["cpu"] == {"Sqrt": 1}
    assert main(["precheck", str(path), "--target", "tflite_micro", "--json"]) == 0
    assert "npu" not in json.loads(capsys.readouterr().out)


@pytest.mark.slow
@needs_tflite
@needs.mark("vela")
@pytest.mark.parametrize(
    "probe",
    ["Conv", "Sqrt", "ReduceSum", "Gather int64 constant indices", "Add int64", "Where"],
)
def test_the_recorded_placement_is_what_vela_does_now(probe: str) -> None:
    """A probe converted and compiled again for every generation lands where targets/
    ethos_u.yaml says (the entry the precheck would read for it): a new Vela or converter that
    moves an operator fails here until `python -m edgeflow.targets.derive ethos_u --write`."""
    from edgeflow.targets.derive import first_input_dtype
    from edgeflow.targets.ethos_u.derive import measure
    from edgeflow.targets.probes import probes

    case = next(c for c in probes() if c.name == probe)
    placed, skipped = measure([case])
    assert not skipped
    recorded = load_profile("ethos_u").npu_placement
    for generation, now in placed[probe].items():
        assert now is not None
        spec = recorded[generation][case.op]
        dtype = first_input_dtype(case)
        entry = spec.checks.get(case.checker) or spec.dtypes.get(dtype) or spec
        assert (entry.placed, entry.cpu, entry.moves) == (now.placed, now.cpu, now.moves), (
            generation
        )


@needs.mark("vela")
def test_the_placement_names_the_vela_it_was_measured_with() -> None:
    from edgeflow.core import resources
    from edgeflow.targets.ethos_u import _vela

    text = (resources.builtin_dir("targets") / "ethos_u.yaml").read_text(encoding="utf-8")
    assert f"# Measured with Vela {_vela.version()} on the int8 .tflite" in text
