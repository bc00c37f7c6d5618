"""Keras' GRU and LSTM layers, and the masks that reach them, written with the ops of
edgeflow's recurrent loop (frameworks.tf_recurrent) while the canonical SavedModel is traced.

TensorFlow writes a Keras recurrent layer as a WHILE loop of TensorList ops, and a Masking
layer as NOT_EQUAL and REDUCE_ANY of bool tensors: LiteRT runs that, TFLite Micro does not
(it has no GATHER for TensorListGetItem; measured on sleepecg's classifier, two masked
bidirectional GRUs). Under `as_loops()` a GRU or LSTM layer computes its steps as the loop
that onnx2tf's recurrent converter writes for an ONNX GRU or LSTM (one WHILE per layer, the
input projection of all steps one FULLY_CONNECTED before it, a step one FULLY_CONNECTED of
the state and the gate equations), the Keras mask a float loop input beside it. Keras ops
with bool kernels TFLite Micro lacks are written with ones it has: not_equal (a Masking
layer's mask) as EQUAL cast to float < 0.5, any as REDUCE_MAX of the values as floats > 0, and
flip (how Bidirectional turns its backward layer's outputs back into time order) as a
STRIDED_SLICE of stride -1, where TensorFlow writes REVERSE_V2. Each is exact: tf_load checks the
canonical SavedModel against the Keras model it came from on every build.

A layer the loop cannot express keeps Keras' own implementation: activations other than
tanh and sigmoid, a time axis or batch without a static size, dropout in training.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

# Keras' LSTM gates (i, f, c, o) in the ONNX order the loop reads (i, o, f, c)
_LSTM_ORDER = (0, 3, 1, 2)


@contextlib.contextmanager
def as_loops() -> Iterator[None]:
    """While the block runs (tracing a Keras model), its GRU and LSTM layers and Keras'
    flip, not_equal and any (the TensorFlow backend's) compute as the module docstring says."""
    from keras.src.backend.tensorflow import numpy as tf_numpy
    from keras.src.layers import GRU, LSTM

    saved = [
        (GRU, "inner_loop", GRU.inner_loop),
        (LSTM, "inner_loop", LSTM.inner_loop),
        *((tf_numpy, name, getattr(tf_numpy, name)) for name in ("flip", "not_equal", "any")),
    ]
    GRU.inner_loop = _inner_loop(GRU.inner_loop)
    LSTM.inner_loop = _inner_loop(LSTM.inner_loop)
    tf_numpy.flip = _flip
    tf_numpy.not_equal = _not_equal(tf_numpy.equal)
    tf_numpy.any = _any
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def replaceable(model: Any) -> bool:
    """Whether the Keras model holds a GRU or LSTM layer (at any depth) that `as_loops`
    writes as a loop."""
    from keras.src.layers import GRU, LSTM

    layers = model._flatten_layers(include_self=False, recursive=True)
    return any(isinstance(x, GRU | LSTM) and recurrent(x) is not None for x in layers)


def _inner_loop(keras_own: Any) -> Any:
    def inner_loop(
        layer: Any, sequences: Any, initial_state: Any, mask: Any, training: bool = False
    ) -> Any:
        node = recurrent(layer)
        steps, batch = sequences.shape[1], sequences.shape[0]
        if node is None or steps is None or batch is None or (training and layer.dropout):
            return keras_own(layer, sequences, initial_state, mask, training)
        return _run(layer, node, sequences, initial_state, mask)

    return inner_loop


def recurrent(layer: Any) -> Any:
    """A Keras GRU or LSTM layer's weights as the loop's `Recurrent` (ONNX layout), or None
    where its activations are not the ones the loop computes."""
    import tensorflow as tf
    from keras import activations

    from edgeflow.frameworks.tf_recurrent import Recurrent

    def value(variable: Any) -> np.ndarray:
        with tf.init_scope():  # eagerly, out of the function being traced
            return np.asarray(variable.numpy(), np.float32)

    cell = layer.cell
    if cell.activation is not activations.tanh or (
        cell.recurrent_activation is not activations.sigmoid
    ):
        return None
    hidden = int(cell.units)
    kernel = value(cell.kernel)  # [F, G*H]
    recurrent_kernel = value(cell.recurrent_kernel)  # [H, G*H]
    gru = type(layer).__name__ == "GRU"
    gates = 3 if gru else 4
    bias = np.zeros(2 * gates * hidden, np.float32)  # [Wb, Rb], ONNX's B
    if cell.use_bias:
        given = value(cell.bias).reshape(-1)
        bias[: given.size] = given  # GRU reset_after: [input bias, recurrent bias]
    if not gru:  # i, f, c, o -> i, o, f, c
        order = [g * hidden + k for g in _LSTM_ORDER for k in range(hidden)]
        kernel, recurrent_kernel = kernel[:, order], recurrent_kernel[:, order]
        bias[: 4 * hidden] = bias[: 4 * hidden][order]
    return Recurrent(
        op="GRU" if gru else "LSTM",
        w=kernel.T[None],
        r=recurrent_kernel.T[None],
        b=bias[None],
        p=None,
        backwards=(bool(layer.go_backwards),),
        linear_before_reset=gru and bool(cell.reset_after),
        biased=False,
    )


def _run(layer: Any, node: Any, sequences: Any, initial_state: Any, mask: Any) -> Any:
    """(last output, outputs, states), as Keras' RNN.inner_loop returns them."""
    import tensorflow as tf

    from edgeflow.frameworks.tf_recurrent import Cell, direction_loop

    states = list(initial_state) if isinstance(initial_state, list | tuple) else [initial_state]
    if isinstance(mask, list | tuple):
        mask = mask[0]
    steps, batch = int(sequences.shape[1]), int(sequences.shape[0])
    x = tf.transpose(sequences, [1, 0, 2])  # [T, B, F]
    projected = Cell(node, 0).projection(tf.reshape(x, [steps * batch, -1]))
    steps_mask = None
    if mask is not None:  # [B, T] bool -> [T, B, 1] float
        steps_mask = tf.transpose(tf.cast(mask, tf.float32))[:, :, None]
    y, h, c = direction_loop(
        node,
        0,
        projected,
        steps,
        [tf.convert_to_tensor(s) for s in states],
        mask=steps_mask,
        zero_output=bool(layer.zero_output_for_mask),
        processing_order=True,
    )
    outputs = tf.transpose(y, [1, 0, 2])  # [B, T, H], in the order the steps ran
    last = outputs[:, -1]
    if not layer.return_sequences:
        outputs = last[:, None]
    return last, outputs, [h] if c is None else [h, c]


def _not_equal(equal: Any) -> Any:
    def not_equal(x1: Any, x2: Any) -> Any:
        """x1 != x2 as EQUAL cast to 0/1 floats, < 0.5 (Keras' own operand promotion): the
        converter fuses LOGICAL_NOT of EQUAL into NOT_EQUAL, which no probe measures."""
        import tensorflow as tf

        return tf.cast(equal(x1, x2), tf.float32) < 0.5

    return not_equal


def _any(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """np.any as REDUCE_MAX of the values as 0/1 floats, > 0 (an empty reduction is -inf:
    False, as np.any)."""
    import tensorflow as tf

    x = tf.convert_to_tensor(x)
    truth = x if x.dtype == tf.bool else tf.not_equal(x, tf.zeros_like(x))
    return tf.reduce_max(tf.cast(truth, tf.float32), axis=axis, keepdims=keepdims) > 0


def _flip(x: Any, axis: Any = None) -> Any:
    """np.flip as a STRIDED_SLICE of stride -1 on each axis (all where axis is None)."""
    import tensorflow as tf

    x = tf.convert_to_tensor(x)
    rank = x.shape.rank
    axes = range(rank) if axis is None else [axis] if isinstance(axis, int) else axis
    flipped = {a % rank for a in axes}
    index = tuple(slice(None, None, -1) if a in flipped else slice(None) for a in range(rank))
    return x[index]
