"""onnx.multiplicative_mask: an attention mask added as a huge negative bias, applied after
the softmax instead."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from edgeflow.rules.base import RuleOptions
from edgeflow.rules.onnx._edit import Edit, NodeRule

SHAPING = frozenset({"Unsqueeze", "Reshape", "Expand", "Squeeze"})  # between bias and scores
HUGE = -1000.0  # a bias at or below this masks: exp(HUGE + 300) underflows float32 to 0
FLOAT = 1


class MultiplicativeMask(NodeRule):
    """Transformers mask padding by adding a bias of about -inf to the attention scores before the
    softmax: `(1 - mask) * finfo(float32).min` (Hugging Face's encoders), `-10000.0` (older BERT
    code), a `masked_fill` of that value (a Where). In float32 the masked keys' exp is 0, so the
    softmax is the softmax over the kept keys. Quantized, that bias is the trouble: one int8
    grid over [-3.4e38, scores] leaves no step for the scores, and LiteRT aborts allocating the
    model (SIGABRT, measured on a 2-layer encoder); with -1e4 the int8 scores keep 5.8 dB.

    The same numbers without the bias: softmax(scores) times the 0/1 keep-mask, divided by its
    sum over the softmax's axis. Exact in real arithmetic wherever a row keeps at least one key
    (float32: within rounding); the int8 tensors then hold probabilities. A row whose keys are
    all masked (an empty attention mask) gives zeros here, the bias form a softmax of garbage:
    the rule changes numerics only there, so verify judges it (tolerance None).

    Matched, for a Softmax over the last axis of `X`:
    - `X = Add(S, Mul(D, C))` (either order): masked where D != 0; keep = 1 - D, for a D of 0s
      and 1s (`1 - mask`, as every exporter writes it); the bias may be reshaped after the
      multiplication (Unsqueeze, Reshape, Expand, Squeeze: `bias[:, None, None, :]`), and the
      keep-mask is reshaped the same way;
    - `X = Add(S, Where(c, C, Z))`, Z a constant 0 or the tensor c was cast from (Hugging Face's
      `_prepare_4d_attention_mask`: `inverted.masked_fill(inverted.bool(), min)`): keep = not c;
    - `X = Where(c, C, S)` (`scores.masked_fill(mask == 0, -1e4)`): keep = not c;
    with C a constant of one value at most -1000 (exp(-1000) is 0 in float32 for any scores
    within +-300 of each other).
    A default rewrite of the TFLite family (armnn: `reduce: mean`)."""

    name = "onnx.multiplicative_mask"
    runs_before: ClassVar[dict[str, str]] = {
        "onnx.sum_as_mean": "with reduce: sum, its row sum is a ReduceSum",
    }
    description = (
        "Apply an additive attention mask (scores + (1 - mask) * -inf) after the softmax: "
        "softmax(scores) * mask / sum; int8 keeps the scores' grid."
    )

    class Options(RuleOptions):
        """reduce: the row sum as ReduceSum ('sum'), or as ReduceMean times the row length
        ('mean': Arm NN 22's parser has MEAN but no SUM)."""

        reduce: Literal["sum", "mean"] = "sum"

    example: ClassVar[tuple[str, str] | None] = (
        "y = Softmax(s + (1 - m) * -3.4e38)",
        "p = Softmax(s) * m; y = p / Max(ReduceSum(p, -1), 1e-30)",
    )

    op_types = frozenset({"Softmax"})
    what = "masked softmax"

    def tolerance(self, opts: Any) -> float | None:
        return None  # exact but where a row masks every key (see the class docstring)

    def replace(self, e: Edit, node: Any, opts: Options) -> str | None:
        rank = e.rank(node.input[0])
        axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
        if e.opset < 13 or rank is None or axis not in (-1, rank - 1):
            return ""
        if e.dtypes.get(node.input[0]) != FLOAT:
            return ""
        found = _masked(e, node.input[0])
        if found is None:
            return ""
        scores, keep, taken = found
        e.removed.update(taken)
        probs = e.op("Mul", e.op("Softmax", scores, axis=-1), keep)
        if opts.reduce == "sum":  # ReduceSum's axes are an input from opset 13
            total = e.op("ReduceSum", probs, e.ints([-1]), keepdims=1)
        else:
            length = e.shape(node.input[0])
            if length is None:
                return "reduce: mean needs the softmax's static length"
            mean = e.reduce_mean(probs, [-1])
            total = e.op("Mul", mean, e.scalar(float(length[-1]), probs))
        total = e.op("Max", total, e.scalar(1e-30, probs))  # a row that masks every key: 0
        e.op("Div", probs, total, out=node.output[0])
        return None


def _masked(e: Edit, x: str) -> tuple[str, str, list[str]] | None:
    """(scores, keep-mask as float 0/1, outputs of the nodes the rewrite takes over) where `x`
    is scores with a huge negative bias added or filled in, else None."""
    add = e.producers.get(x)
    if add is None or e.only_consumer(x) is None:
        return None
    if add.op_type == "Where" and _huge(e, add.input[1]):  # masked_fill on the scores
        return add.input[2], _not(e, add.input[0]), [x]
    if add.op_type != "Add":
        return None
    for scores, bias in ((add.input[0], add.input[1]), (add.input[1], add.input[0])):
        # one bias often serves every layer: taken over with its last reader (the optimize
        # stage drops a bias no reader is left for)
        taken = [x, bias] if e.only_consumer(bias) is not None else [x]
        shaping = []  # `bias[:, None, None, :]` after the multiplication: the keep-mask too
        made = e.producers.get(bias)
        while made is not None and made.op_type in SHAPING and made.input[0]:
            shaping.append(made)
            made = e.producers.get(made.input[0])
        if made is None:
            continue
        keep = None
        if made.op_type == "Mul":
            for d, c in ((made.input[0], made.input[1]), (made.input[1], made.input[0])):
                if keep is None and _huge(e, c) and e.dtypes.get(d) == FLOAT:
                    keep = e.op("Sub", e.scalar(1.0, d), d)
        if made.op_type == "Where" and _huge(e, made.input[1]):
            cond, other = made.input[0], made.input[2]
            cast = e.producers.get(cond)
            zero = e.folded(other)
            if (zero is not None and not zero.any()) or (
                cast is not None and cast.op_type == "Cast" and cast.input[0] == other
            ):
                keep = _not(e, cond)
        if keep is not None:
            from onnx import helper

            for node in reversed(shaping):  # the same reshaping, on the keep-mask
                attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
                keep = e.op(node.op_type, keep, *node.input[1:], **attrs)
            return scores, keep, taken
    return None


def _huge(e: Edit, name: str) -> bool:
    """A constant of one value, at or below HUGE."""
    value = e.folded(name)
    return value is not None and value.size >= 1 and value.max() == value.min() <= HUGE


def _not(e: Edit, cond: str) -> str:
    """1.0 where the bool `cond` is false, else 0.0."""
    import numpy as np

    one = e.array(np.array(1.0, np.float32), "one")
    return e.op("Sub", one, e.op("Cast", cond, to=FLOAT))
