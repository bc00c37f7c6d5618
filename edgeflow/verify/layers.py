"""Per-layer diff: every tensor of an artifact against its counterpart in the source ONNX model.

The source side is the ONNX model after the recipe's rewrites, run in onnxruntime (float32)
with every intermediate tensor marked as an output. The artifact side is whatever the target's
runtime computed for its own tensors (edgeflow.targets.taps reads them, dequantized). The two
graphs name their tensors differently (onnx2tf renames everything, fuses activations into
convolutions, moves channels last), so counterparts are found by value where names do not
carry over: `match_by_value` pairs each artifact tensor of a float32 build with the source
tensor it equals, up to a layout change. A fused op has no separate counterpart for its
inner tensor (a convolution's output before its fused ReLU): the comparison is at the fused
op's output, which is the ReLU's.

Figures per pair, over all compared samples: the largest absolute difference, that difference
relative to the source tensor's range, and the SQNR in dB (10 log10 of the source's power over
the error's power; inf when they are equal). The first divergence is the first tensor, in the
source graph's order, whose SQNR falls below the threshold: it names the layer where the
error starts, and the SQNR of the tensors that feed it says how much it added.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeflow.verify.kinds import power_db

# Below this SQNR a tensor has diverged, by quantization mode: float32 kernels agree to
# float rounding (> 80 dB), float16 to ~60 dB, int8 tensors of a healthy build to 25-45 dB
# (measured: tests/verify/test_layers.py and docs/debugging.md), int8 weights with float
# activations to 27-43 dB (benchmarks/int8_weights.py, docs/recipe.md).
DIVERGENCE_DB = {"none": 60.0, "fp16": 40.0, "int8": 15.0, "int8_weights": 20.0}
# Two tensors are the same value (a float32 build's counterpart) within this share of the
# source tensor's range.
SAME_VALUE = 1e-3
# An int8 tensor with no float32 counterpart pairs by value (`match_near`) where it holds a
# source tensor at least this closely (SQNR, dB), and no less than the divergence threshold:
# a healthy int8 build's tensors hold 20-45 dB their own counterparts, and at most 8.4 dB
# (digits CNN) and 11.0 dB (MobileNet demo) any other source tensor (a ReLU's output against
# the convolution before it).
NEAR_DB = 12.0
COLUMNS = (
    "tensor",
    "op",
    "node",
    "artifact_tensor",
    "artifact_op",
    "shape",
    "max_abs_diff",
    "rel_to_range",
    "sqnr_db",
    "worst_part",
    "paired_by",
)


@dataclass(frozen=True)
class SourceTensor:
    name: str
    op: str  # the ONNX op that writes it ("input" for a graph input)
    node: str  # that node's name
    inputs: tuple[str, ...]  # the tensors the node reads (graph inputs and weights included)
    # a Concat's parts: (input, start, stop) along `axis`; each part is also judged alone, so
    # that boxes and scores in one tensor (one int8 scale for both) cannot hide the scores
    parts: tuple[tuple[str, int, int], ...] = ()
    axis: int = 0


@dataclass
class SourceGraph:
    """The source model's tensors in topological order, with their values per batch."""

    tensors: list[SourceTensor]
    values: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def by_name(self) -> dict[str, SourceTensor]:
        return {t.name: t for t in self.tensors}


@dataclass(frozen=True)
class ArtifactTensor:
    name: str
    op: str  # the artifact operator that writes it ("input" for an input)
    position: int  # the operator's index in the artifact's execution order


