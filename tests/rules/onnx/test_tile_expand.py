"""Tile and Expand for targets without them: onnx.tile_to_concat, and the constant folding
that already removes a Tile or Expand of a constant."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from edgeflow.rules.onnx.indexing import TileToConcat
from edgeflow.rules.onnx.simplify import Simplify
from edgeflow.targets import load_profile
from edgeflow.targets.precheck import check
from tests.rules.onnx.helpers import apply, feeds, model, ops, run, specs
from tests.rules.sites import outcomes

F = T.FLOAT


def tile(repeats: list[int], constant: bool = False) -> onnx.ModelProto:
    """y = Tile(Relu(x), repeats) + 1 for x [1, 3, 4]; with `constant`, Tile(c) + x where c is
    a Constant node of x's shape divided by the repeats."""
    reps = {"r": np.array(repeats, np.int64), "one": np.ones(1, np.float32)}
    if constant:
        c = np.arange(12, dtype=np.float32).reshape(1, 3, 4)
        nodes = [
            helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(c)),
            helper.make_node("Tile", ["c", "r"], ["t"], name="tile"),
            helper.make_node("Add", ["t", "x"], ["y"]),
        ]
        shape = [d * r for d, r in zip([1, 3, 4], repeats, strict=True)]
        return model(nodes, [("x", F, shape)], [("y", F, shape)], reps)
    nodes = [
        helper.make_node("Relu", ["x"], ["h"]),
        helper.make_node("Tile", ["h", "r"], ["t"], name="tile"),
        helper.make_node("Add", ["t", "one"], ["y"]),
    ]
    return model(nodes, [("x", F, [1, 3, 4])], [("y", F, None)], reps)


def assert_same(a: onnx.ModelProto, b: onnx.ModelProto) -> None:
    x = feeds(specs(a))
    for got, want in zip(run(b, x), run(a, x), strict=True):
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("repeats", "concats"), [([1, 2, 3], 2), ([2, 1, 1], 1), ([1, 1, 1], 0), ([3, 2, 2], 3)]
)
def test_a_tile_of_a_runtime_tensor_is_a_concat_per_repeated_axis(
    repeats: list[int], concats: int
) -> None:
    m = tile(repeats)
    result = apply(TileToConcat, m)
    assert outcomes(result) == [("changed", "tile")] and result.matches == 1
    counts = ops(result.model)
    assert "Tile" not in counts and counts.get("Concat", 0) == concats
    assert_same(m, result.model)


def test_a_tile_of_a_constant_is_the_tiled_constant() -> None:
    m = tile([2, 1, 3], constant=True)
    result = apply(TileToConcat, m)
    assert outcomes(result) == [("changed", "tile")]
    assert "Tile" not in ops(result.model) and "Concat" not in ops(result.model)
    assert_same(m, result.model)


def test_dynamic_or_zero_repeats_are_kept() -> None:
    dynamic = tile([1, 2, 1])
    dynamic.graph.initializer.pop(0)
    dynamic.graph.input.append(helper.make_tensor_value_info("r", T.INT64, [3]))
    for m in (dynamic, tile([1, 0, 2])):
        result = apply(TileToConcat, m, specs(m, {"r": [3]}))
        assert outcomes(result) == [("kept", "tile")] and not result.changed


@pytest.mark.parametrize("target", ["tflite_micro", "armnn"])
def test_the_precheck_suggests_it_where_the_target_has_no_tile(target: str) -> None:
    """Measured (targets/*.yaml): TFLite Micro and Arm NN 22 have no TILE; LiteRT has."""
    m = tile([1, 2, 3])
    profile = load_profile(target)
    [finding] = [f for f in check(m, profile) if f.operator == "Tile"]
    assert finding.rule == "onnx.tile_to_concat"
    assert not [f for f in check(apply(TileToConcat, m).model, profile) if f.operator == "Tile"]


@pytest.mark.parametrize("op", ["Expand", "Tile"])
def test_the_optimizers_constant_folding_already_folds_an_expand_or_tile_of_a_constant(
    op: str,
) -> None:
    """onnx.simplify (the optimize stage's onnxscript step, on by default) folds both when
    their data is a constant (measured: the Add then reads a [2, 3, 4] initializer); an
    Expand of a runtime tensor needs no rule: every TFLite-family profile runs it (as MUL)."""
    c = np.arange(4, dtype=np.float32).reshape(1, 1, 4)
    shape = np.array([2, 3, 4] if op == "Expand" else [2, 3, 1], np.int64)
    nodes = [
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(c)),
        helper.make_node(op, ["c", "s"], ["e"]),
        helper.make_node("Add", ["x", "e"], ["y"]),
    ]
    m = model(nodes, [("x", F, [2, 3, 4])], [("y", F, [2, 3, 4])], {"s": shape})
    result = apply(Simplify, m)
    assert ops(result.model) == {"Add": 1}
    assert_same(m, result.model)
    for target in ("tflite", "tflite_micro", "armnn"):
        assert "Expand" in (load_profile(target).operators or {})
