"""WHILE loops with a static trip count, unrolled in the .tflite itself: for a runtime with no
WHILE (Arm NN 22's parser takes one subgraph: "Current TfLite parser only supports 1
subgraph").

A recurrent layer reaches such a runtime as the loop every TFLite runtime with WHILE runs
(frameworks.tf_recurrent.looped, frameworks._keras_recurrent): TensorFlow's converter converts
the loop as fast as one step, whatever the length, and `unroll` then writes the body once per
step into the main subgraph. Converting the steps unrolled instead made TensorFlow's
converter and its int8 quantizer superlinear in the operators: PLCMOS's 2,500 GRU steps took
67.9 s float32 and 204.3 s int8 (137 s in the MLIR quantizer alone); the file keeps the int8
build's choice (the loops float, _tflite_quant.loop_nodes) and each weight once, as a shared
buffer.

Per WHILE, the condition and the body are evaluated step by step:
- the loop counter and every index computed from it are constants (ADD, SUB, MUL, PACK and
  comparisons of constants are folded), so the condition is decided here; a SLICE of a
  step's rows is one output of a tree of SPLITs of the tensor (at most 10 outputs each),
  made once for all steps (any other SLICE at a constant place: a STRIDED_SLICE; Arm NN has
  no SLICE);
- a DYNAMIC_UPDATE_SLICE that writes back the row just read is the tensor itself (the loop
  writes its inputs back, see frameworks.tf_recurrent.direction_loop), and the rows written
  into a tensor are kept as rows: where the tensor is read (after the loop) they are joined
  by CONCATENATIONs of at most 10 inputs, provided they cover it;
- every other operator is copied with its tensors, each constant (weights) one buffer for
  all steps; a FULLY_CONNECTED without a bias gets a zero one where the runtime needs it
  (`biased`: Arm NN rejects one without).
A loop this cannot decide (a condition that depends on data, a write at a computed place that
is not a row) stays a WHILE: the runtime's load then says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeflow.core.recurrent import MAX_CONCAT_INPUTS
from edgeflow.targets import emitted
from edgeflow.targets._tflite_deps import require
from edgeflow.targets.registry import tflite_runtime

MAX_STEPS = 100_000  # a loop that runs longer is left a loop

# numpy dtypes of the TFLite tensor types written or folded here
_DTYPES = {0: np.float32, 2: np.int32, 4: np.int64, 6: np.bool_}
_INDEX_TYPES = (2, 4, 6)  # int32, int64, bool


class _Undecidable(Exception):
    """A loop `unroll` cannot write out (left as it is)."""


@dataclass(frozen=True)
class _Rows:
    """A tensor as rows written into it along axis 0: {row: tensor of shape [1, ...]}."""

    shape: tuple[int, ...]
    rows: dict[int, int]


def for_target(artifact: Path, target: str) -> int:
    """Unroll the loops of the .tflite file in place where `target` runs no WHILE; the number
    of loops the file had (0 for a file without)."""
    loops = emitted.counts(artifact, target).get("WHILE", 0)
    if loops and not tflite_runtime(target).while_loops:
        unrolled, _ = unroll(artifact.read_bytes(), target, biased=True)
        artifact.write_bytes(unrolled)
    return loops


def int8_note(loops: int, target: str) -> str:
    """The int8 scheme's words for a file's loops (their operators stay float32:
    _tflite_quant.loop_nodes)."""
    unrolled = "" if tflite_runtime(target).while_loops else " (unrolled in the file)"
    return f"; the operators inside its {loops} loops float{unrolled}"


def unroll(model: bytes, target: str, biased: bool) -> tuple[bytes, int]:
    """The model with every WHILE of its main subgraph that runs a static number of steps
    unrolled (see the module docstring), and the number unrolled."""
    import flatbuffers

    schema = require("ai_edge_litert.schema_py_generated", target)
    tree = schema.ModelT.InitFromPackedBuf(bytearray(model), 0)
    writer = _Writer(tree, schema, biased)
    done = writer.run()
    if not done:
        return model, 0
    builder = flatbuffers.Builder(len(model) + 1024)
    builder.Finish(tree.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output()), done


class _Writer:
    def __init__(self, tree: Any, schema: Any, biased: bool) -> None:
        self.tree, self.schema, self.biased = tree, schema, biased
        self.ops_enum = schema.BuiltinOperator
        self.main = tree.subgraphs[0]
        self.codes = [max(c.builtinCode, c.deprecatedBuiltinCode) for c in tree.operatorCodes]
        self.ops: list[Any] = []  # the main subgraph's new operators
        self.value: dict[int, Any] = {}  # main tensor -> its tensor, index array or _Rows
        self.shared: dict[tuple[int, int], int] = {}  # (subgraph, tensor) -> main tensor
        self.reads: dict[int, tuple[int, tuple[int, ...]]] = {}  # row read: (source, begin)
        self.blocks: dict[tuple[int, int], list[int]] = {}  # (tensor, rows) -> its blocks
        self.values: dict[tuple[str, tuple[int, ...], bytes], int] = {}  # constant tensors

    # --- the main subgraph

    def run(self) -> int:
        done = 0
        for op in self.main.operators:
            if self.codes[op.opcodeIndex] == self.ops_enum.WHILE:
                try:
                    self._while(op)
                    done += 1
                    continue
                except _Undecidable:
                    pass
            op.inputs = [self._tensor(t) for t in op.inputs]
            self.ops.append(op)
        if done:
            self.main.outputs = [self._tensor(t) for t in self.main.outputs]
            self.main.operators = self.ops
            self._prune()
        return done

    def _tensor(self, t: int) -> int:
        """Main tensor t as a tensor an operator can read (a loop's result written out, once
        for all its readers)."""
        if t < 0:
            return t
        self.value[t] = self._readable(self.value.get(t, t))
        return int(self.value[t])

    def _readable(self, value: Any) -> int:
        if value is None:
            return -1
        if isinstance(value, _Rows):
            return self._join(value)
        if isinstance(value, np.ndarray):
            return self._constant(value, "unrolled/index")
        return int(value)

    # --- one loop

    def _while(self, op: Any) -> None:
        options = op.builtinOptions
        cond = self.tree.subgraphs[options.condSubgraphIndex]
        body = self.tree.subgraphs[options.bodySubgraphIndex]
        state: list[Any] = [self._known(t) for t in op.inputs]
        saved, self.ops = self.ops, []  # this loop's operators, kept once it is decided
        blocks = dict(self.blocks)  # and the SPLITs written for it
        try:
            for step in range(MAX_STEPS + 1):
                env = self._run(cond, options.condSubgraphIndex, state, None)
                go = env[cond.outputs[0]]
                if not isinstance(go, np.ndarray):
                    raise _Undecidable("the condition depends on data")
                if not bool(go.reshape(-1)[0]):
                    break
                env = self._run(body, options.bodySubgraphIndex, state, step)
                state = [env[t] for t in body.outputs]
            else:
                raise _Undecidable(f"more than {MAX_STEPS} steps")
            for value in state:
                if isinstance(value, _Rows) and sorted(value.rows) != list(range(value.shape[0])):
                    raise _Undecidable("rows that do not cover their tensor")
        except _Undecidable:
            self.ops, self.blocks = saved, blocks
            raise
        self.ops = saved + self.ops
        for out, value in zip(op.outputs, state, strict=True):
            self.value[out] = value

    def _known(self, t: int) -> Any:
        """What the main graph knows of tensor t: an index array, rows, or the tensor."""
        value = self.value.get(t, t)
        if isinstance(value, np.ndarray | _Rows):
            return value
        if value < 0:
            return None
        array = _index_array(self.main.tensors[int(value)], self.tree)
        return int(value) if array is None else array

    def _run(self, graph: Any, index: int, state: list[Any], step: int | None) -> dict[int, Any]:
        """One pass of a loop's condition (step None: only index computations allowed) or
        body from the loop variables `state`: the values of its tensors (main tensors, index
        arrays, rows), the body's operators written into the main graph."""
        env: dict[int, Any] = {
            t: value if isinstance(value, np.ndarray | _Rows) or value is None else int(value)
            for t, value in zip(graph.inputs, state, strict=True)
        }
        for t, value in list(env.items()):  # a main tensor that is an index constant
            if isinstance(value, int) and value >= 0:
                array = _index_array(self.main.tensors[value], self.tree)
                env[t] = value if array is None else array
        for op in graph.operators:
            code = self.codes[op.opcodeIndex]
            args = [self._local(graph, index, t, env) for t in op.inputs]
            folded = _fold(code, op, args, self.ops_enum)
            if folded is not None:
                env[op.outputs[0]] = folded
                continue
            if step is None:
                raise _Undecidable("a condition that is not a function of the step")
            written = self._row_op(code, graph, op, args, step)
            if written is not None:
                env[op.outputs[0]] = written
                continue
            outputs = [self._copy(graph.tensors[t], step) for t in op.outputs]
            env.update(zip(op.outputs, outputs, strict=True))
            self._write(code, op, [self._readable(a) for a in args], outputs)
        return env

    def _local(self, graph: Any, index: int, t: int, env: dict[int, Any]) -> Any:
        """A subgraph tensor's value: from this pass, else a constant of the subgraph (an
        index array, or one main tensor for all steps)."""
        if t < 0:
            return None
        if t in env:
            return env[t]
        tensor = graph.tensors[t]
        array = _index_array(tensor, self.tree)
        if array is not None:
            return array
        if not _constant_data(tensor, self.tree):
            raise _Undecidable(f"{tensor.name!r} is neither written nor constant")
        key = (index, t)
        if key not in self.shared:
            self.shared[key] = self._add_tensor(_clone(tensor, self.schema, tensor.name))
        return self.shared[key]

    def _row_op(self, code: int, graph: Any, op: Any, args: list[Any], step: int) -> Any:
        """SLICE at a constant place (a block of a SPLIT tree where it reads whole rows, else
        a STRIDED_SLICE: Arm NN has no SLICE), or DYNAMIC_UPDATE_SLICE at a constant row: its
        result (a tensor, rows); None for any other operator."""
        if code == self.ops_enum.SLICE and all(isinstance(a, np.ndarray) for a in args[1:]):
            begin, size = (np.asarray(a).astype(np.int32).reshape(-1) for a in args[1:])
            source = args[0]
            shape = np.asarray(self._shape(source))
            size = np.where(size < 0, shape - begin, size).astype(np.int32)
            whole_row = not begin[1:].any() and size[0] == 1 and list(size[1:]) == list(shape[1:])
            if isinstance(source, _Rows) and whole_row and int(begin[0]) in source.rows:
                return source.rows[int(begin[0])]
            source = self._readable(source)
            block = int(size[0])
            if not begin[1:].any() and list(size[1:]) == list(shape[1:]) and block > 0:
                count, k = int(shape[0]) // block, int(begin[0]) // block
                pieces = self._blocks(source, block, count) if count * block == shape[0] else []
                if pieces and k * block == begin[0]:
                    self.reads[pieces[k]] = (source, tuple(int(b) for b in begin))
                    return pieces[k]
            out = self._copy(graph.tensors[op.outputs[0]], step)
            return self._strided_slice(source, begin, size, out)
        if code != self.ops_enum.DYNAMIC_UPDATE_SLICE or not isinstance(args[2], np.ndarray):
            return None
        operand, update, start = args[0], args[1], np.asarray(args[2]).reshape(-1)
        read_back = isinstance(update, int) and self.reads.get(update) == (operand, tuple(start))
        if isinstance(operand, int) and read_back:
            return operand  # the row just read, written back where it was
        whole, part = self._shape(operand), self._shape(update)
        if start[1:].any() or part[0] != 1 or part[1:] != whole[1:]:
            raise _Undecidable("a write that is not a row")
        rows = operand.rows if isinstance(operand, _Rows) else {}
        return _Rows(tuple(whole), {**rows, int(start[0]): self._readable(update)})

    # --- writing

    def _write(self, code: int, op: Any, inputs: list[int], outputs: list[int]) -> None:
        copy = self.schema.OperatorT()
        for name, value in vars(op).items():
            setattr(copy, name, value)
        copy.inputs, copy.outputs = inputs, outputs
        unbiased = len(inputs) < 3 or inputs[2] < 0
        if code == self.ops_enum.FULLY_CONNECTED and self.biased and unbiased:
            weights = self.main.tensors[inputs[1]]
            if weights.type == self.schema.TensorType.FLOAT32:
                zero = np.zeros(int(weights.shape[0]), np.float32)
                copy.inputs = [*inputs[:2], self._constant(zero, "unrolled/zero_bias")]
        self.ops.append(copy)

    def _strided_slice(self, source: int, begin: np.ndarray, size: np.ndarray, out: int) -> int:
        op = self.schema.OperatorT()
        op.opcodeIndex = self._code(self.ops_enum.STRIDED_SLICE)
        op.inputs = [
            source,
            self._constant(begin.astype(np.int32), "unrolled/begin"),
            self._constant((begin + size).astype(np.int32), "unrolled/end"),
            self._constant(np.ones(len(begin), np.int32), "unrolled/strides"),
        ]
        op.outputs = [out]
        op.builtinOptionsType = self.schema.BuiltinOptions.StridedSliceOptions
        op.builtinOptions = self.schema.StridedSliceOptionsT()
        self.ops.append(op)
        self.reads[out] = (source, tuple(int(b) for b in begin))
        return out

    def _blocks(self, source: int, block: int, count: int) -> list[int]:
        """Main tensor `source` cut on axis 0 into `count` blocks of `block` rows, once for
        all steps: a tree of SPLITs of at most MAX_CONCAT_INPUTS outputs each (a STRIDED_SLICE
        per step would store its bounds per step); [] where `count` has a prime factor above
        that."""
        key = (source, block)
        if key not in self.blocks:
            self.blocks[key] = self._split(source, count) if _factors(count) else []
        return self.blocks[key]

    def _split(self, source: int, count: int) -> list[int]:
        if count == 1:
            return [source]
        ways = next(k for k in range(MAX_CONCAT_INPUTS, 1, -1) if count % k == 0)
        tensor = self.main.tensors[source]
        shape = [int(d) for d in tensor.shape]
        outputs = []
        for _ in range(ways):
            part = self._add_tensor(_clone(tensor, self.schema, tensor.name + b"/block"))
            self.main.tensors[part].shape = [shape[0] // ways, *shape[1:]]
            self.main.tensors[part].shapeSignature = None
            outputs.append(part)
        op = self.schema.OperatorT()
        op.opcodeIndex = self._code(self.ops_enum.SPLIT)
        op.inputs = [self._constant(np.asarray(0, np.int32), "unrolled/axis"), source]
        op.outputs = outputs
        op.builtinOptionsType = self.schema.BuiltinOptions.SplitOptions
        op.builtinOptions = self.schema.SplitOptionsT()
        op.builtinOptions.numSplits = ways
        self.ops.append(op)
        return [piece for part in outputs for piece in self._split(part, count // ways)]

    def _join(self, rows: _Rows) -> int:
        """The rows as one tensor: CONCATENATIONs on axis 0 of at most MAX_CONCAT_INPUTS
        inputs (TFLite Micro's limit) each."""
        if sorted(rows.rows) != list(range(rows.shape[0])):  # read inside the loop, unfinished
            raise _Undecidable("a tensor read before every row is written")
        pieces = [rows.rows[k] for k in range(rows.shape[0])]
        while len(pieces) > 1:
            groups = [
                pieces[i : i + MAX_CONCAT_INPUTS] for i in range(0, len(pieces), MAX_CONCAT_INPUTS)
            ]
            pieces = [g[0] if len(g) == 1 else self._concat(g) for g in groups]
        return pieces[0]

    def _concat(self, inputs: list[int]) -> int:
        first = self.main.tensors[inputs[0]]
        out = self._add_tensor(_clone(first, self.schema, b"unrolled/rows"))
        count = sum(int(self.main.tensors[t].shape[0]) for t in inputs)
        self.main.tensors[out].shape = [count, *[int(d) for d in first.shape[1:]]]
        self.main.tensors[out].shapeSignature = None
        op = self.schema.OperatorT()
        op.opcodeIndex = self._code(self.ops_enum.CONCATENATION)
        op.inputs, op.outputs = list(inputs), [out]
        op.builtinOptionsType = self.schema.BuiltinOptions.ConcatenationOptions
        op.builtinOptions = self.schema.ConcatenationOptionsT()
        self.ops.append(op)
        return out

    def _shape(self, value: Any) -> list[int]:
        if isinstance(value, _Rows | np.ndarray):
            return [int(d) for d in value.shape]
        return [int(d) for d in self.main.tensors[int(value)].shape]

    def _copy(self, tensor: Any, step: int) -> int:
        name = tensor.name + f"/step{step}".encode() if tensor.name else None
        return self._add_tensor(_clone(tensor, self.schema, name))

    def _add_tensor(self, tensor: Any) -> int:
        self.main.tensors.append(tensor)
        return len(self.main.tensors) - 1

    def _constant(self, array: np.ndarray, name: str) -> int:
        """A constant tensor of this value: one for every use of the same value."""
        key = (array.dtype.str, array.shape, array.tobytes())
        if key in self.values:
            return self.values[key]
        buffer = self.schema.BufferT()
        buffer.data = np.frombuffer(np.ascontiguousarray(array).tobytes(), np.uint8)
        self.tree.buffers.append(buffer)
        tensor = self.schema.TensorT()
        tensor.shape = [int(d) for d in array.shape]
        tensor.type = {np.dtype(v): k for k, v in _DTYPES.items()}[array.dtype]
        tensor.buffer = len(self.tree.buffers) - 1
        tensor.name = name.encode()
        self.values[key] = self._add_tensor(tensor)
        return self.values[key]

    def _code(self, builtin: int) -> int:
        return code_index(self.tree, self.codes, self.schema, builtin)

    def _prune(self) -> None:
        """Drop the operators nothing reads (a loop input every step overwrote), the loops'
        subgraphs where none is left, and the tensors nothing uses."""
        needed = {int(t) for t in self.main.outputs}
        kept = []
        for op in reversed(self.main.operators):
            if any(int(t) in needed for t in op.outputs):
                kept.append(op)
                needed.update(int(t) for t in op.inputs if t >= 0)
        kept.reverse()
        self.main.operators = kept
        if all(self.codes[op.opcodeIndex] != self.ops_enum.WHILE for op in kept):
            self.tree.subgraphs = [self.main]
            # the operator codes only the loops used (WHILE, LESS, DYNAMIC_UPDATE_SLICE...)
            used_codes = sorted({op.opcodeIndex for op in kept})
            renumbered = {old: new for new, old in enumerate(used_codes)}
            self.tree.operatorCodes = [self.tree.operatorCodes[c] for c in used_codes]
            for op in kept:
                op.opcodeIndex = renumbered[op.opcodeIndex]
        used = sorted(
            {int(t) for t in self.main.inputs}
            | {int(t) for t in self.main.outputs}
            | {int(t) for op in kept for t in [*op.inputs, *op.outputs] if t >= 0}
        )
        index = {old: new for new, old in enumerate(used)}
        self.main.tensors = [self.main.tensors[t] for t in used]
        for op in kept:
            op.inputs = [index[int(t)] if t >= 0 else -1 for t in op.inputs]
            op.outputs = [index[int(t)] for t in op.outputs]
        self.main.inputs = [index[int(t)] for t in self.main.inputs]
        self.main.outputs = [index[int(t)] for t in self.main.outputs]
        for signature in self.tree.signatureDefs or []:
            for entry in [*signature.inputs, *signature.outputs]:
                entry.tensorIndex = index[int(entry.tensorIndex)]


def code_index(tree: Any, codes: list[int], schema: Any, builtin: int) -> int:
    """The index of the builtin's operator code in the model (`codes`: its builtin per code),
    added where the model has none."""
    if builtin not in codes:
        code = schema.OperatorCodeT()
        code.builtinCode, code.deprecatedBuiltinCode, code.version = builtin, min(builtin, 127), 1
        tree.operatorCodes.append(code)
        codes.append(builtin)
    return codes.index(builtin)


def _factors(count: int) -> bool:
    """Whether `count` is a product of factors up to MAX_CONCAT_INPUTS."""
    for k in range(MAX_CONCAT_INPUTS, 1, -1):
        while count % k == 0:
            count //= k
    return count == 1


def _constant_data(tensor: Any, tree: Any) -> bool:
    data = tree.buffers[tensor.buffer].data if tensor.buffer else None
    return data is not None and len(data) > 0


def _index_array(tensor: Any, tree: Any) -> np.ndarray | None:
    """A small integer or bool constant (a step, an index, a shape) as an array; None for
    anything else (weights, float constants: shared, not folded)."""
    if tensor.type not in _INDEX_TYPES or not _constant_data(tensor, tree):
        return None
    shape = [int(d) for d in tensor.shape] if tensor.shape is not None else []
    if int(np.prod(shape)) > 16:
        return None
    data = bytes(tree.buffers[tensor.buffer].data)
    return np.frombuffer(data, _DTYPES[tensor.type]).reshape(shape)


def _clone(tensor: Any, schema: Any, name: Any) -> Any:
    copy = schema.TensorT()
    for key, value in vars(tensor).items():
        setattr(copy, key, value)
    copy.name = name
    return copy


def _fold(code: int, op: Any, args: list[Any], ops: Any) -> np.ndarray | None:
    """The op's output where it is an index computation (integer and bool constants in,
    see `_index_array`); else None."""
    if not args or not all(isinstance(a, np.ndarray) and a.dtype.kind in "iub" for a in args):
        return None
    options = op.builtinOptions
    if getattr(options, "fusedActivationFunction", 0):
        return None
    binary = {
        ops.ADD: np.add,
        ops.SUB: np.subtract,
        ops.MUL: np.multiply,
        ops.LESS: np.less,
        ops.LESS_EQUAL: np.less_equal,
        ops.GREATER: np.greater,
        ops.GREATER_EQUAL: np.greater_equal,
        ops.EQUAL: np.equal,
        ops.NOT_EQUAL: np.not_equal,
        ops.MINIMUM: np.minimum,
        ops.MAXIMUM: np.maximum,
        ops.LOGICAL_AND: np.logical_and,
        ops.LOGICAL_OR: np.logical_or,
    }
    if code in binary and len(args) == 2:
        result = np.asarray(binary[code](args[0], args[1]))
        return result if result.dtype == np.bool_ else result.astype(args[0].dtype)
    if code == ops.PACK:
        return np.stack(args, axis=int(options.axis))
    if code == ops.RESHAPE and len(args) == 2:
        return args[0].reshape([int(d) for d in args[1].reshape(-1)])
    return None
