"""onnx.pad_all_axes: an opset-18 Pad that names its axes, as a Pad of every axis."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper

from edgeflow.rules.onnx.conv_pool import PadAllAxes
from edgeflow.targets import load_profile
from edgeflow.targets.precheck import check
from tests.rules.onnx.helpers import apply, feeds, model, run, specs
from tests.rules.sites import outcomes


@pytest.mark.parametrize(("axes", "mode"), [([2, 3], "constant"), ([-1], "reflect")])
def test_a_pad_with_axes_pads_every_axis(axes: list[int], mode: str) -> None:
    pads = np.array([1, 2] * len(axes), np.int64)  # begins, then ends
    consts = {"pads": pads, "axes": np.array(axes, np.int64), "v": np.array(1.5, np.float32)}
    node = helper.make_node("Pad", ["x", "pads", "v", "axes"], ["y"], name="pad", mode=mode)
    m = model([node], [("x", T.FLOAT, [1, 4, 6, 6])], [("y", T.FLOAT, None)], consts)
    result = apply(PadAllAxes, m)
    assert outcomes(result) == [("changed", "pad")]
    [pad] = result.model.graph.node
    assert len(pad.input) == 3 and pad.attribute[0].s.decode() == mode
    x = feeds(specs(m))
    np.testing.assert_array_equal(run(result.model, x)[0], run(m, x)[0])


def test_the_tflite_profile_refuses_it_and_names_the_rule() -> None:
    consts = {"pads": np.ones(4, np.int64), "axes": np.array([2, 3], np.int64)}
    node = helper.make_node("Pad", ["x", "pads", "", "axes"], ["y"])
    m = model([node], [("x", T.FLOAT, [1, 4, 6, 6])], [("y", T.FLOAT, None)], consts)
    [finding] = check(m, load_profile("tflite"))
    assert finding.reason == "pad_all_axes: pads only the axes it names (axes input)"
    assert finding.rule == "onnx.pad_all_axes"
