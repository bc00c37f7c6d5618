"""Operator specs in profiles: derived kernel lists, dtype and version checks, named checkers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T

from edgeflow.core.errors import EdgeflowError
from edgeflow.targets import load_profile
from edgeflow.targets.derive import (
    MARKER,
    family_builtins,
    family_operators,
    family_versions,
)
from edgeflow.targets.onnxruntime_micro.derive import onnxruntime_kernels, render
from edgeflow.targets.precheck import check, render_table, to_json
from edgeflow.targets.profile import TargetProfile
from edgeflow.targets.registry import measured_tflite
from tests import needs
from tests.targets.conftest import needs_tflite
from tests.targets.opzoo import DW, W, X, _const, single


def test_onnxruntime_micro_operators_are_those_of_the_installed_onnxruntime() -> None:
    text = Path("targets/onnxruntime_micro.yaml").read_text(encoding="utf-8")
    generated = text[text.index(MARKER) :]
    assert generated == render(onnxruntime_kernels()), (
        "targets/onnxruntime_micro.yaml is stale: python -m edgeflow.targets.derive "
        "onnxruntime_micro --write"
    )
    profile = load_profile("onnxruntime_micro")
    assert profile.operators is not None and len(profile.operators) > 250
    conv = profile.operators["Conv"].kernels
    assert conv is not None and conv[-1].dtypes == ["float"]
    hardswish = profile.operators["HardSwish"].kernels
    assert hardswish is not None and all(k.expanded for k in hardswish)


@needs_tflite
@pytest.mark.parametrize("target", measured_tflite())
def test_measured_profiles_name_the_installed_tools(target: str) -> None:
    """The tflite-family lists are measurements of these versions (derive tflite_family)."""
    if target == "armnn":
        needs.require("armnn")
    profile = load_profile(target)
    text = Path(f"targets/{target}.yaml").read_text(encoding="utf-8")
    assert f"# Measured with {family_versions(target)}:" in text, (
        f"targets/{target}.yaml was measured with other versions: "
        "python -m edgeflow.targets.derive tflite_family --write"
    )
    assert profile.operators is not None and len(profile.operators) >= 30
    assert "Conv" in profile.operators and "NonZero" not in profile.operators


def test_measured_operator_lists_come_from_verdicts() -> None:
    """family_operators on hand-made verdicts: modes, dtypes, checkers, the missing list."""
    from edgeflow.targets.probes import single as probe
    from edgeflow.targets.trial import Verdict

    cases = [
        probe("Conv", "Conv", X, W),
        probe("Conv grouped", "Conv", X, DW, {"group": 4}, checker="groups_one"),
        probe("Erf", "Erf", X),
        probe("Erf int64", "Erf", [("x", T.INT64, [2, 3])]),
        probe("Gelu", "Gelu", X, opset=20),
        probe("Softmax", "Softmax", X),
        probe("Softmax-11", "Softmax", X, {}, {"axis": 0}, opset=11),  # flattens from axis 0
        probe("Softmax-1", "Softmax", X, opset=10),
    ]
    ok, no = Verdict(True, builtins=["CONV_2D"]), Verdict(False, "load", "nope", ["GELU"])
    verdicts = {
        "Conv": {"t/none": ok, "t/int8": ok},
        "Conv grouped": {"t/none": ok, "t/int8": no},
        "Erf": {"t/none": Verdict(True, builtins=["ERF"]), "t/int8": no},
        "Erf int64": {"t/none": ok},
        "Gelu": {"t/none": no, "t/int8": no},
        "Softmax": {"t/none": ok, "t/int8": ok},
        "Softmax-11": {"t/none": Verdict(False, "compare", "relative error 4.85")},
        "Softmax-1": {"t/none": ok},
    }
    ops, missing = family_operators("t", cases, verdicts, ["none", "int8"])
    # probed at three versions: the main one and later, and the older one that ran
    assert ops["Softmax"]["kernels"] == [{"since": 1, "until": 10}, {"since": 13}]
    assert "Softmax-11: compare: relative error 4.85" in ops["Softmax"]["note"]
    assert ops["Conv"] == {
        "kernels": None,  # one version probed: every version
        "dtypes": ["float"],
        "quantization": None,
        "checks": ["groups_one"],
        "inaccurate": {},
        "kept_float": "",
        "note": "CONV_2D; Conv grouped: load [GELU]: nope",
    }
    assert ops["Erf"]["quantization"] == ["none"] and ops["Erf"]["dtypes"] == ["float", "int64"]
    off = Verdict(False, "compare", "relative error 0.5 (tolerance 0.1)", ["RELU6"])
    verdicts["Erf"]["t/int8"] = off
    ops, _ = family_operators("t", cases, verdicts, ["none", "int8"])
    assert ops["Erf"]["quantization"] is None  # it runs in int8: a warning, not a failure
    assert ops["Erf"]["inaccurate"] == {
        "int8": "compare [RELU6]: relative error 0.5 (tolerance 0.1)"
    }
    assert missing == {"Gelu": "load [GELU]: nope"}
    # an int8 probe that failed only on a builtin that runs in float32 and has no int8 kernel
    # (it ran in float32 and failed alone in int8): the build keeps it float, int8 stays
    verdicts["Erf"]["t/int8"] = Verdict(False, "run", "Node ERF failed", ["ERF"])
    builtins = family_builtins("t", verdicts)
    assert builtins["int8"]["fails"]["ERF"] == "run [ERF]: Node ERF failed"
    ops, _ = family_operators("t", cases, verdicts, ["none", "int8"], builtins)
    assert ops["Erf"]["quantization"] is None
    assert ops["Erf"]["kept_float"] == "no int8 ERF kernel: the int8 build runs it float"
    ops, _ = family_operators("t", cases, verdicts, ["none", "int8"])  # builtins not given
    assert ops["Erf"]["quantization"] == ["none"] and not ops["Erf"]["kept_float"]


def test_native_builtins_fail_where_they_load_run_or_compute_wrong_in_float() -> None:
    """A builtin no running probe has fails where its probe did not load or run, and in
    float32 also where it computed a wrong result that another runtime of the family got
    right with the same builtins (Arm NN's RESIZE_BILINEAR); a wrong result every runtime
    shares may be the converter's (CUMSUM), and in int8 a wrong result is a tolerance."""
    from edgeflow.targets.trial import Verdict

    wrong = Verdict(False, "compare", "relative error 0.577", ["RESIZE_BILINEAR"])
    right = Verdict(True, builtins=["RESIZE_BILINEAR"])
    shared = Verdict(False, "compare", "relative error 0.93", ["CUMSUM"])
    verdicts = {
        "Conv": {"t/none": Verdict(True, builtins=["CONV_2D"])},
        "Resize": {"t/none": wrong, "t/int8": wrong, "u/none": right, "u/int8": right},
        "CumSum": {"t/none": shared, "u/none": shared},
        "Gelu": {"t/none": Verdict(False, "load", "nope", ["GELU"])},
        "Pad": {"t/none": Verdict(False, "load", "off", ["CONV_2D", "PAD", "SUB"])},
    }
    found = family_builtins("t", verdicts)
    assert found["none"]["runs"] == ["CONV_2D"]
    assert found["none"]["fails"] == {  # Pad's probe has two unexplained builtins: no name
        "GELU": "load [GELU]: nope",
        "RESIZE_BILINEAR": "compare [RESIZE_BILINEAR]: relative error 0.577",
    }
    assert found["int8"]["fails"] == {}


def test_an_op_without_int8_kernels_fails_the_int8_precheck() -> None:
    profile = profile_with({"Erf": {"quantization": ["none"]}})
    erf = single("e", "Erf", X).model
    assert check(erf, profile, "none") == []
    [finding] = check(erf, profile, "int8")
    assert finding.reason == "not supported in quantization mode int8 (only none)"
    assert finding.rule == "onnx.decompose" and finding.severity == "error"


def test_an_op_measured_inaccurate_is_a_warning_that_passes() -> None:
    from edgeflow.targets.precheck import errors, render_table, to_json

    profile = profile_with({"Clip": {"inaccurate": {"int8": "143 int8 steps off LiteRT"}}})
    clip = single("c", "Clip", X, {"lo": 0.0, "hi": 6.0}).model
    assert check(clip, profile, "none") == []
    findings = to_json(check(clip, profile, "int8"))
    assert [f["severity"] for f in findings] == ["warning"] and errors(findings) == []
    assert "(warning) int8 may be inaccurate: 143 int8 steps off LiteRT" in render_table(findings)


def profile_with(operators: dict, others: bool = True, **extra: object) -> TargetProfile:
    """tflite_micro with these operator specs; `others`: every other ONNX operator runs as
    well (as a real profile's do), so that a suggested rule may write the ops it needs (the
    precheck suggests only a rule that removes the finding without a new error)."""
    base = load_profile("tflite_micro").model_dump()
    if others:
        every = {s.name: {} for s in onnx.defs.get_all_schemas() if s.domain == ""}
        operators = every | operators
    return TargetProfile.model_validate(base | {"operators": operators, **extra})


def test_a_version_finding_whose_opset_breaks_another_op_suggests_the_next_rule() -> None:
    """Sqrt-6 has no kernel (13 on only) and moving to opset 13 would take Relu to a version
    without one: onnx.convert_opset is tried and onnx.sqrt_newton, which removes the Sqrt, is
    suggested, without the opset option that belonged to the other rule."""
    from onnx import helper

    ops = {"Sqrt": {"kernels": [{"since": 13}]}, "Relu": {"kernels": [{"since": 6, "until": 12}]}}
    profile = profile_with(ops)
    nodes = [helper.make_node("Sqrt", ["x"], ["e"]), helper.make_node("Relu", ["e"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", T.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    [sqrt] = check(model, profile)
    assert sqrt.reason == "no kernel for version 6 of Sqrt (has versions 13-)"
    assert (sqrt.rule, sqrt.options, sqrt.tried) == ("onnx.sqrt_newton", {}, [])


def test_versions_and_input_types() -> None:
    ops = {"Relu": {"kernels": [{"since": 6, "until": 13, "dtypes": ["float"]}]}}
    # only the operator spec decides
    profile = profile_with(ops, float64=True, float16=True, dtype_fallbacks={})
    assert check(single("r", "Relu", X, opset=13).model, profile) == []
    [late] = check(single("r", "Relu", X, opset=14).model, profile)
    assert late.reason == "no kernel for version 14 of Relu (has versions 6-13)"
    assert (late.rule, late.options) == ("onnx.convert_opset", {"opset": 13})
    [table] = render_table(to_json([late])).splitlines()[2:]
    assert table.endswith("| `{rule: onnx.convert_opset, opset: 13}` |")  # as rewrites: takes it
    # outside the profile's opsets: the nearest one inside, and the rule applied with it works
    narrow = profile_with({"Relu": {}}, opset={"min": 11, "max": 20})
    [early] = check(single("r", "Relu", X, opset=7).model, narrow)
    assert early.operator == "(opset)" and early.options == {"opset": 11}
    assert (early.rule, early.tried) == ("onnx.convert_opset", [])
    doubles = [("x", T.DOUBLE, [1, 4])]
    [typed] = check(single("r", "Relu", doubles, opset=13).model, profile)
    assert typed.reason == "no kernel for double inputs (takes float)"
    assert typed.rule == "onnx.cast_float64_to_float32"
    halves = single("r", "Relu", [("x", T.FLOAT16, [1, 4])], opset=13).model
    [half] = check(halves, profile)
    assert half.reason == "no kernel for float16 inputs (takes float)"
    fallback = profile_with(ops, float16=True, dtype_fallbacks={"float16": "float"})
    assert check(halves, fallback) == []


def test_named_checkers_report_each_violation() -> None:
    ops = {
        "Conv": {"checks": ["dilations_one", "groups_one"]},
        "Pad": {"checks": ["constant_inputs"]},
    }
    profile = profile_with(ops)
    dilated = single("c", "Conv", X, W, {"pads": [2, 2, 2, 2], "dilations": [2, 2]}).model
    [finding] = check(dilated, profile)
    assert finding.reason == "dilations_one: dilations [2, 2] (needs 1)"
    depthwise = single("c", "Conv", X, DW, {"pads": [1, 1, 1, 1], "group": 4}).model
    # onnx.split_groups splits grouped convolutions, not depthwise ones: not suggested
    assert [(f.reason, f.rule, f.tried) for f in check(depthwise, profile)] == [
        ("groups_one: grouped convolution (group=4)", "", ["onnx.split_groups"])
    ]
    pads = _const("pads", [0, 0, 1, 1, 0, 0, 1, 1], np.int64)
    assert check(single("p", "Pad", X, {"pads": pads}).model, profile) == []
    dynamic = single("p", "Pad", [*X, ("pads", T.INT64, [8])])
    [computed] = check(dynamic.model, profile)
    assert computed.reason == "constant_inputs: inputs pads are computed, not constants"


def test_axis_zero_point_and_rank_checkers() -> None:
    ops = {
        "Softmax": {"checks": ["axis_last"]},
        "QuantizeLinear": {"checks": ["zero_point_zero"]},
        "Transpose": {"checks": ["rank_at_most_4"]},
    }
    profile = profile_with(ops)
    assert check(single("s", "Softmax", X, attrs={"axis": 3}).model, profile) == []
    [axis] = check(single("s", "Softmax", X, attrs={"axis": 1}).model, profile)
    assert axis.reason == "axis_last: axis 1 (needs the last axis)"
    zero = {"s": 0.1, "z": _const("z", 3, np.int8)}
    [zp] = check(single("q", "QuantizeLinear", X, zero, out_type=T.INT8).model, profile)
    assert zp.reason.startswith("zero_point_zero: zero point is not 0")
    six = [("x", T.FLOAT, [1, 2, 2, 2, 2, 2])]
    [deep] = check(single("t", "Transpose", six, attrs={"perm": [0, 1, 2, 3, 5, 4]}).model, profile)
    assert deep.reason == "rank_at_most_4: tensors above 4-D: x (6-D), y0 (6-D)"


def test_a_checker_typo_is_a_load_error_at_its_line(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    targets = tmp_path / "targets"
    targets.mkdir()
    (targets / "mine.yaml").write_text(
        "name: mine\n"
        "backend: tflite\n"
        "operators:\n"
        "  Conv: {checks: [dilation_one]}\n"
        "  Relu: {dtypes: [floot]}\n"
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EdgeflowError) as info:
        load_profile("mine", tmp_path)
    text = info.value.render()
    assert "mine.yaml:4:" in text and "unknown checker 'dilation_one'" in text
    assert "did you mean 'dilations_one'" in text
    assert "mine.yaml:5:" in text and "unknown dtype 'floot'" in text


def test_variant_checkers() -> None:
    ops = {
        "Conv": {"checks": ["not_depthwise"]},
        "MaxPool": {"checks": ["pads_zero"]},
        "Pad": {"checks": ["pad_constant"]},
        "Resize": {"checks": ["resize_nearest"]},
        "Cast": {"checks": ["cast_not_to_int64"]},
        "Transpose": {"checks": ["rank_at_most_5"]},
        "Gemm": {"checks": ["has_bias"]},
        "Slice": {"checks": ["slice_one_axis"]},
    }
    profile = profile_with(ops)
    two = [("x", T.FLOAT, [2, 16])]
    assert (
        check(single("g", "Gemm", two, {"w": np.ones((16, 4)), "c": np.ones(4)}).model, profile)
        == []
    )
    [bare] = check(single("g", "Gemm", two, {"w": np.ones((16, 4))}).model, profile)
    assert bare.reason == "has_bias: no bias input (C)"
    i64 = np.int64
    one = {"s": _const("s", [1], i64), "e": _const("e", [3], i64), "a": _const("a", [1], i64)}
    assert check(single("s", "Slice", X, one).model, profile) == []
    both = {k: _const(k, [1, 1] if k != "a" else [1, 2], i64) for k in ("s", "e", "a")}
    both["e"] = _const("e", [3, 4], i64)
    [sliced] = check(single("s", "Slice", X, both).model, profile)
    assert sliced.reason == "slice_one_axis: slices 2 axes at once (needs one Slice per axis)"
    assert check(single("c", "Conv", X, W).model, profile) == []
    [dw] = check(single("c", "Conv", X, DW, {"group": 4}).model, profile)
    assert dw.reason == "not_depthwise: depthwise convolution (group=4)"
    pool = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    [padded] = check(single("m", "MaxPool", X, attrs=pool).model, profile)
    assert padded.reason == "pads_zero: padded pooling (pads [1, 1, 1, 1])"
    pads = {"pads": _const("pads", [0, 0, 1, 1, 0, 0, 1, 1], np.int64)}
    assert check(single("p", "Pad", X, pads).model, profile) == []
    [reflect] = check(single("p", "Pad", X, pads, {"mode": "reflect"}).model, profile)
    assert reflect.reason == "pad_constant: pad mode 'reflect' (needs constant)"
    scales = {"roi": np.zeros(0), "scales": [1, 1, 2, 2]}
    assert check(single("r", "Resize", X, scales).model, profile) == []
    [linear] = check(single("r", "Resize", X, scales, {"mode": "linear"}).model, profile)
    assert linear.reason == "resize_nearest: resize mode 'linear' (needs nearest)"
    assert (
        check(single("c", "Cast", X, attrs={"to": T.INT32}, out_type=T.INT32).model, profile) == []
    )
    [cast] = check(single("c", "Cast", X, attrs={"to": T.INT64}, out_type=T.INT64).model, profile)
    assert cast.reason == "cast_not_to_int64: casts to int64"
    five = [("x", T.FLOAT, [1, 2, 2, 2, 2])]
    assert (
        check(single("t", "Transpose", five, attrs={"perm": [0, 1, 2, 4, 3]}).model, profile) == []
    )


def test_a_profile_extends_a_built_in_one(tmp_path: Path) -> None:
    """A board of your own, and an operator your runtime build adds, over the built-in."""
    targets = tmp_path / "targets"
    targets.mkdir()
    (targets / "my_m4.yaml").write_text(
        "extends: tflite_micro\n"
        "description: our Cortex-M4 board\n"
        "boards:\n"
        "  our_board: {description: 'M4, 192 KiB', ram_bytes: 196608, flash_bytes: 524288}\n"
        "default_board: our_board\n"
    )
    (targets / "tflite_micro.yaml").write_text(
        "extends: tflite_micro\noperators:\n  Gelu: {note: our build registers GELU}\n"
    )
    builtin = load_profile("tflite_micro")
    shadowed = load_profile("tflite_micro", tmp_path)  # ours, over the built-in
    mine = load_profile("my_m4", tmp_path)  # over ours, which is the visible tflite_micro
    assert mine.name == "my_m4" and mine.backend == "tflite_micro"
    assert mine.operators == shadowed.operators
    assert set(mine.boards) == {*builtin.boards, "our_board"}
    assert mine.board(None) == ("our_board", mine.boards["our_board"])
    assert shadowed.operators is not None and builtin.operators is not None
    assert set(shadowed.operators) == {*builtin.operators, "Gelu"}
    assert check(single("g", "Gelu", X, opset=20).model, shadowed) == []
    assert check(single("g", "Gelu", X, opset=20).model, builtin) != []


def test_extending_an_unknown_or_looping_profile_is_an_error(tmp_path: Path) -> None:
    targets = tmp_path / "targets"
    targets.mkdir()
    (targets / "a.yaml").write_text("extends: tflite_mikro\n")
    with pytest.raises(EdgeflowError) as info:
        load_profile("a", tmp_path)
    assert "extends: unknown target 'tflite_mikro'" in info.value.render()
    assert "did you mean 'tflite_micro'" in info.value.render()
    (targets / "a.yaml").write_text("extends: b\n")
    (targets / "b.yaml").write_text("extends: a\n")
    with pytest.raises(EdgeflowError, match="extend each other in a loop"):
        load_profile("a", tmp_path)
