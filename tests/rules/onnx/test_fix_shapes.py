"""onnx.fix_shapes: dynamic input dims pinned, shape arithmetic folded, all shapes static."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from edgeflow.core.errors import EdgeflowError
from edgeflow.rules.onnx.shapes import FixShapes
from edgeflow.targets.precheck import check
from edgeflow.targets.profile import TargetProfile
from tests.rules.onnx.helpers import apply, feeds, ops, run, specs
from tests.rules.sites import outcomes

STATIC_ONLY = TargetProfile(name="static", backend="onnxruntime_micro", dynamic_shapes=False)
SHAPE_OPS = {"Shape", "Gather", "Unsqueeze", "Concat"}


def dims(value: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_value or d.dim_param for d in value.type.tensor_type.shape.dim]


def test_declared_shapes_make_the_graph_static(convbn: onnx.ModelProto) -> None:
    assert dims(convbn.graph.input[0]) == ["batch", 3, 8, 8]
    assert ops(convbn).keys() >= SHAPE_OPS
    findings = check(convbn, STATIC_ONLY)
    assert [(f.reason, f.rule) for f in findings] == [
        ("dynamic input shapes are not supported", "onnx.fix_shapes")
    ]

    declared = specs(convbn, {"x": [2, 3, 8, 8]})
    result = apply(FixShapes, convbn, declared)
    g = result.model.graph
    assert dims(g.input[0]) == [2, 3, 8, 8] and dims(g.output[0]) == [2, 5]
    assert not SHAPE_OPS & ops(result.model).keys()
    assert all(0 not in dims(v) and "" not in dims(v) for v in g.value_info)
    assert len(g.value_info) > 0
    assert check(result.model, STATIC_ONLY) == []
    assert outcomes(result)[0] == ("changed", "x")  # its shape pinned
    x = feeds(declared, seed=1, scale=1.0)
    np.testing.assert_allclose(run(result.model, x)[0], run(convbn, x)[0], rtol=1e-4, atol=1e-5)


def test_explicit_shapes_override_the_recipe(convbn: onnx.ModelProto) -> None:
    result = apply(FixShapes, convbn, specs(convbn), shapes={"x": [4, 3, 8, 8]})
    assert dims(result.model.graph.output[0]) == [4, 5]


def test_without_folding_only_shapes_change(convbn: onnx.ModelProto) -> None:
    result = apply(FixShapes, convbn, specs(convbn), fold=False)
    assert ops(result.model) == ops(convbn)
    assert dims(result.model.graph.output[0]) == [1, 5]


@pytest.mark.parametrize(
    ("shapes", "message", "hint"),
    [
        ({"X": [1, 3, 8, 8]}, "the model has no input 'X'", "did you mean 'x'?"),
        ({"x": [1, 3, 8]}, "input 'x' has rank 4 ([batch, 3, 8, 8]), got shape [1, 3, 8]", None),
        ({"x": [1, 4, 8, 8]}, "input 'x' has fixed dim 1 = 3, got 4", "use 3 for axis 1"),
    ],
)
def test_bad_shapes_are_user_errors(
    convbn: onnx.ModelProto, shapes: dict, message: str, hint: str | None
) -> None:
    with pytest.raises(EdgeflowError) as info:
        apply(FixShapes, convbn, [], shapes=shapes)
    assert info.value.message == message
    if hint:
        assert hint in (info.value.hint or "")


def test_a_wrong_declared_output_shape_is_inferred_again() -> None:
    """An exporter declared ddddocr's CRNN output [1, seqlen] for a [steps, 1, classes]
    tensor: inference failed on it ("differ in rank"), so the precheck's own suggestion
    failed as printed. The declared output shapes are inferred again, the change named."""
    from onnx import TensorProto as T
    from onnx import helper

    from tests.rules.onnx.helpers import model

    m = model(
        [helper.make_node("Reshape", ["x", "to"], ["y"])],
        [("x", T.FLOAT, ["steps", 8])],
        [("y", T.FLOAT, ["steps", 1, 8])],
        {"to": np.array([-1, 1, 8], np.int64)},
    )
    declared = m.graph.output[0].type.tensor_type.shape
    del declared.dim[:]
    declared.dim.add().dim_value = 1  # [1, seqlen]: rank 2, as the CRNN's
    declared.dim.add().dim_param = "seqlen"
    result = apply(FixShapes, m, specs(m, {"x": [6, 8]}), fold=False)
    assert dims(result.model.graph.output[0]) == [6, 1, 8]
    assert ("changed", "y") in outcomes(result)
