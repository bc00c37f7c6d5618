"""ONNX LSTM and GRU through onnx2tf at any sequence length, as each runtime can run them.

onnx2tf 1.28.8's own LSTM and GRU converters fail (a segfault on torch's exports, a Reshape
or Split error on the bare ops), and unrolling them in ONNX (onnx.unroll_recurrent) does not
scale: a 3-layer LSTM of 256 over 160 steps unrolls to 10,597 nodes, which onnx2tf converts
for far more than 15 minutes. While onnx2tf runs, `sequence_layers(target, mode)` replaces
both converters; a node becomes

- the runtime's own sequence operator where it has one: an LSTM as a tf_keras (Keras 2) LSTM
  layer carrying the ONNX weights, which TensorFlow's TFLite converter fuses (the layer is
  tagged `lstm_<id>` for that purpose; Keras 3's is not, and becomes a WHILE loop) into
  UNIDIRECTIONAL_SEQUENCE_LSTM (its cell_clip of 10 removed: `unclip_sequence_lstm`).
  LiteRT and TFLite Micro run it (TfliteRuntime.sequence_lstm: the modes in which each does
  it right);
  only Y and Y_h: an LSTM whose Y_c is read, or with peepholes, takes a route below;
- else (every TFLite-family target) the node as a loop over its steps, one WHILE per
  direction whose body is one step (edgeflow.frameworks.tf_recurrent.looped): every GRU
  (TFLite has no GRU operator, and TFLite Micro hangs on the WHILE loop TensorFlow writes
  for a Keras GRU: its TensorList ops), LSTMs whose Y_c is read or with peepholes, LSTMs in
  int8 on tflite (LiteRT's int8 UNIDIRECTIONAL_SEQUENCE_LSTM computes stacked layers wrong:
  relative error 1.05 on two layers of 16 over 20 steps, where TFLite Micro's, on the same
  file, is 0.005), bidirectional ones in int8 on tflite_micro (in int8 the loops stay
  float32: _tflite_quant.loop_nodes), and every LSTM on armnn. For a runtime with no WHILE
  (armnn: Arm NN 22's parser has no recurrent operator and takes one subgraph) the
  converted file's loops are then unrolled in the file (edgeflow.targets._tflite_unroll),
  each weight stored once;
- else (16x8: TensorFlow's 16x8 quantizer cannot calibrate a WHILE) the node unrolled per
  time step in TensorFlow (edgeflow.frameworks.tf_recurrent.unrolled), each weight stored
  once.

Measured (onnx2tf + converter CPU, float32 against onnxruntime, 2026-12): a Conv1d + 3-layer
LSTM of 256 over 160 steps + Linear as layers, 9 s, relative error 1.3e-6, the .tflite 1.00x
the ONNX file; looped and unrolled, see frameworks.tf_recurrent. What no form expresses is
refused with the reason (onnx2tf then fails with it): sequence_lens, clip, input_forget,
activations other than the defaults.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from edgeflow.frameworks.tf_recurrent import Recurrent, looped, unrolled
from edgeflow.rules.onnx.recurrent import DEFAULT_ACTIVATIONS
from edgeflow.targets._tflite_deps import require
from edgeflow.targets.registry import tflite_runtime

SEQUENCE_OP, LOOP, UNROLLED = "sequence op", "loop", "unrolled"  # the routes a node takes


class Unsupported(ValueError):
    """An LSTM or GRU node neither form can express (onnx2tf reports it as its error)."""


@contextlib.contextmanager
def sequence_layers(target: str, mode: str, sixteen: bool = False) -> Iterator[dict[str, str]]:
    """While onnx2tf converts for `target` in quantization `mode`, its LSTM and GRU
    converters are ours (see the module docstring). Yields the route each node took, by
    node name: SEQUENCE_OP, LOOP or UNROLLED. `sixteen` (int8 with int16 activations): no
    loops, unrolled instead: TensorFlow's 16x8 quantizer cannot calibrate a WHILE ("Max and
    min for dynamic tensors should be recorded during calibration")."""
    modules: dict[str, Any] = {
        op: importlib.import_module(f"onnx2tf.ops.{op}") for op in ("LSTM", "GRU")
    }
    saved = {op: m.make_node for op, m in modules.items()}
    # TfliteRuntime.sequence_lstm: the modes in which the target's runtime runs
    # UNIDIRECTIONAL_SEQUENCE_LSTM right (see the module docstring); elsewhere a node is a
    # loop (unrolled in the file where the runtime runs no WHILE: _tflite_unroll), or
    # unrolled in TensorFlow for 16x8. A runtime that rejects a FULLY_CONNECTED without a
    # bias (Arm NN 22) gets one.
    runtime = tflite_runtime(target)
    layer = mode in runtime.sequence_lstm
    routes: dict[str, str] = {}
    for module in modules.values():
        module.make_node = functools.partial(
            _make_node,
            layer=layer,
            loop=not sixteen,
            int8=mode == "int8",
            biased=not runtime.fully_connected_without_bias,
            routes=routes,
        )
    try:
        yield routes
    finally:
        for op, module in modules.items():
            module.make_node = saved[op]


