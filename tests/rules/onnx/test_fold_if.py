"""onnx.fold_if: If nodes with constant conditions become their taken branch."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from edgeflow.rules.onnx.fold_if import FoldIf
from edgeflow.targets.precheck import check
from edgeflow.targets.profile import TargetProfile
from tests.rules.onnx.helpers import apply, feeds, model, ops, run, specs
from tests.rules.sites import outcomes

NO_CONTROL_FLOW = TargetProfile(name="flat", backend="onnxruntime_micro", control_flow=False)
F = T.FLOAT


def branch(name: str, nodes: list, outputs: list[tuple[str, list]], inits: dict | None = None):
    return helper.make_graph(
        nodes,
        name,
        [],
        [helper.make_tensor_value_info(n, F, s) for n, s in outputs],
        [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()],
    )


def clashing_if(cond: bool) -> onnx.ModelProto:
    """A constant If whose branch-local names 'h' and 'w' are also local to a sibling If's
    branch: inlined as they are, the sibling would shadow them (invalid ONNX)."""
    then = branch(
        "then",
        [
            helper.make_node("Add", ["x", "w"], ["h"]),
            helper.make_node("Relu", ["h"], ["t"]),
            helper.make_node("Identity", ["x"], ["tx"]),
        ],
        [("t", [2, 4]), ("tx", [2, 4])],
        {"w": np.full(4, 10, np.float32)},
    )
    other = branch(
        "else",
        [helper.make_node("Mul", ["x", "k"], ["e"]), helper.make_node("Neg", ["e"], ["e2"])],
        [("e", [2, 4]), ("e2", [2, 4])],
    )
    sibling = helper.make_node(
        "If",
        ["d"],
        ["s"],
        name="sibling",
        then_branch=branch(
            "st",
            [helper.make_node("Sub", ["x", "w"], ["h"])],
            [("h", [2, 4])],
            {"w": np.ones(4, np.float32)},
        ),
        else_branch=branch("se", [helper.make_node("Neg", ["x"], ["n"])], [("n", [2, 4])]),
    )
    nodes = [
        helper.make_node(
            "If", ["c"], ["y", "z"], name="branchy", then_branch=then, else_branch=other
        ),
        sibling,
        helper.make_node("Add", ["y", "s"], ["out"]),
    ]
    return model(
        nodes,
        [("x", F, [2, 4]), ("d", T.BOOL, [])],
        [("out", F, [2, 4]), ("z", F, [2, 4])],
        {"c": np.array(cond), "k": np.full(4, 3, np.float32)},
    )


@pytest.mark.parametrize("cond", [True, False])
def test_constant_condition_inlines_the_taken_branch(cond: bool) -> None:
    m = clashing_if(cond)
    result = apply(FoldIf, m, [])
    assert ops(result.model)["If"] == 1  # the sibling's condition is an input
    assert outcomes(result)[0] == ("changed", "branchy")
    for d in (True, False):
        x = {"x": np.linspace(-3, 3, 8, dtype=np.float32).reshape(2, 4), "d": np.array(d)}
        for got, want in zip(run(result.model, x), run(m, x), strict=True):
            np.testing.assert_array_equal(got, want)
    names = [o for n in result.model.graph.node for o in n.output]
    assert len(names) == len(set(names))
    assert "c" not in {t.name for t in result.model.graph.initializer}  # now unused


def test_folding_every_if_satisfies_a_target_without_control_flow() -> None:
    m = clashing_if(True)
    m.graph.node[1].input[0] = "c"  # the sibling's condition becomes constant too
    del m.graph.input[1]
    assert [f.operator for f in check(m, NO_CONTROL_FLOW)] == ["If"]
    result = apply(FoldIf, m, [])
    assert "If" not in ops(result.model)
    assert check(result.model, NO_CONTROL_FLOW) == []
    x = feeds(specs(m))
    for got, want in zip(run(result.model, x), run(m, x), strict=True):
        np.testing.assert_array_equal(got, want)


def test_condition_from_a_static_shape_is_evaluated() -> None:
    """c = Equal(Gather(Shape(x), 0), 1): constant once x's batch is fixed; the branches'
    output shapes differ, so shape inference leaves the If's output dim unknown."""
    then = branch("then", [helper.make_node("Reshape", ["x", "flat"], ["t"])], [("t", [1, 12])])
    other = branch("else", [helper.make_node("Flatten", ["x"], ["e"], axis=2)], [("e", [3, 4])])
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
        helper.make_node("Equal", ["b", "one"], ["c"]),
        helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
    ]
    m = model(
        nodes,
        [("x", F, [1, 3, 2, 2])],
        [("y", F, [None, None])],
        {"zero": np.array(0), "one": np.array(1), "flat": np.array([1, -1])},
    )
    inferred = onnx.shape_inference.infer_shapes(m).graph.output[0]
    assert [d.dim_value for d in inferred.type.tensor_type.shape.dim] == [0, 0]  # unknown
    result = apply(FoldIf, m)
    assert ops(result.model) == {"Reshape": 1}
    assert outcomes(result)[-1] == ("changed", "")  # the condition's nodes, now unused
    static = onnx.shape_inference.infer_shapes(result.model).graph.output[0]
    assert [d.dim_value for d in static.type.tensor_type.shape.dim] == [1, 12]
    x = feeds(specs(m))
    np.testing.assert_array_equal(run(result.model, x)[0], run(m, x)[0])
    assert not apply(FoldIf, m, evaluate=False).changed


