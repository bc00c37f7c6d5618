"""onnx.multiplicative_mask: an attention mask added to the scores as a huge negative bias,
applied after the softmax instead (softmax(s) * keep / its sum): the same probabilities
wherever a row keeps a key, and int8 builds of the TFLite family that keep the scores' grid."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from edgeflow.rules.onnx.attention import MultiplicativeMask
from tests.rules.onnx.helpers import apply, model, ops, run
from tests.rules.sites import outcomes

F = T.FLOAT
MIN = float(np.finfo(np.float32).min)
SCORES = [1, 2, 5, 5]  # batch, heads, queries, keys


def additive(value: float = MIN, shared: bool = False, opset: int = 18) -> onnx.ModelProto:
    """y = Softmax(s + (1 - m) * value) for a 0/1 key mask m [1, 1, 1, 5], as Hugging Face's
    encoders add it; `shared`: one bias for two softmaxes (every layer reads the same one)."""
    n = helper.make_node
    nodes = [
        n("Sub", ["one", "m"], ["inverted"]),
        n("Mul", ["inverted", "value"], ["bias"]),
        n("Add", ["s", "bias"], ["x"]),
        n("Softmax", ["x"], ["y"], axis=-1, name="attn"),
    ]
    outputs = [("y", F, SCORES)]
    if shared:
        nodes += [n("Add", ["bias", "s"], ["x2"]), n("Softmax", ["x2"], ["y2"], axis=3)]
        outputs.append(("y2", F, SCORES))
    inits = {"one": np.array(1.0, np.float32), "value": np.array(value, np.float32)}
    return model(nodes, [("s", F, SCORES), ("m", F, [1, 1, 1, 5])], outputs, inits, opset)


def reshaped_after() -> onnx.ModelProto:
    """((1 - m) * min)[:, None, None, :] added to the scores: the mask [1, 5] multiplied,
    then unsqueezed to [1, 1, 1, 5]."""
    n = helper.make_node
    nodes = [
        n("Sub", ["one", "m"], ["inverted"]),
        n("Mul", ["inverted", "value"], ["flat"]),
        n("Unsqueeze", ["flat", "axes"], ["bias"]),
        n("Add", ["s", "bias"], ["x"]),
        n("Softmax", ["x"], ["y"], axis=-1),
    ]
    inits = {
        "one": np.array(1.0, np.float32),
        "value": np.array(MIN, np.float32),
        "axes": np.array([1, 2], np.int64),
    }
    return model(nodes, [("s", F, SCORES), ("m", F, [1, 5])], [("y", F, SCORES)], inits)


def filled(on_scores: bool) -> onnx.ModelProto:
    """masked_fill of -1e4 on the scores (Where(c, -1e4, s)), or Hugging Face's
    `_prepare_4d_attention_mask` (Where(bool(inverted), min, inverted) added to them)."""
    n = helper.make_node
    if on_scores:
        nodes = [
            n("Equal", ["m", "zero"], ["c"]),
            n("Where", ["c", "value", "s"], ["x"]),
        ]
        value = -1e4
    else:
        nodes = [
            n("Sub", ["one", "m"], ["inverted"]),
            n("Cast", ["inverted"], ["c"], to=T.BOOL),
            n("Where", ["c", "value", "inverted"], ["bias"]),
            n("Add", ["s", "bias"], ["x"]),
        ]
        value = MIN
    nodes.append(n("Softmax", ["x"], ["y"], axis=-1))
    inits = {
        "one": np.array(1.0, np.float32),
        "zero": np.array(0.0, np.float32),
        "value": np.array(value, np.float32),
    }
    return model(nodes, [("s", F, SCORES), ("m", F, [1, 1, 1, 5])], [("y", F, SCORES)], inits)


def inputs(keep: list[int], flat: bool = False) -> dict[str, np.ndarray]:
    s = np.random.default_rng(0).normal(size=SCORES).astype(np.float32) * 4
    m = np.array(keep, np.float32)
    return {"s": s, "m": m.reshape(1, 5) if flat else m.reshape(1, 1, 1, 5)}


@pytest.mark.parametrize(
    "build",
    [
        additive,
        lambda: additive(-1e4),
        lambda: additive(opset=13),  # ReduceMean's axes an attribute before opset 18
        lambda: filled(True),
        lambda: filled(False),
    ],
)
@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_the_probabilities_are_the_masked_softmaxs(build, reduce: str) -> None:
    m = build()
    result = apply(MultiplicativeMask, m, reduce=reduce)
    assert [o[0] for o in outcomes(result)] == ["changed"]
    assert "Where" not in ops(result.model) and ops(result.model)["Softmax"] == 1
    for keep in ([1, 1, 1, 0, 0], [1, 0, 1, 0, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]):
        want, got = run(m, inputs(keep))[0], run(result.model, inputs(keep))[0]
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-7)
    # every key masked: the bias form averages what it masked, this form gives 0
    assert not run(result.model, inputs([0] * 5))[0].any()


def test_one_bias_for_every_layer_is_rewritten_at_each_softmax() -> None:
    m = additive(shared=True)
    result = apply(MultiplicativeMask, m)
    assert [o[0] for o in outcomes(result)] == ["changed", "changed"]
    for got, want in zip(
        run(result.model, inputs([1, 1, 0, 1, 0])), run(m, inputs([1, 1, 0, 1, 0])), strict=True
    ):
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-7)


def test_a_bias_that_is_not_a_mask_is_kept() -> None:
    """-5 (a learned or relative-position bias would be such a value) changes the scores,
    it does not mask them; a softmax over another axis is not attention's."""
    assert not apply(MultiplicativeMask, additive(-5.0)).changed
    other_axis = additive()
    other_axis.graph.node[3].attribute[0].i = 2
    assert not apply(MultiplicativeMask, other_axis).changed


def test_a_bias_reshaped_after_its_multiplication_reshapes_the_keep_mask_the_same_way() -> None:
    m = reshaped_after()
    result = apply(MultiplicativeMask, m)
    assert [o[0] for o in outcomes(result)] == ["changed"]
    for keep in ([1, 1, 1, 0, 0], [0, 1, 0, 1, 1]):
        want, got = (
            run(m, inputs(keep, flat=True))[0],
            run(result.model, inputs(keep, flat=True))[0],
        )
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-7)
