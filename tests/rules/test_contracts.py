"""Every rule's contract is enforced while a build runs: its input stays as it was, its
output passes the ONNX checker, and it computes what its input did within its tolerance. So
is every other graph-changing step (the optimize stage)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from edgeflow.core.errors import EdgeflowError, InternalError, StageFailed
from edgeflow.rules.apply import apply_rules
from edgeflow.rules.base import AstRule, OnnxRule, RewriteContext, RuleResult, RuleSpec
from edgeflow.rules.onnx.simplify import Simplify
from edgeflow.schema.sections import TensorSpec

SPECS = [TensorSpec(name="x", shape=[1, 4])]


def log_model(eps: float = 1e-10) -> onnx.ModelProto:
    """y = Log(x + eps) * 1: finite on silence (x = 0) only thanks to eps."""
    nodes = [
        helper.make_node("Add", ["x", "eps"], ["a"]),
        helper.make_node("Log", ["a"], ["l"]),
        helper.make_node("Mul", ["l", "one"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(eps, np.float32), "eps"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", T.FLOAT, [1, 4])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


class InPlace(OnnxRule):
    name = "user.in_place"
    description = "Edits its input model (forbidden)."

    def apply(self, model: Any, opts: Any, ctx: RewriteContext) -> RuleResult[Any]:
        model.graph.node[0].name = "renamed"
        return RuleResult(model, True, 1)


class Unchecked(OnnxRule):
    name = "user.unchecked"
    description = "Returns a model the ONNX checker refuses."

    def apply(self, model: Any, opts: Any, ctx: RewriteContext) -> RuleResult[Any]:
        out = onnx.ModelProto()
        out.CopyFrom(model)
        out.graph.node[1].input[0] = "nowhere"
        return RuleResult(out, True, 1)


class DropEpsilon(OnnxRule):
    name = "onnx.drop_epsilon"
    description = "Removes the + eps (what onnxscript's tolerant x + 0 rule did)."

    def apply(self, model: Any, opts: Any, ctx: RewriteContext) -> RuleResult[Any]:
        out = onnx.ModelProto()
        out.CopyFrom(model)
        out.graph.node[1].input[0] = "x"
        del out.graph.node[0]
        return RuleResult(out, True, 1)


def spec(rule: type, source: str) -> RuleSpec:
    return RuleSpec(rule, rule.Options(), source)


def run(model: Any, *specs: RuleSpec) -> Any:
    return apply_rules(model, list(specs), ("ast", "fx", "onnx"), RewriteContext(SPECS))


def test_a_rule_that_changes_its_input_in_place_is_refused() -> None:
    with pytest.raises(EdgeflowError, match="changed its input model in place"):
        run(log_model(), spec(InPlace, "rules.py:InPlace"))


def test_a_rule_whose_output_fails_the_onnx_checker_is_refused() -> None:
    with pytest.raises(EdgeflowError, match="its output fails the ONNX checker"):
        run(log_model(), spec(Unchecked, "rules.py:Unchecked"))


def test_a_built_in_rule_breaking_its_tolerance_is_a_bug_naming_the_rules_before_it() -> None:
    simplify = RuleSpec(Simplify, Simplify.Options(), "onnx.simplify")
    with pytest.raises(InternalError) as info:
        run(log_model(), simplify, spec(DropEpsilon, "onnx.drop_epsilon"))
    message = str(info.value)
    assert message.startswith("internal error in rule 'onnx.drop_epsilon' (a bug in edgeflow)")
    assert "becomes NaN or Inf on the declared all-zero inputs" in message
    assert message.endswith("(rules before it: onnx.simplify)")


def test_records_say_what_was_checked() -> None:
    _, [record], _ = run(log_model(), RuleSpec(Simplify, Simplify.Options(), "onnx.simplify"))
    assert record["contract"] == [
        "input left unchanged",
        "ONNX checker",
        "outputs within tolerance 0.0001 on random and all-zero inputs",
    ]


def test_records_count_the_operators_a_rule_changed() -> None:
    """What report.md and report.html show per rule: its operator (ONNX) or layer (PyTorch)
    counts before and after."""
    from edgeflow.report.markdown import rule_lines
    from edgeflow.rules.fx.fuse import FuseConvBn

    _, [record], _ = run(log_model(), RuleSpec(Simplify, Simplify.Options(), "onnx.simplify"))
    assert record["ops"] == {
        "kind": "operators",
        "before": {"Add": 1, "Log": 1, "Mul": 1},
        "after": {"Add": 1, "Log": 1},
    }
    assert "    - operators: Mul 1 -> 0" in rule_lines(record)

    module = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2)).eval()
    images = [TensorSpec(name="x", shape=[1, 1, 6, 6])]
    fuse = RuleSpec(FuseConvBn, FuseConvBn.Options(), "fx.fuse_conv_bn")
    _, [record], _ = apply_rules(module, [fuse], ("fx",), RewriteContext(images))
    assert record["ops"]["kind"] == "layers"
    assert record["ops"]["before"] == {"BatchNorm2d": 1, "Conv2d": 1}
    assert record["ops"]["after"] == {"Conv2d": 1}


def test_onnxscripts_optimizer_keeps_an_epsilon_and_exact_no_ops_go() -> None:
    """onnxscript matches x + 0 within 1e-8: it deleted the + 1e-10 before a Log, and the
    float build of an audio model output NaN on silence. edgeflow's pass list keeps it."""
    import onnxruntime as ort

    from edgeflow.rules.onnx.simplify import simplify

    out = simplify(log_model())
    assert [n.op_type for n in out.graph.node] == ["Add", "Log"]  # the * 1 is gone
    silence = {"x": np.zeros((1, 4), np.float32)}
    [y] = ort.InferenceSession(out.SerializeToString()).run(None, silence)
    assert np.allclose(y, np.log(np.float32(1e-10)))
    assert [n.op_type for n in simplify(log_model(eps=0.0)).graph.node] == ["Log"]