@dataclass
class Pair:
    """One compared tensor: its source counterpart, the artifact's tensor and the figures."""

    source: SourceTensor
    artifact: ArtifactTensor
    layout: str  # how the artifact holds the source's values: same, channel_last, reshape
    shape: tuple[int, ...]
    max_abs_diff: float = 0.0
    peak: float = 0.0
    low: float = math.inf
    high: float = -math.inf
    signal: float = 0.0
    noise: float = 0.0
    part_power: dict[str, list[float]] = field(default_factory=dict)  # part -> [signal, noise]
    paired_by: str = ""  # how the artifact tensor was found (stages/diff.py)

    def add(self, reference: np.ndarray, got: np.ndarray) -> None:
        ref = reference.astype(np.float64)
        out = as_source(got, self.layout, reference.shape).astype(np.float64)
        err = out - ref
        if ref.size:
            self.max_abs_diff = max(self.max_abs_diff, float(np.max(np.abs(err))))
            self.low, self.high = min(self.low, float(ref.min())), max(self.high, float(ref.max()))
        self.signal += float(np.sum(ref * ref))
        self.noise += float(np.sum(err * err))
        for name, start, stop in self.source.parts:
            index = [slice(None)] * ref.ndim
            index[self.source.axis] = slice(start, stop)
            part, part_err = ref[tuple(index)], err[tuple(index)]
            power = self.part_power.setdefault(name, [0.0, 0.0])
            power[0] += float(np.sum(part * part))
            power[1] += float(np.sum(part_err * part_err))

    @property
    def whole_sqnr_db(self) -> float:
        return power_db(self.signal, self.noise)

    @property
    def worst_part(self) -> str:
        """The Concat input whose part of the tensor has the lowest SQNR ('' for others)."""
        if not self.part_power:
            return ""
        return min(self.part_power, key=lambda n: power_db(*self.part_power[n]))

    @property
    def rel_to_range(self) -> float:
        span = self.high - self.low
        return (
            self.max_abs_diff / span if span > 0 else (0.0 if self.max_abs_diff == 0 else math.inf)
        )

    @property
    def sqnr_db(self) -> float:
        """The tensor's SQNR; for a Concat, its worst part's."""
        if self.part_power:
            return power_db(*self.part_power[self.worst_part])
        return self.whole_sqnr_db

    def row(self) -> dict[str, Any]:
        return {
            "tensor": self.source.name,
            "op": self.source.op,
            "node": self.source.node,
            "artifact_tensor": self.artifact.name,
            "artifact_op": self.artifact.op,
            "shape": "x".join(str(d) for d in self.shape),
            "max_abs_diff": f"{self.max_abs_diff:.6g}",
            "rel_to_range": f"{self.rel_to_range:.6g}",
            "sqnr_db": f"{self.sqnr_db:.2f}",
            "worst_part": self.worst_part,
            "paired_by": self.paired_by,
        }


def channel_last(rank: int) -> tuple[int, ...]:
    """NCHW -> NHWC for ranks 3-5 (onnx2tf's layout), identity else."""
    return (0, *range(2, rank), 1) if rank in (3, 4, 5) else tuple(range(rank))


def layouts(artifact_shape: tuple[int, ...], source_shape: tuple[int, ...]) -> list[str]:
    """How an artifact tensor of this shape may hold a source tensor of that shape."""
    if math.prod(artifact_shape) != math.prod(source_shape):
        return []
    found = []
    if artifact_shape == source_shape:
        found.append("same")
    perm = channel_last(len(source_shape))
    if perm != tuple(range(len(source_shape))) and artifact_shape == tuple(
        source_shape[p] for p in perm
    ):
        found.append("channel_last")
    found.append("reshape")  # the same values in the same order, another shape (Flatten)
    return found


def as_source(got: np.ndarray, layout: str, shape: tuple[int, ...]) -> np.ndarray:
    """The artifact's tensor in the source tensor's layout."""
    if layout == "channel_last":
        return np.transpose(got, np.argsort(channel_last(got.ndim))).reshape(shape)
    return got.reshape(shape)


def match_by_value(
    source: SourceGraph,
    artifact: Sequence[ArtifactTensor],
    values: Sequence[dict[str, np.ndarray]],
) -> dict[str, tuple[str, str]]:
    """{artifact tensor: (source tensor, layout)} for the artifact tensors of a float build
    that equal a source tensor within SAME_VALUE of its range on every batch.

    Constant tensors (an all-zero ReLU output) are not matched: they would equal any other.
    Among equal source tensors (a tensor and its Reshape) the first one in graph order that no
    earlier artifact tensor took wins, so chains pair up in order."""
    taken: set[str] = set()
    matches: dict[str, tuple[str, str]] = {}
    batches = range(len(values))
    for tensor in artifact:
        first = values[0][tensor.name]
        for candidate in source.tensors:
            if candidate.name in taken:
                continue
            ref = source.values[candidate.name]
            for layout in layouts(tuple(first.shape), tuple(ref[0].shape)):
                if all(same_values(values[b][tensor.name], ref[b], layout) for b in batches):
                    matches[tensor.name] = (candidate.name, layout)
                    taken.add(candidate.name)
                    break
            if tensor.name in matches:
                break
    return matches


def same_values(got: np.ndarray, reference: np.ndarray, layout: str) -> bool:
    """Whether the artifact tensor holds the source tensor's values in `layout`, within
    SAME_VALUE of its range (a float tensor that is not constant)."""
    if not np.issubdtype(reference.dtype, np.floating):
        return False
    span = float(np.ptp(reference)) if reference.size else 0.0
    if span == 0 or not np.all(np.isfinite(reference)):
        return False
    diff = np.abs(as_source(got, layout, reference.shape).astype(np.float64) - reference)
    return bool(diff.max() <= SAME_VALUE * span)


