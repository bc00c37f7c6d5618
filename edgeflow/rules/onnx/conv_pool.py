"""onnx.maxpool_edge_pad, onnx.reduce_max_as_pool, onnx.split_groups, onnx.shuffle_to_conv,
onnx.pad_with_concat and onnx.pad_all_axes: padded max pooling, max reductions, grouped
convolution, channel shuffles and padding in forms every TFLite runtime parses and computes
right.

All are exact (the same float operations in another arrangement). Most exist for Arm NN 22's
TfLite parser: onnx2tf writes some padded MaxPools and every Pad with a value other than 0 as
PADV2, which that parser lacks, and Arm NN's CpuRef gets grouped (not depthwise) CONV_2D wrong
(relative error 1.1, measured by the target's probes).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from edgeflow.rules.base import RuleOptions
from edgeflow.rules.fixes import Fix
from edgeflow.rules.onnx._build import attr
from edgeflow.rules.onnx._edit import Edit, NodeRule


class MaxPoolEdgePad(NodeRule):
    """Exact. onnx2tf writes a MaxPool whose ceil_mode adds a partial last window as PAD +
    MAX_POOL_2D that computes it wrong (relative error 0.44 on LiteRT, TFLite Micro and Arm
    NN, measured by the targets' probes), and Arm NN 22's TfLite parser has no PADV2, which
    onnx2tf writes for some padded pools. Every window that reaches into the padding also
    holds the edge value the copies repeat (it starts inside the input), so the maximum is
    unchanged; a partial last window becomes a whole one over more edge copies, and the pool
    rounds down (ceil_mode 0) to the same output size. Kept: dilated pooling, auto_pad, a
    used Indices output, a window that lies in the padding alone. `ceil_mode_only` leaves the
    pools without a partial window as they are. A default rewrite of armnn, and with
    ceil_mode_only of tflite and tflite_micro."""

    name = "onnx.maxpool_edge_pad"
    description = "Pad a MaxPool by repeating edge rows/columns (Slice + Concat), not with -inf."
    fixes = (Fix.check("MaxPool", "pads_zero"), Fix.check("MaxPool", "no_partial_window"))

    class Options(RuleOptions):
        """ceil_mode_only: rewrite only the pools whose ceil_mode adds a partial window."""

        ceil_mode_only: bool = False

    example: ClassVar[tuple[str, str] | None] = (
        "y = MaxPool(x, kernel 3x3, stride 2, pads 1)",
        "y = MaxPool(Concat(x[:, :, :1], x, x[:, :, -1:]) ... along W too, pads 0)",
    )

    def tolerance(self, opts: Any) -> float | None:
        return 0.0  # every window holds the same values, only repeated: exact

    op_types = frozenset({"MaxPool"})
    what = "padded MaxPool"

    def replace(self, e: Edit, node: Any, opts: Options) -> str | None:
        return _edge_pad_maxpool(node, e, opts.ceil_mode_only)


def _edge_pad_maxpool(node: Any, e: Edit, ceil_mode_only: bool) -> str | None:
    """A window that reaches into the padding always holds the edge value it would repeat
    (it starts inside the input or ends inside it), so max over [edge copies + real values]
    = max over the real values."""
    kernel = list(attr(node, "kernel_shape", []))
    spatial = len(kernel)
    pads = list(attr(node, "pads", [0] * 2 * spatial))
    shape = e.shape(node.input[0])
    strides = list(attr(node, "strides", [1] * spatial))
    begins, ends = pads[:spatial], pads[spatial:]
    partial = None
    if attr(node, "ceil_mode", 0) and shape is not None:
        # the end padding that makes the last (partial) window whole: floor then rounds
        # to the size ceil gave
        partial = [
            (-(n + b + f - k)) % s
            for n, k, s, b, f in zip(shape[2:], kernel, strides, begins, ends, strict=True)
        ]
    if not any(partial or ()) and (ceil_mode_only or not any(pads)):
        return ""
    if attr(node, "auto_pad", "NOTSET") != "NOTSET":
        return "auto_pad is set"
    if len(node.output) > 1 and node.output[1]:
        return "the Indices output is used"
    if any(d != 1 for d in attr(node, "dilations", [1] * spatial)):
        return "dilated pooling"
    if shape is None:
        return "the input shape is not static"
    ends = [f + extra for f, extra in zip(ends, partial or [0] * spatial, strict=True)]
    if any(b >= k for b, k in zip(begins, kernel, strict=True)):
        return f"pads {pads} reach past a whole window (kernel {kernel})"
    for n, k, s, b, f in zip(shape[2:], kernel, strides, begins, ends, strict=True):
        if ((n + b + f - k) // s) * s - b >= n:  # the last window's start
            return "the last window lies in the padding alone"
    x = node.input[0]
    for i in range(spatial):
        axis, n = 2 + i, shape[2 + i]
        if not begins[i] and not ends[i]:
            continue
        first = [e.slice(x, axis, 0, 1)] * begins[i]
        last = [e.slice(x, axis, n - 1, n)] * ends[i]
        x = e.op("Concat", *first, x, *last, axis=axis)
    keep = {"kernel_shape", "strides", "storage_order"}
    attrs = {a.name: attr(node, a.name, None) for a in node.attribute if a.name in keep}
    e.op("MaxPool", x, out=node.output[0], **attrs)
    return None


class SplitGroups(NodeRule):
    """The same sums in another order. Arm NN's CpuRef computes grouped (not depthwise)
    CONV_2D wrong: relative error 1.1 in the target's probe. Depthwise convolutions (one input
    channel per group) are kept: every runtime has DEPTHWISE_CONV_2D. Needs a constant weight
    (and bias). A default rewrite of armnn."""

    name = "onnx.split_groups"
    description = "Split a grouped (not depthwise) Conv into one Conv per group and a Concat."
    fixes = (Fix.check("Conv", "not_grouped"), Fix.check("Conv", "groups_one"))

    class Options(RuleOptions):
        pass

    example: ClassVar[tuple[str, str] | None] = (
        "y = Conv(x[1, 48, h, w], W[48, 8, 3, 3], group=6)",
        "x0..x5 = Split(x, 6, axis=1); y = Concat(Conv(x0, W[0:8]), ..., Conv(x5, W[40:48]))",
    )

    def tolerance(self, opts: Any) -> float | None:
        return 1e-5  # the same sums, in another order

    op_types = frozenset({"Conv"})
    what = "grouped Conv"

    def replace(self, e: Edit, node: Any, opts: Options) -> str | None:
        return _split_groups(node, e)


def _split_groups(node: Any, e: Edit) -> str | None:
    groups = int(attr(node, "group", 1))
    if groups == 1:
        return ""
    weight = e.constants.get(node.input[1])
    if weight is None:
        return "the weight is not a constant"
    if weight.shape[1] == 1:
        return ""  # depthwise (one input channel per group): every runtime has it
    bias = e.constants.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if len(node.input) > 2 and node.input[2] and bias is None:
        return "the bias is not a constant"
    per_group = weight.shape[0] // groups
    in_per_group = weight.shape[1]
    if e.opset >= 13:
        parts = e.ops("Split", [node.input[0], e.ints([in_per_group] * groups)], groups, axis=1)
    else:
        parts = e.ops("Split", [node.input[0]], groups, axis=1, split=[in_per_group] * groups)
    attrs = {a.name: attr(node, a.name, None) for a in node.attribute if a.name != "group"}
    outputs = []
    for g, part in enumerate(parts):
        rows = slice(g * per_group, (g + 1) * per_group)
        inputs = [part, e.array(weight[rows], "weight")]
        if bias is not None:
            inputs.append(e.array(bias[rows], "bias"))
        outputs.append(e.op("Conv", *inputs, **attrs))
    e.op("Concat", *outputs, out=node.output[0], axis=1)
    return None


class ShuffleToConv(NodeRule):
    """Exact (each output is 1 x one input + 0 x the others). ShuffleNet's channel shuffle,
    `x.view(n, g, c // g, h, w).transpose(1, 2).reshape(n, c, h, w)`, is a Reshape to 5-D,
    a Transpose and a Reshape back. After it, onnx2tf writes the next depthwise convolution as
    a grouped CONV_2D instead of DEPTHWISE_CONV_2D, which Arm NN's CpuRef computes wrong
    (relative error 1.5, measured on that three-op chain + a depthwise Conv). Any
    Reshape/Transpose/Reshape chain whose net effect on a static [N, C, H, W] tensor is a
    permutation of the channels (found by running the chain on index numbers) becomes one
    1x1 Conv with a 0/1 weight: C x C multiply-adds per pixel. A default rewrite of armnn."""

    name = "onnx.shuffle_to_conv"
    description = "Turn a channel shuffle (Reshape, Transpose, Reshape) into a 1x1 Conv."

    class Options(RuleOptions):
        """max_channels: the most channels a shuffle may have (the weight is C x C)."""

        max_channels: int = Field(1024, ge=1)

    example: ClassVar[tuple[str, str] | None] = (
        "y = Reshape(Transpose(Reshape(x[1, 48, h, w], [1, 2, 24, h, w]), [0, 2, 1, 3, 4]), "
        "[1, 48, h, w])",
        "y = Conv(x, P[48, 48, 1, 1]) with P[i, j] = 1 where output channel i is input j",
    )

    def tolerance(self, opts: Any) -> float | None:
        return 0.0

    op_types = frozenset({"Reshape"})
    what = "channel shuffle"

    def replace(self, e: Edit, node: Any, opts: Options) -> str | None:
        return _shuffle_to_conv(node, e, opts.max_channels)


def _shuffle_to_conv(node: Any, e: Edit, max_channels: int) -> str | None:
    """`node` is the first Reshape of a Reshape -> Transpose -> Reshape chain."""
    import numpy as np

    shape = e.shape(node.input[0])
    transpose = e.only_consumer(node.output[0])
    if transpose is None or transpose.op_type != "Transpose":
        return ""
    back = e.only_consumer(transpose.output[0])
    if back is None or back.op_type != "Reshape":
        return ""
    if shape is None:
        return "the input shape is not static"
    if len(shape) != 4 or e.shape(back.output[0]) != shape:
        return ""  # a view change (patches, heads), not a shuffle
    middle = e.shape(node.output[0])
    perm = attr(transpose, "perm", None)
    if middle is None or perm is None:
        return "shapes or the permutation unknown"
    n, c, h, w = shape
    if c > max_channels:
        return f"{c} channels (max_channels {max_channels})"
    index = np.arange(n * c * h * w).reshape(shape)
    moved = index.reshape(middle).transpose(perm).reshape(shape)
    # a channel permutation: every output channel is one input channel, same n, h, w
    source = moved[0, :, 0, 0] // (h * w) % c
    if not np.array_equal(moved, index[:, source]):
        return "the chain moves values across batch or space, not only channels"
    weight = np.zeros((c, c, 1, 1), np.float32)
    weight[np.arange(c), source] = 1.0
    dtype = e.dtypes.get(node.input[0]) or 1
    if dtype != 1:
        return "not float32"
    e.op("Conv", node.input[0], e.array(weight, "shuffle"), out=back.output[0], kernel_shape=[1, 1])
    e.removed.update((transpose.output[0], back.output[0]))
    return None


# Fill blocks up to this many values are stored as constants; larger ones computed (_concat_fill)
MAX_STORED_FILL = 4096


class PadWithConcat(NodeRule):
    """Exact (the same zeros, placed by Concat). onnx2tf writes a Conv whose pads are not what
    TensorFlow's SAME padding gives (pad 1 around a stride-2 convolution of an even-sized
    input: SAME pads 0 before and 1 after) and every zero-padding Pad node as PAD + a VALID
    convolution. Arm NN 22's CpuRef pads an int8 tensor with the integer 0 instead of its
    zero point, so the border reads -zero_point x scale instead of 0 (measured on the mobilenet
    demo: 0.50, 0.45 and 1.01 around three PADs; the stride-2 depthwise convolutions after
    them fell from 22 dB SQNR to 5 dB and the demo's accuracy from 0.978 to 0.589). Arm NN
    folds a PAD into a following CONV_2D correctly, but not into DEPTHWISE_CONV_2D or a pooling.
    Zero rows and columns concatenated to the tensor (CONCATENATION) quantize to the zero
    point exactly. Convolutions whose pads SAME gives are kept as they are (no PAD is written
    for them). Pad nodes in reflect and edge mode, which onnx2tf writes as MIRROR_PAD (Arm NN
    22's parser has none), become single-row slices of the tensor (mirrored, or the edge row
    repeated) concatenated around it: the same values. A constant other than 0, which onnx2tf
    writes as PADV2 (the parser has none), becomes blocks of that constant. A block of more
    than MAX_STORED_FILL values is the tensor's first rows times 0 (plus the constant), not a
    stored constant: the same values for finite inputs. Needs a static input shape (float32
    for constant padding). A default rewrite of armnn."""

    name = "onnx.pad_with_concat"
    description = "Pad by concatenating zeros, edge or mirrored rows (Concat), not PAD/MIRROR_PAD."
    # Pad nodes (zero padding): armnn's profile measures int8 PAD inaccurate (a warning);
    # reflect/edge Pad: its parser has no MIRROR_PAD (the pad_constant check); a value other
    # than 0: no PADV2 (pad_value_zero)
    fixes = (Fix.op("Pad"), Fix.check("Pad", "pad_constant"), Fix.check("Pad", "pad_value_zero"))

    class Options(RuleOptions):
        pass

    example: ClassVar[tuple[str, str] | None] = (
        "y = Conv(x[1, 16, 16, 16], W, group=16, stride 2, pads 1)",
        "y = Conv(Concat(0[.., 1, 18], Concat(0[.., 16, 1], x, 0[.., 16, 1], axis=3), "
        "0[.., 1, 18], axis=2), W, group=16, stride 2, pads 0)",
    )

    def tolerance(self, opts: Any) -> float | None:
        return 0.0  # the same values: zeros, or the tensor's own rows, placed around it

    op_types = frozenset({"Conv", "Pad"})
    what = "explicit padding"

    def replace(self, e: Edit, node: Any, opts: Options) -> str | None:
        if node.op_type == "Pad":
            return _pad_node_with_concat(node, e)
        return _conv_with_concat(node, e)


def _conv_with_concat(node: Any, e: Edit) -> str | None:
    pads = list(attr(node, "pads", []))
    if not any(pads):
        return ""
    if attr(node, "auto_pad", "NOTSET") != "NOTSET":
        return ""  # SAME_* or VALID: onnx2tf maps them to TensorFlow's own padding
    shape = e.shape(node.input[0])
    if shape is None:
        return "the input shape is not static"
    spatial = len(shape) - 2
    weight = e.shape(node.input[1])
    kernel = list(attr(node, "kernel_shape", weight[2:] if weight else []))
    if len(kernel) != spatial:
        return "the kernel shape is not known"
    strides = list(attr(node, "strides", [1] * spatial))
    dilations = list(attr(node, "dilations", [1] * spatial))
    begins, ends = pads[:spatial], pads[spatial:]
    same = [
        _same_pads(n, k, s, d)
        for n, k, s, d in zip(shape[2:], kernel, strides, dilations, strict=True)
    ]
    if all((b, f) == p for b, f, p in zip(begins, ends, same, strict=True)):
        return ""  # TensorFlow's SAME padding: no PAD is written
    if e.dtypes.get(node.input[0]) != 1:
        return "not float32"
    padded = _concat_fill(e, node.input[0], shape, begins, ends)
    attrs = {a.name: attr(node, a.name, None) for a in node.attribute if a.name != "pads"}
    e.op("Conv", padded, *node.input[1:], out=node.output[0], **attrs)
    return None


def _pad_node_with_concat(node: Any, e: Edit) -> str | None:
    import numpy as np

    mode = attr(node, "mode", "constant")
    if mode not in ("constant", "reflect", "edge"):
        return f"pad mode '{mode}'"
    shape = e.shape(node.input[0])
    if shape is None:
        return "the input shape is not static"
    if e.opset >= 11:
        given = e.constants.get(node.input[1]) if len(node.input) > 1 else None
        value = e.constants.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if given is None:
            return "the pads are not a constant"
        if len(node.input) > 3 and node.input[3]:
            return "Pad with axes"
        pads = [int(p) for p in given]
    else:
        pads, value = list(attr(node, "pads", [])), np.asarray(attr(node, "value", 0.0))
    if any(p < 0 for p in pads):
        return "negative pads (a crop)"
    rank = len(shape)
    if mode != "constant" and e.opset < 10:
        return "opset below 10 (its Slice takes attributes)"
    if mode != "constant":
        return _pad_with_slices(e, node, shape, pads[:rank], pads[rank:], mode)
    if e.dtypes.get(node.input[0]) != 1:
        return "not float32"
    fill = 0.0 if value is None else float(np.asarray(value).ravel()[0])
    x = _concat_fill(e, node.input[0], shape, pads[:rank], pads[rank:], first_axis=0, fill=fill)
    e.op("Identity", x, out=node.output[0])
    return None


def _pad_with_slices(
    e: Edit, node: Any, shape: list[int], begins: list[int], ends: list[int], mode: str
) -> str | None:
    """Reflect or edge padding as one-row slices of the tensor concatenated around it, axis by
    axis: reflect puts x[b], ..., x[1] before and x[n-2], ..., x[n-1-f] after; edge repeats
    x[0] and x[n-1]."""
    for n, b, f in zip(shape, begins, ends, strict=True):
        if mode == "reflect" and max(b, f) > n - 1:
            return f"reflect pads {b}, {f} on an axis of {n} (at most {n - 1})"
        if mode == "edge" and (b or f) and not n:
            return "edge pads on an empty axis"
    x = node.input[0]
    for axis, (n, b, f) in enumerate(zip(shape, begins, ends, strict=True)):
        if not b and not f:
            continue
        if mode == "edge":
            before = [e.slice(x, axis, 0, 1)] * b
            after = [e.slice(x, axis, n - 1, n)] * f
        else:
            before = [e.slice(x, axis, i, i + 1) for i in range(b, 0, -1)]
            after = [e.slice(x, axis, n - 1 - i, n - i) for i in range(1, f + 1)]
        x = e.op("Concat", *before, x, *after, axis=axis)
    e.op("Identity", x, out=node.output[0])
    return None


def _same_pads(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """TensorFlow's SAME padding along one axis: (before, after)."""
    out = -(-size // stride)
    total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


def _concat_fill(
    e: Edit,
    x: str,
    shape: list[int],
    begins: list[int],
    ends: list[int],
    first_axis: int = 2,
    fill: float = 0.0,
) -> str:
    """x with `begins[i]` slices of zeros (or `fill`) before and `ends[i]` after along axis
    first_axis + i. A block of more than MAX_STORED_FILL values is computed, not stored: the
    first rows of x times 0 (plus `fill`), the same values for a finite x (PLCMOS's padded
    convolutions over 625 frames stored 239 KB of zeros, 0.2x its weights)."""
    import math

    import numpy as np

    dims = list(shape)
    for i, (before, after) in enumerate(zip(begins, ends, strict=True)):
        axis = first_axis + i
        if not before and not after:
            continue
        parts = []
        for count in (before, after):
            zeros = [*dims[:axis], count, *dims[axis + 1 :]]
            if not count:
                parts.append("")
            elif math.prod(zeros) > MAX_STORED_FILL and count <= dims[axis]:
                made = e.op("Mul", e.slice(x, axis, 0, count), e.scalar(0.0, x))
                parts.append(e.op("Add", made, e.scalar(fill, x)) if fill else made)
            else:
                block = np.full(zeros, fill, np.float32)
                parts.append(e.array(block, "pad_zeros" if fill == 0 else "pad_fill"))
        x = e.op("Concat", *(p for p in (parts[0], x, parts[1]) if p), axis=axis)
        dims[axis] += before + after
    return x


class ReduceMaxAsPool(NodeRule):
    """Exact (max is max, in int8 too: a pooling keeps its input's scale). Arm NN 22's parser
    has no REDUCE_MAX (measured: "Operator not supported ... REDUCE_MAX"), but its MAX_POOL_2D
    runs: a ReduceMax over consecutive axes becomes a MaxPool whose window spans them, the
    input reshaped to [1, outer, reduced, inner] (the axes before, the reduced ones, the axes
    after) and the result reshaped to the ReduceMax's shape. AECMOS (speechmos) takes the max
    over its spectrogram's frequency, then its time axis. Needs a static input shape and
    constant axes. A default rewrite of armnn."""

    name = "onnx.reduce_max_as_pool"
    description = "Write a ReduceMax over consecutive axes as a MaxPool whose window spans them."
    fixes = (Fix.op("ReduceMax"),)

    class Options(RuleOptions):
        pass

    example: ClassVar[tuple[str, str] | None] = (
        "y = ReduceMax(x[1, 3, 300, 160], axes=[3], keepdims=0)",
        "y = Reshape(MaxPool(Reshape(x, [1, 900, 160, 1]), kernel_shape=[160, 1]), [1, 3, 300])",
    )

    def tolerance(self, opts: Any) -> float | None:
        return 0.0

    op_types = frozenset({"ReduceMax"})
    what = "ReduceMax"

    def replace(self, e: Edit, node: Any, opts: Options) -> str | None:
        import math

        import numpy as np

        shape = e.shape(node.input[0])
        if shape is None:
            return "the input shape is not static"
        if len(node.input) > 1 and node.input[1]:  # opset 18: the axes an input
            given = e.constants.get(node.input[1])
            if given is None:
                return "the axes are not a constant"
            axes = [int(a) for a in given.reshape(-1)]
        else:
            axes = [int(a) for a in attr(node, "axes", range(len(shape)))]
        if not axes:
            return "no axes (noop_with_empty_axes)"
        axes = sorted(a % len(shape) for a in axes)
        if axes != list(range(axes[0], axes[-1] + 1)):
            return f"axes {axes} are not consecutive"
        outer = math.prod(shape[: axes[0]])
        reduced = math.prod(shape[axes[0] : axes[-1] + 1])
        inner = math.prod(shape[axes[-1] + 1 :])
        keep = attr(node, "keepdims", 1)
        out_shape = [1 if i in axes else d for i, d in enumerate(shape) if keep or i not in axes]
        window = np.array([1, outer, reduced, inner], np.int64)
        flat = e.op("Reshape", node.input[0], e.array(window, "shape"))
        pooled = e.op("MaxPool", flat, kernel_shape=[reduced, 1])
        e.op("Reshape", pooled, e.array(np.array(out_shape, np.int64), "shape"), out=node.output[0])
        return None


class SumAsMean(NodeRule):
    """Arm NN 22's parser has no SUM (measured: "Operator not supported ... SUM") but runs
    MEAN: a float ReduceSum over axes of static size n becomes ReduceMean times n, within
    float32 rounding. A transformer's masked mean pooling (the sum of the kept tokens over
    their count) and a sum over a spectrum's bins are such sums. Needs a static input shape
    and constant axes. A default rewrite of armnn."""

    name = "onnx.sum_as_mean"
    description = "Write a float ReduceSum as ReduceMean times the number of values it sums."
    fixes = (Fix.op("ReduceSum"),)

    class Options(RuleOptions):
        pass

    example: ClassVar[tuple[str, str] | None] = (
        "y = ReduceSum(x[1, 32, 64], axes=[1], keepdims=0)",
        "y = ReduceMean(x, axes=[1], keepdims=0) * 32",
    )

    op_types = frozenset({"ReduceSum"})
    what = "ReduceSum"

    def replace(self, e: Edit, node: Any, opts: Options) -> str | None:
        import math

        if e.dtypes.get(node.input[0]) not in (1, 11):  # float, double
            return "not float32/float64"
        shape = e.shape(node.input[0])
        if shape is None:
            return "the input shape is not static"
        if len(node.input) > 1 and node.input[1]:  # opset 13 on: the axes an input
            given = e.constants.get(node.input[1])
            if given is None:
                return "the axes are not a constant"
            axes = [int(a) for a in given.reshape(-1)]
        else:  # before opset 13: an attribute
            axes = [int(a) for a in attr(node, "axes", [])]
        if not axes and attr(node, "noop_with_empty_axes", 0):
            return "no axes (noop_with_empty_axes)"
        axes = sorted(a % len(shape) for a in axes or range(len(shape)))
        mean = e.reduce_mean(node.input[0], axes, attr(node, "keepdims", 1))
        count = math.prod(shape[a] for a in axes)
        e.op("Mul", mean, e.scalar(float(count), node.input[0]), out=node.output[0])
        return None


class PadAllAxes(NodeRule):
    """Exact. Opset 18 lets a Pad name the axes it pads (an `axes` input, pads for those
    axes only); onnx2tf 1.28.8 reads the pads as if for every axis and fails ("cannot reshape
    array of size 4 into shape (2,4)"). The same Pad with pads for every axis (0 on the
    others). Needs the input's rank and constant pads and axes. A default rewrite of tflite,
    tflite_micro and armnn."""

    name = "onnx.pad_all_axes"
    description = "Write a Pad that names its axes as a Pad of every axis (0 on the others)."
    fixes = (Fix.check("Pad", "pad_all_axes"),)

    class Options(RuleOptions):
        pass

    example: ClassVar[tuple[str, str] | None] = (
        "y = Pad(x[1, 4, 6, 6], pads=[1, 1, 1, 1], axes=[2, 3])",
        "y = Pad(x, pads=[0, 0, 1, 1, 0, 0, 1, 1])",
    )

    def tolerance(self, opts: Any) -> float | None:
        return 0.0

    op_types = frozenset({"Pad"})
    what = "Pad with axes"

    def replace(self, e: Edit, node: Any, opts: Options) -> str | None:
        import numpy as np

        if len(node.input) < 4 or not node.input[3]:
            return ""
        rank = e.rank(node.input[0])
        pads, axes = e.constants.get(node.input[1]), e.constants.get(node.input[3])
        if rank is None:
            return "the input's rank is unknown"
        if pads is None or axes is None:
            return "the pads or axes are not constants"
        full = np.zeros(2 * rank, np.int64)
        for k, axis in enumerate(int(a) % rank for a in axes):
            full[axis], full[rank + axis] = pads[k], pads[len(axes) + k]
        inputs = [node.input[0], e.array(full, "pads"), node.input[2]]
        e.op("Pad", *inputs, out=node.output[0], mode=attr(node, "mode", "constant"))
        return None
