"""onnx.unroll_loop: Loops with a constant trip count become one body copy per iteration."""

from __future__ import annotations

import io
import warnings
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as T
from onnx import helper

from edgeflow.rules.base import Status
from edgeflow.rules.onnx.loop import UnrollLoop
from edgeflow.targets import load_profile
from edgeflow.targets.precheck import check
from tests.rules.onnx.helpers import apply, feeds, model, ops, run, specs
from tests.rules.sites import outcomes

F = T.FLOAT
I64, BOOL = T.INT64, T.BOOL


def body(
    nodes: list[onnx.NodeProto],
    carried: list[tuple[str, str, list[int]]],
    scans: list[tuple[str, list[Any] | None]],
    prefix: str = "",
) -> onnx.GraphProto:
    """A Loop body (i, cond_in, carried ins) -> (cond_out, carried outs, scan outputs);
    `carried` holds (input name, output name, shape); `prefix` starts the first three."""
    v = helper.make_tensor_value_info
    cond_out = f"{prefix}cond_out"
    inputs = [v(f"{prefix}i", I64, []), v(f"{prefix}cond_in", BOOL, [])]
    inputs += [v(name, F, shape) for name, _, shape in carried]
    outputs = [v(cond_out, BOOL, [])]
    outputs += [v(out, F, shape) for _, out, shape in carried]
    outputs += [v(name, F, shape) for name, shape in scans]
    return helper.make_graph(nodes, "body", inputs, outputs)


def cumulative_sum(
    trips: int = 5,
    cond: bool = True,
    scan_shape: list[Any] | None = [2, 3],  # noqa: B006
) -> onnx.ModelProto:
    """x = Relu(x0) added to s (from x) `trips` times, each partial sum times its iteration
    number a scan output: s_k = s_{k-1} + x, ys[k] = s_k * k; the Loop between other nodes."""
    loop_body = body(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["s_in", "x"], ["s_out"]),
            helper.make_node("Cast", ["i"], ["k"], to=F),
            helper.make_node("Mul", ["s_out", "k"], ["scan"]),
        ],
        [("s_in", "s_out", [2, 3])],
        [("scan", scan_shape)],
    )
    nodes = [
        helper.make_node("Relu", ["x0"], ["x"]),
        helper.make_node("Loop", ["M", "c", "x"], ["s", "ys"], name="cumsum", body=loop_body),
        helper.make_node("Neg", ["ys"], ["y"]),
    ]
    return model(
        nodes,
        [("x0", F, [2, 3])],
        [("s", F, [2, 3]), ("y", F, [trips, 2, 3])],
        {"M": np.array(trips, np.int64), "c": np.array(cond)},
    )


def assert_same(a: onnx.ModelProto, b: onnx.ModelProto, seed: int = 0) -> None:
    x = feeds(specs(a), seed)
    for got, want in zip(run(b, x), run(a, x), strict=True):
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


# How the scan output's values are stacked, by the shape the body declares for it.
STACKING = {
    "static": ([2, 3], {"Concat": 1, "Reshape": 1}),
    "symbolic": (["n", 3], {"Concat": 2, "Reshape": 1, "Shape": 1}),
    "unknown": (None, {"Concat": 1, "Unsqueeze": 5}),
}


@pytest.mark.parametrize("declared", list(STACKING))
def test_a_cumulative_sum_with_a_scan_output_is_unrolled_exactly(declared: str) -> None:
    shape, stacking = STACKING[declared]
    m = cumulative_sum(scan_shape=shape)
    result = apply(UnrollLoop, m)
    assert outcomes(result) == [("changed", "cumsum")] and result.matches == 1
    # five Adds, five Muls (Cast(i) folded to constants), then the stacking
    assert ops(result.model) == {"Relu": 1, "Add": 5, "Mul": 5, "Neg": 1, **stacking}
    assert_same(m, result.model)
    x = feeds(specs(m))["x0"]
    s, y = run(result.model, {"x0": x})
    # s starts as x: after iteration k it is (k + 2) x
    np.testing.assert_allclose(s, np.maximum(x, 0) * 6, rtol=1e-6)
    np.testing.assert_allclose(y[3], -(np.maximum(x, 0) * 5) * 3, rtol=1e-6)
    assert {t.name for t in result.model.graph.initializer}.isdisjoint({"M", "c"})


def test_without_a_condition_input_and_with_a_constant_true_condition() -> None:
    """Loop(M, "") with the body's condition a Constant true; a carried value passed
    through unchanged, and one set to an outer value."""
    true = helper.make_tensor("t", BOOL, [], [True])
    loop_body = body(
        [
            helper.make_node("Constant", [], ["cond_out"], value=true),
            helper.make_node("Mul", ["a_in", "w"], ["a_out"]),
            helper.make_node("Identity", ["b_in"], ["b_out"]),
            helper.make_node("Identity", ["x"], ["c_out"]),
        ],
        [("a_in", "a_out", [4]), ("b_in", "b_out", [4]), ("c_in", "c_out", [4])],
        [("a_out", [4])],
    )
    nodes = [
        helper.make_node("Loop", ["M", "", "x", "x", "x"], ["a", "b", "c", "as"], body=loop_body)
    ]
    m = model(
        nodes,
        [("x", F, [4])],
        [("a", F, [4]), ("b", F, [4]), ("c", F, [4]), ("as", F, [3, 4])],
        {"M": np.array(3, np.int64), "w": np.array([0.5, -2, 3, 1], np.float32)},
    )
    result = apply(UnrollLoop, m)
    assert "Loop" not in ops(result.model) and ops(result.model)["Mul"] == 3
    assert_same(m, result.model)


