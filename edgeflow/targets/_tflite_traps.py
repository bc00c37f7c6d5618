"""The traps of the TFLite runtimes' int8 kernels, in one place: what an int8 build keeps
float, and whether a converter's int8 file fell into one (then edgeflow quantizes the float
model again itself, `_tflite_quant.quantize`, with those operators float). Used by the ONNX
path (onnx2tf's int8 file, edgeflow's own calibration) and the native one alike.

- a DIV by a divisor computed in the graph (`_tflite_div`): LiteRT stops the run where the
  int8 divisor rounds to its zero point, TFLite Micro computes it wrong, Arm NN aborts;
- a SOFTMAX over 256 or more values on tflite_micro (`_tflite_softmax`): its reference
  kernel aborts;
- an operator whose int8 kernel writes a constant input's values into its output as they
  are stored, without moving them to the output's grid (`COPIES`): ONE_HOT's on and off
  values. TensorFlow's quantizer gives each constant a grid of its own: measured 2026-12 on
  magika's one-hot of its bytes, on value 1.0 on the output's grid (scale 1/255, zero point
  -128) but off value 0.0 at scale 3.9e-9, zero point 0, so LiteRT wrote every off entry as
  int8 0, which the output's grid reads as 0.502: the one-hot at -18 dB, the model's top-1
  agreement 0.062 where onnxruntime's int8 keeps 1.0. Kept float, it verifies (docs/int8.md).
- an operator the target runs in float32 but has no int8 kernel for (`float_kernels`, from
  the profile's measured builtins: those that ran in float32 and failed alone in int8):
  TFLite Micro's SQRT, EXP and LOG (an L2 normalisation's SQRT, measured 2026-12: "Node SQRT
  failed to invoke"), and GATHER at int64 positions. The int8 build runs them float between
  DEQUANTIZE and QUANTIZE; the profile's operators say so (`kept_float`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edgeflow.core import resources
from edgeflow.targets import _tflite_div, _tflite_softmax
from edgeflow.targets._tflite_graph import TfliteGraph, tflite_graph
from edgeflow.targets.registry import tflite_runtime

# operator: the inputs whose stored values its int8 kernel copies into the output
COPIES = {"ONE_HOT": (2, 3)}
COPIES_WHY = "an int8 ONE_HOT (its kernel copies on/off values stored on grids of their own)"


@dataclass(frozen=True)
class Kept:
    """Operators an int8 build keeps float for one trap."""

    key: str  # the convert record's key (int8.float_divisions, ...)
    names: list[str]  # their output tensor names, as TensorFlow's quantizer denylists them
    note: str  # what the int8 scheme says of them


def kept_float(float_model: bytes, target: str) -> list[Kept]:
    """What an int8 build of this float .tflite for `target` keeps float, per trap (those
    with nothing to keep left out)."""
    graph = tflite_graph(float_model, "tflite")
    divisions = _tflite_div.divisions_kept(graph)
    softmaxes = _tflite_softmax.wide_in(graph, "FLOAT32") if _reference_softmax(target) else []
    copies = _copies(graph, "FLOAT32")
    kernels = runtime_float_kernels(target)
    lacking = _of(graph, kernels, "FLOAT32")
    lacked = sorted({op.name for op in graph.ops if op.name in kernels})
    kept = [
        Kept(
            "float_divisions",
            divisions,
            f"{len(divisions)} operators float: each DIV by a computed divisor and what "
            "computes it (an int8 divisor at its zero point stops LiteRT's DIV)",
        ),
        Kept(
            "float_softmaxes",
            softmaxes,
            f"{len(softmaxes)} SOFTMAX float: over 256 or more values (TFLite Micro's int8 "
            "SOFTMAX aborts on them)",
        ),
        Kept(
            "float_copies",
            copies,
            f"{len(copies)} ONE_HOT float: its int8 kernel writes the on/off values as stored, "
            "on grids TensorFlow's quantizer sets apart from the output's",
        ),
        Kept(
            "float_kernels",
            lacking,
            f"{len(lacking)} operators float: {target} has no int8 kernel for {', '.join(lacked)}",
        ),
    ]
    return [k for k in kept if k.names]


def float_nodes(float_model: bytes, target: str) -> list[str]:
    """The output tensor names `kept_float` keeps float, in one list."""
    return [name for kept in kept_float(float_model, target) for name in kept.names]


def trapped(model: bytes, target: str) -> str:
    """What of an int8 .tflite the target's runtime cannot run right ("" when nothing)."""
    graph = tflite_graph(model, "tflite")
    if _tflite_div.trapped_in(graph) > 0:
        return _tflite_div.WHY
    if _reference_softmax(target) and _tflite_softmax.wide_in(graph, "INT8"):
        return _tflite_softmax.WHY
    if _copies(graph, "INT8"):
        return COPIES_WHY
    lacking = _of(graph, runtime_float_kernels(target), "INT8")
    if lacking:
        return f"int8 operators {target} has no int8 kernel for ({', '.join(lacking)})"
    return ""


def float_kernels(builtins: Mapping[str, Any] | None) -> frozenset[str]:
    """The builtins a profile's `builtins:` (per mode: runs, fails) measured to run in float32
    and to fail, alone, in int8: no int8 kernel, so an int8 build runs them float."""
    if not builtins or "none" not in builtins or "int8" not in builtins:
        return frozenset()
    runs, fails = (_listed(builtins[mode]) for mode in ("none", "int8"))
    return frozenset(runs[0]) & frozenset(fails[1])


def _listed(measured: Any) -> tuple[list[str], dict[str, str]]:
    """(runs, fails) of one mode, from the profile model or its YAML data."""
    if isinstance(measured, Mapping):
        return list(measured.get("runs", [])), dict(measured.get("fails", {}))
    return list(measured.runs), dict(measured.fails)


@functools.cache
def _reference_softmax(target: str) -> bool:
    """Whether the target's int8 SOFTMAX is the reference kernel ("": no target named)."""
    return bool(target) and tflite_runtime(target).reference_int8_softmax


def runtime_float_kernels(backend: str) -> frozenset[str]:
    """float_kernels of the runtime of a TFLite-family backend, from its built-in profile (the
    runtime's measured builtins: a user's profile of that backend runs the same kernels)."""
    import yaml

    path = resources.builtin_dir("targets") / f"{backend}.yaml"
    if not path.is_file():
        return frozenset()
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return float_kernels(data.get("builtins"))


def _of(graph: TfliteGraph, builtins: frozenset[str], dtype: str) -> list[str]:
    """The output names of the operators among `builtins` whose output is of `dtype`."""
    return [
        graph.written_name(op.outputs[0])
        for op in graph.ops
        if op.name in builtins and graph.types[op.outputs[0]] == dtype
    ]


def _copies(graph: TfliteGraph, dtype: str) -> list[str]:
    """The output names of the COPIES operators whose output is of `dtype`."""
    return _of(graph, frozenset(COPIES), dtype)
