"""onnx.ids_as_float: integer inputs (token ids, an attention mask) fed as float32, embedding
lookups as one-hot MatMuls and the mask's Cast dropped: exact for ids in the table's rows."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from edgeflow.core.onnxsession import as_declared
from edgeflow.rules.onnx.ids import IdsAsFloat
from edgeflow.targets import load_profile
from edgeflow.targets.precheck import check
from tests.rules.onnx.helpers import apply, model, ops, run
from tests.rules.sites import outcomes

ROWS, WIDTH, TOKENS = 50, 8, 6


def token_model(table_shape: tuple[int, ...] = (ROWS, WIDTH)) -> onnx.ModelProto:
    """BERT's front, as exporters write it: e = Gather(table, ids), the mask cast to float
    and unsqueezed, y = e * mask (int64 ids and mask [1, TOKENS])."""
    n = helper.make_node
    rest = list(table_shape[1:])
    nodes = [
        n("Gather", ["table", "ids"], ["e"], name="embedding"),
        n("Unsqueeze", ["mask", "axes"], ["m3"]),
        n("Cast", ["m3"], ["mf"], to=T.FLOAT),
        n("Mul", ["e", "mf" if len(rest) == 1 else "mf4"], ["y"]),
    ]
    inits = {
        "table": np.random.default_rng(0).normal(size=table_shape).astype(np.float32),
        "axes": np.array([-1], np.int64),
    }
    if len(rest) > 1:  # a table of [rows, a, b]: the mask broadcast over both
        nodes.insert(3, n("Unsqueeze", ["mf", "axes"], ["mf4"]))
    return model(
        nodes,
        [("ids", T.INT64, [1, TOKENS]), ("mask", T.INT64, [1, TOKENS])],
        [("y", T.FLOAT, [1, TOKENS, *rest])],
        inits,
    )


def fed(m: onnx.ModelProto, ids: list[int], mask: list[int]) -> dict[str, np.ndarray]:
    """int64 samples as the build feeds them: in each input's declared type."""
    types = {"1": "tensor(float)", "7": "tensor(int64)"}
    declared = {v.name: types[str(v.type.tensor_type.elem_type)] for v in m.graph.input}
    samples = {"ids": np.array([ids], np.int64), "mask": np.array([mask], np.int64)}
    return {k: as_declared(v, declared[k]) for k, v in samples.items()}


@pytest.mark.parametrize("table_shape", [(ROWS, WIDTH), (ROWS, 2, 4)])
def test_token_inputs_become_float_and_the_lookup_a_one_hot_matmul(
    table_shape: tuple[int, ...],
) -> None:
    m = token_model(table_shape)
    result = apply(IdsAsFloat, m)
    assert [o[0] for o in outcomes(result)] == ["changed", "changed", "changed"]
    assert [v.type.tensor_type.elem_type for v in result.model.graph.input] == [T.FLOAT] * 2
    counts = ops(result.model)
    assert "Gather" not in counts and "Cast" not in counts and counts["MatMul"] == 1
    for ids, mask in (([0, 1, 2, 49, 7, 7], [1, 1, 1, 1, 0, 0]), ([3, 9, 27, 48, 0, 0], [1] * 6)):
        want = run(m, fed(m, ids, mask))[0]
        got = run(result.model, fed(result.model, ids, mask))[0]
        np.testing.assert_array_equal(got, want)  # one 1.0 per row: the table's own values


def test_an_id_past_the_table_gives_a_zero_row() -> None:
    """Where Gather fails (or wraps a negative id), the one-hot row is all zeros."""
    rewritten = apply(IdsAsFloat, token_model()).model
    got = run(rewritten, fed(rewritten, [0, 50, -1, 1, 2, 3], [1] * 6))[0]
    assert not got[0, 1].any() and not got[0, 2].any() and got[0, 0].any()


