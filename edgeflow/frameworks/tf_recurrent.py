"""ONNX LSTM and GRU as TensorFlow ops with each weight stored once: looped over the time
steps (`looped`, one WHILE per direction) or unrolled per step (`unrolled`).

Where a runtime has no sequence operator for a recurrent node (TFLite has no GRU; Arm NN 22's
parser has no recurrent operator and no WHILE; LiteRT's int8 UNIDIRECTIONAL_SEQUENCE_LSTM is
wrong on stacked layers), onnx2tf's converter for the node writes these ops instead
(`_onnx2tf_recurrent`: looped, or unrolled in 16x8, whose quantizer cannot calibrate a
WHILE); a Keras GRU or LSTM layer takes the loop too (`_keras_recurrent`). TensorFlow's
TFLite converter maps them one to one:

- the input projection of all steps is one FULLY_CONNECTED over [steps * batch, features],
  with every bias it can take; unrolled, it is split per step (and per gate for a GRU) by a
  tree of SPLITs (`split`); looped, a step reads its rows with SLICE;
- each step: one FULLY_CONNECTED of the state (two for a GRU with linear_before_reset=0) and
  the gate equations (LOGISTIC, TANH, MUL, ADD, SUB); unrolled, a zero initial state skips
  the first step's recurrent terms, and every step's FULLY_CONNECTED reads the same weight
  buffer;
- Y, Y_h and Y_c are CONCATENATIONs of the steps' states (`stack`; looped, Y is written a
  row per step by DYNAMIC_UPDATE_SLICE), in the ONNX shapes of either layout.

Unrolled, only ops that LiteRT, TFLite Micro and Arm NN 22 all run: for armnn every
FULLY_CONNECTED has a bias (Arm NN rejects one without: a zero bias is written as 2^-126,
which TensorFlow keeps; `Recurrent.biased`), no CONCATENATION of more than 10 inputs
(TFLite Micro's limit), no PACK (see `stack`), no FULLY_CONNECTED of a 3-D input (Arm NN 22
rejects its keep_num_dims shape).

Measured (onnx2tf and TensorFlow's converter CPU, float32 against onnxruntime, 2026-12,
benchmarks/recurrent.py): a 2-layer GRU of 256 over 200 steps converts looped in 5.5 s
(unrolled 18.9 s), weights 1.00x the source's, relative error 6.9e-7 (LiteRT), 3.1e-7
(TFLite Micro, and Arm NN unrolled).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# the ONNX ops' gate blocks, and TFLite Micro's CONCATENATION input limit, as the ONNX unroll
# rule has them
from edgeflow.core.recurrent import GATES, MAX_CONCAT_INPUTS


@dataclass(frozen=True)
class Recurrent:
    """One ONNX LSTM or GRU node's constants, in its own layout (W [D, G*H, F], R [D, G*H, H],
    B [D, 2*G*H] or None, LSTM peepholes P [D, 3H] or None)."""

    op: str
    w: np.ndarray
    r: np.ndarray
    b: np.ndarray | None
    p: np.ndarray | None
    backwards: tuple[bool, ...]  # per direction: whether it runs from the last step
    linear_before_reset: bool = False  # GRU
    # every FULLY_CONNECTED with a bias (Arm NN 22 rejects one without); elsewhere a zero
    # bias is left out, which in int8 saves each step a bias tensor and its scales
    biased: bool = True

    @property
    def hidden(self) -> int:
        return int(self.r.shape[-1])


def unrolled(
    node: Recurrent, x: Any, initial_h: list[Any] | None, initial_c: list[Any] | None
) -> tuple[Any, Any, Any]:
    """Y [T, D, B, H], Y_h [D, B, H] and Y_c [D, B, H] (Y_c None for a GRU) of a time-major
    input x [T, B, F]; the initial states per direction as [B, H] tensors, None for zero."""
    import tensorflow as tf

    steps = int(x.shape[0])
    flat = tf.reshape(x, [-1, int(x.shape[-1])])  # [T * B, F], a 2-D FULLY_CONNECTED input
    ys, last_h, last_c = [], [], []
    for d, backwards in enumerate(node.backwards):
        cell = Cell(node, d)
        h = initial_h[d] if initial_h else None
        c = initial_c[d] if initial_c else None
        inputs = cell.inputs(flat, steps)
        states: list[Any] = [None] * steps
        for t in reversed(range(steps)) if backwards else range(steps):
            h, c = cell.step([part[t] for part in inputs], h, c)
            states[t] = h
        ys.append(stack(states, axis=0))  # [T, B, H]
        last_h.append(h)
        last_c.append(c)
    return _joined(node, ys, last_h, last_c)


def looped(
    node: Recurrent, x: Any, initial_h: list[Any] | None, initial_c: list[Any] | None
) -> tuple[Any, Any, Any]:
    """As `unrolled`, each direction as one loop over the steps (tf.while_loop, which the
    converter writes as a WHILE operator whose body is one step): the ops stay as few as at
    one step whatever the length (for Arm NN, which runs no WHILE, the file's loops are then
    unrolled: targets._tflite_unroll).

    The input projection of all steps is one FULLY_CONNECTED before the loop; the loop carries
    the step, the states, the projection X [T * B, G*H] and Y [T, B, H]. A step reads its
    rows of X with SLICE and writes its state into Y with DYNAMIC_UPDATE_SLICE (each
    O(B * H), not a copy of the sequence). It also writes its rows of X back in place:
    TensorFlow's calibrator (every int8 build) segfaults on a WHILE whose body returns a loop
    input unchanged, and X otherwise is one. The weights are constants of the body, created
    in it (an outer tensor would be another loop input passed through)."""
    import tensorflow as tf

    steps, batch = int(x.shape[0]), int(x.shape[1])
    flat = tf.reshape(x, [-1, int(x.shape[-1])])  # [T * B, F]
    zeros = tf.zeros([batch, node.hidden])
    ys, last_h, last_c = [], [], []
    for d in range(len(node.backwards)):
        projected = Cell(node, d).projection(flat)
        states = [initial_h[d] if initial_h else zeros]
        if node.op == "LSTM":
            states.append(initial_c[d] if initial_c else zeros)
        y, h, c = direction_loop(node, d, projected, steps, states)
        ys.append(y)
        last_h.append(h)
        last_c.append(c)
    return _joined(node, ys, last_h, last_c)


def _joined(
    node: Recurrent, ys: list[Any], last_h: list[Any], last_c: list[Any]
) -> tuple[Any, Any, Any]:
    """Y [T, D, B, H], Y_h [D, B, H] and Y_c (None for a GRU) of the directions' Y [T, B, H]
    and final states."""
    y_c = stack(last_c, axis=0) if node.op == "LSTM" else None
    return stack(ys, axis=1), stack(last_h, axis=0), y_c


def direction_loop(
    node: Recurrent,
    d: int,
    projected: Any,
    steps: int,
    states: list[Any],
    mask: Any = None,
    zero_output: bool = True,
    processing_order: bool = False,
) -> tuple[Any, Any, Any]:
    """Direction d as one tf.while_loop over the input projection [T * B, G*H] of `steps`
    steps, from the initial states ([h] or [h, c]): Y [T, B, H], the final h and c (None for
    a GRU). The projection stays 2-D, a step's rows read at t * B: reshaped to 3-D after its
    FULLY_CONNECTED, the converter fuses the two into a FULLY_CONNECTED with keep_num_dims,
    whose shape Arm NN 22 rejects.

    With a `mask` [T, B, 1] (float 1 for a step that counts, 0 for one that does not: Keras'
    masking), a masked step keeps the states, and its output is 0 (`zero_output`) or the
    previous step's output, as Keras' RNN layers compute it (each select written as
    m * new + (1 - m) * old, exact for m in {0, 1}, with the ops every target runs). Y's rows
    are in time order, or with `processing_order` in the order the steps run (a backwards
    direction's reversed, as Keras' go_backwards layers return it)."""
    import tensorflow as tf
    from tensorflow.compiler.tf2xla.python import xla

    batch, width = int(projected.shape[0]) // steps, int(projected.shape[1])
    lstm, backwards = node.op == "LSTM", node.backwards[d]
    masked, previous = mask is not None, mask is not None and not zero_output

    def body(i: Any, *carried: Any) -> list[Any]:
        h, c = carried[0], carried[1] if lstm else None
        out = carried[2 if lstm else 1] if previous else None
        xs, ms = (carried[-3], carried[-2]) if masked else (carried[-2], None)
        y = carried[-1]
        cell = Cell(node, d)  # the step's constants, in the body's graph
        t = steps - 1 - i if backwards else i
        at, rows = tf.stack([t, 0, 0]), tf.stack([t * batch, 0])
        row = tf.slice(xs, rows, [batch, width])
        xs = xla.dynamic_update_slice(xs, row, rows)
        new_h, new_c = cell.step(cell.parts(row), h, c)
        result = new_h
        if masked:
            m = tf.slice(ms, at, [1, batch, 1])
            ms = xla.dynamic_update_slice(ms, m, at)  # in place, as xs
            m = tf.reshape(m, [batch, 1])
            kept = 1.0 - m
            new_h, result = m * new_h + kept * h, m * new_h
            new_c = m * new_c + kept * c if lstm else None
            if previous:
                out = result = result + kept * out
        written = tf.stack([i, 0, 0]) if processing_order and backwards else at
        y = xla.dynamic_update_slice(y, tf.expand_dims(result, 0), written)
        states = [new_h, *([new_c] if lstm else []), *([out] if previous else [])]
        return [i + 1, *states, xs, *([ms] if masked else []), y]

    # Y starts as any [T, B, H] tensor, each row is overwritten: a zero constant would be
    # stored in the file, as large as a layer's weights
    carried = [*states, *([tf.zeros_like(states[0])] if previous else [])]
    # the mask its own loop input, read a row per step as X is (joined to X, an int8 build
    # would give the two one scale, outside the loop)
    masks = [mask] if masked else []
    y = tf.reshape(projected[:, : node.hidden], [steps, batch, node.hidden])
    start = [tf.constant(0), *carried, projected, *masks, y]
    done = tf.while_loop(lambda i, *_: i < steps, body, start)
    return done[-1], done[1], done[2] if lstm else None


def stack(tensors: list[Any], axis: int) -> Any:
    """tf.stack written as CONCATENATIONs of at most MAX_CONCAT_INPUTS inputs (TFLite Micro's
    limit): Arm NN 22 computes an int8 PACK of states with their own scales wrong (relative
    error 1.36 on a GRU of 16 over 12 steps, where LiteRT's is 0.06, and its heap is
    corrupted: "free(): invalid next size"). On axis 0 the tensors are joined as they are and
    one RESHAPE adds the axis; on another axis each is reshaped with the new axis first."""
    import tensorflow as tf

    pieces = tensors if axis == 0 else [tf.expand_dims(t, axis) for t in tensors]
    while len(pieces) > MAX_CONCAT_INPUTS:
        pieces = [
            tf.concat(pieces[i : i + MAX_CONCAT_INPUTS], axis)
            for i in range(0, len(pieces), MAX_CONCAT_INPUTS)
        ]
    out = pieces[0] if len(pieces) == 1 else tf.concat(pieces, axis)
    if axis == 0:  # [n * d0, ...] -> [n, d0, ...]
        out = tf.reshape(out, [len(tensors), *(int(d) for d in tensors[0].shape)])
    return out


def split(tensor: Any, count: int) -> list[Any]:
    """tf.split(tensor, count) on axis 0, written as a tree of SPLITs of at most
    MAX_CONCAT_INPUTS outputs each (a count with no divisor up to that cut in two first by
    STRIDED_SLICE). TensorFlow's MLIR quantizer names every output of a SPLIT by all of its
    outputs' names joined: one SPLIT of 400 steps gave 800 tensor names of 11.5 KB, 9.2 MB of
    a 2-layer LSTM of 150's int8 file whose weights are 0.4 MB."""
    import tensorflow as tf

    if count <= MAX_CONCAT_INPUTS:
        return tf.split(tensor, count, axis=0) if count > 1 else [tensor]
    width = int(tensor.shape[0]) // count  # rows per part
    ways = max((k for k in range(2, MAX_CONCAT_INPUTS + 1) if count % k == 0), default=0)
    if ways == 0:  # e.g. 127 steps: 120 + 7
        head = count - count % MAX_CONCAT_INPUTS
        return split(tensor[: head * width], head) + split(tensor[head * width :], count - head)
    return [
        part for group in tf.split(tensor, ways, axis=0) for part in split(group, count // ways)
    ]


def kept_bias(bias: np.ndarray) -> np.ndarray:
    """A bias TensorFlow's converter keeps: 2^-126 where it is all zero (see the docstring)."""
    if bias.any():
        return bias.astype(np.float32)
    return np.full(bias.shape, np.finfo(np.float32).tiny, np.float32)


def _bias(bias: np.ndarray, biased: bool) -> Any:
    """The bias as a constant; None for a zero one that need not be kept."""
    import tensorflow as tf

    if not biased and not bias.any():
        return None
    return tf.constant(kept_bias(bias))


def _linear(x: Any, w: Any, b: Any) -> Any:
    """x w^T (+ b): one FULLY_CONNECTED, its weights [out, in] as TFLite stores them."""
    import tensorflow as tf

    y = tf.matmul(x, w, transpose_b=True)
    return y if b is None else tf.nn.bias_add(y, b)


class Cell:
    """One direction's constants (each a single TensorFlow constant, read by every step) and
    the ops of one step."""

    def __init__(self, node: Recurrent, d: int) -> None:
        import tensorflow as tf

        self.op, hidden = node.op, node.hidden
        gates = GATES[node.op]
        bias = node.b[d] if node.b is not None else np.zeros(2 * gates * hidden, np.float32)
        wb, rb = bias[: gates * hidden], bias[gates * hidden :]
        w, r = node.w[d], node.r[d]
        # the recurrent bias joins the input projection's, except a GRU's candidate bias
        # under linear_before_reset (r (.) (h R_h^T + Rb_h)), which stays with the state's FC
        lbr = node.op == "GRU" and node.linear_before_reset
        moved = rb.copy()
        # without armnn's biases, Rb_h is added after the FC instead (one ADD per step, no
        # bias tensor per step in int8)
        self.rb_h_after = None
        if lbr and not node.biased and rb[2 * hidden :].any():
            self.rb_h_after = tf.constant(rb[2 * hidden :].astype(np.float32))
        if lbr:
            moved[2 * hidden :] = 0
        kept = rb - moved
        if self.rb_h_after is not None:
            kept[2 * hidden :] = 0
        self.w = tf.constant(w)
        self.wb = _bias(wb + moved, node.biased)
        self.lbr = lbr
        if node.op == "GRU" and not lbr:  # (r (.) h) R_h^T: the candidate's FC reads r (.) h
            self.r = tf.constant(r[: 2 * hidden])
            self.rb = _bias(np.zeros(2 * hidden, np.float32), node.biased)
            self.r_h = tf.constant(r[2 * hidden :])
            self.rb_h = _bias(np.zeros(hidden, np.float32), node.biased)
        else:
            self.r = tf.constant(r)
            self.rb = _bias(kept, node.biased)
        self.rb_candidate = rb[2 * hidden :] if lbr else None  # for a zero state's first step
        peep = node.p[d] if node.p is not None else None
        self.p = None if peep is None or not peep.any() else tf.split(tf.constant(peep), 3)

    def projection(self, flat: Any) -> Any:
        """The input projection of every step: [T * B, G * H] of the input [T * B, F]."""
        return _linear(flat, self.w, self.wb)

    def parts(self, projected: Any) -> list[Any]:
        """A projection's parts as a step reads them: the whole gate vector for an LSTM; z, r
        and h for a GRU."""
        import tensorflow as tf

        return tf.split(projected, 3, axis=1) if self.op == "GRU" else [projected]

    def inputs(self, flat: Any, steps: int) -> list[list[Any]]:
        """Per part (see `parts`), a list of [B, part's width] tensors, one per step."""
        return [split(part, steps) for part in self.parts(self.projection(flat))]

    def step(self, x: list[Any], h: Any, c: Any) -> tuple[Any, Any]:
        if self.op == "LSTM":
            return self._lstm(x[0], h, c)
        return self._gru(x, h), None

    def _recurrent(self, h: Any, r: Any, rb: Any) -> Any:
        return _linear(h, r, rb)

    def _lstm(self, x: Any, h: Any, c: Any) -> tuple[Any, Any]:
        import tensorflow as tf

        gates = x if h is None else x + self._recurrent(h, self.r, self.rb)
        i, o, f, g = tf.split(gates, 4, axis=1)
        if self.p is not None and c is not None:  # P: i, o, f
            i, f = i + self.p[0] * c, f + self.p[2] * c
        new_c = tf.sigmoid(i) * tf.tanh(g)
        if c is not None:
            new_c = tf.sigmoid(f) * c + new_c
        if self.p is not None:
            o = o + self.p[1] * new_c
        return tf.sigmoid(o) * tf.tanh(new_c), new_c

    def _gru(self, x: list[Any], h: Any) -> Any:
        import tensorflow as tf

        xz, xr, xh = x
        if h is None:  # a zero state: h R^T vanishes; H = (1 - z) (.) h~ = h~ - z (.) h~
            z, r = tf.sigmoid(xz), tf.sigmoid(xr)
            if self.rb_candidate is not None and self.rb_candidate.any():
                xh = xh + r * tf.constant(self.rb_candidate)
            candidate = tf.tanh(xh)
            return candidate - z * candidate
        if self.lbr:  # r (.) (h R_h^T + Rb_h)
            hz, hr, hh = tf.split(self._recurrent(h, self.r, self.rb), 3, axis=1)
            hh = hh if self.rb_h_after is None else hh + self.rb_h_after
            z, r = tf.sigmoid(xz + hz), tf.sigmoid(xr + hr)
            candidate = tf.tanh(xh + r * hh)
        else:  # (r (.) h) R_h^T + Rb_h (Rb_h moved into the input projection's bias)
            hz, hr = tf.split(self._recurrent(h, self.r, self.rb), 2, axis=1)
            z, r = tf.sigmoid(xz + hz), tf.sigmoid(xr + hr)
            candidate = tf.tanh(xh + self._recurrent(r * h, self.r_h, self.rb_h))
        # H = (1 - z) (.) h~ + z (.) h = h~ + z (.) (h - h~)
        return candidate + z * (h - candidate)
