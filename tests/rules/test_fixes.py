"""What rules fix (edgeflow.rules.fixes): every declaration is well formed and something the
precheck or `edgeflow explain` reports, and they suggest only rules that declare what they
found."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T

import edgeflow.explain
import edgeflow.targets.precheck
from edgeflow.core.errors import EdgeflowError
from edgeflow.core.refs import ImportRef
from edgeflow.explain import BAKED, CAUSES, HAZARDS, _diagnose, rules_for
from edgeflow.rules import builtin_rules, rules_fixing
from edgeflow.rules.entries import options_for
from edgeflow.rules.fixes import CAPTURES, FINDINGS, Fix
from edgeflow.targets import load_profile
from edgeflow.targets.checkers import CHECKERS
from edgeflow.targets.findings import SETTINGS, suggest
from edgeflow.targets.precheck import check, check_memory
from edgeflow.targets.probes import single
from edgeflow.targets.profile import TargetProfile

RULES = builtin_rules()
DECLARED = sorted({fix for rule in RULES.values() for fix in rule.fixes}, key=repr)
X = [("x", T.FLOAT, [1, 4, 8, 8])]


def named(entry: str) -> str:
    """The rule an entry names: `{rule: fx.wrap_leaf, functions: <list>}` -> fx.wrap_leaf."""
    found = re.match(r"\{rule: ([\w.]+)", entry)
    return found.group(1) if found else entry


def followable(fix: Fix) -> list[str]:
    """The rules that declare `fix` whose entry can be written without the user's choices."""
    return [r.name for r in rules_fixing(fix) if options_for(r, fix) is not None]


def profile_with(**fields: Any) -> TargetProfile:
    return TargetProfile.model_validate(load_profile("tflite_micro").model_dump() | fields)