def test_nested_ifs_fold_and_a_data_dependent_if_stays() -> None:
    inner = helper.make_node(
        "If",
        ["c"],
        ["i"],
        then_branch=branch("it", [helper.make_node("Neg", ["x"], ["n"])], [("n", [2, 4])]),
        else_branch=branch("ie", [helper.make_node("Abs", ["x"], ["a"])], [("a", [2, 4])]),
    )
    outer = helper.make_node(
        "If",
        ["c"],
        ["y"],
        name="outer",
        then_branch=branch("ot", [inner, helper.make_node("Relu", ["i"], ["r"])], [("r", [2, 4])]),
        else_branch=branch("oe", [helper.make_node("Sigmoid", ["x"], ["s"])], [("s", [2, 4])]),
    )
    dynamic = helper.make_node(
        "If",
        ["d"],
        ["z"],
        name="dynamic",
        then_branch=branch("dt", [helper.make_node("Neg", ["x"], ["dn"])], [("dn", [2, 4])]),
        else_branch=branch("de", [helper.make_node("Exp", ["x"], ["de_"])], [("de_", [2, 4])]),
    )
    c = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(False)))
    m = model(
        [c, outer, dynamic],
        [("x", F, [2, 4]), ("d", T.BOOL, [])],
        [("y", F, [2, 4]), ("z", F, [2, 4])],
    )
    result = apply(FoldIf, m, [])
    assert ops(result.model) == {"Sigmoid": 1, "If": 1, "Neg": 1, "Exp": 1}
    assert ("kept", "dynamic") in outcomes(result)  # its condition 'd' is not constant
    x = {"x": np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4), "d": np.array(True)}
    for got, want in zip(run(result.model, x), run(m, x), strict=True):
        np.testing.assert_array_equal(got, want)


def test_no_if_nodes() -> None:
    m = model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, [2])], [("y", F, [2])])
    result = apply(FoldIf, m)
    assert not result.changed and outcomes(result) == [("not_applicable", "")]


def test_a_scripted_torch_branch_on_the_batch_size() -> None:
    """torch.jit.script keeps `if x.shape[0] == 1` as an If on Shape -> Gather -> Equal -> Cast;
    with the batch fixed (onnx.fix_shapes, no folding) the condition is evaluated."""
    import io
    import warnings

    import torch

    from edgeflow.rules.onnx.shapes import FixShapes

    class Branchy(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x * 2 if x.shape[0] == 1 else x + 1
            return y.relu()

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            torch.jit.script(Branchy()),
            (torch.randn(1, 4),),
            buffer,
            dynamo=False,
            opset_version=17,
            input_names=["x"],
            output_names=["y"],
            dynamic_axes={"x": {0: "b"}},
        )
    m = onnx.load_from_string(buffer.getvalue())
    declared = specs(m, {"x": [1, 4]})
    assert not apply(FoldIf, m, declared).changed  # the batch is dynamic: nothing to evaluate
    fixed = apply(FixShapes, m, declared, fold=False).model
    assert [f.operator for f in check(fixed, NO_CONTROL_FLOW)] == ["If"]
    result = apply(FoldIf, fixed, declared)
    assert {"Mul", "Relu"} <= ops(result.model).keys() and "If" not in ops(result.model)
    assert check(result.model, NO_CONTROL_FLOW) == []
    x = {"x": np.arange(4, dtype=np.float32).reshape(1, 4)}
    np.testing.assert_array_equal(run(result.model, x)[0], run(m, x)[0])
