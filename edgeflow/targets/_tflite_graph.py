"""A .tflite's structure (subgraph 0), read once from its flatbuffer: the operators in
execution order with their tensors, and each tensor's name and shape. A leaf of the TFLite
modules: the diff's taps, the quantizer's output_writers and the fallback read it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edgeflow.targets import emitted
from edgeflow.targets._tflite_deps import require


@dataclass(frozen=True)
class TfliteOp:
    name: str  # the builtin operator (CONV_2D)
    inputs: tuple[int, ...]  # tensor indices (-1: an optional input left out)
    outputs: tuple[int, ...]
    option: str = ""  # a fused activation (RELU), as emitted.option reads it


@dataclass(frozen=True)
class TfliteGraph:
    """Subgraph 0 of a .tflite, read once from its flatbuffer."""

    ops: list[TfliteOp]  # in execution order
    names: list[str]  # per tensor; unique: a repeated name gets '#index'
    shapes: list[tuple[int, ...]]  # per tensor
    inputs: list[int]
    outputs: list[int]
    types: list[str] = field(default_factory=list)  # per tensor: FLOAT32, INT8, ...
    # per tensor: (scale, zero point) of a per-tensor quantized tensor, else None
    grids: list[tuple[float, int] | None] = field(default_factory=list)

    def written_name(self, tensor: int) -> str:
        """A tensor's name as the file has it (without the '#index' a repeat gets here): what
        TensorFlow's quantizer takes as a denylisted node."""
        return self.names[tensor].removesuffix(f"#{tensor}")


def tflite_graph(model: bytes, target: str) -> TfliteGraph:
    schema = require("ai_edge_litert.schema_py_generated", target)
    root = schema.Model.GetRootAs(model, 0)
    codes = emitted.operators_by_code(root, schema)
    graph = root.Subgraphs(0)
    names: list[str] = []
    shapes: list[tuple[int, ...]] = []
    types: list[str] = []
    grids: list[tuple[float, int] | None] = []
    type_names = {v: k for k, v in vars(schema.TensorType).items() if k.isupper()}
    seen: set[str] = set()
    for i in range(graph.TensorsLength()):
        tensor = graph.Tensors(i)
        name = tensor.Name().decode(errors="replace")
        names.append(f"{name}#{i}" if name in seen else name)
        seen.add(name)
        shapes.append(tuple(int(d) for d in tensor.ShapeAsNumpy()) if tensor.ShapeLength() else ())
        types.append(type_names.get(tensor.Type(), str(tensor.Type())))
        grids.append(_grid(tensor.Quantization()))
    ops = []
    for k in range(graph.OperatorsLength()):
        op = graph.Operators(k)
        ins = tuple(int(t) for t in op.InputsAsNumpy()) if op.InputsLength() else ()
        outs = tuple(int(t) for t in op.OutputsAsNumpy()) if op.OutputsLength() else ()
        ops.append(TfliteOp(codes[op.OpcodeIndex()], ins, outs, emitted.option(op, schema)))
    inputs = [int(t) for t in graph.InputsAsNumpy()]
    outputs = [int(t) for t in graph.OutputsAsNumpy()]
    return TfliteGraph(ops, names, shapes, inputs, outputs, types, grids)


def _grid(quantization: Any) -> tuple[float, int] | None:
    """(scale, zero point) of a tensor quantized per tensor; None for float or per channel."""
    if quantization is None or quantization.ScaleLength() != 1:
        return None
    scale = float(quantization.Scale(0))
    zero = int(quantization.ZeroPoint(0)) if quantization.ZeroPointLength() else 0
    return scale, zero
