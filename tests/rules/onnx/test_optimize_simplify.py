"""onnx.optimize (onnxoptimizer passes) and onnx.simplify (onnxscript's optimizer)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper
from pydantic import ValidationError

from edgeflow.rules.onnx.optimize import Optimize
from edgeflow.rules.onnx.simplify import Simplify
from tests.rules.onnx.helpers import apply, feeds, model, ops, run, specs
from tests.rules.sites import outcomes


def same_outputs(a: onnx.ModelProto, b: onnx.ModelProto, tol: float) -> None:
    x = feeds(specs(a, {"x": [2, 3, 8, 8]}), seed=3, scale=1.0)
    np.testing.assert_allclose(run(b, x)[0], run(a, x)[0], rtol=tol, atol=tol)


def test_optimize_default_passes_fold_bn_and_identities(convbn: onnx.ModelProto) -> None:
    assert "BatchNormalization" in ops(convbn)
    result = apply(Optimize, convbn)
    assert result.changed and ("changed", "BatchNormalization") in outcomes(result)
    assert "BatchNormalization" not in ops(result.model)
    same_outputs(convbn, result.model, Optimize().tolerance(Optimize.Options()))


def test_optimize_runs_only_the_named_passes() -> None:
    nodes = [
        helper.make_node("Identity", ["x"], ["i"]),
        helper.make_node("Transpose", ["i"], ["t"], perm=[0, 1]),  # a no-op transpose
        helper.make_node("Relu", ["t"], ["y"]),
    ]
    m = model(nodes, [("x", T.FLOAT, [2, 3])], [("y", T.FLOAT, [2, 3])])
    result = apply(Optimize, m, passes=["eliminate_identity"])
    assert ops(result.model) == {"Transpose": 1, "Relu": 1}
    assert ops(apply(Optimize, m).model) == {"Relu": 1}
    x = feeds(specs(m))
    np.testing.assert_array_equal(run(result.model, x)[0], run(m, x)[0])


def test_optimize_unknown_pass_suggests_the_closest() -> None:
    with pytest.raises(ValidationError, match="unknown onnxoptimizer pass 'fuse_bn_into_conw'"):
        Optimize.Options(passes=["fuse_bn_into_conw"])
    try:
        Optimize.Options(passes=["fuse_bn_into_conw"])
    except ValidationError as exc:
        assert "did you mean 'fuse_bn_into_conv'" in exc.errors()[0]["ctx"]["hint"]


def test_optimize_with_nothing_to_do() -> None:
    m = model(
        [helper.make_node("Relu", ["x"], ["y"])], [("x", T.FLOAT, [2])], [("y", T.FLOAT, [2])]
    )
    result = apply(Optimize, m)
    assert not result.changed and outcomes(result) == [("not_applicable", "")]


def test_simplify_folds_bn_constants_and_identities(convbn: onnx.ModelProto) -> None:
    result = apply(Simplify, convbn)
    after = ops(result.model)
    assert not {"BatchNormalization", "Constant"} & after.keys()
    assert sum(after.values()) < sum(ops(convbn).values())
    assert after["Conv"] == 1
    same_outputs(convbn, result.model, Simplify().tolerance(Simplify.Options()))


def test_simplify_removes_dead_code_and_folds_constant_math() -> None:
    nodes = [
        helper.make_node("Add", ["a", "b"], ["c"]),  # constant: folds
        helper.make_node("Mul", ["x", "c"], ["y"]),
        helper.make_node("Neg", ["x"], ["dead"]),  # unused: removed
    ]
    m = model(
        nodes,
        [("x", T.FLOAT, [3])],
        [("y", T.FLOAT, [3])],
        {"a": np.ones(3, np.float32), "b": np.full(3, 2, np.float32)},
    )
    result = apply(Simplify, m)
    assert ops(result.model) == {"Mul": 1}
    x = {"x": np.arange(3, dtype=np.float32)}
    np.testing.assert_array_equal(run(result.model, x)[0], [0, 3, 6])
    assert not apply(Simplify, result.model).changed


def _dynamic_reshape(opset: int) -> onnx.ModelProto:
    """x [N, 3, 4] -> Reshape(x, Concat(Shape(x)[0], -1)) -> Relu, with the exporter's
    value_info [N, 12] on the Reshape: onnxscript's MaterializeReshapeShape makes the shape
    the constant [-1, 12], with `allowzero=1`."""
    from onnx import numpy_helper

    graph = helper.make_graph(
        [
            helper.make_node("Shape", ["x"], ["shape"]),
            helper.make_node("Gather", ["shape", "first"], ["batch"], axis=0),
            helper.make_node("Concat", ["batch", "rest"], ["target"], axis=0),
            helper.make_node("Reshape", ["x", "target"], ["flat"]),
            helper.make_node("Relu", ["flat"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", T.FLOAT, ["N", 3, 4])],
        [helper.make_tensor_value_info("y", T.FLOAT, ["N", 12])],
        [
            numpy_helper.from_array(np.array([0], np.int64), "first"),
            numpy_helper.from_array(np.array([-1], np.int64), "rest"),
        ],
        value_info=[helper.make_tensor_value_info("flat", T.FLOAT, ["N", 12])],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 7
    onnx.checker.check_model(m, full_check=True)
    return m


def test_simplify_writes_no_reshape_allowzero_before_opset_14() -> None:
    """An opset-12 file: the shape chain is folded to a constant and the Reshape has no
    `allowzero` (which onnx.checker and onnxruntime refuse there); at opset 14 onnxscript's
    own rule writes it."""
    import onnxruntime as ort

    old = _dynamic_reshape(12)
    result = apply(Simplify, old)
    assert ops(result.model) == {"Reshape": 1, "Relu": 1}
    reshape = next(n for n in result.model.graph.node if n.op_type == "Reshape")
    assert [a.name for a in reshape.attribute] == []
    onnx.checker.check_model(result.model, full_check=True)
    ort.InferenceSession(result.model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = {"x": np.random.default_rng(0).standard_normal((5, 3, 4)).astype(np.float32)}
    np.testing.assert_array_equal(run(result.model, x)[0], run(old, x)[0])
    assert apply(Simplify, result.model).model == result.model  # idempotent

    new = apply(Simplify, _dynamic_reshape(14)).model
    reshape = next(n for n in new.graph.node if n.op_type == "Reshape")
    assert [(a.name, a.i) for a in reshape.attribute] == [("allowzero", 1)]
