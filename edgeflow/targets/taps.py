"""Every intermediate tensor of an artifact, as its own runtime computes it (the per-layer diff).

- TFLite family (LiteRT, TFLite Micro, Arm NN): a copy of the .tflite whose subgraph lists
  every tensor an operator writes among its outputs (the flatbuffer is edited, nothing else
  changes: the same operators, kernels and quantization), run in the target's own runner. A
  runtime must then keep each such tensor, which LiteRT, TFLM and Arm NN do; int8 tensors are
  dequantized with their own scale and zero point.
- onnxruntime: the model the converter turned into the .ort file (the quantize stage's QDQ
  model), in onnxruntime with every tensor an output. A quantized activation's value is that
  of its DequantizeLinear: what the next layer reads.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeflow.targets._tflite_deps import require
from edgeflow.targets._tflite_graph import TfliteGraph, TfliteOp, tflite_graph
from edgeflow.targets._tflite_io import Quant
from edgeflow.verify.layers import ArtifactTensor

# Operators that only change a tensor's type: skipped when two .tflite graphs are aligned.
TYPE_ONLY = ("QUANTIZE", "DEQUANTIZE")


@dataclass
class Captured:
    """An artifact's tensors in execution order and their values per batch (float32, in the
    artifact's own layout)."""

    tensors: list[ArtifactTensor]
    values: list[dict[str, np.ndarray]]
    graph: TfliteGraph | None = None  # a .tflite's structure, as read for the capture


def mark_outputs(
    model: bytes, tensors: Sequence[int], target: str, names: Sequence[str] = ()
) -> tuple[bytes, list[int]]:
    """The model with `tensors` appended to subgraph 0's outputs, and its tensors renamed to
    `names` where given (a runtime that binds outputs by name, Arm NN, needs them unique: a
    loop unrolled in the file repeats its tensors' names); returns it and the full output
    list (the model's own outputs first)."""
    import flatbuffers

    schema = require("ai_edge_litert.schema_py_generated", target)
    tree = schema.ModelT.InitFromPackedBuf(bytearray(model), 0)
    graph = tree.subgraphs[0]
    outputs = [int(t) for t in graph.outputs]
    outputs += [t for t in tensors if t not in outputs]
    graph.outputs = outputs
    for tensor, name in zip(graph.tensors, names, strict=False):
        tensor.name = name.encode()
    builder = flatbuffers.Builder(len(model) + 1024)
    builder.Finish(tree.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output()), outputs


def capture_tflite(
    target: str,
    artifact: Path,
    io: dict[str, Any],
    batches: Sequence[dict[str, np.ndarray]],
    work: Path,
) -> Captured:
    """Run the .tflite in `target`'s runtime with every operator output readable."""
    model = artifact.read_bytes()
    graph = tflite_graph(model, target)
    ops, names, inputs = graph.ops, graph.names, graph.inputs
    written = [t for op in ops for t in op.outputs]
    marked, outputs = mark_outputs(model, written, target, names)
    path = work / f"marked-{artifact.name}"
    path.write_bytes(marked)
    layout = {
        "inputs": io["inputs"],
        "outputs": [
            {"name": names[t], "index": k, "perm": list(range(len(graph.shapes[t])))}
            for k, t in enumerate(outputs)
        ],
    }
    runner = open_tflite(target, path, layout)
    writer = {t: (op.name, k) for k, op in enumerate(ops) for t in op.outputs}
    tensors = [ArtifactTensor(names[t], "input", -1) for t in inputs]
    tensors += [ArtifactTensor(names[t], *writer[t]) for t in written]
    values = []
    for feeds in batches:
        got = dict(zip((o["name"] for o in layout["outputs"]), runner.run(feeds), strict=True))
        for spec in io["inputs"]:  # the input as the artifact holds it: quantized, if int8
            pos, t = spec["index"], inputs[spec["index"]]
            quant: Quant = runner.inputs[pos]
            laid_out = np.transpose(feeds[spec["name"]], spec["perm"])
            got[names[t]] = quant.dequantize(quant.quantize(laid_out))
        values.append(got)
    del runner
    return Captured(tensors, values, graph)


def open_tflite(target: str, path: Path, layout: dict[str, Any]) -> Any:
    """The target's own runner for a .tflite file (its backend module's `tflite_runner`)."""
    from edgeflow.targets.registry import get

    family = get(target)
    if family.tflite is None:
        raise ValueError(f"no TFLite-family runtime '{target}'")
    return family.load().tflite_runner(path, layout)


