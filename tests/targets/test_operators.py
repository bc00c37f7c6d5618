"""Operator specs in profiles: derived kernel lists, dtype and version checks, named checkers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto as T

from edgeflow.errors import EdgeflowError
from edgeflow.targets import load_profile
from edgeflow.targets.derive import MARKER, onnxruntime_kernels, render
from edgeflow.targets.precheck import check
from edgeflow.targets.profile import TargetProfile
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


def profile_with(operators: dict, **extra: object) -> TargetProfile:
    base = load_profile("tflite_micro").model_dump()
    return TargetProfile.model_validate(base | {"operators": operators, **extra})


def test_versions_and_input_types() -> None:
    ops = {"Relu": {"kernels": [{"since": 6, "until": 13, "dtypes": ["float"]}]}}
    profile = profile_with(ops, float64=True, float16=True)  # only the operator spec decides
    assert check(single("r", "Relu", X, opset=13).model, profile) == []
    [late] = check(single("r", "Relu", X, opset=14).model, profile)
    assert late.reason == "no kernel for version 14 of Relu (has versions 6-13)"
    assert late.rule == "onnx.convert_opset"
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
    assert [f.reason for f in check(depthwise, profile)] == [
        "groups_one: grouped convolution (group=4)"
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
