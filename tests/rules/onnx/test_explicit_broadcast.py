"""onnx.explicit_broadcast: broadcast operands at the output's rank, Sum/Mean of unequal shapes
as Adds; and the tflite build it makes right (a rank-3 constant on a 4-D tensor was silently
wrong, a broadcasting Sum did not convert)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from edgeflow.rules.onnx.broadcast import ExplicitBroadcast
from edgeflow.targets import load_profile
from edgeflow.targets.precheck import check
from tests.rules.onnx.helpers import apply, feeds, model, ops, run, specs
from tests.rules.sites import outcomes

F = T.FLOAT
RNG = np.random.default_rng(0)


def broadcasting(opset: int = 18) -> onnx.ModelProto:
    """Mul by a [C, H, W] constant, Add of a computed rank-3 tensor, a scalar Sub, and a Mean
    and a three-input Sum whose inputs differ in shape, on x [1, 4, 8, 8]."""
    consts = {
        "chw": RNG.uniform(0.5, 2, (4, 8, 8)).astype(np.float32),
        "c11": RNG.standard_normal((1, 4, 1, 1)).astype(np.float32),
        "hw": RNG.standard_normal((1, 8, 8)).astype(np.float32),
        "half": np.array(0.5, np.float32),
    }
    nodes = [
        helper.make_node("Mul", ["x", "chw"], ["m"], name="mul"),
        helper.make_node("ReduceMean", ["x"], ["r"], axes=[0], keepdims=0)
        if opset < 18
        else helper.make_node("ReduceMean", ["x", "axes"], ["r"], keepdims=0),
        helper.make_node("Add", ["m", "r"], ["a"], name="add"),  # r: [4, 8, 8], computed
        helper.make_node("Sub", ["a", "half"], ["s"], name="sub"),  # a scalar stays
        helper.make_node("Mean", ["s", "c11"], ["mean"], name="mean"),
        helper.make_node("Sum", ["mean", "hw", "x"], ["y"], name="sum"),
    ]
    if opset >= 18:
        consts["axes"] = np.array([0], np.int64)
    return model(nodes, [("x", F, [1, 4, 8, 8])], [("y", F, [1, 4, 8, 8])], consts, opset=opset)


@pytest.mark.parametrize("opset", [11, 18])
def test_operands_get_the_output_rank_and_sums_become_adds(opset: int) -> None:
    m = broadcasting(opset)
    result = apply(ExplicitBroadcast, m)  # checker, idempotence, input untouched
    assert outcomes(result) == [
        ("changed", "mul"),
        ("changed", "add"),
        ("changed", "mean"),
        ("changed", "sum"),
    ]
    counts = ops(result.model)
    assert "Sum" not in counts and "Mean" not in counts
    assert (counts["Add"], counts["Div"], counts["Unsqueeze"]) == (4, 1, 1)
    inferred = onnx.shape_inference.infer_shapes(result.model).graph
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in (*inferred.value_info,)}
    ranks |= {t.name: len(t.dims) for t in inferred.initializer}
    for node in inferred.node:
        if node.op_type in ("Mul", "Add", "Div", "Sub"):
            assert {ranks.get(n, 4) for n in node.input} - {0} == {4}, node
    x = feeds(specs(m))
    np.testing.assert_allclose(run(result.model, x)[0], run(m, x)[0], rtol=1e-6, atol=1e-6)


def test_explicit_broadcasting_is_left_alone() -> None:
    nodes = [helper.make_node("Add", ["x", "b"], ["y"]), helper.make_node("Sum", ["y", "x"], ["z"])]
    b = {"b": np.ones((1, 4, 1, 1), np.float32)}
    m = model(nodes, [("x", F, [1, 4, 8, 8])], [("z", F, [1, 4, 8, 8])], b)
    result = apply(ExplicitBroadcast, m)
    assert not result.changed and ops(result.model) == {"Add": 1, "Sum": 1}


def test_the_precheck_names_the_rule_where_the_profile_measured_the_failure() -> None:
    """The tflite profile's Mul and Sum carry the checkers their variant probes failed."""
    profile = load_profile("tflite")
    assert profile.operators is not None
    assert "same_rank" in profile.operators["Mul"].checks
    assert "same_shapes" in profile.operators["Sum"].checks
    findings = {f.operator: f for f in check(broadcasting(), profile) if f.operator != "Add"}
    assert findings["Mul"].reason == "same_rank: inputs below 4-D: chw (3-D)"
    assert findings["Mul"].rule == "onnx.explicit_broadcast"
    assert findings["Sum"].reason.startswith("same_shapes: inputs of different shapes")
    assert findings["Sum"].rule == "onnx.explicit_broadcast"


@pytest.mark.slow
def test_a_tflite_build_of_implicit_broadcasts_verifies(tmp_path: Path) -> None:
    """Measured without the rule: onnx2tf's Mul by the [C, H, W] constant 0.52 of the output
    off; the Sum of unequal shapes does not convert. With it (a tflite default): verified."""
    from edgeflow.cli import main

    onnx.save(broadcasting(), str(tmp_path / "m.onnx"))
    data = RNG.standard_normal((4, 4, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "data.npz", x=data)
    (tmp_path / "r.yaml").write_text(
        "source: {kind: onnx, model: m.onnx, inputs: [{name: x, shape: [1, 4, 8, 8]}]}\n"
        "evaluation: {dataset: data.npz, metric: agreement}\n"
        "quantization: {mode: none}\n"
        "target: tflite\n"
        "verify: {latency_runs: 2, warmup_runs: 0, max_relative_diff: 1.0e-5}\n"
    )
    args = [f"cache_dir={tmp_path / 'c'}", f"build_dir={tmp_path / 'b'}"]
    assert main(["run", f"recipe={tmp_path / 'r.yaml'}", *args]) == 0
    metrics = json.loads((tmp_path / "b" / "r" / "tflite-none" / "metrics.json").read_text())
    assert metrics["verified"] is True
    assert metrics["agreement"]["max_relative_diff"] <= 1e-6