def test_an_input_with_another_reader_stays_an_integer_and_says_which() -> None:
    """`mask == 0` (an Equal) has no float rewrite here: the mask is kept, the ids still
    converted."""
    m = token_model()
    n = helper.make_node
    m.graph.node.append(n("Equal", ["mask", "zero"], ["pad"], name="is_pad"))
    m.graph.initializer.append(helper.make_tensor("zero", T.INT64, [], [0]))
    m.graph.output.append(helper.make_tensor_value_info("pad", T.BOOL, [1, TOKENS]))
    result = apply(IdsAsFloat, m)
    assert ("kept", "mask") in outcomes(result)
    [kept] = [site for site in result.sites if site.where == "mask"]
    assert "is_pad" in kept.message  # the reader that keeps it
    assert [v.type.tensor_type.elem_type for v in result.model.graph.input] == [T.FLOAT, T.INT64]
    want = run(m, fed(m, [4, 5, 6, 0, 0, 0], [1, 1, 1, 0, 0, 0]))
    got = run(result.model, fed(result.model, [4, 5, 6, 0, 0, 0], [1, 1, 1, 0, 0, 0]))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_a_model_without_integer_inputs_is_left_alone() -> None:
    n = helper.make_node
    m = model([n("Relu", ["x"], ["y"])], [("x", T.FLOAT, [1, 4])], [("y", T.FLOAT, [1, 4])])
    result = apply(IdsAsFloat, m)
    assert not result.changed and outcomes(result)[0][0] == "not_applicable"


def test_integer_samples_are_fed_as_float_only_where_exact() -> None:
    ids = np.array([[0, 7, 2**24]], np.int64)
    assert as_declared(ids, "tensor(float)").dtype == np.float32
    too_big = np.array([[2**24 + 1]], np.int64)  # float32 would round it: fed as it is
    assert as_declared(too_big, "tensor(float)").dtype == np.int64
    assert as_declared(np.array([1.5], np.float32), "tensor(float)").dtype == np.float32


def test_the_armnn_precheck_names_the_rule_for_the_lookup_and_the_cast() -> None:
    """A transformer's front: the embeddings then a projection (a MatMul, which Arm NN's
    parser lacks until onnx.lower_matmul). The rewrite adds no finding of its own (its
    operands are 3-D, as the parser's broadcasting kernels take them; its MatMul is one
    more of a finding the model has), so the precheck proves it and suggests it."""
    m = token_model()
    m.graph.node.append(helper.make_node("MatMul", ["y", "w"], ["q"]))
    w = np.ones((WIDTH, 4), np.float32)
    m.graph.initializer.append(onnx.numpy_helper.from_array(w, "w"))
    m.graph.output[0].CopyFrom(helper.make_tensor_value_info("q", T.FLOAT, [1, TOKENS, 4]))
    findings = {f.operator: f for f in check(m, load_profile("armnn"))}
    assert findings["Gather"].rule == findings["Cast"].rule == "onnx.ids_as_float"
    after = check(apply(IdsAsFloat, m).model, load_profile("armnn"))
    assert {f.operator for f in after if f.severity == "error"} == {"MatMul"}


def test_an_input_a_subgraph_reads_stays_an_integer() -> None:
    """An If's branch reading the ids by name would see float where it expects int64."""
    n = helper.make_node
    m = token_model()
    branch = helper.make_graph(
        [n("Cast", ["ids"], ["c"], to=T.FLOAT)],
        "b",
        [],
        [helper.make_tensor_value_info("c", T.FLOAT, [1, TOKENS])],
    )
    m.graph.node.append(n("If", ["flag"], ["z"], then_branch=branch, else_branch=branch, name="if"))
    m.graph.input.append(helper.make_tensor_value_info("flag", T.BOOL, []))
    m.graph.output.append(helper.make_tensor_value_info("z", T.FLOAT, [1, TOKENS]))
    result = apply(IdsAsFloat, m)
    [kept] = [site for site in result.sites if site.where == "ids"]
    assert "If 'if'" in kept.message
    assert result.model.graph.input[0].type.tensor_type.elem_type == T.INT64
