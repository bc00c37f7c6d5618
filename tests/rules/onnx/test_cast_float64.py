"""onnx.cast_float64_to_float32: float64 everywhere -> float32, numerics kept."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as T
from onnx import helper

from edgeflow.rules.base import Status
from edgeflow.rules.onnx.casts import CastFloat64ToFloat32
from tests.rules.onnx.helpers import apply, feeds, model, run, specs
from tests.rules.sites import outcomes

D, F = T.DOUBLE, T.FLOAT


def doubles(m: onnx.ModelProto) -> list[str]:
    """Every place a float64 type survives, by name."""
    g = m.graph
    found = [t.name for t in g.initializer if t.data_type == D]
    found += [
        v.name for v in (*g.input, *g.output, *g.value_info) if v.type.tensor_type.elem_type == D
    ]
    for n in g.node:
        found += [n.name for a in n.attribute if a.type == a.TENSOR and a.t.data_type == D]
        found += [n.name for a in n.attribute if n.op_type == "Cast" and a.i == D]
    return found


@pytest.fixture
def mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node(
            "Constant",
            [],
            ["b"],
            name="const",
            value=onnx.numpy_helper.from_array(rng.standard_normal(4)),
        ),
        helper.make_node("Add", ["h", "b"], ["a"], name="add"),
        helper.make_node("Cast", ["s"], ["s64"], name="cast", to=D),
        helper.make_node("Mul", ["a", "s64"], ["m"], name="mul"),
        helper.make_node("Relu", ["m"], ["y"], name="relu"),
    ]
    m = model(
        nodes,
        [("x", D, [2, 3]), ("s", F, [2, 4])],
        [("y", D, [2, 4])],
        {"w": rng.standard_normal((3, 4))},
    )
    return onnx.shape_inference.infer_shapes(m)


def test_everything_becomes_float32_and_outputs_match(mlp: onnx.ModelProto) -> None:
    assert doubles(mlp)
    result = apply(CastFloat64ToFloat32, mlp, specs(mlp), io="float32")
    assert result.changed and doubles(result.model) == []
    x = feeds(specs(mlp))
    want = run(mlp, x)[0]
    got = run(result.model, {k: v.astype(np.float32) for k, v in x.items()})[0]
    assert got.dtype == np.float32
    # Outputs of order 10: float32 rounding stays far below the rule's declared 1e-4 on unit scale.
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_auto_keeps_declared_float64_inputs_behind_a_cast(mlp: onnx.ModelProto) -> None:
    result = apply(CastFloat64ToFloat32, mlp, specs(mlp))  # io: auto; recipe declares x float64
    g = result.model.graph
    assert g.input[0].type.tensor_type.elem_type == D
    assert g.node[0].op_type == "Cast" and g.node[0].input[0] == "x"
    assert g.output[0].type.tensor_type.elem_type == F
    x = feeds(specs(mlp))
    np.testing.assert_allclose(run(result.model, x)[0], run(mlp, x)[0], rtol=1e-5, atol=1e-5)
    assert ("kept", "x") in outcomes(result)  # the input stays float64, a Cast after it


def test_keep_leaves_the_interface_float64(mlp: onnx.ModelProto) -> None:
    result = apply(CastFloat64ToFloat32, mlp, specs(mlp), io="keep")
    g = result.model.graph
    assert [v.type.tensor_type.elem_type for v in (*g.input, *g.output)] == [D, F, D]
    assert g.node[0].op_type == "Cast" and g.node[-1].op_type == "Cast"
    assert sorted(doubles(result.model)) == ["x", "y", "y_f32"]  # interface + the output Cast
    x = feeds(specs(mlp))
    got = run(result.model, x)[0]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, run(mlp, x)[0], rtol=1e-5, atol=1e-5)


def test_float64_conv_onnxruntime_rejects_runs_after_rewrite() -> None:
    """onnxruntime 1.32 has no float64 Conv kernel: the original fails to load, the rewrite runs."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 3, 3, 3))
    m = model(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
        [("x", D, [1, 3, 8, 8])],
        [("y", D, [1, 4, 8, 8])],
        {"w": w},
    )
    x = rng.standard_normal((1, 3, 8, 8))
    with pytest.raises(Exception, match=r"NOT_IMPLEMENTED.*Conv"):
        run(m, {"x": x})
    result = apply(CastFloat64ToFloat32, m, specs(m), io="float32")
    got = run(result.model, {"x": x.astype(np.float32)})[0]
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_subgraphs_and_overflow_are_reported() -> None:
    branch = helper.make_graph(
        [
            helper.make_node(
                "Constant", [], ["c"], value=onnx.numpy_helper.from_array(np.array([1e300, 2.0]))
            )
        ],
        "then",
        [],
        [helper.make_tensor_value_info("c", D, [2])],
    )
    other = helper.make_graph(
        [
            helper.make_node(
                "Constant", [], ["d"], value=onnx.numpy_helper.from_array(np.array([3.0, 4.0]))
            )
        ],
        "else",
        [],
        [helper.make_tensor_value_info("d", D, [2])],
    )
    m = model(
        [helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=other)],
        [("cond", T.BOOL, [])],
        [("y", D, [2])],
    )
    result = apply(CastFloat64ToFloat32, m, [])
    assert len(result.sites_of(Status.CHANGED)) == 2  # the narrowing, one tensor overflowing
    got = run(result.model, {"cond": np.array(False)})[0]
    assert got.dtype == np.float32 and got.tolist() == [3.0, 4.0]


def test_a_float32_model_is_left_alone() -> None:
    m = model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, [2])], [("y", F, [2])])
    result = apply(CastFloat64ToFloat32, m)
    assert not result.changed and outcomes(result) == [("not_applicable", "")]


def test_a_float64_weight_exposed_as_an_input_is_retyped_with_its_initializer() -> None:
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["w"], ["wf"], to=F),
            helper.make_node("Add", ["x", "wf"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", F, [2]), helper.make_tensor_value_info("w", D, [2])],
        [helper.make_tensor_value_info("y", F, [2])],
        [onnx.numpy_helper.from_array(np.array([1.0, 2.0]), "w")],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    result = apply(CastFloat64ToFloat32, m, [], io="keep")
    assert result.model.graph.input[1].type.tensor_type.elem_type == F
    assert result.model.graph.initializer[0].data_type == F
    np.testing.assert_array_equal(run(result.model, {"x": np.zeros(2, np.float32)})[0], [1, 2])
