"""onnx.cancel_transposes: a channel-last graph with a Transpose around every Conv (as jax2onnx
writes it) becomes channel-first inside, exactly; where nothing cancels, nothing changes."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper

from edgeflow.rules.onnx.transposes import CancelTransposes
from tests.rules.onnx.helpers import apply, feeds, model, ops, run, specs
from tests.rules.sites import outcomes

F = T.FLOAT
TO_NCHW, TO_NHWC = [0, 3, 1, 2], [0, 2, 3, 1]


def channel_last_block() -> onnx.ModelProto:
    """x [1, 16, 16, 16] NHWC -> (Transpose, Conv, Transpose) -> HardSwish -> (Transpose,
    Conv, Transpose) + x -> Relu: each Conv wrapped as a channel-last exporter wraps it."""
    rng = np.random.default_rng(0)
    weights = {
        f"w{i}": rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.1 for i in (1, 2)
    }
    nodes = [
        helper.make_node("Transpose", ["x"], ["a"], perm=TO_NCHW),
        helper.make_node("Conv", ["a", "w1"], ["b"], pads=[1, 1, 1, 1]),
        helper.make_node("Transpose", ["b"], ["c"], perm=TO_NHWC),
        helper.make_node("HardSwish", ["c"], ["d"]),
        helper.make_node("Transpose", ["d"], ["e"], perm=TO_NCHW),
        helper.make_node("Conv", ["e", "w2"], ["f"], pads=[1, 1, 1, 1]),
        helper.make_node("Transpose", ["f"], ["g"], perm=TO_NHWC),
        helper.make_node("Add", ["g", "x"], ["h"]),
        helper.make_node("Relu", ["h"], ["y"]),
    ]
    shape = [1, 16, 16, 16]
    return model(nodes, [("x", F, shape)], [("y", F, shape)], weights)


def test_inverse_pairs_around_the_convs_cancel_exactly() -> None:
    m = channel_last_block()
    result = apply(CancelTransposes, m)
    assert outcomes(result) == [("changed", "Transpose")]
    assert ops(m)["Transpose"] == 4
    assert ops(result.model).get("Transpose", 0) < 4
    assert ops(result.model)["Conv"] == 2
    assert {o.domain for o in result.model.opset_import} <= {"", "ai.onnx"}
    x = feeds(specs(m))
    for got, want in zip(run(result.model, x), run(m, x), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_model_where_nothing_cancels_is_left_as_it_was() -> None:
    nodes = [
        helper.make_node("Transpose", ["x"], ["a"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["a", "w"], ["y"]),
    ]
    w = {"w": np.ones((3, 5), np.float32)}
    m = model(nodes, [("x", F, [1, 3, 4])], [("y", F, [1, 4, 5])], w)
    result = apply(CancelTransposes, m)
    assert not result.changed and outcomes(result) == [("not_applicable", "")]
    plain = model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, [2])], [("y", F, [2])])
    assert outcomes(apply(CancelTransposes, plain)) == [("not_applicable", "")]
