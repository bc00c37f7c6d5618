"""Named constraint checkers: a target profile lists them per operator
(`operators: {Conv: {checks: [dilations_one]}}`), the precheck runs them on every node of that
op type. A checker returns None when the node is fine, else the reason in words. A profile can
name only checkers in CHECKERS: a typo is an error when the profile loads.

To add one: write `def name(node: Node) -> str | None` below and add it to CHECKERS; say in
docs/targets.md which runtime limit it encodes and where that limit is documented.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Node:
    """One ONNX node with what checkers need to know about its graph."""

    proto: Any  # onnx.NodeProto
    constants: dict[str, Any]  # initializer / Constant outputs -> numpy arrays
    ranks: dict[str, int]  # tensor -> rank, where shape inference knows it
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # where static
    read: frozenset[str] = frozenset()  # the tensors a node or the graph's outputs read
    types: dict[str, int] = field(default_factory=dict)  # tensor -> ONNX element type, if known

    def attribute(self, name: str, default: Any = None) -> Any:
        import onnx

        for a in self.proto.attribute:
            if a.name == name:
                return onnx.helper.get_attribute_value(a)
        return default

    def input(self, i: int) -> str:
        return self.proto.input[i] if i < len(self.proto.input) else ""


def dilations_one(node: Node) -> str | None:
    dilations = node.attribute("dilations") or []
    return None if all(d == 1 for d in dilations) else f"dilations {list(dilations)} (needs 1)"


def groups_one(node: Node) -> str | None:
    groups = node.attribute("group", 1)
    return None if groups == 1 else f"grouped convolution (group={groups})"


def not_grouped(node: Node) -> str | None:
    """A Conv with group 1, or a depthwise one (group = input channels): not in between."""
    groups, weight = node.attribute("group", 1), node.constants.get(node.input(1))
    if groups == 1 or (weight is not None and weight.shape[1] == 1):
        return None
    return f"grouped convolution (group={groups}, not depthwise)"


def has_bias(node: Node) -> str | None:
    """A Gemm (or Conv) with its bias input."""
    return None if node.input(2) else "no bias input (C)"


def no_bias(node: Node) -> str | None:
    """A ConvTranspose without its bias input (Arm NN's TfLite parser rejects the 4-input
    TRANSPOSE_CONV that onnx2tf writes for one with a bias)."""
    return "a bias input (B)" if node.input(2) else None


def constant_inputs(node: Node) -> str | None:
    """Every input after the data input is a constant (pads, axes, scales, shapes, ...)."""
    dynamic = [name for name in node.proto.input[1:] if name and name not in node.constants]
    return None if not dynamic else f"inputs {', '.join(dynamic)} are computed, not constants"


def constant_axes(node: Node) -> str | None:
    """An `axes` input, where the op has one, is a constant."""
    import onnx

    try:
        names = [i.name for i in onnx.defs.get_schema(node.proto.op_type).inputs]
    except onnx.defs.SchemaError:
        return None
    if "axes" not in names:
        return None
    axes = node.input(names.index("axes"))
    return None if not axes or axes in node.constants else f"axes ({axes}) is computed"


def axis_last(node: Node) -> str | None:
    axis = node.attribute("axis", -1)
    rank = node.ranks.get(node.input(0))
    if axis == -1 or (rank is not None and axis == rank - 1):
        return None
    return f"axis {axis} (needs the last axis)"


def zero_point_zero(node: Node) -> str | None:
    """QuantizeLinear / DequantizeLinear with zero point 0 (symmetric quantization)."""
    zero = node.constants.get(node.input(2))
    if not node.input(2) or (zero is not None and not zero.any()):
        return None
    return "zero point is not 0 (needs symmetric quantization)"


def rank_at_most_4(node: Node) -> str | None:
    names = [n for n in (*node.proto.input, *node.proto.output) if n]
    deep = [f"{n} ({node.ranks[n]}-D)" for n in names if node.ranks.get(n, 0) > 4]
    return None if not deep else f"tensors above 4-D: {', '.join(deep)}"


def rank_at_most_5(node: Node) -> str | None:
    names = [n for n in (*node.proto.input, *node.proto.output) if n]
    deep = [f"{n} ({node.ranks[n]}-D)" for n in names if node.ranks.get(n, 0) > 5]
    return None if not deep else f"tensors above 5-D: {', '.join(deep)}"


def not_depthwise(node: Node) -> str | None:
    """A Conv whose group equals its input channels (one filter per channel)."""
    groups, weight = node.attribute("group", 1), node.constants.get(node.input(1))
    if groups > 1 and (weight is None or weight.shape[1] == 1):
        return f"depthwise convolution (group={groups})"
    return None


def pads_zero(node: Node) -> str | None:
    pads = node.attribute("pads") or []
    if any(pads) or node.attribute("auto_pad", b"NOTSET") not in (b"NOTSET", b"VALID"):
        return f"padded pooling (pads {list(pads)})"
    return None


def pad_constant(node: Node) -> str | None:
    mode = node.attribute("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    return None if mode == "constant" else f"pad mode '{mode}' (needs constant)"


def resize_nearest(node: Node) -> str | None:
    mode = node.attribute("mode", b"nearest")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    return None if mode == "nearest" else f"resize mode '{mode}' (needs nearest)"


def slice_one_axis(node: Node) -> str | None:
    """A Slice along one axis (its starts input holds one value)."""
    starts = node.constants.get(node.input(1))
    if starts is not None and starts.size > 1:
        return f"slices {starts.size} axes at once (needs one Slice per axis)"
    return None


def no_partial_window(node: Node) -> str | None:
    """A pooling whose ceil_mode adds no window reaching past the padded input (the output
    size that floor rounding gives); an unknown input shape with ceil_mode counts as one."""
    if not node.attribute("ceil_mode", 0):
        return None
    shape = node.shapes.get(node.input(0))
    kernel = list(node.attribute("kernel_shape") or [])
    if shape is None or len(shape) != len(kernel) + 2:
        return "ceil_mode on an input of unknown shape"
    spatial = len(kernel)
    pads = list(node.attribute("pads") or [0] * 2 * spatial)
    strides = list(node.attribute("strides") or [1] * spatial)
    dilations = list(node.attribute("dilations") or [1] * spatial)
    for i, (n, k, s, d) in enumerate(zip(shape[2:], kernel, strides, dilations, strict=True)):
        if (n + pads[i] + pads[spatial + i] - d * (k - 1) - 1) % s:
            return "ceil_mode adds a partial last window"
    return None


def pad_value_zero(node: Node) -> str | None:
    """A constant-mode Pad fills with 0 (its value input, or before opset 11 its `value`
    attribute, is absent or 0)."""
    import numpy as np

    mode = node.attribute("mode", b"constant")
    if (mode.decode() if isinstance(mode, bytes) else mode) != "constant":
        return None
    value = node.attribute("value")
    if node.input(2):
        value = node.constants.get(node.input(2))
        if value is None:
            return "a pad value that is not a constant"
    if value is None or not np.any(np.asarray(value) != 0):
        return None
    return f"pads with {float(np.asarray(value).ravel()[0]):g} (needs 0)"


def no_final_cell_state(node: Node) -> str | None:
    """An LSTM whose final cell state (Y_c, its third output) nothing reads: the sequence
    operators of the TFLite runtimes output the hidden states only."""
    cell = node.proto.output[2] if len(node.proto.output) > 2 else ""
    return "its final cell state Y_c is read" if cell and cell in node.read else None


def pad_all_axes(node: Node) -> str | None:
    """A Pad without an `axes` input (opset 18): its pads cover every axis."""
    return "pads only the axes it names (axes input)" if node.input(3) else None


def same_rank(node: Node) -> str | None:
    """Inputs below the rank of the others are scalars: broadcasting adds no leading dims."""
    ranks = {n: node.ranks.get(n) for n in node.proto.input if n}
    known = [r for r in ranks.values() if r is not None]
    if not known:
        return None
    top = max(known)
    lower = [f"{n} ({r}-D)" for n, r in ranks.items() if r is not None and 0 < r < top]
    return None if not lower else f"inputs below {top}-D: {', '.join(lower)}"


def same_shapes(node: Node) -> str | None:
    """Every input has the same static shape (no broadcasting between them)."""
    shapes = [node.shapes.get(n) for n in node.proto.input if n]
    if None in shapes or len(set(shapes)) < 2:
        return None
    return f"inputs of different shapes ({', '.join(str(list(s or ())) for s in shapes)})"


def constant_divisor(node: Node) -> str | None:
    """A Div whose divisor (B) is a constant, or a Reciprocal of one: in int8, a divisor
    computed in the graph is a tensor whose grid has a zero point it can round to."""
    divisor = node.input(0 if node.proto.op_type == "Reciprocal" else 1)
    if not divisor or divisor in node.constants:
        return None
    return f"divides by {divisor}, a tensor computed in the graph"


def narrow_softmax(node: Node) -> str | None:
    """A Softmax over fewer than WIDE_SOFTMAX values (its axis, static): TFLite Micro's int8
    SOFTMAX aborts on more (edgeflow.targets._tflite_softmax)."""
    from edgeflow.targets._tflite_softmax import WIDE_SOFTMAX

    shape = node.shapes.get(node.input(0))
    if not shape:
        return None
    axis = node.attribute("axis", -1)
    size = shape[axis] if -len(shape) <= axis < len(shape) else None
    if size is None or size < WIDE_SOFTMAX:
        return None
    return f"a softmax over {size} values (axis {axis})"


def cast_not_to_int64(node: Node) -> str | None:
    return "casts to int64" if node.attribute("to") == 7 else None  # TensorProto.INT64


def computed_int32_indices(node: Node) -> str | None:
    """A Gather whose indices the graph computes as int32 (token ids fed as int32): TFLite
    Micro's GATHER takes no int64 positions, and onnx2tf 1.28.8 fails on int32 constant ones
    (tf.gather: TypeError; measured 2026-12 on the probes)."""
    import onnx

    indices = node.input(1)
    if indices in node.constants:
        return "constant indices (onnx.gather_to_slice makes them slices)"
    if node.types.get(indices) == onnx.TensorProto.INT64:
        return "int64 indices (TFLite Micro's GATHER takes int32 ones)"
    return None


def rank_at_least_3(node: Node) -> str | None:
    """An input of 3 or more dimensions: onnx2tf 1.28.8 converts a ReduceL2 of a 2-D tensor
    (F.normalize of an embedding) to tf.norm, which fails ("'axis' must be None, an integer,
    or a tuple of 2 unique integers")."""
    rank = node.ranks.get(node.input(0))
    return None if rank is None or rank >= 3 else f"a {rank}-D input"


def constant_weights(node: Node) -> str | None:
    """A MatMul whose second operand is a constant (a layer's weights), not a computed tensor
    (attention's query-key scores: a batch matmul)."""
    return None if node.input(1) in node.constants else "a MatMul of two computed tensors"


CHECKERS: dict[str, Callable[[Node], str | None]] = {
    "dilations_one": dilations_one,
    "groups_one": groups_one,
    "not_grouped": not_grouped,
    "has_bias": has_bias,
    "no_bias": no_bias,
    "constant_inputs": constant_inputs,
    "constant_axes": constant_axes,
    "axis_last": axis_last,
    "zero_point_zero": zero_point_zero,
    "rank_at_most_4": rank_at_most_4,
    "rank_at_most_5": rank_at_most_5,
    "not_depthwise": not_depthwise,
    "pads_zero": pads_zero,
    "pad_constant": pad_constant,
    "pad_value_zero": pad_value_zero,
    "no_partial_window": no_partial_window,
    "resize_nearest": resize_nearest,
    "cast_not_to_int64": cast_not_to_int64,
    "computed_int32_indices": computed_int32_indices,
    "rank_at_least_3": rank_at_least_3,
    "constant_weights": constant_weights,
    "constant_divisor": constant_divisor,
    "narrow_softmax": narrow_softmax,
    "slice_one_axis": slice_one_axis,
    "pad_all_axes": pad_all_axes,
    "no_final_cell_state": no_final_cell_state,
    "same_rank": same_rank,
    "same_shapes": same_shapes,
}