def has_sequence_ops(onnx_path: Path) -> bool:
    """Whether the model file holds an LSTM or GRU node (in its main graph)."""
    import onnx

    return holds_sequence_ops(onnx.load(str(onnx_path), load_external_data=False))


def holds_sequence_ops(model: Any) -> bool:
    """Whether the ModelProto holds an LSTM or GRU node (in its main graph): its conversion
    then depends on the target and mode (see the module docstring)."""
    return any(n.op_type in ("LSTM", "GRU") for n in model.graph.node)


def float_from_saved_model(out: Path, mode: str, per_channel: bool) -> None:
    """Write the float-activation files (model_float32.tflite, and that of an fp16 or
    int8_weights build: _tflite_weights) in `out` from the SavedModel in `out`, where an LSTM
    took the SEQUENCE_OP route. onnx2tf converts float from a concrete function of its Keras
    model, in which the converter does not fuse the tf_keras LSTM (measured: a WHILE loop,
    which TFLite Micro hangs on); from a SavedModel of that model, as onnx2tf makes its int8
    file, it does. TFLite builtins only (none of edgeflow's runtimes has Select TF ops)."""
    import tensorflow as tf

    from edgeflow.targets import _tflite_weights

    converter = tf.lite.TFLiteConverter.from_saved_model(str(out))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    _tflite_weights.write(converter, tf, out, mode, per_channel)


def unclip_sequence_lstm(artifact: Path) -> int:
    """Set the cell_clip of every UNIDIRECTIONAL_SEQUENCE_LSTM in the .tflite to 0 (no clip);
    returns how many it changed. TensorFlow's converter writes cell_clip 10.0 into every LSTM
    it fuses from a Keras layer, which an ONNX LSTM does not have: measured on BeatNet's
    trained 2-layer LSTM over 400 frames, whose cell state passes 10, the fused artifact was
    off by 0.13 of the output range (30.7 dB) in LiteRT and TFLite Micro alike, where the
    same model unrolled was within 5.5e-7. The field is written in place (a float32 in the
    operator's options table)."""
    import struct

    schema = require("ai_edge_litert.schema_py_generated", "tflite")
    data = bytearray(artifact.read_bytes())
    model = schema.Model.GetRootAs(data, 0)
    codes = [
        max(model.OperatorCodes(i).BuiltinCode(), model.OperatorCodes(i).DeprecatedBuiltinCode())
        for i in range(model.OperatorCodesLength())
    ]
    changed = 0
    for g in range(model.SubgraphsLength()):
        graph = model.Subgraphs(g)
        for i in range(graph.OperatorsLength()):
            op = graph.Operators(i)
            table = op.BuiltinOptions()
            lstm = schema.BuiltinOperator.UNIDIRECTIONAL_SEQUENCE_LSTM
            if codes[op.OpcodeIndex()] != lstm or table is None:
                continue
            options = schema.UnidirectionalSequenceLSTMOptions()
            options.Init(table.Bytes, table.Pos)
            field = options._tab.Offset(6)  # cell_clip (absent: its default, 0)
            if field and options.CellClip() != 0.0:
                struct.pack_into("<f", data, options._tab.Pos + field, 0.0)
                changed += 1
    if changed:
        artifact.write_bytes(bytes(data))
    return changed


