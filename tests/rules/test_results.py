"""A rule's outcome as data: sites, what RuleResult derives from them, what the stages record."""

from __future__ import annotations

from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper

from edgeflow.report.markdown import MAX_SITES, rule_lines
from edgeflow.rules.apply import apply_rules
from edgeflow.rules.base import (
    GraphOrigin,
    OnnxRule,
    RewriteContext,
    RuleOptions,
    RuleResult,
    RuleSpec,
    Site,
    Status,
)
from tests.rules.sites import outcomes


def test_changed_and_matches_follow_from_the_sites() -> None:
    result = RuleResult(
        "m", sites=[Site.changed("a", "done"), Site.kept("b", "why"), Site.changed("c", "done")]
    )
    assert result.changed and result.matches == 2
    assert [s.where for s in result.sites_of(Status.KEPT)] == ["b"]
    nothing = RuleResult("m", sites=[Site.not_applicable("none here")])
    assert not nothing.changed and nothing.matches == 0
    assert nothing.sites[0].where == ""  # the model as a whole


def test_a_whole_graph_site_may_stand_for_many_matches() -> None:
    result = RuleResult("m", matches=7, sites=[Site.changed("", "nodes 12 -> 5")])
    assert result.changed and result.matches == 7


def test_changed_must_agree_with_the_sites() -> None:
    with pytest.raises(ValueError, match="changed=True"):
        RuleResult("m", True, sites=[Site.kept("a", "why")])
    with pytest.raises(ValueError, match="changed=False"):
        RuleResult("m", False, sites=[Site.changed("a", "done")])
    with pytest.raises(ValueError, match="matches=2"):
        RuleResult("m", matches=2, sites=[Site.kept("a", "why")])


def test_reasons_of_rules_written_before_sites_become_sites() -> None:
    changed = RuleResult("m", True, 3, ["removed 3 Identity"])
    assert changed.changed and changed.matches == 3
    assert outcomes(changed) == [("changed", "")]
    kept = RuleResult("m", False, 0, ["nothing to do"], {"x.py": "pass\n"})
    assert outcomes(kept) == [("not_applicable", "")] and kept.sources == {"x.py": "pass\n"}
    assert not RuleResult("m", True, 1).sites  # changed, nothing said: allowed


def test_record_is_data() -> None:
    result = RuleResult(
        "m",
        sites=[Site.changed("bn (BatchNorm2d)", "folded into conv (Conv2d)")],
        graph=GraphOrigin("symbolic_trace"),
    )
    assert result.record() == {
        "changed": True,
        "matches": 1,
        "graph": {"kind": "symbolic_trace", "note": ""},
        "sites": [
            {
                "status": "changed",
                "where": "bn (BatchNorm2d)",
                "message": "folded into conv (Conv2d)",
            }
        ],
    }


class MarkRelu(OnnxRule):
    """A user rule that reports sites: it keeps every Relu, and says so."""

    name = "user.mark_relu"
    description = "Keep every Relu."

    class Options(RuleOptions):
        pass

    def apply(self, model: Any, opts: Any, ctx: RewriteContext) -> RuleResult[Any]:
        relus = [n for n in model.graph.node if n.op_type == "Relu"]
        sites = [Site.kept(n.name, "left as it is") for n in relus]
        return RuleResult(model, sites=sites or [Site.not_applicable("no Relu")])


def test_the_stages_records_hold_the_sites() -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="act")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    spec = RuleSpec(MarkRelu, MarkRelu.Options(), "rules.py:MarkRelu")
    out, [record], _ = apply_rules(model, [spec], ("onnx",), RewriteContext([]), check=False)
    assert out is model
    assert record["rule"] == "user.mark_relu" and not record["changed"]
    assert [(s["status"], s["where"]) for s in record["sites"]] == [("kept", "act")]
    onnx.checker.check_model(out)


def test_the_report_renders_each_site_under_its_rule() -> None:
    sites = [Site.changed(f"n{i}", "rewritten").record() for i in range(MAX_SITES + 3)]
    record = {"rule": "onnx.x", "changed": True, "matches": len(sites), "sites": sites}
    lines = rule_lines({**record, "graph": {"kind": "torch.export", "note": "why"}})
    assert lines[0] == f"  - `onnx.x`: changed, {MAX_SITES + 3} matches"
    assert lines[1] == "    - graph from torch.export: why"
    assert lines[2] == "    - changed `n0`: rewritten"
    assert len(lines) == 2 + MAX_SITES + 1 and "3 more" in lines[-1]
    nothing = Site.not_applicable("no x").record()
    lines = rule_lines({"rule": "r", "changed": False, "matches": 0, "sites": [nothing]})
    assert lines == ["  - `r`: no change, 0 matches", "    - nothing to do: no x"]