GROUPED = single("c", "Conv", X, {"w": np.ones((4, 2, 3, 3))}, {"group": 2}).model
# A node that fails each check.
CHECK_CASES: dict[tuple[str, str], onnx.ModelProto] = {
    ("Conv", "not_grouped"): GROUPED,
    ("Conv", "groups_one"): GROUPED,
    ("MaxPool", "pads_zero"): single(
        "m", "MaxPool", X, attrs={"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    ).model,
    ("Resize", "resize_nearest"): single(
        "r", "Resize", X, {"roi": np.zeros(0), "scales": [1, 1, 2, 2]}, {"mode": "linear"}
    ).model,
    ("Slice", "rank_at_most_4"): single(
        "s",
        "Slice",
        [("x", T.FLOAT, [2, 2, 2, 2, 2])],
        {k: np.array([v], np.int64) for k, v in (("starts", 0), ("ends", 1), ("axes", 0))},
    ).model,
    ("Slice", "slice_one_axis"): single(
        "s",
        "Slice",
        X,
        {
            k: np.array(v, np.int64)
            for k, v in (("starts", [0, 1]), ("ends", [2, 3]), ("axes", [1, 3]))
        },
    ).model,
    ("Pad", "pad_constant"): single(
        "p", "Pad", X, {"pads": np.array([0, 0, 1, 1] * 2, np.int64)}, {"mode": "reflect"}
    ).model,
    ("MaxPool", "no_partial_window"): single(
        "m", "MaxPool", X, attrs={"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}
    ).model,
    ("LSTM", "no_final_cell_state"): single(
        "l",
        "LSTM",
        [("x", T.FLOAT, [5, 1, 8])],
        {"W": np.ones((1, 64, 8)) / 8, "R": np.ones((1, 64, 16)) / 16},
        {"hidden_size": 16},
        outputs=3,
    ).model,
    # an embedding lookup at int64 ids the graph is given (TFLite Micro takes int32 ones)
    ("Gather", "computed_int32_indices"): single(
        "g", "Gather", [("table", T.FLOAT, [20, 8]), ("ids", T.INT64, [1, 5])]
    ).model,
    ("Pad", "pad_value_zero"): single(
        "p", "Pad", X, {"pads": np.array([0, 0, 1, 1] * 2, np.int64), "v": 1.5}
    ).model,
    ("Pad", "pad_all_axes"): single(
        "p",
        "Pad",
        X,
        {"pads": np.ones(4, np.int64), "v": 0.0, "axes": np.array([2, 3], np.int64)},
        opset=18,
    ).model,
    **{
        (op, "same_rank"): single(op, op, X, {"c": np.ones(X[0][2][1:])}).model
        for op in ("Add", "Sub", "Mul", "Div", "Max", "Min")
    },
    **{
        (op, "same_shapes"): single(op, op, X, {"c": np.ones([1] * len(X[0][2]))}).model
        for op in ("Sum", "Mean")
    },
}


def _internal_float64() -> onnx.ModelProto:
    """float32 in and out, float64 inside (Cast, Relu, Cast): as exporters emit it."""
    h = onnx.helper
    nodes = [
        h.make_node("Cast", ["x"], ["d"], to=T.DOUBLE),
        h.make_node("Relu", ["d"], ["r"]),
        h.make_node("Cast", ["r"], ["y"], to=T.FLOAT),
    ]
    io = [h.make_tensor_value_info(n, T.FLOAT, [1, 4]) for n in ("x", "y")]
    graph = h.make_graph(nodes, "f64", io[:1], io[1:])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def _int64_inside() -> onnx.ModelProto:
    """x + Cast(5 - Range(0, 4, 1)), the Range and Sub in int64: values the rule proves fit."""
    h = onnx.helper
    nodes = [
        h.make_node("Range", ["a", "b", "c"], ["r"]),
        h.make_node("Sub", ["five", "r"], ["s"]),
        h.make_node("Cast", ["s"], ["f"], to=T.FLOAT),
        h.make_node("Add", ["x", "f"], ["y"]),
    ]
    consts = (("a", 0), ("b", 4), ("c", 1), ("five", 5))
    inits = [onnx.numpy_helper.from_array(np.array(v, np.int64), n) for n, v in consts]
    io = [h.make_tensor_value_info(n, T.FLOAT, [4]) for n in ("x", "y")]
    graph = h.make_graph(nodes, "i64", io[:1], io[1:], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def _constant_if() -> onnx.ModelProto:
    """If(true) { Relu(x) } else { Neg(x) }: a condition fold_if can read."""
    h = onnx.helper
    branch = [
        h.make_graph(
            [h.make_node(op, ["x"], [out])],
            op,
            [],
            [h.make_tensor_value_info(out, T.FLOAT, [1, 4])],
        )
        for op, out in (("Relu", "t"), ("Neg", "e"))
    ]
    node = h.make_node("If", ["c"], ["y"], then_branch=branch[0], else_branch=branch[1])
    cond = onnx.numpy_helper.from_array(np.array(True), "c")
    io = [h.make_tensor_value_info(n, T.FLOAT, [1, 4]) for n in ("x", "y")]
    graph = h.make_graph([node], "if", io[:1], io[1:], [cond])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def _static_loop() -> onnx.ModelProto:
    """s = x; for i in range(3): s = s + x: a Loop onnx.unroll_loop can unroll."""
    h = onnx.helper
    v = h.make_tensor_value_info
    body = h.make_graph(
        [h.make_node("Identity", ["cond"], ["cond_out"]), h.make_node("Add", ["s", "x"], ["t"])],
        "body",
        [v("i", T.INT64, []), v("cond", T.BOOL, []), v("s", T.FLOAT, [1, 4])],
        [v("cond_out", T.BOOL, []), v("t", T.FLOAT, [1, 4])],
    )
    node = h.make_node("Loop", ["m", "", "x"], ["y"], body=body)
    trips = onnx.numpy_helper.from_array(np.array(3, np.int64), "m")
    io = [v(n, T.FLOAT, [1, 4]) for n in ("x", "y")]
    graph = h.make_graph([node], "loop", io[:1], io[1:], [trips])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def _constant_padding() -> onnx.ModelProto:
    """Pad(x, Concat(ConstantOfShape([6]), [1, 1])): pads from constants, as TorchScript
    exports F.pad."""
    h = onnx.helper
    nodes = [
        h.make_node(
            "ConstantOfShape", ["n"], ["zeros"], value=h.make_tensor("v", T.INT64, [1], [0])
        ),
        h.make_node("Concat", ["zeros", "ends"], ["pads"], axis=0),
        h.make_node("Pad", ["x", "pads"], ["y"]),
    ]
    inits = [
        onnx.numpy_helper.from_array(np.array([6], np.int64), "n"),
        onnx.numpy_helper.from_array(np.array([1, 1], np.int64), "ends"),
    ]
    io = [h.make_tensor_value_info("x", T.FLOAT, [1, 6, 10, 10])]
    out = [h.make_tensor_value_info("y", T.FLOAT, [1, 6, 11, 11])]
    graph = h.make_graph(nodes, "pad", io, out, inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def _cast_mask() -> onnx.ModelProto:
    """An int64 attention mask cast to float (onnx.ids_as_float feeds it as float)."""
    h = onnx.helper
    nodes = [h.make_node("Cast", ["m"], ["f"], to=T.FLOAT), h.make_node("Relu", ["f"], ["y"])]
    io = [h.make_tensor_value_info("m", T.INT64, [1, 8])]
    out = [h.make_tensor_value_info("y", T.FLOAT, [1, 8])]
    graph = h.make_graph(nodes, "mask", io, out)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


# An operator a one-node probe does not represent: the precheck keeps only a suggested rule
# that removes it from the very model, so the case must be one the rule can fix.
OP_CASES = {
    "If": _constant_if(),
    "Loop": _static_loop(),
    "ConstantOfShape": _constant_padding(),
    "Pad": single("p", "Pad", X, {"pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)}).model,
    "Cast": _cast_mask(),
    **{
        op: single(
            op.lower(),
            op,
            [("x", T.FLOAT, [8, 1, 4])],
            {
                "W": np.full((1, gates * 4, 4), 0.1),
                "R": np.full((1, gates * 4, 4), 0.1),
                "B": np.full((1, gates * 8), 0.1),
            },
            {"hidden_size": 4},
        ).model
        for op, gates in (("LSTM", 4), ("GRU", 3))
    },
}
# A model, a profile the precheck reports each finding for, and the finding's operator.
FINDING_CASES: dict[str, tuple[onnx.ModelProto, dict[str, Any], str]] = {
    "float64": (_internal_float64(), {"float64": False}, ""),
    "inputs": (
        single("r", "Relu", [("x", T.FLOAT, ["n", 4])]).model,
        {"dynamic_shapes": False},
        "",
    ),
    "opset": (single("r", "Relu", X).model, {"opset": {"min": 13, "max": 13}}, ""),
    "memory": (single("r", "Relu", [("x", T.FLOAT, ["n", 4])]).model, {}, ""),
    "int64": (
        _int64_inside(),
        {"operators": {"Sub": {"dtypes": ["float", "int32"]}, "Range": {}, "Cast": {}, "Add": {}}},
        "Sub",  # "no kernel for int64 inputs (takes float, int32)"
    ),
}
# An exporter's error that `edgeflow explain` puts in each class.
CAPTURE_ERRORS = {
    "nonzero": "Could not extract specialized integer from data-dependent expression (nonzero)",
    "item": "Tried to call .item() on a proxy",
    "float64": "expected scalar type Float but found Double",
    "shape": "x.shape[0] has no static value",
    "loop": "iteration over a 0-d tensor",
    "tensor_if": "symbolically traced variables cannot be used as inputs to control flow",
    "unsupported": "Exporting the operator 'aten::foo' to ONNX opset version 17 is not supported",
}


def test_a_fix_names_a_known_finding_or_capture_failure() -> None:
    with pytest.raises(ValueError, match="did you mean 'float64'"):
        Fix.finding("flaot64")
    with pytest.raises(ValueError, match="unknown capture 'nonzeros'"):
        Fix.capture("nonzeros")
    with pytest.raises(ValueError, match="constraint"):
        Fix("check", "Conv")
    with pytest.raises(ValueError, match="unknown Fix kind"):
        Fix("operator", "Conv")  # type: ignore[arg-type]
    assert Fix.check("Conv", "not_grouped") == Fix("check", "Conv", "not_grouped")
    assert [str(f) for f in (Fix.op("Erf"), Fix.finding("opset"))] == ["Erf", "(opset)"]


@pytest.mark.parametrize("rule", RULES.values(), ids=list(RULES))
def test_declarations_are_well_formed(rule: Any) -> None:
    assert isinstance(rule.fixes, tuple) and all(isinstance(f, Fix) for f in rule.fixes)
    assert len(set(rule.fixes)) == len(rule.fixes), f"{rule.name} declares a fix twice"
    for fix in rule.fixes:
        if fix.kind in ("op", "check"):
            assert onnx.defs.has(fix.name), f"{rule.name}: {fix.name} is no ONNX operator"
        if fix.kind == "check":
            assert fix.constraint in CHECKERS, f"{rule.name}: no checker {fix.constraint}"


@pytest.mark.parametrize("fix", DECLARED, ids=str)
def test_every_declared_fix_is_reported_with_a_rule_that_declares_it(fix: Fix) -> None:
    """The precheck (operators, failed checks, findings) or explain (capture failures)
    reports it, with a rule that declares it."""
    if fix.kind == "capture":
        assert fix.name in {c for _, c in CAUSES} | {BAKED}, "explain never reports it"
        if fix.name == BAKED:  # from a trace's warnings: tests/test_explain.py
            return
        assert fix.name in CAPTURE_ERRORS, "add an error explain puts in this class"
        attempt = _diagnose("probe", RuntimeError(CAPTURE_ERRORS[fix.name]), set())
        assert (attempt.cause, attempt.rules) == (CAPTURES[fix.name], rules_for(fix))
        assert attempt.rules and all(fix in RULES[named(r)].fixes for r in attempt.rules)
        return
    # every other ONNX operator runs: the suggested rule must remove the finding and may
    # write the ops it needs (the precheck keeps only a rule that adds no error of its own)
    others = {s.name: {} for s in onnx.defs.get_all_schemas() if s.domain == ""}
    others.pop(fix.name, None)
    if fix.kind == "op":
        model, operator = OP_CASES.get(fix.name) or single("n", fix.name, X).model, fix.name
        fields: dict[str, Any] = {"operators": others}
    elif fix.kind == "check":
        assert (fix.name, fix.constraint) in CHECK_CASES, "add a node that fails the check"
        model, operator = CHECK_CASES[fix.name, fix.constraint], fix.name
        fields = {"operators": {**others, fix.name: {"checks": [fix.constraint]}}}
    else:
        assert fix.name in FINDING_CASES, "add a model the precheck reports this for"
        model, fields, operator = FINDING_CASES[fix.name]
        operator = operator or f"({fix.name})"
    profile = profile_with(**fields)
    too_big = check_memory(model, profile)[1]

    def the_finding(source: str) -> Any:
        found = [
            f for f in check(model, profile, source=source) + too_big if f.operator == operator
        ]
        if fix.kind == "check":
            found = [f for f in found if f.reason.startswith(f"{fix.constraint}: ")]
        [finding] = found
        return finding

    finding = the_finding("pytorch")  # a pytorch source: its recipe takes rules of every level
    chosen = suggest(fix, options=finding.options)  # the options: the finding's (an opset)
    assert finding.rule == chosen
    if chosen:
        assert fix in RULES[chosen].fixes
    else:  # every rule that declares it needs options only the user knows
        assert fix == Fix.op("NonMaxSuppression") and followable(fix) == []
    # an ONNX file's own recipe takes onnx rules only: a source rule is not suggested for it
    onnx_finding = the_finding("onnx")
    level = RULES[chosen].level if chosen else "onnx"
    assert onnx_finding.rule == (chosen if level == "onnx" else "")


@pytest.mark.parametrize("rule", RULES.values(), ids=list(RULES))
def test_explain_lists_every_rule_that_declares_what_it_reports(rule: Any) -> None:
    for fix in rule.fixes:
        if fix.kind == "capture" or (fix.kind == "op" and fix.name in HAZARDS):
            assert rule.name in [named(e) for e in rules_for(fix)]


def _every_question() -> list[Fix]:
    asked = {*DECLARED, *(Fix.finding(k) for k in FINDINGS), *(Fix.capture(c) for c in CAPTURES)}
    asked |= {Fix.op(op) for op in HAZARDS}
    asked |= {Fix.check(op, c) for op, c in CHECK_CASES}
    return sorted(asked, key=repr)


@pytest.mark.parametrize("fix", _every_question(), ids=str)
def test_every_suggestion_names_a_rule_that_declares_the_fix(fix: Fix) -> None:
    """The precheck suggests the first rule (onnx first) whose entry it can print whole;
    explain lists every rule that declares the fix, a template where the options are the
    user's (`{rule: fx.wrap_leaf, functions: <list>}`)."""
    chosen = suggest(fix)
    assert chosen == "" or fix in RULES[chosen].fixes
    listed = [named(e) for e in rules_for(fix)]
    assert all(fix in RULES[name].fixes for name in listed)
    assert listed == [name for name in RULES if name in listed]  # catalogue order
    ready = followable(fix)
    onnx_rules = [name for name in ready if RULES[name].level == "onnx"]
    assert chosen == ((onnx_rules or ready or [""])[0])
    templates = [e for e in rules_for(fix) if "<" in e]
    assert [named(e) for e in templates] == [n for n in listed if n not in ready]


def test_settings_the_precheck_suggests_are_recipe_keys_not_rules() -> None:
    assert set(SETTINGS) <= set(FINDINGS)
    assert all(v.startswith("quantization.") and v not in RULES for v in SETTINGS.values())


@pytest.mark.parametrize("module", [edgeflow.targets.precheck, edgeflow.explain])
def test_no_rule_is_named_in_the_precheck_or_explain(module: Any) -> None:
    """They ask the registry which rules fix what they found: no table of rule names."""
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)]
    words = {w for s in strings if isinstance(s, str) for w in re.findall(r"[\w.]+", s)}
    assert not words & set(RULES)


# What the precheck suggested from its hand-kept tables before rules declared their fixes.
PRECHECK_BEFORE = {
    **dict.fromkeys(
        (Fix.op(op) for op in ("Erf", "Gelu", "HardSigmoid", "HardSwish")), "onnx.decompose"
    ),
    **dict.fromkeys(
        (Fix.op(op) for op in ("LayerNormalization", "Softplus", "Mish")), "onnx.decompose"
    ),
    Fix.op("If"): "onnx.fold_if",
    Fix.op("Sqrt"): "onnx.sqrt_newton",
    Fix.op("MatMul"): "onnx.lower_matmul",
    Fix.op("Gather"): "onnx.gather_to_slice",
    Fix.op("Scan"): "ast.unroll_loops",
    Fix.op("NonZero"): "ast.nonzero_to_mask",
    Fix.finding("float64"): "onnx.cast_float64_to_float32",
    Fix.finding("inputs"): "onnx.fix_shapes",
    Fix.finding("opset"): "onnx.convert_opset",
    Fix.check("Conv", "not_grouped"): "onnx.split_groups",
    Fix.check("Conv", "groups_one"): "onnx.split_groups",
    Fix.check("MaxPool", "pads_zero"): "onnx.maxpool_edge_pad",
    Fix.check("Resize", "resize_nearest"): "onnx.resize_to_matmul",
    Fix.check("Slice", "rank_at_most_4"): "onnx.slice_rank",
}
# Suggested since: decompose's other ops, and rules the tables did not know.
PRECHECK_NEW = {
    **dict.fromkeys((Fix.op(op) for op in ("Softsign", "Elu", "Selu")), "onnx.decompose"),
    Fix.op("BatchNormalization"): "fx.fuse_conv_bn",
    Fix.op("Dropout"): "fx.remove_dropout",
    Fix.finding("int64"): "onnx.int64_to_int32",
    Fix.op("Pad"): "onnx.pad_with_concat",
    Fix.op("ConstantOfShape"): "onnx.fold_constants",
    Fix.finding("memory"): "onnx.fix_shapes",
    **dict.fromkeys(
        (Fix.op(op) for op in ("PRelu", "ReduceL2", "LpNormalization")), "onnx.decompose"
    ),
    Fix.check("Slice", "slice_one_axis"): "onnx.split_slice",
    Fix.check("Pad", "pad_constant"): "onnx.pad_with_concat",
    **dict.fromkeys((Fix.op(op) for op in ("LSTM", "GRU")), "onnx.unroll_recurrent"),
    # before: ast.unroll_loops (a Python loop before export); a static ONNX Loop unrolls itself
    Fix.op("Loop"): "onnx.unroll_loop",
}
# Suggested no longer: a bare ast.replace_call fails at load ("needs from, to"), as does
# ast.replace_method (method); the functions are the user's to name. explain lists both as
# templates.
PRECHECK_DROPPED = {Fix.op("NonMaxSuppression"): ""}
# The options the precheck computes for a finding (the opset nearest the model's own).
COMPUTED = {Fix.finding("opset"): {"opset": 13}}
# `edgeflow explain`'s lists, in catalogue order (the hand-kept lists had tensor_if's and
# unsupported's in another order, and onnx.cast_float64_to_float32 for float64, which runs
# after an export and so cannot mend a failed one).
EXPLAIN = {
    Fix.capture("nonzero"): [
        "ast.nonzero_to_mask",
        "{rule: ast.replace_call, from: <str>, to: <str>}",
    ],
    Fix.capture("item"): ["ast.static_item"],
    Fix.capture("float64"): ["ast.float64_to_float32"],
    Fix.capture("shape"): ["ast.specialize_shapes"],
    Fix.capture("loop"): ["ast.unroll_loops"],
    Fix.capture("tensor_if"): ["ast.specialize_shapes", "ast.tensor_if_to_where"],
    Fix.capture("unsupported"): [
        "{rule: ast.replace_call, from: <str>, to: <str>}",
        "{rule: fx.wrap_leaf, functions: <list>}",
        "{rule: fx.replace_pattern, pattern: <str>, replacement: <str>}",
    ],
    Fix.capture("baked_branch"): ["ast.tensor_if_to_where", "ast.static_item"],
    Fix.op("NonZero"): ["ast.nonzero_to_mask"],
    Fix.op("If"): ["ast.tensor_if_to_where", "onnx.fold_if"],
    Fix.op("Loop"): ["ast.unroll_loops", "onnx.unroll_loop"],
    Fix.op("Scan"): ["ast.unroll_loops"],
    Fix.op("NonMaxSuppression"): [
        "{rule: ast.replace_call, from: <str>, to: <str>}",
        "{rule: ast.replace_method, method: <str>}",
    ],
}


def test_the_precheck_suggests_what_its_tables_did() -> None:
    def suggested(table: dict[Fix, str]) -> dict[Fix, str]:
        return {fix: suggest(fix, options=COMPUTED.get(fix)) for fix in table}

    assert suggested(PRECHECK_BEFORE) == PRECHECK_BEFORE
    assert suggested(PRECHECK_NEW) == PRECHECK_NEW
    assert suggested(PRECHECK_DROPPED) == PRECHECK_DROPPED
    assert suggest(Fix.finding("opset")) == ""  # no opset to print: not an entry that loads


def test_explain_lists_the_rules_its_tables_did() -> None:
    assert {fix: rules_for(fix) for fix in EXPLAIN} == EXPLAIN
    assert {Fix.op(op) for op in HAZARDS} | {Fix.capture(c) for _, c in CAUSES} <= set(EXPLAIN)


USER_RULE = """
from edgeflow.rules.base import OnnxRule, RuleResult
from edgeflow.rules.fixes import Fix


class DropIdentity(OnnxRule):
    name = "mine.drop_identity"
    description = "Remove Identity nodes."
    fixes = (Fix.op("Identity"), Fix.finding("{finding}"))

    def apply(self, model, opts, ctx):
        return RuleResult(model, False)
"""


def test_a_user_rule_declares_fixes_that_are_checked_but_not_suggested(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text(USER_RULE.format(finding="float64"))
    rule = ImportRef.parse("mine.py:DropIdentity", tmp_path).load()
    assert rule.fixes == (Fix.op("Identity"), Fix.finding("float64"))
    assert suggest(Fix.op("Identity")) == "" and rules_for(Fix.op("Identity")) == []
    (tmp_path / "typo.py").write_text(USER_RULE.format(finding="flaot64"))
    with pytest.raises(EdgeflowError, match=r"unknown finding 'flaot64': did you mean 'float64'"):
        ImportRef.parse("typo.py:DropIdentity", tmp_path).load()
