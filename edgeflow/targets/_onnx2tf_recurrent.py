"""ONNX LSTM through onnx2tf as the runtime's own sequence operator, at any length.

onnx2tf 1.28.8's LSTM and GRU converters fail (a segfault on torch's exports, a Reshape or
Split error on the bare ops), and unrolling them (onnx.unroll_recurrent) does not scale: a
3-layer LSTM of 256 over 160 steps unrolls to 10,597 nodes, which onnx2tf converts for far
more than 15 minutes. While onnx2tf runs, `sequence_layers(target)` replaces its LSTM and
GRU converters: an LSTM becomes a tf_keras (Keras 2) LSTM layer carrying the ONNX weights,
which TensorFlow's TFLite converter fuses (the layer is tagged `lstm_<id>` for that purpose;
Keras 3's LSTM is not, and becomes a WHILE loop) into UNIDIRECTIONAL_SEQUENCE_LSTM, which
LiteRT and TFLite Micro run. A GRU is refused with the reason: TFLite has no GRU operator,
and the WHILE loop TensorFlow writes for a tf_keras GRU hangs TFLite Micro and crashes the
int8 calibrator (measured 2026-12; LiteRT runs it in float32). So:

- tflite, tflite_micro: LSTM as a layer; GRU refused, and unrolled (the profiles' default);
- armnn: neither: Arm NN 22's TfLite parser has no recurrent operator and no WHILE, so both
  are unrolled (its profile's default).

Measured (onnx2tf + converter CPU, float32 against onnxruntime): a Conv1d + 3-layer LSTM of
256 over 160 steps + Linear, 9 s, relative error 1.3e-6, the .tflite 1.00x the ONNX file.
What the layers do not express is refused with the reason (onnx2tf then fails, and the
precheck's rule for the op, onnx.unroll_recurrent, applies): sequence_lens, peepholes, clip,
input_forget, activations other than the defaults.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

# The targets whose runtime runs each op's layer form (see the module docstring).
LAYERS = {"tflite": ("LSTM",), "tflite_micro": ("LSTM",)}
DEFAULT_ACTIVATIONS = ["Sigmoid", "Tanh", "Tanh"]  # per direction


class Unsupported(ValueError):
    """An LSTM or GRU node the layer form cannot express (onnx2tf reports it as its error)."""


@contextlib.contextmanager
def sequence_layers(target: str) -> Iterator[None]:
    """While onnx2tf converts for `target`, its LSTM and GRU converters build tf_keras layers
    (the ops of LAYERS[target]); the others are refused with the reason."""
    modules: dict[str, Any] = {
        op: importlib.import_module(f"onnx2tf.ops.{op}") for op in ("LSTM", "GRU")
    }
    saved = {op: m.make_node for op, m in modules.items()}
    for op, module in modules.items():
        module.make_node = _make_node if op in LAYERS.get(target, ()) else _refuse(op, target)
    try:
        yield
    finally:
        for op, module in modules.items():
            module.make_node = saved[op]


def has_sequence_ops(onnx_path: Path) -> bool:
    """Whether the model holds an LSTM or GRU node (in its main graph)."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    return any(n.op_type in ("LSTM", "GRU") for n in model.graph.node)


def float_from_saved_model(out: Path, names: list[str], fp16: bool) -> None:
    """Write onnx2tf's float files (`names` in `out`) again from the SavedModel it wrote
    there. onnx2tf converts float from a concrete function of its Keras model, in which the
    converter does not fuse the tf_keras LSTM (measured: a WHILE loop, which TFLite Micro
    hangs on); from the SavedModel, as onnx2tf makes its int8 file, it does. TFLite builtins
    only (none of edgeflow's runtimes has Select TF ops)."""
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_saved_model(str(out))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    (out / names[0]).write_bytes(converter.convert())
    if fp16 and len(names) > 1:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
        (out / names[1]).write_bytes(converter.convert())


def _refuse(op: str, target: str) -> Any:
    def make_node(*, graph_node: Any, tf_layers_dict: dict[str, Any], **kwargs: Any) -> None:
        raise Unsupported(
            f"{op} node '{graph_node.name}': the {target} runtime has no operator for a "
            f"whole {op} sequence; onnx.unroll_recurrent writes it per time step"
        )

    return make_node


