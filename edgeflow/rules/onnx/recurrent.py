"""onnx.unroll_recurrent: LSTM and GRU as an explicit cell per time step (static sequence).

Each step is the ONNX operator's own equations in ops every edge runtime has: Gemm (the input
projection with both biases), MatMul (the recurrent projection), Add, Sigmoid, Tanh, Mul, Sub,
on [batch, hidden] tensors; Slice and Reshape take a step's input, Concat and Reshape assemble
Y, Y_h and Y_c in their ONNX shapes (either layout). Exact in float: the same products, summed
in another order (at most 3.9e-7 from onnxruntime's LSTM/GRU kernels on hidden 16 over 8
steps). The step inputs are read from before torch's batch_first Transpose: onnx2tf 1.28.8
converted that Transpose followed by a Reshape wrongly (relative error 1.0).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from edgeflow.core.onnxgraph import is_zero
from edgeflow.core.recurrent import GATES, MAX_CONCAT_INPUTS
from edgeflow.rules.base import RewriteContext, RuleOptions, RuleResult, Site
from edgeflow.rules.fixes import Fix
from edgeflow.rules.onnx._build import attr
from edgeflow.rules.onnx._edit import Edit, NodeRule

if TYPE_CHECKING:
    import numpy as np
    import onnx

# The activations each op's equations name, in the attribute's order (per direction).
DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"]}


class UnrollRecurrent(NodeRule):
    """Exact in float (the same sums in another order, within 1e-5 of onnxruntime). For a
    static sequence length and batch, each time step becomes the op's equations on [batch,
    hidden] tensors: Gemm(x_t, W_g^T, Wb_g + Rb_g) + MatMul(h, R_g^T) per gate, Sigmoid/Tanh,
    Mul, Add (GRU's linear_before_reset too; LSTM peepholes). Directions forward, reverse and
    bidirectional; initial_h / initial_c inputs (a zero state, as torch exports it through
    Expand, skips the recurrent terms of the first step); all of Y, Y_h, Y_c in their ONNX
    shapes, layout 0 or 1. Every step reads the same weight initializers. Keeps nodes with
    sequence_lens, clip, input_forget or non-default activations. For a runtime without
    LSTM/GRU kernels that takes an ONNX graph. No target's default: the TFLite-family
    targets convert LSTM and GRU themselves, as the runtime's sequence operator or unrolled
    in TensorFlow (targets/_onnx2tf_recurrent.py): onnx2tf converts this rule's graph slowly
    (a 3-layer LSTM of 256 over 160 steps unrolls to 10,597 nodes, which it converts for
    far more than 15 minutes; the target converts the LSTM in 9 s)."""

    name = "onnx.unroll_recurrent"
    description = "Unroll LSTM/GRU over a static sequence into per-step MatMul/Sigmoid/Tanh math."
    fixes = (Fix.op("LSTM"), Fix.op("GRU"), Fix.check("LSTM", "no_final_cell_state"))

    class Options(RuleOptions):
        """max_steps: the longest sequence to unroll (the graph grows by a cell per step)."""

        max_steps: int = 256

    example: ClassVar[tuple[str, str] | None] = (
        "Y, Y_h, Y_c = LSTM(x[8, 1, 8], W, R, B, hidden_size=16)",
        "h1 = Sigmoid(Gemm(x0, Wo^T, bo)) * Tanh(c1); ...; Y = Reshape(Concat(h1..h8), Y's shape)",
    )

    def tolerance(self, opts: Any) -> float | None:
        return 1e-5

    op_types = frozenset({"LSTM", "GRU"})
    what = "recurrent layer"

    def replace(self, e: Edit, node: Any, opts: Options) -> str | None:
        return _unroll(node, e, opts.max_steps)

    def apply(
        self, model: onnx.ModelProto, opts: Any, ctx: RewriteContext
    ) -> RuleResult[onnx.ModelProto]:
        from edgeflow.rules.onnx.fold_if import _remove_dead_code

        result = super().apply(model, opts, ctx)
        if result.changed:  # torch's zero initial state (Shape, Gather, Expand) is unread now
            removed = _remove_dead_code(result.model)
            if removed:
                result.sites.append(Site.changed("", f"removed {removed} nodes left unused"))
        return result


def _kept(node: Any, e: Edit, max_steps: int) -> str:
    """Why a node cannot be unrolled, or ''."""
    op = node.op_type
    inputs = [*node.input, *[""] * 8]
    if any(e.folded(name) is None for name in inputs[1:4] if name):
        return "W, R or B is not computed from constants only"
    if inputs[4]:
        return "sequence_lens given (per-sequence lengths are not unrolled)"
    if attr(node, "clip", None) is not None:
        return "clip is set"
    if op == "LSTM" and int(attr(node, "input_forget", 0)):
        return "input_forget=1"
    directions = 2 if attr(node, "direction", "forward") == "bidirectional" else 1
    wanted = DEFAULT_ACTIVATIONS[op] * directions
    given = [str(a) for a in attr(node, "activations", [])]
    if given and [a.lower() for a in given] != [a.lower() for a in wanted]:
        return f"activations {given} (only the defaults unroll)"
    if attr(node, "activation_alpha", None) or attr(node, "activation_beta", None):
        return "activation_alpha/beta set"
    shape = e.shape(node.input[0])
    if shape is None or len(shape) != 3:
        return "the input shape is not static"
    steps = shape[1] if int(attr(node, "layout", 0)) else shape[0]
    if steps > max_steps:
        return f"{steps} steps (more than max_steps {max_steps})"
    return ""


def _unroll(node: Any, e: Edit, max_steps: int) -> str | None:
    import numpy as np

    why = _kept(node, e, max_steps)
    if why:
        return why
    op = node.op_type
    layout = int(attr(node, "layout", 0))
    direction = attr(node, "direction", "forward")
    inputs = [*node.input, *[""] * 8]
    outputs = [*node.output, "", ""]
    w, r = e.constants[inputs[1]], e.constants[inputs[2]]
    dirs, rows, size = w.shape[0], w.shape[1], w.shape[2]
    hidden = rows // GATES[op]
    bias = e.constants[inputs[3]] if inputs[3] else np.zeros((dirs, 2 * rows), w.dtype)
    shape = e.shape(node.input[0])
    assert shape is not None  # checked by _kept
    steps, batch = (shape[1], shape[0]) if layout else (shape[0], shape[1])
    x, major = node.input[0], layout  # major: x is batch-major ([batch, steps, size])
    producer = e.producers.get(x)
    swap = producer is not None and producer.op_type == "Transpose"
    if producer is not None and swap and not layout and attr(producer, "perm", []) == [1, 0, 2]:
        x, major = producer.input[0], 1  # torch's batch_first Transpose: read its input
    # step inputs [batch, size]: rows of x viewed [steps * batch, size] (sequence-major), or
    # columns of x viewed [batch, steps * size] (batch-major)
    flat = e.reshape(x, [batch, steps * size] if major else [steps * batch, size])
    xs = [
        e.slice(flat, 1, t * size, (t + 1) * size)
        if major
        else e.slice(flat, 0, t * batch, (t + 1) * batch)
        for t in range(steps)
    ]
    peep = e.constants.get(inputs[7]) if op == "LSTM" and inputs[7] else None
    if op == "LSTM" and inputs[7] and peep is None:
        return "the peepholes P are not a constant"
    ys: list[list[str]] = [[] for _ in range(steps)]  # [t][d]
    last_h, last_c = [], []
    for d in range(dirs):
        reverse = direction == "reverse" or d == 1
        cell = _Cell(e, op, w[d], r[d], bias[d], hidden, peep[d] if peep is not None else None)
        h = _state(e, inputs[5], d, dirs, batch, hidden, layout)
        c = _state(e, inputs[6], d, dirs, batch, hidden, layout) if op == "LSTM" else None
        for t in reversed(range(steps)) if reverse else range(steps):
            h, c = cell.step(xs[t], h, c, int(attr(node, "linear_before_reset", 0)))
            ys[t].append(h)
        last_h.append(h)
        last_c.append(c)
    # Y: [steps, dirs, batch, hidden] (layout 0) or [batch, steps, dirs, hidden] (layout 1)
    axis = 1 if layout else 0
    if outputs[0]:
        pieces = [h for t in range(steps) for h in ys[t]]
        full = [batch, steps, dirs, hidden] if layout else [steps, dirs, batch, hidden]
        e.reshape(_concat(e, pieces, axis), full, out=outputs[0])
    for out, states in ((outputs[1], last_h), (outputs[2], last_c)):
        if out:
            full = [batch, dirs, hidden] if layout else [dirs, batch, hidden]
            e.reshape(_concat(e, [s for s in states if s], axis), full, out=out)
    return None


def _concat(e: Edit, pieces: list[str], axis: int) -> str:
    """Concat of the pieces, nested so that no Concat takes more than MAX_CONCAT_INPUTS."""
    while len(pieces) > MAX_CONCAT_INPUTS:
        groups = [
            pieces[i : i + MAX_CONCAT_INPUTS] for i in range(0, len(pieces), MAX_CONCAT_INPUTS)
        ]
        pieces = [g[0] if len(g) == 1 else e.op("Concat", *g, axis=axis) for g in groups]
    return pieces[0] if len(pieces) == 1 else e.op("Concat", *pieces, axis=axis)


def _state(
    e: Edit, name: str, d: int, dirs: int, batch: int, hidden: int, layout: int
) -> str | None:
    """Direction d's initial state as [batch, hidden], or None for a zero state."""
    if not name or _is_zero(e, name):
        return None
    x = e.slice(name, 1 if layout else 0, d, d + 1) if dirs > 1 else name
    return e.reshape(x, [batch, hidden])


def _is_zero(e: Edit, name: str) -> bool:
    """A zero tensor by construction (torch's export of a zero initial state)."""
    return is_zero(name, e.constants, e.producers)


class _Cell:
    """One direction's weights, split per gate, and the nodes of one step."""

    def __init__(
        self,
        e: Edit,
        op: str,
        w: np.ndarray,
        r: np.ndarray,
        b: np.ndarray,
        hidden: int,
        peep: np.ndarray | None,
    ) -> None:
        import numpy as np

        self.e, self.op, self.hidden = e, op, hidden
        n = GATES[op]
        wb, rb = b[: n * hidden], b[n * hidden :]
        block = [slice(g * hidden, (g + 1) * hidden) for g in range(n)]
        self.w = [np.ascontiguousarray(w[s].T) for s in block]  # [size, hidden]
        self.r = [e.array(np.ascontiguousarray(r[s].T), "R") for s in block]  # [hidden, hidden]
        self.wb, self.rb = [wb[s] for s in block], [rb[s] for s in block]
        self.peep = (
            [e.array(peep[g * hidden : (g + 1) * hidden], "P") for g in range(3)]
            if (peep is not None and peep.any())
            else None
        )

    def gate(self, x: str, h: str | None, g: int, recurrent_bias: bool = True) -> str:
        """x W_g^T + (Wb_g + Rb_g) + h R_g^T, the recurrent term skipped for a zero h."""
        bias = self.wb[g] + self.rb[g] if recurrent_bias else self.wb[g]
        y = self.e.gemm(x, self.w[g], bias)
        return y if h is None else self.e.op("Add", y, self.e.op("MatMul", h, self.r[g]))

    def step(self, x: str, h: str | None, c: str | None, linear_before_reset: int) -> Any:
        if self.op == "LSTM":
            return self._lstm(x, h, c)
        return self._gru(x, h, linear_before_reset), None

    def _lstm(self, x: str, h: str | None, c: str | None) -> tuple[str, str]:
        e, p = self.e, self.peep
        i, o, f, g = (self.gate(x, h, k) for k in range(4))
        if p is not None and c is not None:  # P: i, o, f
            i = e.op("Add", i, e.op("Mul", p[0], c))
            f = e.op("Add", f, e.op("Mul", p[2], c))
        it, ct = e.op("Sigmoid", i), e.op("Tanh", g)
        new_c = e.op("Mul", it, ct)
        if c is not None:
            new_c = e.op("Add", e.op("Mul", e.op("Sigmoid", f), c), new_c)
        if p is not None:
            o = e.op("Add", o, e.op("Mul", p[1], new_c))
        return e.op("Mul", e.op("Sigmoid", o), e.op("Tanh", new_c)), new_c

    def _gru(self, x: str, h: str | None, linear_before_reset: int) -> str:
        import numpy as np

        e = self.e
        z, r = (e.op("Sigmoid", self.gate(x, h, k)) for k in range(2))
        if h is None:  # a zero state: r (.) h and h R_h^T vanish; H = (1 - z) (.) h~
            rb = self.rb[2]
            if linear_before_reset:  # r (.) (0 R^T + Rb_h)
                hh = e.op("Add", e.gemm(x, self.w[2], self.wb[2]), e.op("Mul", r, e.array(rb)))
            else:  # 0 R^T + Rb_h
                hh = e.gemm(x, self.w[2], self.wb[2] + rb)
            candidate = e.op("Tanh", hh)
            one = e.array(np.ones(1, self.w[2].dtype), "one")
            return e.op("Mul", e.op("Sub", one, z), candidate)
        xh = e.gemm(x, self.w[2], self.wb[2])
        if linear_before_reset:  # r (.) (h R_h^T + Rb_h)
            rec = e.op("Add", e.op("MatMul", h, self.r[2]), e.array(self.rb[2], "Rb"))
            hh = e.op("Add", xh, e.op("Mul", r, rec))
        else:  # (r (.) h) R_h^T + Rb_h
            rec = e.op("MatMul", e.op("Mul", r, h), self.r[2])
            hh = e.op("Add", xh, e.op("Add", rec, e.array(self.rb[2], "Rb")))
        candidate = e.op("Tanh", hh)
        # H = (1 - z) (.) h~ + z (.) h = h~ + z (.) (h - h~)
        return e.op("Add", candidate, e.op("Mul", z, e.op("Sub", h, candidate)))
