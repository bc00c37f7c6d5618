"""onnx.cut: the graph up to named tensors, which become its outputs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from edgeflow.core.errors import EdgeflowError
from edgeflow.core.onnxgraph import copy_model
from edgeflow.rules.onnx.cut import Cut
from tests.rules.onnx.helpers import apply, feeds, model, ops, run, specs
from tests.rules.sites import outcomes


def with_outputs(m: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """The original model with extra outputs: onnxruntime's values of inner tensors."""
    out = copy_model(m)
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(m).graph.value_info}
    out.graph.output.extend(
        inferred[n] for n in names if n not in {o.name for o in out.graph.output}
    )
    return out


def relu_output(m: onnx.ModelProto) -> str:
    return next(n.output[0] for n in m.graph.node if n.op_type == "Relu")


def test_cut_at_an_inner_tensor(convbn: onnx.ModelProto) -> None:
    relu = relu_output(convbn)
    result = apply(Cut, convbn, outputs=[relu])
    after = ops(result.model)
    assert "Gemm" not in after and "Reshape" not in after and after["Relu"] == 1
    [out] = result.model.graph.output
    assert out.name == relu
    assert [d.dim_value or d.dim_param for d in out.type.tensor_type.shape.dim] == [
        "batch",
        4,
        6,
        6,
    ]
    assert {t.name for t in result.model.graph.initializer} == {
        t.name for t in convbn.graph.initializer if t.name.startswith(("conv", "bn"))
    }
    x = feeds(specs(convbn, {"x": [2, 3, 8, 8]}))
    want = run(with_outputs(convbn, [relu]), x)[1]
    np.testing.assert_array_equal(run(result.model, x)[0], want)


def test_several_outputs_in_the_given_order(convbn: onnx.ModelProto) -> None:
    conv = next(n.output[0] for n in convbn.graph.node if n.op_type == "Conv")
    result = apply(Cut, convbn, outputs=["y", conv])
    assert [o.name for o in result.model.graph.output] == ["y", conv]
    x = feeds(specs(convbn))
    full = run(with_outputs(convbn, [conv]), x)
    got = run(result.model, x)
    np.testing.assert_array_equal(got[0], full[0])
    np.testing.assert_array_equal(got[1], full[1])


def test_unknown_tensor_suggests_the_closest(convbn: onnx.ModelProto) -> None:
    relu = relu_output(convbn)
    with pytest.raises(EdgeflowError) as info:
        apply(Cut, convbn, outputs=[relu.replace("Relu", "Relu6")])
    assert info.value.message == f"the model has no tensor '{relu.replace('Relu', 'Relu6')}'"
    assert info.value.hint.startswith(f"did you mean '{relu}'? (tensors: ")


def test_prune_inputs_drops_inputs_the_cut_graph_does_not_read() -> None:
    nodes = [helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Add", ["r", "b"], ["y"])]
    m = model(nodes, [("a", T.FLOAT, [2]), ("b", T.FLOAT, [2])], [("y", T.FLOAT, [2])])
    kept = apply(Cut, m, outputs=["r"])
    assert [v.name for v in kept.model.graph.input] == ["a", "b"]
    pruned = apply(Cut, m, outputs=["r"], prune_inputs=True)
    assert [v.name for v in pruned.model.graph.input] == ["a"]
    assert ("changed", "b") in outcomes(pruned)  # the input no kept node reads, dropped
    got = run(pruned.model, {"a": np.array([-1, 2], np.float32)})[0]
    np.testing.assert_array_equal(got, [0, 2])


def test_a_tensor_of_unknown_rank_cannot_be_an_output() -> None:
    nodes = [
        helper.make_node("Foo", ["x"], ["f"], domain="my.ops"),
        helper.make_node("Relu", ["f"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [2])],
        [helper.make_tensor_value_info("y", T.FLOAT, [2])],
    )
    m = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("my.ops", 1)]
    )
    with pytest.raises(EdgeflowError, match="cannot infer the type and rank of tensor 'f'"):
        Cut().apply(m, Cut.Options(outputs=["f"]), None)  # type: ignore[arg-type]


def test_same_outputs_is_a_no_op(convbn: onnx.ModelProto) -> None:
    assert not apply(Cut, convbn, outputs=["y"]).changed
