"""FULLY_CONNECTED with keep_num_dims written as RESHAPE, a 2-D FULLY_CONNECTED and RESHAPE, in
the .tflite itself: for Arm NN 22, which rejects the kept dims at load ("FullyConnectedLayer:
TensorShape set on OutputSlot[0] does not match the inferred shape. : [127,1,8210] !=
[127,8210]", ddddocr's CRNN classifier over its LSTM's steps).

TensorFlow's converter fuses Reshape, MatMul and Reshape into one FULLY_CONNECTED that keeps the
input's leading dims (onnx.lower_matmul's 2-D Gemm between Reshapes included), so no ONNX rule
can prevent it. The same values: a RESHAPE keeps its input's quantization, and the 2-D
FULLY_CONNECTED computes the same rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgeflow.targets._tflite_deps import require
from edgeflow.targets._tflite_unroll import code_index
from edgeflow.targets.registry import tflite_runtime


def for_target(artifact: Path, target: str) -> int:
    """Flatten the file's kept-dims FULLY_CONNECTEDs in place where `target` needs it; how
    many."""
    if tflite_runtime(target).kept_dims_fully_connected:
        return 0
    model, count = flatten(artifact.read_bytes(), target)
    if count:
        artifact.write_bytes(model)
    return count


def flatten(model: bytes, target: str) -> tuple[bytes, int]:
    """The model with each FULLY_CONNECTED whose keep_num_dims is set on an input of rank
    above 2 written as RESHAPE to [rows, features], FULLY_CONNECTED and RESHAPE back."""
    import flatbuffers

    schema = require("ai_edge_litert.schema_py_generated", target)
    tree = schema.ModelT.InitFromPackedBuf(bytearray(model), 0)
    codes = [max(c.builtinCode, c.deprecatedBuiltinCode) for c in tree.operatorCodes]
    count = 0
    for graph in tree.subgraphs:
        ops = []
        for op in graph.operators:
            options = op.builtinOptions
            kept = codes[op.opcodeIndex] == schema.BuiltinOperator.FULLY_CONNECTED and getattr(
                options, "keepNumDims", False
            )
            source = graph.tensors[op.inputs[0]] if kept else None
            if source is None or len(source.shape) <= 2:
                ops.append(op)
                continue
            out = graph.tensors[op.outputs[0]]
            rows = int(np.prod(source.shape[:-1]))
            flat_in = _tensor(graph, schema, source, [rows, int(source.shape[-1])], b"/flat")
            flat_out = _tensor(graph, schema, out, [rows, int(out.shape[-1])], b"/flat")
            reshape = code_index(tree, codes, schema, schema.BuiltinOperator.RESHAPE)
            ops.append(_reshape(schema, reshape, op.inputs[0], flat_in, tree, graph))
            options.keepNumDims = False
            op.inputs = [flat_in, *op.inputs[1:]]
            final = op.outputs[0]
            op.outputs = [flat_out]
            ops.append(op)
            ops.append(_reshape(schema, reshape, flat_out, final, tree, graph))
            count += 1
        graph.operators = ops
    if not count:
        return model, 0
    builder = flatbuffers.Builder(len(model) + 1024)
    builder.Finish(tree.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output()), count


def _tensor(graph: Any, schema: Any, like: Any, shape: list[int], suffix: bytes) -> int:
    tensor = schema.TensorT()
    for key, value in vars(like).items():
        setattr(tensor, key, value)
    tensor.shape, tensor.shapeSignature, tensor.buffer = shape, None, 0
    tensor.name = (like.name or b"") + suffix
    graph.tensors.append(tensor)
    return len(graph.tensors) - 1


def _reshape(schema: Any, code: int, source: int, out: int, tree: Any, graph: Any) -> Any:
    """RESHAPE source -> out, the new shape a constant input (as TensorFlow writes it)."""
    shape = np.asarray(graph.tensors[out].shape, np.int32)
    buffer = schema.BufferT()
    buffer.data = np.frombuffer(shape.tobytes(), np.uint8)
    tree.buffers.append(buffer)
    constant = schema.TensorT()
    constant.shape, constant.type = [len(shape)], schema.TensorType.INT32
    constant.buffer, constant.name = len(tree.buffers) - 1, b"flat_fc/shape"
    graph.tensors.append(constant)
    op = schema.OperatorT()
    op.opcodeIndex = code
    op.inputs, op.outputs = [source, len(graph.tensors) - 1], [out]
    op.builtinOptionsType = schema.BuiltinOptions.ReshapeOptions
    op.builtinOptions = schema.ReshapeOptionsT()
    op.builtinOptions.newShape = [int(d) for d in shape]
    return op
