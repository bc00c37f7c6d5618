"""onnx.gather_to_slice, onnx.slice_rank and onnx.split_slice: indexing in forms small
runtimes take.

- A Gather whose indices are a constant evenly spaced run (torch's `as_strided`, `x[2]`,
  `x[:, 1:5]` exported through index tensors) is a Slice, plus a Reshape to the indices' shape.
  TFLite Micro and Arm NN 22 have no GATHER.
- A Slice of a tensor above 4-D (attention's `qkv.unbind(0)` on a 5-D view) becomes a Slice
  of the same data viewed with fewer dims: neighbouring dims that are not sliced merge, and a
  sliced dim (step 1) absorbs the dims after it. TFLite Micro's STRIDED_SLICE and Arm NN's
  StridedSlice take at most 4-D.
- A Slice over several axes becomes one Slice per axis: onnx2tf 1.28.8 converts a Slice of
  the channel axis and another axis to a tensor of the wrong shape.
- A Tile by constant repeats is a Concat of copies along each repeated axis (a constant
  input: the tiled constant). TFLite Micro and Arm NN 22 have no TILE.

All are exact: they move the same values.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from edgeflow.rules.base import RuleOptions
from edgeflow.rules.fixes import Fix
from edgeflow.rules.onnx._build import attr
from edgeflow.rules.onnx._edit import Edit, NodeRule


class GatherToSlice(NodeRule):
    """Exact. Exporters write some views and indexing (torch's `as_strided` in timm's
    ConvNeXt head, `x[2]`) as a Gather of constant indices; TFLite Micro and Arm NN 22 have no
    GATHER. Indices that run evenly upward (step >= 1, negatives allowed) become a Slice, or
    only a Reshape when they cover the whole axis. A default rewrite of tflite_micro and
    armnn."""

    name = "onnx.gather_to_slice"
    description = "Turn a Gather of constant, evenly spaced indices into Slice (+ Reshape)."
    fixes = (Fix.op("Gather"),)

    class Options(RuleOptions):
        pass

    example: ClassVar[tuple[str, str] | None] = (
        "y = Gather(x[320], indices=arange(320).reshape(1, 320, 1, 1), axis=0)",
        "y = Reshape(x, [1, 320, 1, 1])",
    )

    def tolerance(self, opts: Any) -> float | None:
        return 0.0

    op_types = frozenset({"Gather"})
    what = "Gather of a constant run"

    def replace(self, e: Edit, node: Any, opts: Options) -> str | None:
        return _gather_to_slice(node, e)


def _gather_to_slice(node: Any, e: Edit) -> str | None:
    import numpy as np

    indices = e.constants.get(node.input[1])
    if indices is None:
        return "the indices are not constant"
    shape = e.shape(node.input[0])
    if shape is None:
        return "the data shape is not static"
    axis = int(attr(node, "axis", 0)) % len(shape)
    n = shape[axis]
    flat = indices.astype(np.int64).reshape(-1)
    if flat.size == 0 or (flat < -n).any() or (flat >= n).any():
        return "empty or out-of-range indices"
    flat = np.where(flat < 0, flat + n, flat)
    step = int(flat[1] - flat[0]) if flat.size > 1 else 1
    if step < 1 or (np.diff(flat) != step).any():
        return "the indices are not an increasing, evenly spaced run"
    start, count = int(flat[0]), int(flat.size)
    out_shape = [*shape[:axis], *indices.shape, *shape[axis + 1 :]]
    x, start, n = _concat_part(e, node.input[0], axis, start, start + step * (count - 1), n)
    if not (start == 0 and count == n and step == 1):
        x = e.slice(x, axis, start, start + step * (count - 1) + 1, step)
    else:
        # A whole-axis Gather is a view: of a Reshape's input when the data is a Reshape
        # (timm's head: [1, C, 1, 1] -> [C] -> Gather -> [1, C, 1, 1] is no change at all).
        producer = e.producers.get(x)
        if producer is not None and producer.op_type == "Reshape":
            if e.only_consumer(x) is node:
                e.removed.add(x)
            x = producer.input[0]
        if e.shape(x) == out_shape:
            e.op("Identity", x, out=node.output[0])
            return None
    e.reshape(x, out_shape, out=node.output[0])
    return None


def _concat_part(e: Edit, x: str, axis: int, first: int, last: int, n: int) -> tuple[str, int, int]:
    """Where `x` is a Concat on `axis` and the positions first..last lie in one of its inputs
    (torch's stacked LSTM: h_n = Concat(h_0, h_1), then h_n[-1]), that input, the start within
    it and its size on the axis; else `x` as it is. onnx2tf 1.28.8 converts such a Gather of a
    3-D Concat to a tensor of the wrong shape."""
    producer = e.producers.get(x)
    if producer is None or producer.op_type != "Concat" or int(attr(producer, "axis", 0)) < 0:
        return x, first, n
    if int(attr(producer, "axis", 0)) != axis:
        return x, first, n
    offset = 0
    for part in producer.input:
        part_shape = e.shape(part)
        if part_shape is None or len(part_shape) <= axis:
            return x, first, n
        size = part_shape[axis]
        if offset <= first and last < offset + size:
            if e.only_consumer(x) is not None:
                e.removed.add(x)
            return part, first - offset, size
        offset += size
    return x, first, n


class SliceRank(NodeRule):
    """Exact. TFLite Micro's STRIDED_SLICE and Arm NN's StridedSlice take at most 4-D; an
    attention's `qkv.reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)` slices a 5-D
    tensor. Neighbouring dims that are not sliced merge, and a sliced dim with step 1 absorbs
    the dims after it (its range scales by their size), so the Slice sees a view of at most
    `max_rank` dims; a Reshape restores the shape, going straight to a following Squeeze's
    shape. Needs a static input shape and constant starts/ends/axes/steps. A default rewrite
    of tflite_micro and armnn."""

    name = "onnx.slice_rank"
    description = "Slice a tensor above 4-D as a view of at most 4 dims (merging unsliced dims)."
    fixes = (Fix.check("Slice", "rank_at_most_4"),)

    class Options(RuleOptions):
        """max_rank: the most dims the Slice may see."""

        max_rank: int = 4

    example: ClassVar[tuple[str, str] | None] = (
        "q = Squeeze(Slice(x[3, 4, 4, 64, 16], starts=[0], ends=[1], axes=[0]), [0])",
        "q = Reshape(Slice(Reshape(x, [3, 16384]), [0], [1], axes=[0]), [4, 4, 64, 16])",
    )

    def tolerance(self, opts: Any) -> float | None:
        return 0.0

    op_types = frozenset({"Slice"})
    what = "Slice of more than max_rank dims"

    def replace(self, e: Edit, node: Any, opts: Options) -> str | None:
        return _slice_rank(node, e, opts.max_rank)


def _slice_rank(node: Any, e: Edit, max_rank: int) -> str | None:
    shape = e.shape(node.input[0])
    if shape is None:
        return "the input shape is not static"
    if len(shape) <= max_rank:
        return ""
    if len(node.input) < 3 or any(
        name and name not in e.constants for name in node.input[1:]
    ):  # opset < 10 Slice has attributes: those graphs predate 5-D attention anyway
        return "starts/ends/axes/steps are not constant inputs"
    starts, ends = (e.constants[n].tolist() for n in node.input[1:3])
    rank = len(shape)
    axes = e.constants[node.input[3]].tolist() if _given(node, 3) else list(range(len(starts)))
    steps = e.constants[node.input[4]].tolist() if _given(node, 4) else [1] * len(starts)
    sliced: dict[int, tuple[int, int, int]] = {}
    for a, s, t, k in zip(axes, starts, ends, steps, strict=True):
        a %= rank
        if k < 1:
            return "negative step"
        begin, end = slice(s, t, k).indices(shape[a])[:2]
        sliced[a] = (begin, max(begin, end), k)
    # Groups of consecutive dims viewed as one: a sliced dim (step 1) absorbs the unsliced
    # dims after it; unsliced dims merge with each other.
    groups: list[list[int]] = []
    open_group = False
    for a in range(rank):
        if a in sliced:
            groups.append([a])
            open_group = sliced[a][2] == 1
        elif open_group:
            groups[-1].append(a)
        else:
            groups.append([a])
            open_group = True
    if len(groups) > max_rank:
        return f"needs {len(groups)} dims even after merging (more than {max_rank} sliced dims?)"
    view, starts_v, ends_v, axes_v, steps_v = [], [], [], [], []
    for g, dims in enumerate(groups):
        inner = math.prod(shape[d] for d in dims[1:])
        view.append(math.prod(shape[d] for d in dims))
        if dims[0] in sliced:
            begin, end, step = sliced[dims[0]]
            starts_v.append(begin * inner)
            ends_v.append(end * inner)
            axes_v.append(g)
            steps_v.append(step)
    out_shape = [(len(range(*sliced[a])) if a in sliced else shape[a]) for a in range(rank)]
    x = e.reshape(node.input[0], view)
    inputs = [e.ints(starts_v), e.ints(ends_v), e.ints(axes_v)]
    if any(k != 1 for k in steps_v):
        inputs.append(e.ints(steps_v))
    y = e.op("Slice", x, *inputs)
    # The usual reader is a Squeeze of the sliced dim (unbind): reshape straight to its shape.
    reader = e.only_consumer(node.output[0])
    if reader is not None and reader.op_type == "Squeeze" and e.shape(reader.output[0]):
        e.reshape(y, e.shape(reader.output[0]) or [], out=reader.output[0])
        e.removed.add(reader.output[0])
    else:
        e.reshape(y, out_shape, out=node.output[0])
    return None


def _given(node: Any, i: int) -> bool:
    return len(node.input) > i and bool(node.input[i])


class SplitSlice(NodeRule):
    """Exact (the same elements, taken one axis at a time). onnx2tf 1.28.8 converts some
    Slices of the channel axis and another axis into a STRIDED_SLICE of the wrong output
    shape (the target probes' "Slice two axes": [1, 6, 10, 10] sliced on axes 1 and 3 gave
    (1, 10, 4, 4) for (1, 4, 10, 7), for tflite, tflite_micro and armnn alike; axes 2 and 1
    converted right), so those profiles' `slice_one_axis` check refuses every multi-axis
    Slice. One Slice per axis converted right in every case measured (error 0, int8 0.0035).
    Axes a slice leaves whole (start 0, to the end, step 1) are dropped where the input shape
    is static. Needs constant starts/ends/axes/steps (opset 10+). A default rewrite of tflite,
    tflite_micro and armnn, after `onnx.slice_rank`."""

    name = "onnx.split_slice"
    description = "Write a Slice over several axes as one Slice per axis (a chain of Slices)."
    fixes = (Fix.check("Slice", "slice_one_axis"),)

    class Options(RuleOptions):
        pass

    example: ClassVar[tuple[str, str] | None] = (
        "y = Slice(x[1, 6, 10, 10], starts=[1, 2], ends=[5, 9], axes=[1, 3])",
        "y = Slice(Slice(x, [1], [5], axes=[1]), [2], [9], axes=[3])",
    )

    def tolerance(self, opts: Any) -> float | None:
        return 0.0

    op_types = frozenset({"Slice"})
    what = "Slice over several axes"

    def replace(self, e: Edit, node: Any, opts: Options) -> str | None:
        return _split_slice(node, e)


def _split_slice(node: Any, e: Edit) -> str | None:
    starts = e.constants.get(node.input[1]) if len(node.input) > 1 else None
    if starts is None or starts.size < 2:
        return ""  # one axis, or opset < 10 attributes (the precheck's check reads inputs)
    if any(name and name not in e.constants for name in node.input[2:]):
        return "ends/axes/steps are not constant inputs"
    begins = [int(v) for v in starts.reshape(-1)]
    ends = [int(v) for v in e.constants[node.input[2]].reshape(-1)]
    given = [int(v) for v in e.constants[node.input[3]].reshape(-1)] if _given(node, 3) else []
    axes = given or list(range(len(begins)))
    steps = [int(v) for v in e.constants[node.input[4]].reshape(-1)] if _given(node, 4) else []
    steps = steps or [1] * len(begins)
    shape = e.shape(node.input[0])
    parts = []
    for axis, begin, end, step in zip(axes, begins, ends, steps, strict=True):
        n = shape[axis] if shape is not None else -1
        if n >= 0 and slice(begin, end, step).indices(n) == (0, n, 1):
            continue  # the whole axis: no Slice
        parts.append((axis, begin, end, step))
    x = node.input[0]
    if not parts:
        e.op("Identity", x, out=node.output[0])
        return None
    for i, (axis, begin, end, step) in enumerate(parts):
        inputs = [e.ints([begin]), e.ints([end]), e.ints([axis])]
        if step != 1:
            inputs.append(e.ints([step]))
        x = e.op("Slice", x, *inputs, out=node.output[0] if i == len(parts) - 1 else "")
    return None


MAX_TILED = 1 << 20  # elements: a larger tiled constant stays Concats of the constant


class TileToConcat(NodeRule):
    """Exact (the same values, copied). TFLite Micro and Arm NN 22 have no TILE (torch's
    `x.repeat(...)` exports as Tile): a Tile by constant repeats becomes, for each axis
    repeated r > 1 times, a Concat of r copies along it; of a constant input (an initializer
    or a Constant), the tiled constant itself (the optimize stage's constant folding does
    that too, but after the target's rewrites). A default rewrite of tflite_micro and armnn.
    Keeps a Tile whose repeats are not a constant, or hold a 0."""

    name = "onnx.tile_to_concat"
    description = "Turn a Tile by constant repeats into a Concat of copies per repeated axis."
    fixes = (Fix.op("Tile"),)

    class Options(RuleOptions):
        pass

    example: ClassVar[tuple[str, str] | None] = (
        "y = Tile(x[1, 3, 4], repeats=[1, 2, 3])",
        "t = Concat(x, x, axis=1); y = Concat(t, t, t, axis=2)",
    )

    def tolerance(self, opts: Any) -> float | None:
        return 0.0

    op_types = frozenset({"Tile"})
    what = "Tile"

    def replace(self, e: Edit, node: Any, opts: Options) -> str | None:
        import numpy as np

        repeats = e.constants.get(node.input[1])
        if repeats is None:
            return "the repeats are not a constant"
        counts = [int(r) for r in repeats.reshape(-1)]
        if any(r < 1 for r in counts):
            return f"repeats {counts} hold a 0: the output is empty"
        data, out = e.constants.get(node.input[0]), node.output[0]
        if data is not None and data.size * math.prod(counts) <= MAX_TILED:
            tiled = e.array(np.tile(data, counts), "tiled")
            e.op("Identity", tiled, out=out)
            return None
        x = node.input[0]
        last = max((axis for axis, r in enumerate(counts) if r > 1), default=-1)
        if last < 0:  # all ones: the input as it is
            e.op("Identity", x, out=out)
        for axis, r in enumerate(counts):
            if r > 1:
                x = e.op("Concat", *[x] * r, axis=axis, out=out if axis == last else "")
        return None
