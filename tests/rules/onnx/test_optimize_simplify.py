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
