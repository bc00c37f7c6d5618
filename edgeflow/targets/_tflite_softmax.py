"""TFLite Micro's int8 SOFTMAX trap, and the softmax kept float that avoids it.

TFLite Micro runs an int8 SOFTMAX with the reference kernel, which accumulates exp(x - max)
over the axis in fixed point and aborts the process when that sum needs more than 8 integer
bits (`TFLITE_CHECK(0 <= exponent && exponent <= 31)` in softmax.h): so from 256 values on,
whenever enough of them score near the top one. Measured 2026-12 (a Dense layer on 32 random
inputs, then Softmax, full int8): 700 classes ran, 720 and more aborted (SIGABRT, no
message); LiteRT's int8 SOFTMAX (a lookup table) runs them all. An int8 build for
tflite_micro keeps such a SOFTMAX float (DEQUANTIZE before it, QUANTIZE after), and the
precheck says so (the `narrow_softmax` checker of targets/tflite_micro.yaml's
int8_warnings).
"""

from __future__ import annotations

from edgeflow.targets._tflite_graph import TfliteGraph, tflite_graph

WIDE_SOFTMAX = 256  # values on the axis from which the sum can need 9 integer bits
WHY = "an int8 SOFTMAX over 256 or more values, which TFLite Micro aborts on"


def wide_softmaxes(model: bytes, dtype: str) -> list[str]:
    """The output tensor names of the SOFTMAXes of the main subgraph over WIDE_SOFTMAX or
    more values (TFLite's softmax is over the last axis) whose input is of `dtype`."""
    return wide_in(tflite_graph(model, "tflite_micro"), dtype)


def wide_in(graph: TfliteGraph, dtype: str) -> list[str]:
    """wide_softmaxes, of a .tflite already read."""
    return [
        graph.written_name(op.outputs[0])
        for op in graph.ops
        if op.name == "SOFTMAX"
        and graph.shapes[op.inputs[0]]
        and graph.shapes[op.inputs[0]][-1] >= WIDE_SOFTMAX
        and graph.types[op.inputs[0]] == dtype
    ]
