"""Bisection: cut points, prefixes whose outputs are every tensor crossing the cut, and the
binary search for the first failing one."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from edgeflow.stages.bisect import Attempt, cut_points, prefix, search


def _branchy() -> onnx.ModelProto:
    """x -> Relu a -> (Sigmoid b, Neg c) -> Mul d: the gate b branches off a."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Sigmoid", ["a"], ["b"], name="gate"),
        helper.make_node("Mul", ["a", "w"], ["c"], name="scale"),
        helper.make_node("Mul", ["b", "c"], ["d"], name="apply"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("d", T.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.full((1, 4), 2.0, np.float32), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return onnx.shape_inference.infer_shapes(model)


def test_a_prefix_outputs_every_tensor_that_crosses_the_cut() -> None:
    model = _branchy()
    points = cut_points(model)
    assert [p[0] for p in points] == ["a", "b", "c", "d"]
    outputs = [[o.name for o in prefix(model, points, k).graph.output] for k in range(4)]
    # after the gate, `a` is still read by `scale`: a wrong `a` cannot hide behind the gate
    assert outputs == [["a"], ["a", "b"], ["b", "c"], ["d"]]
    assert [n.name for n in prefix(model, points, 1).graph.node] == ["relu", "gate"]


def test_the_search_finds_the_first_failing_prefix_in_log2_attempts() -> None:
    for first_bad in (0, 1, 17, 40, 63):
        tried: list[int] = []

        def attempt(k: int, first_bad: int = first_bad, tried: list[int] = tried) -> Attempt:
            tried.append(k)
            return Attempt(k, f"t{k}", "Conv", f"n{k}", "diverges" if k >= first_bad else "ok")

        attempts = search(64, attempt)
        failing = min(a.index for a in attempts if a.failed)
        assert failing == first_bad
        assert tried[0] == 63 and len(tried) <= 1 + 6  # the whole model, then log2(64)
    passing = search(8, lambda k: Attempt(k, "t", "Conv", "n", "ok"))
    assert len(passing) == 1 and not passing[0].failed  # the whole model passes: done