def test_the_optimize_stage_names_the_step_that_changed_the_model() -> None:
    from edgeflow.rules import contract
    from edgeflow.stages.optimize import _checked

    feeds = contract.probes(SPECS)
    broken = DropEpsilon().apply(log_model(), None, RewriteContext(SPECS)).model
    with pytest.raises(StageFailed) as info:
        _checked("onnxscript's optimizer", broken, contract.onnx_outputs(log_model(), feeds),
                 feeds, "optimize.onnxscript: false")  # fmt: skip
    assert "onnxscript's optimizer changed what the model computes: output 0" in info.value.message
    assert "set optimize.onnxscript: false" in str(info.value.hint)


class Rebind(AstRule):
    name = "user.rebind"
    description = "Rebinds the input module's forward (forbidden)."
    Scale: ClassVar[float] = 3.0

    def apply(self, model: Any, opts: Any, ctx: RewriteContext) -> RuleResult[Any]:
        inner = model.forward
        model.forward = lambda x: inner(x) * self.Scale
        return RuleResult(model, True, 1)


def test_a_torch_rule_that_rebinds_its_inputs_forward_is_refused() -> None:
    class Tiny(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

    with pytest.raises(EdgeflowError, match="changed its input model in place"):
        run(Tiny(), spec(Rebind, "rules.py:Rebind"))


def test_a_rule_that_narrows_an_integer_input_is_fed_the_same_values_narrowed() -> None:
    """onnx.int64_to_int32 with io: int32 makes an int64 input int32, as its option says; its
    contract is checked on the same token ids as int32 (it was an internal error: onnxruntime
    refused the int64 feed of the int32 input)."""
    from edgeflow.rules.onnx.casts import Int64ToInt32

    table = numpy_helper.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)],
        "lookup",
        [helper.make_tensor_value_info("ids", T.INT64, [1, 3])],
        [helper.make_tensor_value_info("y", T.FLOAT, [1, 3, 4])],
        [table],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    ids = [TensorSpec(name="ids", shape=[1, 3], dtype="int64")]
    narrowing = RuleSpec(Int64ToInt32, Int64ToInt32.Options(io="int32"), "rewrites[0]")
    out, [record], _ = apply_rules(model, [narrowing], ("onnx",), RewriteContext(ids))
    assert out.graph.input[0].type.tensor_type.elem_type == T.INT32
    assert "outputs within tolerance 0 on random and all-zero inputs" in record["contract"]
    # a reference run of the narrowed graph (the fallback search's, the diff's) is fed the
    # recipe's int64 ids too; ids beyond int32 are fed as they are, and onnxruntime refuses them
    from edgeflow.verify.runners import OnnxRunner

    runner = OnnxRunner.checking(out.SerializeToString())
    [y] = runner.run({"ids": np.array([[1, 9, 0]], np.int64)})
    np.testing.assert_array_equal(y[0, 1], [36, 37, 38, 39])
    with pytest.raises(Exception, match="int64"):
        runner.run({"ids": np.array([[1, 2**40, 0]], np.int64)})
