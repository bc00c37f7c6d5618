"""`rewrites: auto`: the rules the precheck proves remove a finding, applied before its verdict."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgeflow.rules.apply import apply_rules
from edgeflow.rules.base import RewriteContext, RuleSpec
from edgeflow.targets import load_profile
from edgeflow.targets.auto_rewrites import search
from edgeflow.targets.precheck import _input_specs, check, errors, to_json


def _model(opset: int, ops: list[str]) -> onnx.ModelProto:
    """x [1, 4] through `ops` (one-input float ops) in a chain."""
    nodes, name = [], "x"
    for i, op in enumerate(ops):
        nodes.append(helper.make_node(op, [name], [f"t{i}"], name=f"n{i}"))
        name = f"t{i}"
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _apply(applied: list[str]) -> Any:
    def apply(spec: RuleSpec, model: Any) -> Any:
        ctx = RewriteContext(_input_specs(model))  # the contract's probes: the graph's inputs
        rewritten, _, _ = apply_rules(model, [spec], ("onnx",), ctx)
        applied.append(spec.name)
        return rewritten

    return apply


def test_each_error_is_removed_by_the_rule_that_removes_the_most() -> None:
    profile = load_profile("tflite")
    model = _model(9, ["Relu", "Erf"])  # opset 9 (tflite takes 11..20), Erf
    before = errors(to_json(check(model, profile)))
    assert {f["operator"] for f in before} == {"(opset)", "Erf"}
    applied: list[str] = []
    original = copy.deepcopy(model)
    rewritten, found = search(model, profile, "none", _apply(applied))
    assert model == original  # the input is left as it was
    assert found.errors_before == 2 and found.errors_left == []
    assert [s.rule for s in found.steps] == applied == ["onnx.convert_opset", "onnx.decompose"]
    assert found.steps[0].options == {"opset": 11}  # the lowest opset the target accepts
    assert found.steps[0].removed == ["(opset): opset 9 is outside the target's 11..20"]
    assert found.steps[-1].errors_left == 0
    assert errors(to_json(check(rewritten, profile))) == []
    entries = [step.entry for step in found.steps]
    assert entries[0] == "{rule: onnx.convert_opset, opset: 11}"
    assert entries[1].startswith("{rule: onnx.decompose")
    assert [c["rule"] for c in found.record()["chosen"]] == applied
    x = np.linspace(-2, 2, 4, dtype=np.float32)[None]
    import onnxruntime as ort

    def run(m: onnx.ModelProto) -> np.ndarray:
        session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(None, {"x": x})[0]

    np.testing.assert_allclose(run(rewritten), run(original), atol=1e-6)


def test_a_model_that_passes_is_left_alone_and_a_rule_the_recipe_lists_is_not_tried() -> None:
    profile = load_profile("tflite")
    applied: list[str] = []
    clean = _model(13, ["Relu", "Sigmoid"])
    rewritten, found = search(clean, profile, "none", _apply(applied))
    assert rewritten is clean and found.steps == [] and applied == []
    model = _model(13, ["Erf"])
    _, found = search(model, profile, "none", _apply(applied), frozenset({"onnx.decompose"}))
    assert applied == [] and found.errors_left == ["Erf: not supported by tflite"]


@pytest.mark.parametrize("target", ["onnxruntime_micro", "tflite_micro", "armnn"])
def test_what_no_rule_removes_is_left_for_the_precheck(target: str) -> None:
    """An operator nothing lowers stays a finding: the search stops, it never loops."""
    profile = load_profile(target)
    model = _model(13, ["Relu", "Erf", "Relu"])
    model.graph.node[0].op_type = "Hardmax"  # no rule declares it
    applied: list[str] = []
    _, found = search(model, profile, "none", _apply(applied))
    left = errors(to_json(check(model, profile)))
    assert len(found.errors_left) <= len(left)
    assert all("Hardmax" not in s.removed for s in found.steps)
    assert len(applied) == len(found.steps) <= 2


def test_a_rule_that_adds_errors_is_taken_with_the_rules_that_remove_them() -> None:
    """armnn: LayerNormalization decomposed brings a Sqrt and 1-D operands, which
    onnx.sqrt_newton and onnx.explicit_broadcast then remove: taken as one step."""
    profile = load_profile("armnn")
    rng = np.random.default_rng(0)
    scale, bias = (
        helper.make_tensor(n, TensorProto.FLOAT, [8], rng.standard_normal(8).tolist())
        for n in ("g", "b")
    )
    node = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])],
        [scale, bias],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    applied: list[str] = []
    rewritten, found = search(model, profile, "none", _apply(applied))
    assert found.errors_left == [] and errors(to_json(check(rewritten, profile))) == []
    assert applied[0] == "onnx.decompose"
    assert set(applied[1:]) == {"onnx.sqrt_newton", "onnx.explicit_broadcast"}
    assert found.steps[0].added  # what the next rules removed
    x = rng.standard_normal((1, 4, 8)).astype(np.float32)
    import onnxruntime as ort

    def run(m: onnx.ModelProto) -> np.ndarray:
        session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(None, {"x": x})[0]

    np.testing.assert_allclose(run(rewritten), run(model), atol=1e-4)
