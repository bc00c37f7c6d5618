"""The int8 DIV trap of the TFLite runtimes, and the division kept float that avoids it.

A divisor computed in the graph is an int8 tensor whose range includes 0 (TFLite's
asymmetric ranges always do), so a divisor below half a step of its grid rounds to its zero
point. LiteRT's int8 DIV then stops the run ("tflite/kernels/div.cc:262 data[i] !=
zero_point was not true ... DIV failed to invoke"); TFLite Micro's divides by it unchecked
(its check is a debug-build DCHECK: 0.5 / 0.001 came back as -89.9, -0.5 / 0.001 as +22.7);
Arm NN's computes 0 / 0 as NaN and aborts the process quantizing it (TypesUtils.cpp:37,
`!std::isnan(value)`). A Reciprocal becomes the same DIV (of 1); Pow(x, -1), a POW that
int8 computes wrong (SQNR 0.1 dB). Measured 2026-12 on h / (mean(relu(h)) + 1e-5) with silent
(all-zero) frames among the inputs (tests/targets/test_tflite_div.py): the DIV float, and
the operators that compute its divisor float back to the one that keeps it off zero (the
ADD of the eps), int8 everywhere else, verifies at 34.8 dB in LiteRT and TFLite Micro and
34.1 dB in Arm NN (per-tensor weights); the DIV alone float divides the silent frames' 0 by
the int8 divisor's 0 (-6.3 dB).
A reciprocal's MUL stays float too: 1 / d has no bound where d nears 0. Used by the ONNX
path (_onnx2tf.outputs) and the native one (_tf_native.convert) alike.
"""

from __future__ import annotations

from edgeflow.targets._tflite_graph import TfliteGraph, TfliteOp, tflite_graph

# What edgeflow's int8 calibration is for, where the int8 file had such a DIV (the error's words)
WHY = "a DIV by a divisor computed in the graph"
# Operators through which a divisor's value passes element by element (or reshaped): the walk
# up from a DIV goes on through them. Any other operator (the ADD of an eps, a MAXIMUM with
# one, a MEAN) computes the divisor's value: it is kept float, and the walk stops there.
PASS_THROUGH = (
    "ABS",
    "BROADCAST_TO",
    "EXP",
    "EXPAND_DIMS",
    "LOGISTIC",
    "MUL",
    "NEG",
    "RELU",
    "RELU6",
    "RESHAPE",
    "SQRT",
    "SQUARE",
    "SQUEEZE",
    "TANH",
    "TRANSPOSE",
)
LONGEST = 8  # operators kept float for one divisor, at most


def float_divisions(model: bytes) -> list[str]:
    """The output tensor names of what an int8 build keeps float in a float .tflite (onnx2tf's
    float32 file, or it calibrated): every DIV of the main subgraph whose divisor is a float32
    tensor computed in the graph, the operators computing that divisor (up through
    PASS_THROUGH operators to the first other one) and, for a reciprocal, the MULs by it."""
    return divisions_kept(tflite_graph(model, "tflite"))


def divisions_kept(graph: TfliteGraph) -> list[str]:
    """float_divisions of a .tflite already read."""
    found = _Divisions(graph)
    kept = [
        o for op in found.divisions("FLOAT32") for o in (op, *found.chain(op), *found.scaled(op))
    ]
    names = [graph.written_name(o.outputs[0]) for o in kept]
    return list(dict.fromkeys(names))


def trapped(model: bytes) -> int:
    """How many DIVs of an int8 .tflite's main subgraph divide by an int8 tensor computed in
    the graph."""
    return trapped_in(tflite_graph(model, "tflite"))


def trapped_in(graph: TfliteGraph) -> int:
    """trapped, of a .tflite already read."""
    return len(_Divisions(graph).divisions("INT8"))


class _Divisions:
    """A .tflite's main subgraph, with who writes each tensor."""

    def __init__(self, graph: TfliteGraph) -> None:
        self.graph = graph
        self.writer = {t: op for op in graph.ops for t in op.outputs if t >= 0}

    def computed(self, tensor: int) -> bool:
        return tensor in self.writer or tensor in self.graph.inputs

    def divisions(self, dtype: str) -> list[TfliteOp]:
        """The DIVs whose divisor (second input) is computed and of this type."""
        return [
            op
            for op in self.graph.ops
            if op.name == "DIV"
            and self.computed(op.inputs[1])
            and self.graph.types[op.inputs[1]] == dtype
        ]

    def chain(self, op: TfliteOp) -> list[TfliteOp]:
        """The operators that compute the DIV's divisor, nearest first (see PASS_THROUGH)."""
        found: list[TfliteOp] = []
        tensor = op.inputs[1]
        while tensor in self.writer and len(found) < LONGEST:
            producer = self.writer[tensor]
            found.append(producer)
            live = [t for t in producer.inputs if self.computed(t)]
            if producer.name not in PASS_THROUGH or len(live) != 1:
                break
            tensor = live[0]
        return found

    def scaled(self, op: TfliteOp) -> list[TfliteOp]:
        """Where the DIV is a reciprocal (1 / d: a constant numerator), the MULs that read
        it: 1 / d has no bound where d nears 0, and x * (1 / d) has one again."""
        if self.computed(op.inputs[0]):
            return []
        return [o for o in self.graph.ops if o.name == "MUL" and op.outputs[0] in o.inputs]