# Of two source tensors an artifact tensor holds equally well, the one it holds in this
# layout: its own shape before the NCHW/NHWC transpose before any other shape.
PREFERRED = {"same": 2, "channel_last": 1, "reshape": 0}


def match_near(
    source: SourceGraph,
    artifact: Sequence[ArtifactTensor],
    values: Sequence[dict[str, np.ndarray]],
    taken: set[str],
    floor_db: float,
) -> dict[str, tuple[str, str]]:
    """{artifact tensor: (source tensor, layout)} for the artifact tensors of an int8 build
    that hold a source tensor up to rounding: the source tensor not in `taken` of the highest
    SQNR over every batch, where that is at least `floor_db` and NEAR_DB (a tensor and its
    Reshape tie: the one in the artifact's own shape wins, else the first in graph order).
    Source tensors paired are added to `taken`; constant ones (an all-zero ReLU output) are
    not matched, as in `match_by_value`."""
    floor_db = max(floor_db, NEAR_DB)
    matches: dict[str, tuple[str, str]] = {}
    for tensor in artifact:
        got = [batch[tensor.name] for batch in values]
        best: tuple[float, int] | None = None
        for candidate in source.tensors:
            ref = source.values.get(candidate.name)
            if candidate.name in taken or ref is None or not _comparable(ref[0]):
                continue
            for layout in layouts(tuple(got[0].shape), tuple(ref[0].shape)):
                db = round(_sqnr_db(ref, got, layout), 1)  # a tensor and its Reshape: a tie
                if db >= max(floor_db, NEAR_DB) and (
                    best is None or (db, PREFERRED[layout]) > best
                ):
                    best = (db, PREFERRED[layout])
                    matches[tensor.name] = (candidate.name, layout)
        if tensor.name in matches:
            taken.add(matches[tensor.name][0])
    return matches


def _comparable(reference: np.ndarray) -> bool:
    """A float tensor that is not constant: one a value can be recognised by."""
    return (
        np.issubdtype(reference.dtype, np.floating)
        and reference.size > 0
        and bool(np.all(np.isfinite(reference)))
        and float(np.ptp(reference)) > 0
    )


def _sqnr_db(reference: Sequence[np.ndarray], got: Sequence[np.ndarray], layout: str) -> float:
    signal = noise = 0.0
    for ref, out in zip(reference, got, strict=True):
        ref64 = ref.astype(np.float64)
        err = as_source(out, layout, ref.shape).astype(np.float64) - ref64
        signal += float(np.sum(ref64 * ref64))
        noise += float(np.sum(err * err))
    db = power_db(signal, noise)
    return db if not math.isnan(db) else -math.inf


def compare(
    source: SourceGraph,
    artifact: dict[str, ArtifactTensor],
    values: Sequence[dict[str, np.ndarray]],
    pairing: dict[str, tuple[str, str]],
    paired_by: dict[str, str] | None = None,
) -> list[Pair]:
    """The figures of every paired tensor, in the source graph's order; `paired_by`: how
    each artifact tensor was paired, for the record. A pair whose artifact tensor does not
    hold as many values as the source's is left out: the operator alignment paired tensors
    of different ops (an artifact TensorFlow's own converter wrote, whose graph differs from
    onnx2tf's float32 one)."""
    by_name = source.by_name()
    pairs = []
    for artifact_name, (source_name, layout) in pairing.items():
        ref = source.values[source_name]
        if any(batch[artifact_name].size != ref[b].size for b, batch in enumerate(values)):
            continue
        pair = Pair(by_name[source_name], artifact[artifact_name], layout, tuple(ref[0].shape))
        pair.paired_by = (paired_by or {}).get(artifact_name, "")
        for b, batch in enumerate(values):
            pair.add(ref[b], batch[artifact_name])
        pairs.append(pair)
    order = {t.name: k for k, t in enumerate(source.tensors)}
    return sorted(pairs, key=lambda p: order[p.source.name])


@dataclass(frozen=True)
class Divergence:
    pair: Pair
    # the lowest SQNR among the compared tensors that feed it (None: none does; inf: exact)
    before_db: float | None
    # source nodes between those tensors and this one that have no compared output: fused
    # into the artifact operator that computes it (a Conv before its fused ReLU), in order
    fused: tuple[SourceTensor, ...] = ()

    def line(self) -> str:
        s = self.pair.source
        if self.before_db is None:
            before = "(nothing compared before it)"
        else:
            before = "exact" if math.isinf(self.before_db) else f"{self.before_db:.0f} dB"
        inner = "".join(f"; with {t.op} node {t.node}" for t in self.fused)
        part = f" in its part from {self.pair.worst_part}" if self.pair.worst_part else ""
        return (
            f"first divergence: {s.name} ({s.op}, node {s.node}{inner}), "
            f"SQNR {before} -> {self.pair.sqnr_db:.0f} dB{part}"
        )

    @property
    def nodes(self) -> list[str]:
        """The source nodes the divergent tensor comes from: fused ones, then its own."""
        return [t.node for t in self.fused] + [self.pair.source.node]