def nested(inner_trips_from_outer: bool) -> onnx.ModelProto:
    """An outer Loop (3 iterations) whose body holds an inner Loop adding x to the carried
    value 2 times, or i + 1 times (its trip count computed from the outer iteration)."""
    inner = body(
        [
            helper.make_node("Identity", ["inner_cond_in"], ["inner_cond_out"]),
            helper.make_node("Add", ["t_in", "x"], ["t_out"]),
        ],
        [("t_in", "t_out", [2])],
        [],
        prefix="inner_",
    )
    count = [helper.make_node("Add", ["i", "one"], ["n"])] if inner_trips_from_outer else []
    outer = body(
        [
            *count,
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node(
                "Loop", ["n" if inner_trips_from_outer else "two", "", "s_in"], ["u"], body=inner
            ),
            helper.make_node("Mul", ["u", "half"], ["s_out"]),
        ],
        [("s_in", "s_out", [2])],
        [("u", [2])],
    )
    nodes = [
        helper.make_node("Sigmoid", ["x0"], ["x"]),
        helper.make_node("Loop", ["M", "c", "x0"], ["s", "us"], name="outer", body=outer),
        helper.make_node("Add", ["s", "x"], ["y"]),
    ]
    inits = {
        "M": np.array(3, np.int64),
        "c": np.array(True),
        "two": np.array(2, np.int64),
        "one": np.array(1, np.int64),
        "half": np.array([0.5], np.float32),
    }
    return model(nodes, [("x0", F, [2])], [("y", F, [2]), ("us", F, [3, 2])], inits)


@pytest.mark.parametrize("from_outer", [False, True], ids=["constant", "from_outer"])
def test_nested_loops_are_unrolled_in_turn(from_outer: bool) -> None:
    m = nested(from_outer)
    result = apply(UnrollLoop, m)
    # the outer Loop, then each of its 3 copies of the inner one
    assert [s for s, _ in outcomes(result)] == ["changed"] * 4 and result.matches == 4
    assert "Loop" not in ops(result.model)
    assert ops(result.model)["Add"] == 1 + (6 if not from_outer else 1 + 2 + 3)
    assert_same(m, result.model)


def test_dynamic_trip_counts_and_data_dependent_conditions_are_kept() -> None:
    dynamic = cumulative_sum()
    dynamic.graph.initializer.pop(0)  # M becomes an input: a count the caller chooses
    dynamic.graph.input.append(helper.make_tensor_value_info("M", I64, []))
    while_loop = cumulative_sum()
    loop_body = while_loop.graph.node[1].attribute[0].g
    del loop_body.node[0]  # continue while the sum's least element stays below 4
    loop_body.node.append(helper.make_node("ReduceMin", ["s_out"], ["low"], keepdims=0))
    loop_body.node.append(helper.make_node("Less", ["low", "four"], ["cond_out"]))
    loop_body.initializer.append(onnx.numpy_helper.from_array(np.array(4, np.float32), "four"))
    onnx.checker.check_model(while_loop, full_check=True)
    for m in (dynamic, while_loop, cumulative_sum(cond=False)):
        result = apply(UnrollLoop, m, specs(m, {"M": []}))
        assert outcomes(result) == [("kept", "cumsum")] and not result.changed
    big = apply(UnrollLoop, cumulative_sum(8), max_iterations=6)
    assert outcomes(big) == [("kept", "cumsum")]


@pytest.mark.parametrize("target", ["tflite", "tflite_micro", "armnn"])
def test_the_precheck_suggests_it_where_the_target_has_no_loop(target: str) -> None:
    m = cumulative_sum()
    profile = load_profile(target)
    [finding] = [f for f in check(m, profile) if f.operator == "Loop"]
    assert finding.rule == "onnx.unroll_loop"
    after = apply(UnrollLoop, m).model
    assert not [f for f in check(after, profile) if f.severity == "error"]


