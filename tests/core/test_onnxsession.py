"""Checking sessions: onnxruntime without its graph optimizer, on a streaming model's constant
`If` (a sample-rate initializer the graph branches on, static input shapes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from edgeflow.core.onnxsession import checking_session
from edgeflow.rules import contract


def _sample_rate_if() -> onnx.ModelProto:
    """y = If(Equal(sr, 16000)): x * 2 + state (then) or x + 1 (else); `sr` = 16000 a 0-D
    int64 initializer, x [1, 16] static: what a streaming audio model's export holds."""
    then = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "two"], ["doubled"]),
            helper.make_node("Add", ["doubled", "state"], ["then_y"]),
        ],
        "then",
        [],
        [helper.make_tensor_value_info("then_y", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])],
    )
    other = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["else_y"])],
        "else",
        [],
        [helper.make_tensor_value_info("else_y", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Equal", ["sr", "k16000"], ["is_16k"]),
            helper.make_node("If", ["is_16k"], ["y"], then_branch=then, else_branch=other),
        ],
        "stream",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16]),
            helper.make_tensor_value_info("state", TensorProto.FLOAT, [1, 16]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
        [
            helper.make_tensor("sr", TensorProto.INT64, [], [16000]),
            helper.make_tensor("k16000", TensorProto.INT64, [], [16000]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def _feeds() -> dict[str, np.ndarray]:
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    return {"x": x, "state": np.full((1, 16), 0.5, np.float32)}


def test_a_checking_session_has_no_graph_optimizations_from_any_form(tmp_path: Path) -> None:
    model = _sample_rate_if()
    path = tmp_path / "stream.onnx"
    onnx.save(model, str(path))
    want = _feeds()["x"] * 2 + 0.5  # the then branch: sr is 16000
    for form in (model, model.SerializeToString(), path, str(path)):
        session = checking_session(form)
        options = session.get_session_options()
        assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        assert session.get_providers() == ["CPUExecutionProvider"]
        np.testing.assert_array_equal(session.run(None, _feeds())[0], want)


def test_the_rules_contract_runs_a_constant_if_without_the_optimizer() -> None:
    """The contract's reference (rules, the optimize stage) computes the branch sr selects;
    onnxruntime 1.32 with its optimizer happens to load this small one too (the issue's
    InlineIfSubgraph failure needs a larger export), so the test pins the session's options
    above and the numbers here."""
    outputs = contract.onnx_outputs(_sample_rate_if(), [_feeds()])
    assert outputs.error is None and outputs.per_probe is not None
    np.testing.assert_array_equal(outputs.per_probe[0][0], _feeds()["x"] * 2 + 0.5)
