"""onnx.convert_opset: the version converter, with a clear error where it cannot convert."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper
from pydantic import ValidationError

from edgeflow.core.errors import EdgeflowError
from edgeflow.core.onnxgraph import opset_version
from edgeflow.rules.onnx.decompose import Decompose
from edgeflow.rules.onnx.opset import ConvertOpset
from edgeflow.targets.precheck import check
from edgeflow.targets.profile import OpsetRange, TargetProfile
from tests.rules.onnx.helpers import apply, feeds, model, ops, run, specs
from tests.rules.sites import outcomes


def test_downgrade_moves_reduce_axes_to_an_attribute() -> None:
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=1)]
    m = model(
        nodes,
        [("x", T.FLOAT, [2, 3, 4])],
        [("y", T.FLOAT, [2, 1, 4])],
        {"axes": np.array([1], np.int64)},
        opset=18,
    )
    result = apply(ConvertOpset, m, opset=13)
    assert opset_version(result.model) == 13
    [node] = result.model.graph.node
    assert list(node.input) == ["x"] and helper.get_attribute_value(node.attribute[-1]) == [1]
    x = feeds(specs(m))
    np.testing.assert_allclose(run(result.model, x)[0], run(m, x)[0], rtol=1e-6)


def test_convbn_converts_down_and_up(convbn: onnx.ModelProto) -> None:
    x = feeds(specs(convbn), scale=1.0)
    for opset in (15, 19):
        result = apply(ConvertOpset, convbn, opset=opset)
        assert opset_version(result.model) == opset
        np.testing.assert_allclose(run(result.model, x)[0], run(convbn, x)[0], rtol=1e-5, atol=1e-6)
    # onnx 1.23's converter has no BatchNormalization adapter below opset 15.
    with pytest.raises(EdgeflowError) as info:
        apply(ConvertOpset, convbn, opset=13)
    assert info.value.message == (
        "cannot convert opset 17 -> 13: No Adapter From Version $15 for BatchNormalization"
    )


def test_gelu_cannot_go_below_opset_20_until_decomposed() -> None:
    m = model(
        [helper.make_node("Gelu", ["x"], ["y"])],
        [("x", T.FLOAT, [2, 8])],
        [("y", T.FLOAT, [2, 8])],
        opset=20,
    )
    # onnx's own converter fails with an assertion ("No Previous Version of Gelu exists").
    with pytest.raises(RuntimeError, match="No Previous Version of Gelu"):
        onnx.version_converter.convert_version(m, 17)
    with pytest.raises(EdgeflowError) as info:
        apply(ConvertOpset, m, opset=17)
    assert info.value.message == (
        "cannot convert opset 20 -> 17: Gelu (since opset 20) did not exist at opset 17"
    )
    assert "onnx.decompose" in (info.value.hint or "")

    profile = TargetProfile(name="old", backend="onnxruntime_micro", opset=OpsetRange(max=17))
    assert [f.operator for f in check(m, profile)] == ["(opset)"]
    decomposed = apply(Decompose, m).model
    converted = apply(ConvertOpset, decomposed, opset=17).model
    assert check(converted, profile) == [] and "Gelu" not in ops(converted)
    x = feeds(specs(m))
    np.testing.assert_allclose(run(converted, x)[0], run(m, x)[0], rtol=1e-5, atol=1e-5)


def test_same_opset_is_a_no_op(convbn: onnx.ModelProto) -> None:
    result = apply(ConvertOpset, convbn, opset=17)
    assert not result.changed and outcomes(result) == [("not_applicable", "")]


def test_unknown_opset_is_rejected() -> None:
    with pytest.raises(ValidationError, match="opset must be between 7 and"):
        ConvertOpset.Options(opset=99)
