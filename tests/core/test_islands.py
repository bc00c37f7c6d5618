"""Float islands (edgeflow.core.islands): found by what they compute, and found again by
their boundary tensors after a rule has rewritten what lies between them."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgeflow.core import islands
from edgeflow.rules.onnx.decompose import Decompose
from tests.rules.onnx.helpers import apply


def block() -> onnx.ModelProto:
    """A transformer block as exporters write it: a token embedding (Gather of a constant
    table), LayerNormalization, a weight MatMul (no island), query-key scores (a MatMul of
    two computed tensors), Softmax, and an erf GELU with its 0.5 applied to x first."""
    rng = np.random.default_rng(0)
    table = numpy_helper.from_array(rng.normal(size=(16, 8)).astype(np.float32), "table")
    weight = numpy_helper.from_array(rng.normal(size=(8, 8)).astype(np.float32), "weight")
    scale = numpy_helper.from_array(np.ones(8, np.float32), "scale")
    consts = [
        numpy_helper.from_array(np.array(v, np.float32), n)
        for n, v in (("sqrt2", 1.4142135), ("one", 1.0), ("half", 0.5))
    ]
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["embedded"], name="embed"),
        helper.make_node("LayerNormalization", ["embedded", "scale"], ["normed"], name="ln"),
        helper.make_node("MatMul", ["normed", "weight"], ["projected"], name="project"),
        helper.make_node("Transpose", ["projected"], ["keys"], perm=[1, 0], name="keys"),
        helper.make_node("MatMul", ["projected", "keys"], ["scores"], name="scores"),
        helper.make_node("Softmax", ["scores"], ["probs"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["probs", "projected"], ["context"], name="context"),
        helper.make_node("Div", ["context", "sqrt2"], ["scaled"], name="gelu_div"),
        helper.make_node("Erf", ["scaled"], ["erf"], name="gelu_erf"),
        helper.make_node("Add", ["erf", "one"], ["plus1"], name="gelu_add"),
        helper.make_node("Mul", ["context", "half"], ["halfx"], name="gelu_half"),
        helper.make_node("Mul", ["halfx", "plus1"], ["gelu"], name="gelu_mul"),
    ]
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("gelu", TensorProto.FLOAT, [4, 8])],
        [table, weight, scale, *consts],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_each_kind_is_found_by_what_it_computes() -> None:
    found = islands.find(block())
    assert [(i.kind, i.entries, i.exits) for i in found] == [
        ("embeddings", ("ids",), ("embedded",)),
        ("layernorm", ("embedded",), ("normed",)),
        ("attention_scores", ("projected", "keys"), ("scores",)),  # keys: a moved tensor
        ("softmax", ("scores",), ("probs",)),
        ("attention_scores", ("probs", "projected"), ("context",)),
        ("gelu", ("context",), ("gelu",)),  # 0.5 x times (1 + erf): the exporter's order
    ]  # the weight's MatMul is none
    model = block()
    nodes, inputs = islands.onnx_nodes(model)
    kept, lost = islands.kept_nodes(found, ["gelu", "softmax"], nodes, inputs)
    assert (
        kept
        == {
            "softmax": [["softmax"]],
            "gelu": [["gelu_div", "gelu_erf", "gelu_add", "gelu_half", "gelu_mul"]],
        }
        and not lost
    )


def test_an_island_is_found_again_after_a_rule_decomposed_it() -> None:
    """onnx.decompose writes Erf as a rational approximation (two dozen nodes) and keeps the
    Erf's input and output names: the GELU found before it is the same island after, its
    nodes those of the approximation and the GELU's own, nothing of the graph around it."""
    model = block()
    found = [i for i in islands.find(model) if i.kind == "gelu"]
    rewritten = apply(Decompose, model, ops=["Erf"]).model
    assert "Erf" not in {n.op_type for n in rewritten.graph.node}
    kept, lost = islands.kept_nodes(found, ["gelu"], *islands.onnx_nodes(rewritten))
    inside = kept["gelu"][0]
    around = {"embed", "ln", "project", "keys", "scores", "softmax", "context"}
    assert not lost and len(inside) > 20 and not around & set(inside)
    assert {"gelu_div", "gelu_add", "gelu_half", "gelu_mul"} <= set(inside)


def test_an_island_whose_boundary_is_gone_is_lost_not_widened() -> None:
    model = block()
    nodes, inputs = islands.onnx_nodes(model)
    gone = islands.Island("gelu", ("context",), ("renamed",))
    assert islands.region(nodes, gone, inputs) is None
    # an entry the walk never meets: it would reach the graph's input around it
    wrong = islands.Island("softmax", ("elsewhere",), ("probs",))
    assert islands.region(nodes, wrong, inputs) is None
    kept, lost = islands.kept_nodes([gone, wrong], islands.KINDS, nodes, inputs)
    assert kept == {} and lost == [gone, wrong]
    record = islands.record(kept, lost, islands.KINDS)
    assert record["summary"] == "" and [i["exits"] for i in record["lost"]] == [
        ["renamed"],
        ["probs"],
    ]