def align(float_ops: Sequence[TfliteOp], quant_ops: Sequence[TfliteOp]) -> dict[int, int] | None:
    """{float tensor: int8 tensor} for two conversions of one graph (onnx2tf's float32 and
    int8 files): the same operators (and fused activations) in the same order, once the
    type-only ones are skipped; None when the sequences differ."""
    left = [op for op in float_ops if op.name not in TYPE_ONLY]
    right = [op for op in quant_ops if op.name not in TYPE_ONLY]
    if [(op.name, op.option) for op in left] != [(op.name, op.option) for op in right]:
        return None
    pairs: dict[int, int] = {}
    for a, b in zip(left, right, strict=True):
        if len(a.outputs) != len(b.outputs):
            return None
        pairs.update(zip(a.outputs, b.outputs, strict=True))
    return pairs


def align_runs(floats: TfliteGraph, quants: TfliteGraph) -> dict[int, int]:
    """{float tensor: int8 tensor} for two conversions whose operators differ (a loop where
    the other has a sequence operator, an activation one of them fuses): the longest runs of
    operators the two sequences share (difflib, type-only operators skipped), an operator
    matching one of the same builtin and fused activation whose outputs have the same
    shapes."""
    from difflib import SequenceMatcher

    left = [op for op in floats.ops if op.name not in TYPE_ONLY]
    right = [op for op in quants.ops if op.name not in TYPE_ONLY]
    mine, theirs = (
        [(op.name, op.option, tuple(graph.shapes[t] for t in op.outputs)) for op in ops]
        for graph, ops in ((floats, left), (quants, right))
    )
    pairs: dict[int, int] = {}
    for a, b, size in SequenceMatcher(None, mine, theirs, autojunk=False).get_matching_blocks():
        for k in range(size):
            pairs.update(zip(left[a + k].outputs, right[b + k].outputs, strict=True))
    return pairs


def same_names(floats: TfliteGraph, quants: TfliteGraph) -> dict[int, int]:
    """{float tensor: int8 tensor} for the tensors of one name and shape that operators of
    the same builtin and fused activation write in both files (TensorFlow's quantizer keeps
    the names of the float32 file it quantizes; type-only operators' outputs left out)."""

    def written(graph: TfliteGraph) -> dict[str, tuple[int, tuple[Any, ...]]]:
        return {
            graph.names[t]: (t, (op.name, op.option, graph.shapes[t]))
            for op in graph.ops
            if op.name not in TYPE_ONLY
            for t in op.outputs
        }

    theirs = written(quants)
    return {
        t: theirs[name][0]
        for name, (t, kind) in written(floats).items()
        if name in theirs and theirs[name][1] == kind
    }


def capture_onnx(model_path: Path, batches: Sequence[dict[str, np.ndarray]]) -> Captured:
    """The (QDQ) ONNX model in onnxruntime, every float tensor read: its DequantizeLinear's
    output for a quantized activation, the tensor itself otherwise."""
    import onnx

    from edgeflow.verify.layers import source_graph

    model = onnx.load(str(model_path))
    graph = source_graph(model, batches)
    quantized = dequantized_names(model)
    tensors, values = [], [dict[str, np.ndarray]() for _ in batches]
    for k, tensor in enumerate(graph.tensors):
        if tensor.op in ("QuantizeLinear", "DequantizeLinear"):
            continue
        read = quantized.get(tensor.name, tensor.name)
        if read not in graph.values:
            continue
        tensors.append(ArtifactTensor(tensor.name, tensor.op, k))
        for b in range(len(batches)):
            values[b][tensor.name] = graph.values[read][b]
    return Captured(tensors, values)


def dequantized_names(model: Any) -> dict[str, str]:
    """{activation: the DequantizeLinear output that holds its quantized value} of a QDQ model
    (tensor -> QuantizeLinear -> DequantizeLinear)."""
    nodes = list(model.graph.node)
    q_of = {n.output[0]: n.input[0] for n in nodes if n.op_type == "QuantizeLinear"}
    return {
        q_of[n.input[0]]: n.output[0]
        for n in nodes
        if n.op_type == "DequantizeLinear" and n.input[0] in q_of
    }


def batches_of(
    samples: Any, batch: int, fixed: bool, limit: int
) -> Iterator[dict[str, np.ndarray]]:
    """The first `limit` samples as feeds of `batch` (the model's fixed batch, or up to it)."""
    count = 0
    for feeds, size in samples.batches(batch, fixed=fixed):
        if count >= limit:
            return
        count += size
        yield feeds