def _make_node(*, graph_node: Any, tf_layers_dict: dict[str, Any], **kwargs: Any) -> None:
    """One ONNX LSTM node as tf_keras layers (one per direction); its outputs Y and Y_h in
    their ONNX shapes and layout (Y_c, which the sequence operator does not output, is
    refused where it is read)."""
    import tensorflow as tf
    import tf_keras

    op, inputs, attrs = graph_node.op, graph_node.inputs, graph_node.attrs
    weights = [_constant(inputs, i) for i in range(4)]
    w, r, b = weights[1], weights[2], weights[3]
    if w is None or r is None:
        raise Unsupported(f"{op} node '{graph_node.name}': W and R must be constants")
    _check(graph_node, inputs, attrs)
    if _used(graph_node.outputs[2:3], kwargs.get("onnx_graph")):
        raise Unsupported(
            f"LSTM node '{graph_node.name}': its final cell state Y_c is used, which the "
            "sequence operator does not output (TensorFlow's converter then writes a loop)"
        )
    layout, hidden = int(attrs.get("layout", 0)), r.shape[-1]
    batch_major = [1, 0, 2]  # [T, B, F] <-> [B, T, F]
    x = _tensor(inputs[0], tf_layers_dict)
    x = tf.transpose(x, batch_major) if layout == 0 else x
    direction = attrs.get("direction", "forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    backwards = [False, True] if direction == "bidirectional" else [direction == "reverse"]
    states = [_state(inputs, i, layout, len(backwards), tf_layers_dict) for i in (5, 6)]
    outs = []
    for d, back in enumerate(backwards):
        layer = tf_keras.layers.LSTM(hidden, return_sequences=True, go_backwards=back)
        initial = None
        if any(s is not None for s in states):  # the layer takes both states or none
            given = next(s[d] for s in states if s is not None)
            initial = [tf.zeros_like(given) if s is None else s[d] for s in states]
        y = layer(x, initial_state=initial)
        layer.set_weights(keras_weights(w, r, b, d))
        # the final hidden state is the last step processed (the converter fuses the layer
        # only where its states are not asked for)
        outs.append((tf.reverse(y, [1]) if back else y, y[:, -1]))
    y = tf.stack([o[0] for o in outs], axis=2)  # [B, T, D, H]
    y = tf.transpose(y, [1, 2, 0, 3]) if layout == 0 else y  # [T, D, B, H]
    final = tf.stack([o[1] for o in outs], axis=0)  # Y_h: [D, B, H]
    final = tf.transpose(final, batch_major) if layout == 1 else final  # [B, D, H]
    for out, tensor in zip(graph_node.outputs[:2], [y, final], strict=False):
        if out.name:
            tf_layers_dict[out.name] = {
                "optype": op,
                "shape": out.shape,
                "dtype": out.dtype,
                "tf_node": tensor,
                # in the ONNX node's own layout: the ops after it read its axes as they are
                "before_op_output_shape_trans": False,
            }


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
    if 7 in given and op == "LSTM":
        problems.append("peepholes")
    if attrs.get("clip") is not None:
        problems.append("clip")
    if int(attrs.get("input_forget", 0)):
        problems.append("input_forget")
    activations = [a.decode() if isinstance(a, bytes) else a for a in attrs.get("activations", [])]
    per_direction = DEFAULT_ACTIVATIONS
    if activations and any(
        a.lower() != per_direction[i % len(per_direction)].lower()
        for i, a in enumerate(activations)
    ):
        problems.append(f"activations {activations}")
    if problems:
        raise Unsupported(
            f"{op} node '{node.name}': {', '.join(problems)} (no tf_keras layer has them)"
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


def _state(
    inputs: list[Any], i: int, layout: int, directions: int, tf_layers_dict: dict[str, Any]
) -> Any:
    """initial_h (5) or initial_c (6) per direction, [B, H] each; None where absent or zero."""
    import tensorflow as tf

    if i >= len(inputs) or not inputs[i].name:
        return None
    value = _constant(inputs, i)
    if value is not None:
        if not np.any(value):
            return None
        state = tf.constant(value)
    else:
        state = _tensor(inputs[i], tf_layers_dict)
    if layout == 1:  # [B, D, H]
        state = tf.transpose(state, [1, 0, 2])
    return tf.unstack(state, num=directions, axis=0)
