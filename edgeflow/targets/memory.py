"""Memory estimate of an ONNX model on a target, before any converter runs.

- weights: the bytes of every initializer (and Constant node) at the chosen quantization:
  int8 stores float weights in 1 byte (biases of Conv/Gemm stay 4-byte int32), fp16 in 2,
  int8_weights the weight of each Conv/Gemm/MatMul in 1 byte and the rest as it is (TFLite's
  dynamic-range converter keeps tensors under 1,024 elements float: a little more there);
- activations: every other tensor lives from the node that produces it (graph inputs: from
  the start) to its last consumer (graph outputs: to the end), in the graph's execution order;
  buffers are placed greedily, largest first, at the lowest 16-byte aligned offset that no
  buffer alive at the same time overlaps (the plan of TFLite Micro's GreedyMemoryPlanner).
  The arena is the end of the highest buffer. Activations are 1 byte per element for int8,
  2 for fp16, else (int8_weights too) the tensor's own element size. An activation (Relu,
  Clip) right after the Conv/Gemm/MatMul/Add that alone feeds it is fused by converters: it
  gets no buffer.
- tflite_micro adds the runtime's persistent allocations (`TFLM_*`: the sizes TFLM's
  RecordingMicroAllocator reports per tensor, node and quantized channel) to the arena.

Shapes come from ONNX shape inference on the declared inputs; a tensor whose size is unknown
(a dynamic dimension) is counted as 0 bytes and listed in `unknown`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from edgeflow.core.onnxgraph import all_graphs, subgraphs

ALIGN = 16
FUSED_ACTIVATIONS = {"Relu", "Clip", "LeakyRelu"}
FUSES_INTO = {"Conv", "Gemm", "MatMul", "Add", "ConvTranspose"}
BIAS_INPUT = {"Conv": 2, "Gemm": 2, "ConvTranspose": 2}
WEIGHT_OPS = ("Conv", "Gemm", "MatMul")  # whose weight int8_weights stores as int8
# TFLite Micro's persistent ("tail") allocations, from its RecordingMicroAllocator report for
# tflite-micro 0.dev20261023182759: TfLiteEvalTensor 24 B per tensor, NodeAndRegistration 64 B
# per node, a persistent TfLiteTensor 64 B per graph input/output, 8 B per output channel of a
# quantized Conv/Gemm (multiplier + shift), ~72 B of op data per node, ~700 B for the
# interpreter's own structures.
TFLM_TENSOR, TFLM_NODE, TFLM_IO, TFLM_CHANNEL, TFLM_OPDATA, TFLM_FIXED = 24, 64, 64, 8, 72, 700


@dataclass
class MemoryEstimate:
    weights_bytes: int
    activations_bytes: int  # the greedy arena plan of the activations
    overhead_bytes: int  # the runtime's own persistent allocations (tflite_micro)
    peak_node: str  # the node at which the most activation bytes are alive
    unknown: list[str] = field(default_factory=list)  # tensors of unknown size

    @property
    def arena_bytes(self) -> int:
        return self.activations_bytes + self.overhead_bytes


def with_shapes(model: Any) -> Any:
    """The model with the shapes onnx infers for its intermediates; as it is when inference
    fails (a failure is the precheck's own finding; unknown sizes are listed as unknown)."""
    import onnx

    with contextlib.suppress(Exception):
        return onnx.shape_inference.infer_shapes(model)
    return model


def estimate(
    model: Any, quantization: str = "none", arena: bool = False, inferred: bool = False
) -> MemoryEstimate:
    """Weights and peak activation memory of `model` (an onnx.ModelProto) at `quantization`:
    none, fp16, int8, int8_weights (int8 weights, float activations) or int16_act (int8
    weights, int16 activations). `arena`: the runtime plans one arena with its own persistent
    allocations (TFLite Micro: TfliteRuntime.arena), which are added. `inferred`: the
    model is what `infer_shapes` made of it already (the precheck infers shapes once)."""
    model = model if inferred else with_shapes(model)
    graph = model.graph
    sizes = _sizes(model, quantization)
    # int16_act (TFLite 16x8): int8 weights, int16 activations
    quantization = "int8" if quantization == "int16_act" else quantization
    weights = sum(_weights(g, quantization) for g in all_graphs(graph))
    constants = {t.name for t in graph.initializer}
    constants |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    aliases = _fused(graph)
    first, last = _lifetimes(graph, constants, aliases)
    plan = greedy_plan({t: sizes.get(t, 0) for t in first}, first, last)
    # a control-flow node's bodies run inside it: the largest body's activations on top
    bodies, body_unknown = _bodies(graph, quantization)
    peak_node = _peak(graph, sizes, first, last)
    overhead = _tflm_overhead(graph, quantization, aliases) if arena else 0
    # every buffer whose size shape inference could not give (absent, or a dynamic dim)
    unknown = sorted({t for t in first if t not in sizes} | set(body_unknown))
    return MemoryEstimate(weights, plan + bodies, overhead, peak_node, unknown)


def _bodies(graph: Any, quantization: str) -> tuple[int, list[str]]:
    """The most activation bytes any control-flow node's body holds (each body's tensors
    counted whole: an upper bound), and the body tensors of unknown size."""
    most, unknown = 0, []
    for node in graph.node:
        for body in subgraphs(node):
            total = 0
            for g in all_graphs(body):
                made = {o for n in g.node for o in n.output}
                sized = {v.name: v for v in (*g.value_info, *g.output)}
                for name in sorted(made):
                    size = _value_bytes(sized[name], quantization) if name in sized else None
                    if size is None:
                        unknown.append(name)
                    else:
                        total += size
            most = max(most, total)
    return most, unknown


def _value_bytes(value: Any, quantization: str) -> int | None:
    t = value.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
    if not t.HasField("shape") or any(d < 0 for d in dims) or not t.elem_type:
        return None
    count = 1
    for d in dims:
        count *= d
    return count * _element_bytes(t.elem_type, quantization)


def layers(model: Any, quantization: str = "none", inferred: bool = False) -> list[dict[str, Any]]:
    """Per node, in graph order: its output bytes, the activation bytes alive while it runs
    (the same lifetimes as the arena estimate) and the bytes of the weights it reads."""
    model = model if inferred else with_shapes(model)
    graph = model.graph
    sizes = _sizes(model, quantization)
    element = "int8" if quantization == "int16_act" else quantization
    initializers = {t.name: t for t in graph.initializer}
    constants = set(initializers) | {
        o for n in graph.node if n.op_type == "Constant" for o in n.output
    }
    first, last = _lifetimes(graph, constants, _fused(graph))
    biases, matrices = _biases(graph), _matrices(graph)
    rows = []
    for i, (node, alive) in enumerate(
        zip(graph.node, _alive(graph, sizes, first, last), strict=True)
    ):
        weights = [initializers[n] for n in node.input if n in initializers]
        rows.append(
            {
                "layer": i,
                "node": node.name or f"#{i}",
                "op": node.op_type,
                "output_bytes": sum(sizes.get(o, 0) for o in node.output),
                "alive_bytes": alive,
                "weight_bytes": sum(_stored_bytes(t, element, biases, matrices) for t in weights),
            }
        )
    return rows


def greedy_plan(sizes: dict[str, int], first: dict[str, int], last: dict[str, int]) -> int:
    """Bytes of an arena holding every buffer, placed largest first at the lowest aligned
    offset that does not overlap a buffer alive at the same time."""
    import numpy as np

    order = sorted((n for n in sizes if sizes[n] > 0), key=lambda n: (-sizes[n], first[n], n))
    offsets = np.zeros(len(order), np.int64)
    ends = np.zeros(len(order), np.int64)
    starts_at = np.array([first[n] for n in order], np.int64)
    ends_at = np.array([last[n] for n in order], np.int64)
    for k, name in enumerate(order):
        size = _aligned(sizes[name])
        alive = (starts_at[:k] <= last[name]) & (first[name] <= ends_at[:k])
        offset = 0
        placed = zip(offsets[:k][alive].tolist(), ends[:k][alive].tolist(), strict=True)
        for start, end in sorted(placed):
            if offset + size <= start:
                break
            offset = max(offset, end)
        offsets[k], ends[k] = offset, offset + size
    return int(ends.max()) if len(order) else 0


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _element_bytes(elem_type: int, quantization: str) -> int:
    import onnx

    dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
    floating = dtype.kind == "f"
    if floating and quantization == "int8":
        return 1
    if floating and quantization in ("fp16", "int16_act"):
        return 2
    return int(dtype.itemsize)


def _sizes(model: Any, quantization: str) -> dict[str, int]:
    """Bytes of every value of the main graph whose shape and type inference gave."""
    graph = model.graph
    sizes: dict[str, int] = {}
    for value in (*graph.input, *graph.value_info, *graph.output):
        size = _value_bytes(value, quantization)
        if size is not None:
            sizes[value.name] = size
    return sizes


def _has_bias(node: Any) -> bool:
    return node.op_type in BIAS_INPUT and len(node.input) > BIAS_INPUT[node.op_type]


def _weights(graph: Any, quantization: str) -> int:
    biases, matrices = _biases(graph), _matrices(graph)
    tensors = list(graph.initializer)
    tensors += [
        a.t for n in graph.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"
    ]
    return sum(_stored_bytes(t, quantization, biases, matrices) for t in tensors)


def _stored_bytes(t: Any, quantization: str, biases: set[str], matrices: set[str]) -> int:
    """A stored tensor's bytes at `quantization`; int8_weights stores the `matrices` (the
    weights of Conv/Gemm/MatMul) as int8 and every other tensor as it is."""
    if quantization == "int8_weights":
        return _tensor_bytes(t, "int8" if t.name in matrices else "none", False)
    return _tensor_bytes(t, quantization, t.name in biases)


def _biases(graph: Any) -> set[str]:
    return {node.input[BIAS_INPUT[node.op_type]] for node in graph.node if _has_bias(node)}


def _matrices(graph: Any) -> set[str]:
    """The weight inputs of Conv, Gemm and MatMul: what int8_weights stores as int8."""
    return {n.input[1] for n in graph.node if n.op_type in WEIGHT_OPS and len(n.input) > 1}


def _tensor_bytes(t: Any, quantization: str, is_bias: bool) -> int:
    """A stored tensor's bytes at `quantization` (int8 keeps biases as int32)."""
    import numpy as np
    import onnx

    if t.data_type == onnx.TensorProto.STRING:
        return 0
    count = int(np.prod(t.dims)) if len(t.dims) else 1
    element = 4 if is_bias and quantization == "int8" else _element_bytes(t.data_type, quantization)
    return count * element


def _fused(graph: Any) -> dict[str, str]:
    """Outputs of activations that a converter fuses into their producer -> that producer's
    output (they share its buffer)."""
    producer = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            consumers[name] = consumers.get(name, 0) + 1
    aliases = {}
    for node in graph.node:
        if node.op_type not in FUSED_ACTIVATIONS or not node.input:
            continue
        source = producer.get(node.input[0])
        if source is not None and source.op_type in FUSES_INTO and consumers[node.input[0]] == 1:
            aliases[node.input[0]] = node.output[0]  # the producer writes the fused result
    return aliases


def _lifetimes(
    graph: Any, constants: set[str], aliases: dict[str, str]
) -> tuple[dict[str, int], dict[str, int]]:
    """First and last node index of every activation buffer (fused ones merged)."""
    end = len(graph.node)
    first: dict[str, int] = {}
    last: dict[str, int] = {}

    def buffer(name: str) -> str:
        return aliases.get(name, name)

    for value in graph.input:
        if value.name not in constants:
            first[value.name] = last[value.name] = 0
    for i, node in enumerate(graph.node):
        for name in node.input:
            if name and name not in constants and buffer(name) in first:
                last[buffer(name)] = max(last[buffer(name)], i)
        for name in node.output:
            if name and name not in constants:
                first.setdefault(buffer(name), i)
                last[buffer(name)] = max(last.get(buffer(name), i), i)
    for value in graph.output:
        if buffer(value.name) in last:
            last[buffer(value.name)] = end
    return first, last


def _alive(
    graph: Any, sizes: dict[str, int], first: dict[str, int], last: dict[str, int]
) -> list[int]:
    """Activation bytes alive while each node runs (a sweep over lifetimes)."""
    change = [0] * (len(graph.node) + 2)
    for name in first:
        change[first[name]] += sizes.get(name, 0)
        change[last[name] + 1] -= sizes.get(name, 0)
    alive, total = [], 0
    for i in range(len(graph.node)):
        total += change[i]
        alive.append(total)
    return alive


def _peak(graph: Any, sizes: dict[str, int], first: dict[str, int], last: dict[str, int]) -> str:
    """The node at which the most activation bytes are alive (the first, on a tie)."""
    alive = _alive(graph, sizes, first, last)
    if not alive:
        return ""
    i = alive.index(max(alive))
    node = graph.node[i]
    return node.name or f"#{i} {node.op_type}"


def _tflm_overhead(graph: Any, quantization: str, aliases: dict[str, str]) -> int:
    """TFLite Micro's persistent allocations for this graph (see the TFLM_* constants)."""
    nodes = [
        n for n in graph.node if n.op_type != "Constant" and n.output[0] not in aliases.values()
    ]
    tensors = {name for n in nodes for name in (*n.input, *n.output) if name}
    channels = 0
    if quantization == "int8":
        dims = {t.name: list(t.dims) for t in graph.initializer}
        for n in nodes:
            if n.op_type in ("Conv", "Gemm", "MatMul") and len(n.input) > 1 and n.input[1] in dims:
                shape = dims[n.input[1]]
                channels += shape[0] if n.op_type == "Conv" else shape[-1]
    io = len(graph.input) + len(graph.output)
    return (
        TFLM_TENSOR * len(tensors)
        + (TFLM_NODE + TFLM_OPDATA) * len(nodes)
        + TFLM_IO * io
        + TFLM_CHANNEL * channels
        + TFLM_FIXED
    )


def memory_line(memory: dict[str, Any]) -> str:
    """The memory estimate in one line, with the board's budgets."""
    at_least = "at least " if memory.get("unknown_sizes") else ""
    text = (
        f"memory at {memory['quantization']}: weights {memory['weights_bytes']:,} B, "
        f"arena {at_least}{memory['arena_bytes']:,} B (activations "
        f"{memory['activations_bytes']:,} B, peak at {memory['peak_node']})"
    )
    if memory["board"]:
        ram, flash = (
            f"{memory[k]:,} B" if memory[k] else "unlimited" for k in ("ram_bytes", "flash_bytes")
        )
        text += f"; board {memory['board']}: RAM {ram}, flash {flash}"
    return text
