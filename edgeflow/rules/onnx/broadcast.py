"""onnx.explicit_broadcast: numpy broadcasting written out, in the form onnx2tf converts right.

Measured with onnx2tf 1.28.8 (LiteRT and Arm NN alike, edgeflow/targets/probes.py): a rank-3
constant added to or multiplied with a 4-D tensor ([C, H, W] or [1, H, W] against
[N, C, H, W]) converts silently wrong (0.52 and 0.75 of the output off), while the same
constant with its leading 1 written out ([1, C, H, W]) converts right; and a Sum or Mean whose
inputs differ in shape does not convert at all (TensorFlow's add_n takes equal shapes only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from edgeflow.rules.base import RuleOptions
from edgeflow.rules.fixes import Fix
from edgeflow.rules.onnx._edit import Edit, NodeRule

if TYPE_CHECKING:
    import onnx

# Ops whose inputs broadcast numpy-style (multidirectionally) to the output's shape.
BROADCASTING = frozenset(
    {
        *("Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean"),
        *("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor"),
        "Where",
    }
)
VARIADIC_SUMS = frozenset({"Sum", "Mean"})  # converted as add_n: equal shapes only
# The ops whose probes measured it (the same_rank and same_shapes checks of the TFLite family)
MEASURED = ("Add", "Sub", "Mul", "Div", "Max", "Min")


class ExplicitBroadcast(NodeRule):
    """Exact. Every operand of a broadcasting op (Add, Mul, Where, the comparisons, ...)
    below the output's rank gets leading 1 dims (a constant is reshaped, a computed tensor
    goes through Unsqueeze); scalars stay. A Sum or Mean whose inputs differ in shape becomes
    a chain of Add in the same order (a Mean then divided by its input count). Needs the
    inputs' ranks (Sum and Mean: their static shapes). A default rewrite of tflite,
    tflite_micro and armnn."""

    name = "onnx.explicit_broadcast"
    description = "Give broadcast operands the output's rank; Sum/Mean of unequal shapes as Adds."
    fixes = (
        *(Fix.check(op, "same_rank") for op in MEASURED),
        *(Fix.check(op, "same_shapes") for op in sorted(VARIADIC_SUMS)),
    )

    class Options(RuleOptions):
        pass

    example: ClassVar[tuple[str, str] | None] = (
        "y = Mul(x[1, 4, 8, 8], c[4, 8, 8]); s = Mean(x, b[1, 1, 8, 8])",
        "y = Mul(x, c'[1, 4, 8, 8]); s = Div(Add(x, b), 2)",
    )

    def tolerance(self, opts: Any) -> float | None:
        return 1e-6  # a Mean divides its sum by the count: onnxruntime may round otherwise

    op_types = BROADCASTING
    what = "implicit broadcast"

    def replace(self, e: Edit, node: Any, opts: Options) -> str | None:
        return _explicit(node, e)


def _explicit(node: onnx.NodeProto, e: Edit) -> str | None:
    inputs = list(node.input)
    ranks = [e.rank(name) for name in inputs]
    if any(rank is None for name, rank in zip(inputs, ranks, strict=True) if name):
        return "an input's rank is unknown"
    rank = max(r for r in ranks if r is not None)
    lower = [i for i, r in enumerate(ranks) if r is not None and 0 < r < rank]
    chain = node.op_type in VARIADIC_SUMS and len(inputs) > 1
    if chain:
        shapes = [e.shape(name) for name in inputs]
        if any(shape is None for shape in shapes):
            return "an input's shape is not static"
        chain = len({tuple(shape or ()) for shape in shapes}) > 1
    if not lower and not chain:
        return ""  # broadcasting is explicit already
    operands = [_full_rank(e, name, rank) if i in lower else name for i, name in enumerate(inputs)]
    if not chain:
        e.op(node.op_type, *operands, out=node.output[0], **_attributes(node))
        return None
    total = operands[0]
    for k, operand in enumerate(operands[1:], start=2):
        last = k == len(operands) and node.op_type == "Sum"
        total = e.op("Add", total, operand, out=node.output[0] if last else "")
    if node.op_type == "Mean":
        e.op("Div", total, e.scalar(float(len(operands)), inputs[0]), out=node.output[0])
    return None


def _full_rank(e: Edit, name: str, rank: int) -> str:
    """`name` with leading 1 dims up to `rank`: a reshaped constant, else an Unsqueeze."""
    missing = rank - (e.rank(name) or 0)
    value = e.constants.get(name)
    if value is not None:
        return e.array(value.reshape((1,) * missing + value.shape), "full_rank")
    axes = list(range(missing))
    if e.opset >= 13:
        return e.op("Unsqueeze", name, e.ints(axes))
    return e.op("Unsqueeze", name, axes=axes)


def _attributes(node: onnx.NodeProto) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}