def first_divergence(
    source: SourceGraph, pairs: Sequence[Pair], below_db: float
) -> Divergence | None:
    """The first compared tensor, in graph order, whose SQNR is below `below_db`."""
    by_name = source.by_name()
    compared = {p.source.name: p for p in pairs}
    order = {t.name: k for k, t in enumerate(source.tensors)}
    for pair in pairs:
        if pair.sqnr_db >= below_db:
            continue
        feeding, between = _upstream(pair.source, by_name, compared)
        fused = tuple(sorted(between, key=lambda t: order[t.name]))
        before = min((compared[n].sqnr_db for n in feeding), default=None)
        return Divergence(pair, before, fused)
    return None


def _upstream(
    tensor: SourceTensor, by_name: dict[str, SourceTensor], compared: dict[str, Pair]
) -> tuple[list[str], list[SourceTensor]]:
    """The nearest compared tensors upstream of `tensor`, and the uncompared tensors between
    (graph inputs are never "between": they are compared, or fed as they are)."""
    found, between, seen = [], [], set()
    stack = list(tensor.inputs)
    while stack:
        name = stack.pop()
        if name in seen or name not in by_name:  # a weight, or already visited
            continue
        seen.add(name)
        if name in compared:
            found.append(name)
        elif by_name[name].op != "input" and by_name[name].inputs:  # not a Constant
            between.append(by_name[name])
            stack.extend(by_name[name].inputs)
    return found, between


def write_csv(path: Path, pairs: Iterable[Pair]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for pair in pairs:
            writer.writerow(pair.row())


def source_graph(model: Any, batches: Sequence[dict[str, np.ndarray]]) -> SourceGraph:
    """Run an ONNX model (a ModelProto) in onnxruntime with every float tensor an output."""
    import onnx

    from edgeflow.core.onnxsession import as_declared, checking_session

    model = onnx.shape_inference.infer_shapes(model)
    graph = model.graph
    weights = {t.name for t in graph.initializer}
    types = {v.name: v.type.tensor_type.elem_type for v in (*graph.value_info, *graph.output)}
    tensors = [
        SourceTensor(i.name, "input", i.name, ()) for i in graph.input if i.name not in weights
    ]
    outputs = {o.name for o in graph.output}
    for k, node in enumerate(graph.node):
        for name in node.output:
            if not name:
                continue
            tensors.append(
                SourceTensor(name, node.op_type, node.name or f"#{k}", tuple(node.input))
            )
            if name not in outputs and types.get(name) == onnx.TensorProto.FLOAT:
                graph.output.append(onnx.helper.make_tensor_value_info(name, types[name], None))
                outputs.add(name)
    session = checking_session(model)
    names = [o.name for o in session.get_outputs()]
    declared = {i.name: i.type for i in session.get_inputs()}
    result = SourceGraph([t for t in tensors if t.name in outputs or t.op == "input"])
    for given in batches:
        # a graph narrowed to int32 ids (tflite_micro's default) takes the int64 samples so
        feeds = {k: as_declared(v, declared.get(k, "")) for k, v in given.items()}
        got = dict(zip(names, session.run(None, feeds), strict=True))
        for tensor in result.tensors:
            value = feeds[tensor.name] if tensor.op == "input" else got[tensor.name]
            result.values.setdefault(tensor.name, []).append(np.asarray(value))
    concats = {n.output[0]: n for n in graph.node if n.op_type == "Concat"}
    result.tensors = [_with_parts(t, concats, result.values) for t in result.tensors]
    return result


def _with_parts(
    tensor: SourceTensor, concats: dict[str, Any], values: dict[str, list[np.ndarray]]
) -> SourceTensor:
    """A Concat's output with its parts, when every input's extent is known."""
    node = concats.get(tensor.name)
    if node is None or tensor.name not in values or len(node.input) < 2:
        return tensor
    rank = values[tensor.name][0].ndim
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0) % max(rank, 1)
    parts, start = [], 0
    for name in node.input:
        if name not in values:  # a constant or an integer input: extent unknown here
            return tensor
        stop = start + values[name][0].shape[axis]
        parts.append((name, start, stop))
        start = stop
    return dataclasses.replace(tensor, parts=tuple(parts), axis=axis)
