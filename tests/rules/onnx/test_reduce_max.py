"""onnx.reduce_max_as_pool: ReduceMax over consecutive axes as a MaxPool whose window spans
them (Arm NN 22's parser has no REDUCE_MAX), exact, and built and verified on armnn."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from edgeflow.rules.onnx.conv_pool import ReduceMaxAsPool, SumAsMean
from edgeflow.targets import load_profile
from edgeflow.targets.precheck import check
from tests.rules.onnx.helpers import apply, feeds, model, ops, run, specs
from tests.rules.sites import outcomes
from tests.targets.conftest import build_on_armnn, needs_tflite
from tests.targets.test_armnn import needs_armnn

F = T.FLOAT


def reductions(opset: int, axes: list[int], keepdims: int) -> onnx.ModelProto:
    """y = ReduceMax(Relu(x), axes) for x [1, 3, 6, 5]: as AECMOS (speechmos) takes the max
    over frequency then time (axes [3], then [2], keepdims 0)."""
    inputs = ["h"]
    extra = {}
    if opset >= 18:
        extra["axes"] = np.array(axes, np.int64)
        inputs.append("axes")
        attrs = {"keepdims": keepdims}
    else:
        attrs = {"axes": axes, "keepdims": keepdims}
    nodes = [
        helper.make_node("Relu", ["x"], ["h"]),
        helper.make_node("ReduceMax", inputs, ["y"], name="max", **attrs),
    ]
    return model(nodes, [("x", F, [1, 3, 6, 5])], [("y", F, None)], extra, opset=opset)


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize(
    ("axes", "keepdims"), [([3], 0), ([2], 1), ([2, 3], 0), ([1, 2, 3], 1), ([-1], 0)]
)
def test_a_reduce_max_is_a_max_pool_of_the_same_values(
    opset: int, axes: list[int], keepdims: int
) -> None:
    m = reductions(opset, axes, keepdims)
    result = apply(ReduceMaxAsPool, m)
    assert outcomes(result) == [("changed", "max")]
    assert "ReduceMax" not in ops(result.model) and ops(result.model)["MaxPool"] == 1
    x = feeds(specs(m))
    for got, want in zip(run(result.model, x), run(m, x), strict=True):
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_axes_that_are_not_consecutive_are_kept() -> None:
    result = apply(ReduceMaxAsPool, reductions(13, [1, 3], 0))
    assert outcomes(result) == [("kept", "max")] and not result.changed


def test_the_armnn_precheck_suggests_it() -> None:
    """Measured (targets/armnn.yaml): the parser has no REDUCE_MAX."""
    m = reductions(13, [3], 0)
    profile = load_profile("armnn")
    [finding] = [f for f in check(m, profile) if f.operator == "ReduceMax"]
    assert finding.rule == "onnx.reduce_max_as_pool"
    after = apply(ReduceMaxAsPool, m).model
    assert not [f for f in check(after, profile) if f.operator == "ReduceMax"]


@pytest.mark.slow
@needs_tflite
@needs_armnn
@pytest.mark.parametrize("mode", ["none", "int8"])
def test_a_reduce_max_builds_and_verifies_on_armnn(
    mode: str, tmp_path: Path, shared_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before the rule, Arm NN failed at load: "Operator not supported ... REDUCE_MAX". The
    int8 build is exact too: a max pool keeps its input's scale."""
    m = model(
        [
            helper.make_node("Relu", ["x"], ["h"]),
            helper.make_node("ReduceMax", ["h"], ["f"], axes=[3], keepdims=0),
            helper.make_node("ReduceMax", ["f"], ["y"], axes=[2], keepdims=0),
        ],
        [("x", F, [1, 3, 6, 5])],
        [("y", F, [1, 3])],
        {},
        opset=9,
    )
    data = np.random.default_rng(1).standard_normal((16, 3, 6, 5)).astype(np.float32)
    out = build_on_armnn(m, data, mode, tmp_path, shared_cache, lambda: capsys.readouterr().err)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["verified"] is True
    if mode == "none":
        assert metrics["agreement"]["max_relative_diff"] == 0.0
    else:
        assert metrics["agreement"]["outputs"]["y"]["sqnr_db"] > 30


def sums(opset: int, axes: list[int], keepdims: int) -> onnx.ModelProto:
    """y = ReduceSum(Relu(x), axes) for x [1, 3, 6, 5]: the axes an input from opset 13, an
    attribute before."""
    inputs, extra, attrs = ["h"], {}, {"keepdims": keepdims}
    if axes and opset >= 13:
        extra["axes"] = np.array(axes, np.int64)
        inputs.append("axes")
    elif axes:
        attrs["axes"] = axes
    nodes = [
        helper.make_node("Relu", ["x"], ["h"]),
        helper.make_node("ReduceSum", inputs, ["y"], name="sum", **attrs),
    ]
    return model(nodes, [("x", F, [1, 3, 6, 5])], [("y", F, None)], extra, opset=opset)


@pytest.mark.parametrize("opset", [11, 13, 18])
@pytest.mark.parametrize(("axes", "keepdims"), [([1], 0), ([2, 3], 1), ([-1], 1), ([], 0)])
def test_a_reduce_sum_is_a_mean_times_its_count(opset: int, axes: list[int], keepdims: int) -> None:
    m = sums(opset, axes, keepdims)
    result = apply(SumAsMean, m)
    assert outcomes(result) == [("changed", "sum")]
    assert "ReduceSum" not in ops(result.model) and ops(result.model)["ReduceMean"] == 1
    x = feeds(specs(m))
    for got, want in zip(run(result.model, x), run(m, x), strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


def test_an_integer_sum_is_kept() -> None:
    m = model(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
        [("x", T.INT64, [2, 4])],
        [("y", T.INT64, [2])],
        {"axes": np.array([1], np.int64)},
    )
    assert outcomes(apply(SumAsMean, m)) == [("kept", "y")]


@pytest.mark.slow
@needs_tflite
@needs_armnn
def test_a_masked_mean_builds_and_verifies_on_armnn(
    tmp_path: Path, shared_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A transformer's masked mean pooling, sum(x * m) / sum(m): before the rule Arm NN failed
    at load ("Operator not supported ... SUM")."""
    n = helper.make_node
    axes = {"axes": np.array([1], np.int64), "m": (np.arange(6) < 4).astype(np.float32)}
    axes["m"] = axes["m"].reshape(1, 6, 1)
    m = model(
        [
            n("Mul", ["x", "m"], ["kept"]),
            n("ReduceSum", ["kept", "axes"], ["total"], keepdims=0),
            n("ReduceSum", ["m", "axes"], ["count"], keepdims=0),
            n("Div", ["total", "count"], ["y"]),
        ],
        [("x", F, [1, 6, 8])],
        [("y", F, [1, 8])],
        axes,
    )
    data = np.random.default_rng(1).standard_normal((16, 6, 8)).astype(np.float32)
    out = build_on_armnn(m, data, "none", tmp_path, shared_cache, lambda: capsys.readouterr().err)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["verified"] is True
    assert metrics["agreement"]["max_relative_diff"] < 1e-5