class ScriptedLoop(torch.nn.Module):
    """A recurrence over the input's columns, each state appended to a list that is stacked:
    TorchScript exports a Loop whose trip count its shape fixes, and the list as SequenceEmpty,
    a SequenceInsert per iteration and ConcatFromSequence."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x
        states = []
        for i in range(x.size(1)):
            h = torch.tanh(self.lin(h) + x * i)
            states.append(h)
        return h, torch.stack(states)


def scripted_loop() -> onnx.ModelProto:
    torch.manual_seed(0)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            torch.jit.script(ScriptedLoop().eval()),
            (torch.randn(1, 8),),
            buffer,
            dynamo=False,
            opset_version=17,
            input_names=["x"],
            output_names=["h", "hs"],
        )
    return onnx.load_from_string(buffer.getvalue())


def test_torchscripts_loop_and_list_become_plain_tensors() -> None:
    m = scripted_loop()
    assert {"Loop", "SequenceEmpty", "ConcatFromSequence"} <= set(ops(m))
    result = apply(UnrollLoop, m)
    statuses = [s for s, _ in outcomes(result)]
    assert statuses[:2] == ["changed", "changed"] and result.matches == 1  # the Loop, the list
    assert ops(result.model) == {"Gemm": 8, "Mul": 8, "Add": 8, "Tanh": 8, "Concat": 1,
                                 "Reshape": 1}  # fmt: skip
    assert_same(m, result.model)


def test_a_sequence_carried_through_the_loop_is_read_as_its_tensors() -> None:
    """seq = []; for 3 iterations: s = s * 2, seq.append(s); then Concat(seq) on axis 0,
    seq[-1] and len(seq)."""
    v = helper.make_tensor_value_info
    sequence = helper.make_tensor_sequence_value_info
    loop_body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Mul", ["s_in", "two"], ["s_out"]),
            helper.make_node("SequenceInsert", ["q_in", "s_out"], ["q_out"]),
        ],
        "body",
        [v("i", I64, []), v("cond_in", BOOL, []), v("s_in", F, [2]), sequence("q_in", F, [2])],
        [v("cond_out", BOOL, []), v("s_out", F, [2]), sequence("q_out", F, [2])],
    )
    nodes = [
        helper.make_node("SequenceEmpty", [], ["q0"], dtype=F),
        helper.make_node("Loop", ["M", "", "x", "q0"], ["s", "q"], body=loop_body),
        helper.make_node("ConcatFromSequence", ["q"], ["all"], axis=0),
        helper.make_node("SequenceAt", ["q", "last"], ["end"]),
        helper.make_node("SequenceLength", ["q"], ["n"]),
    ]
    m = model(
        nodes,
        [("x", F, [2])],
        [("all", F, [6]), ("end", F, [2]), ("n", I64, [])],
        {"M": np.array(3, np.int64), "two": np.full(2, 2, np.float32), "last": np.array(-1)},
    )
    result = apply(UnrollLoop, m)
    assert result.matches == 1 and len(result.sites_of(Status.CHANGED)) >= 4
    assert not {"Loop", "SequenceEmpty", "SequenceInsert"} & set(ops(result.model))
    assert_same(m, result.model)


def test_a_loop_inside_an_if_branch_is_unrolled_there() -> None:
    """The Loop reads the branch's value y0 and the main graph's trip count."""
    loop_body = body(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["s_in", "y0"], ["s_out"]),
        ],
        [("s_in", "s_out", [2])],
        [],
    )
    then = helper.make_graph(
        [
            helper.make_node("Neg", ["x"], ["y0"]),
            helper.make_node("Loop", ["M", "", "y0"], ["t"], name="inner", body=loop_body),
        ],
        "then",
        [],
        [helper.make_tensor_value_info("t", F, [2])],
    )
    other = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", F, [2])],
    )
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    m = model(
        nodes, [("x", F, [2]), ("c", BOOL, [])], [("y", F, [2])], {"M": np.array(4, np.int64)}
    )
    result = apply(UnrollLoop, m)
    assert outcomes(result)[0] == ("changed", "inner") and result.matches == 1
    assert ops(result.model) == {"If": 1, "Neg": 1, "Relu": 1, "Add": 4}
    for c in (True, False):
        x = {"x": np.array([1.5, -2], np.float32), "c": np.array(c)}
        np.testing.assert_array_equal(run(result.model, x)[0], run(m, x)[0])


def test_a_trip_count_from_a_static_shape_is_evaluated() -> None:
    """M = Shape(x0)[1] (3 for x0 [2, 3]), as exporters write `range(x.size(1))`; with
    evaluate: false it stays a computed count."""
    m = cumulative_sum(trips=3)
    m.graph.initializer.pop(0)  # M
    m.graph.initializer.append(onnx.numpy_helper.from_array(np.array(1, np.int64), "one"))
    m.graph.node.insert(0, helper.make_node("Shape", ["x0"], ["shape"]))
    m.graph.node.insert(1, helper.make_node("Gather", ["shape", "one"], ["M"], axis=0))
    onnx.checker.check_model(m, full_check=True)
    result = apply(UnrollLoop, m)
    assert outcomes(result)[0] == ("changed", "cumsum")
    assert not {"Loop", "Shape", "Gather"} & set(ops(result.model))
    assert_same(m, result.model)
    kept = apply(UnrollLoop, m, evaluate=False)
    assert outcomes(kept) == [("kept", "cumsum")]
