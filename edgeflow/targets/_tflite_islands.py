"""quantization.keep_float for the TFLite family: the float islands (edgeflow.core.islands)
found in onnx2tf's float32 .tflite, so TensorFlow's quantizer keeps them float.

onnx2tf names its tensors after its own TensorFlow ops, not the ONNX graph's, so an island's
entry and exit tensors are found by value: the ONNX model (the one converted) and the float32
.tflite run on the same calibration batches, every tensor of the .tflite read (LiteRT,
`experimental_preserve_all_tensors`), and each boundary tensor paired with a .tflite tensor
that holds the same values (in any layout onnx2tf gives it, within layers.SAME_VALUE of its
range). The island's operators are then those between its exits and its entries in the
.tflite graph (`islands.region`); integer tensors (token ids, positions) bound it too.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeflow.core import islands
from edgeflow.schema.source import batch_size
from edgeflow.targets.base import ConvertJob

# TFLite operators that move values without computing them
MOVES = ("RESHAPE", "TRANSPOSE", "SQUEEZE", "EXPAND_DIMS")

SAMPLES = 4  # calibration batches both models run to pair tensors by value


def locate(job: ConvertJob, out: Path, layout: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """(the output tensor names of the .tflite operators of the islands job.keep_float
    asks for, found in onnx2tf's float32 file in `out`; the record for convert.json)."""
    import onnx

    from edgeflow.targets._tflite_tensors import all_tensors
    from edgeflow.verify.layers import source_graph

    wanted = [i for i in job.float_islands if i.kind in job.keep_float]
    if not wanted or job.calibration is None:
        return [], islands.record({}, [], job.keep_float)
    feeds = [
        f
        for k, (f, _) in enumerate(job.calibration.batches(batch_size(job.inputs), True))
        if k < SAMPLES
    ]
    source = source_graph(onnx.load(str(job.onnx)), feeds).values
    values, ops = all_tensors((out / "model_float32.tflite").read_bytes(), layout, feeds)
    order = [name for _, _, outs in ops for name in outs]
    whole = [name for name in order if np.issubdtype(values[name][0].dtype, np.integer)]
    nodes = [(outs[0], inputs, outs) for _, inputs, outs in ops]
    inputs = [name for name in values if name not in set(order)]
    kept: dict[str, list[list[str]]] = {}
    lost = []
    for island in wanted:
        exits = [_twins(source.get(t), values, order)[:1] for t in island.exits]
        entries = [_twins(source.get(t), values, [*inputs, *order]) for t in island.entries]
        inside = None
        if all(exits):
            found = islands.Island(
                island.kind,
                (*(n for twins in entries for n in twins), *whole),
                tuple(twins[0] for twins in exits),
            )
            inside = islands.region(nodes, found, inputs)
        if inside is None:
            lost.append(island)
        else:
            kept.setdefault(island.kind, []).append(inside)
    names = sorted({name for groups in kept.values() for inside in groups for name in inside})
    return names, islands.record(kept, lost, job.keep_float)


def _twins(
    reference: list[np.ndarray] | None, values: dict[str, list[np.ndarray]], order: list[str]
) -> list[str]:
    """The .tflite tensors (in execution order) holding the values of one ONNX tensor on
    every batch, in any layout; none for a tensor the ONNX run did not read."""
    from edgeflow.verify.layers import layouts, same_values

    if reference is None or not np.issubdtype(reference[0].dtype, np.floating):
        return []
    found = []
    for name in order:
        got = values[name]
        if not np.issubdtype(got[0].dtype, np.floating) or got[0].size != reference[0].size:
            continue
        for layout in layouts(tuple(got[0].shape), tuple(reference[0].shape)):
            if all(same_values(g, r, layout) for g, r in zip(got, reference, strict=True)):
                found.append(name)
                break
    return found


def read_by(model: bytes, float_nodes: Sequence[str]) -> tuple[list[str], list[str]]:
    """The model inputs that an operator kept float (its output among `float_nodes`) reads,
    directly or through operators that only move values (a RESHAPE), and those operators'
    outputs, to keep float too. Such a build takes float32 I/O (TensorFlow's quantizer sets
    one type for every input): an int8 input grid would merge the values a float island
    needs exact (token ids fed as float by onnx.ids_as_float: 1,000 ids on 256 levels)."""
    if not float_nodes:
        return [], []
    from edgeflow.targets._tflite_graph import tflite_graph

    graph = tflite_graph(model, "tflite")
    kept = set(float_nodes)
    moved = {t: t for t in graph.inputs}  # tensor -> the input it moves
    movers: dict[int, list[int]] = {t: [] for t in graph.inputs}  # input -> moving ops' outputs
    read: set[int] = set()
    for op in graph.ops:
        sources = [moved[t] for t in op.inputs if t in moved]
        if not sources:
            continue
        if any(graph.written_name(o) in kept for o in op.outputs):
            read.update(sources)
        elif op.name in MOVES and op.inputs[0] in moved:
            moved[op.outputs[0]] = moved[op.inputs[0]]
            movers[moved[op.inputs[0]]].append(op.outputs[0])
    inputs = [graph.written_name(t) for t in graph.inputs if t in read]
    return inputs, [graph.written_name(o) for t in graph.inputs if t in read for o in movers[t]]