def _make_node(
    *,
    graph_node: Any,
    tf_layers_dict: dict[str, Any],
    layer: bool,
    loop: bool,
    int8: bool,
    biased: bool,
    routes: dict[str, str],
    **kwargs: Any,
) -> None:
    """One ONNX LSTM or GRU node, its outputs Y, Y_h and Y_c in their ONNX shapes and layout:
    as tf_keras LSTM layers (one per direction) where `layer` allows and the node's final
    cell state and peepholes are unused (in int8: and it runs forward only: TFLite Micro's
    int8 kernel, fed by REVERSE_V2, gave relative error 0.28 on a bidirectional LSTM of 16
    over 12 steps, unrolled 0.026), else looped where `loop` allows, else unrolled
    (edgeflow.frameworks.tf_recurrent)."""
    op, inputs, attrs = graph_node.op, graph_node.inputs, graph_node.attrs
    w, r, b = (_constant(inputs, i) for i in range(1, 4))
    if w is None or r is None:
        raise Unsupported(f"{op} node '{graph_node.name}': W and R must be constants")
    _check(graph_node, inputs, attrs)
    peepholes = _constant(inputs, 7) if op == "LSTM" else None
    direction = attrs.get("direction", "forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    backwards = (False, True) if direction == "bidirectional" else (direction == "reverse",)
    lbr = bool(int(attrs.get("linear_before_reset", 0)))
    node = Recurrent(op, w, r, b, peepholes, backwards, lbr, biased)
    layout = int(attrs.get("layout", 0))
    x = _tensor(inputs[0], tf_layers_dict)
    states = [_state(inputs, i, tf_layers_dict) for i in (5, 6)]
    cell_read = op == "LSTM" and _used(graph_node.outputs[2:3], kwargs.get("onnx_graph"))
    plain = peepholes is None or not peepholes.any()
    forward = not any(backwards) or not int8
    if layer and op == "LSTM" and not cell_read and plain and forward:
        results = _layers(node, x, states, layout)
        routes[graph_node.name] = SEQUENCE_OP
    else:
        results = _steps(node, x, states, layout, loop)
        routes[graph_node.name] = LOOP if loop else UNROLLED
    for out, tensor in zip(graph_node.outputs, results, strict=False):
        if out.name and tensor is not None:
            tf_layers_dict[out.name] = {
                "optype": op,
                "shape": out.shape,
                "dtype": out.dtype,
                "tf_node": tensor,
                # in the ONNX node's own layout: the ops after it read its axes as they are
                "before_op_output_shape_trans": False,
            }


def _layers(node: Recurrent, x: Any, states: list[Any], layout: int) -> list[Any]:
    """Y and Y_h of an LSTM node as tf_keras LSTM layers, which TensorFlow's converter fuses
    into UNIDIRECTIONAL_SEQUENCE_LSTM."""
    import tensorflow as tf
    import tf_keras

    batch_major = [1, 0, 2]  # [T, B, F] <-> [B, T, F]
    x = tf.transpose(x, batch_major) if layout == 0 else x
    states = [tf.constant(s) if isinstance(s, np.ndarray) else s for s in states]
    per_direction = [_directions(s, layout, len(node.backwards)) for s in states]
    outs = []
    for d, back in enumerate(node.backwards):
        layer = tf_keras.layers.LSTM(node.hidden, return_sequences=True, go_backwards=back)
        initial = None
        if any(s is not None for s in per_direction):  # the layer takes both states or none
            given = next(s[d] for s in per_direction if s is not None)
            initial = [tf.zeros_like(given) if s is None else s[d] for s in per_direction]
        y = layer(x, initial_state=initial)
        layer.set_weights(keras_weights(node.w, node.r, node.b, d))
        # the final hidden state is the last step processed (the converter fuses the layer
        # only where its states are not asked for)
        outs.append((tf.reverse(y, [1]) if back else y, y[:, -1]))
    y = tf.stack([o[0] for o in outs], axis=2)  # [B, T, D, H]
    y = tf.transpose(y, [1, 2, 0, 3]) if layout == 0 else y  # [T, D, B, H]
    final = tf.stack([o[1] for o in outs], axis=0)  # Y_h: [D, B, H]
    final = tf.transpose(final, batch_major) if layout == 1 else final  # [B, D, H]
    return [y, final]


def _steps(node: Recurrent, x: Any, states: list[Any], layout: int, loop: bool) -> list[Any]:
    """Y, Y_h (and an LSTM's Y_c) of the node looped over its steps (`loop`) or unrolled,
    each from its own (identity) layer: onnx2tf names an output's layer after the ONNX
    output, and three outputs of one layer got the keys y2, y2_1, y2_2 in the SavedModel's
    signature, which no longer say which output is which."""
    import tensorflow as tf

    tensors = [s for s in states if _is_tensor(s)]
    layer = _steps_layer(node, layout, states, looped if loop else unrolled)
    return [tf.identity(t) for t in layer([x, *tensors])]


def _steps_layer(node: Recurrent, layout: int, states: list[Any], form: Any) -> Any:
    """A tf_keras layer that computes the node in `form` (looped or unrolled): called on
    [X, the initial states that are tensors], it returns [Y, Y_h, Y_c] in the node's layout
    (Y_c None for a GRU); constant states (numpy arrays) are its own constants. One layer,
    not one per op, for onnx2tf's Keras model of thousands of steps' ops."""
    import tensorflow as tf
    import tf_keras

    class Steps(tf_keras.layers.Layer):
        def call(self, inputs: list[Any]) -> list[Any]:
            return compute(list(inputs))

    # a tf.function: traced once, when onnx2tf builds its Keras model, and called as that
    # graph again when the model is traced for conversion (else every step's ops are built
    # twice in Python: PLCMOS unrolled for armnn, 14 s and 17 s)
    @tf.function(autograph=False)
    def compute(inputs: list[Any]) -> list[Any]:
        x, rest = inputs[0], list(inputs[1:])
        x = tf.transpose(x, [1, 0, 2]) if layout == 1 else x  # time-major [T, B, F]
        given = [
            s if s is None or not isinstance(s, np.ndarray) else tf.constant(s)
            for s in (rest.pop(0) if _is_tensor(s) else s for s in states)
        ]
        y, y_h, y_c = form(node, x, *(_directions(s, layout, len(node.backwards)) for s in given))
        if layout == 1:  # Y [B, T, D, H], Y_h and Y_c [B, D, H]
            y = tf.transpose(y, [2, 0, 1, 3])
            y_h = tf.transpose(y_h, [1, 0, 2])
            y_c = None if y_c is None else tf.transpose(y_c, [1, 0, 2])
        return [y, y_h] if y_c is None else [y, y_h, y_c]

    return Steps()


def _used(outputs: list[Any], model: Any) -> bool:
    """Whether any of these node outputs is read: by a node, or as a graph output."""
    names = {o.name for o in model.graph.output} if model is not None else set()
    return any(o.name and (o.outputs or o.name in names) for o in outputs)


def _check(node: Any, inputs: list[Any], attrs: dict[str, Any]) -> None:
    op = node.op
    given = {i for i, v in enumerate(inputs) if getattr(v, "name", "")}
    problems = []
    if 4 in given:
        problems.append("sequence_lens")
    if attrs.get("clip") is not None:
        problems.append("clip")
    if int(attrs.get("input_forget", 0)):
        problems.append("input_forget")
    activations = [a.decode() if isinstance(a, bytes) else a for a in attrs.get("activations", [])]
    per_direction = DEFAULT_ACTIVATIONS[op]
    if activations and any(
        a.lower() != per_direction[i % len(per_direction)].lower()
        for i, a in enumerate(activations)
    ):
        problems.append(f"activations {activations}")
    if problems:
        raise Unsupported(
            f"{op} node '{node.name}': {', '.join(problems)} (edgeflow converts neither "
            "the sequence operator nor its steps with them)"
        )


def keras_weights(w: Any, r: Any, b: Any, d: int) -> list[np.ndarray]:
    """Direction d of ONNX LSTM weights W [D, 4H, F], R [D, 4H, H], B [D, 8H] as the tf_keras
    layer's [kernel, recurrent_kernel, bias]: gates ONNX i, o, f, c; Keras i, f, c, o; the two
    biases summed."""
    hidden = r.shape[-1]
    b = np.zeros((w.shape[0], 8 * hidden), np.float32) if b is None else b
    order = np.concatenate([np.arange(0, hidden), np.arange(2 * hidden, 4 * hidden)])
    order = np.concatenate([order, np.arange(hidden, 2 * hidden)])
    return [w[d][order].T, r[d][order].T, (b[d][: 4 * hidden] + b[d][4 * hidden :])[order]]


def _constant(inputs: list[Any], i: int) -> np.ndarray | None:
    import onnx_graphsurgeon as gs

    if i >= len(inputs) or not inputs[i].name or not isinstance(inputs[i], gs.Constant):
        return None
    return np.asarray(inputs[i].values, np.float32)


def _tensor(value: Any, tf_layers_dict: dict[str, Any]) -> Any:
    """A non-constant input as TensorFlow has it, in the ONNX node's layout: onnx2tf feeds a
    3-D graph input channel-last ([A, B, C] as [A, C, B]), which is turned back."""
    import tensorflow as tf

    tensor = tf_layers_dict[value.name]["tf_node"]
    want = [d if isinstance(d, int) else None for d in (value.shape or [])]
    have = list(tensor.shape)
    if len(want) == 3 and have != want and [have[0], have[2], have[1]] == want:
        return tf.transpose(tensor, [0, 2, 1])
    return tensor


def _state(inputs: list[Any], i: int, tf_layers_dict: dict[str, Any]) -> Any:
    """initial_h (5) or initial_c (6) as the node has it ([D, B, H], or [B, D, H] in layout
    1): a tensor, a numpy array where constant, None where absent or zero."""
    if i >= len(inputs) or not inputs[i].name:
        return None
    value = _constant(inputs, i)
    if value is None:
        return _tensor(inputs[i], tf_layers_dict)
    return value if np.any(value) else None


def _is_tensor(state: Any) -> bool:
    return state is not None and not isinstance(state, np.ndarray)


def _directions(state: Any, layout: int, directions: int) -> list[Any] | None:
    """A state [D, B, H] (layout 0) or [B, D, H] (layout 1) as [B, H] per direction."""
    import tensorflow as tf

    if state is None:
        return None
    if layout == 1:
        state = tf.transpose(state, [1, 0, 2])
    return list(tf.unstack(state, num=directions, axis=0))
