"""Activation ranges for edgeflow's own int8 calibration of the TFLite family: every
activation's min and max as its values take them (`observed`: TensorFlow's calibrator
records some tensors with another's range), and quantization.method percentile and mse,
ranges from histograms where TensorFlow's converter takes min and max.

TensorFlow's calibrator records each activation's min and max over the calibration batches
(`_tflite_quant.calibrate`), and its MLIR quantizer derives every int8 scale and zero point
from them. For these methods the recorded range of each activation of the main subgraph is
replaced before the quantizer reads it, from a histogram of the tensor's values over the
same batches (BINS bins between its min and max; the calibrated model run in LiteRT with
every tensor kept):
- `percentile`: the (100 - PERCENTILE)th and the PERCENTILE-th percentile, each end on its
  own (TFLite's activations are asymmetric; onnxruntime's percentile keeps the 99.999th
  percentile of |x|, symmetric);
- `mse`: the range [a * min, a * max] (a in SHRINK) whose int8 grid, as TFLite lays it (0
  on the grid), gives the histogram the least squared error: clipping the tails against
  rounding everything else more finely.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from edgeflow.targets._tflite_deps import require

METHODS = ("percentile", "mse")
BINS = 2048
PERCENTILE = 99.999
SHRINK = np.linspace(1.0, 0.05, 96)  # 1.00, 0.99, ..., 0.05 of the min/max range
SPREAD = 8  # points per bin where mse weighs a histogram's error


def ranged(calibrated: bytes, batches: Iterable[list[np.ndarray]], method: str) -> bytes:
    """The calibrated model with each activation's recorded range replaced by the method's,
    from its values on `batches` (lists of inputs in the model's input order)."""
    tree, recorded = _recorded(calibrated)
    ranges = {name: _range(t) for name, t in recorded.items()}
    bounds = {name: (low, high) for name, (low, high) in ranges.items() if high > low}
    for name, (counts, edges) in histograms(calibrated, batches, bounds).items():
        low, high = choose(counts, edges, method)
        recorded[name].quantization.min = [low]
        recorded[name].quantization.max = [high]
    return _packed(tree, len(calibrated))


def observed(calibrated: bytes, batches: Iterable[list[np.ndarray]]) -> bytes:
    """The calibrated model with each activation's recorded min and max replaced by those
    its values take on `batches`, the model run in LiteRT with every tensor kept.
    TensorFlow's calibrator (2.21) records some tensors with another's range: measured,
    a MEAN whose output a MUL by a constant then scales (a masked mean pooling as MEAN
    times the count, onnx.sum_as_mean) was recorded with the MUL's range, 32 times its own,
    unless the MUL wrote a model output; the int8 MEAN then kept 8.7 dB of its input's 29.5
    (the development sentence encoder on Arm NN, 2026-12-07)."""
    tree, recorded = _recorded(calibrated)
    seen: dict[str, tuple[float, float]] = {}
    for name, values in _runs(calibrated, batches, set(recorded)):
        if values.size and np.isfinite(values).all():
            low, high = float(values.min()), float(values.max())
            old = seen.get(name, (low, high))
            seen[name] = (min(old[0], low), max(old[1], high))
    for name, (low, high) in seen.items():
        recorded[name].quantization.min = [low]
        recorded[name].quantization.max = [high]
    return _packed(tree, len(calibrated))


def _recorded(calibrated: bytes) -> tuple[Any, dict[str, Any]]:
    """The model's object tree and, by name, the main subgraph's tensors with a recorded
    min and max."""
    schema = require("ai_edge_litert.schema_py_generated", "tflite")
    tree = schema.ModelT.InitFromPackedBuf(bytearray(calibrated), 0)
    recorded = {
        t.name.decode(): t
        for t in tree.subgraphs[0].tensors
        if t.quantization is not None
        and t.quantization.min is not None
        and len(t.quantization.min) == 1
    }
    return tree, recorded


def _range(tensor: Any) -> tuple[float, float]:
    return float(tensor.quantization.min[0]), float(tensor.quantization.max[0])


def _packed(tree: Any, size: int) -> bytes:
    import flatbuffers

    builder = flatbuffers.Builder(size + 1024)
    builder.Finish(tree.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def _runs(
    model: bytes, batches: Iterable[list[np.ndarray]], names: set[str]
) -> Iterator[tuple[str, np.ndarray]]:
    """(name, values) of each tensor named in `names` that the model's main subgraph
    computes or takes as input, per batch."""
    litert = require("ai_edge_litert.interpreter", "tflite")
    interp = litert.Interpreter(  # the builtin kernels: a delegate would hide the tensors
        model_content=model,
        experimental_preserve_all_tensors=True,
        experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
    )
    interp.allocate_tensors()
    inputs = [d["index"] for d in interp.get_input_details()]
    written = {t for op in interp._get_ops_details() for t in op["outputs"]}
    read = {
        d["index"]: d["name"]
        for d in interp.get_tensor_details()
        if d["name"] in names and (d["index"] in written or d["index"] in inputs)
    }
    for batch in batches:
        for index, data in zip(inputs, batch, strict=True):
            interp.set_tensor(index, np.ascontiguousarray(data))
        interp.invoke()
        for index, name in read.items():
            yield name, interp.get_tensor(index).ravel()


def histograms(
    model: bytes, batches: Iterable[list[np.ndarray]], bounds: dict[str, tuple[float, float]]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(counts, edges) of every tensor named in `bounds` that the model's main subgraph
    computes or takes as input, over the batches, BINS bins between its bounds (values
    outside them, a float kernel's rounding, counted in the end bins)."""
    kept = {name for name, bound in bounds.items() if resolvable(*bound)}
    counts = {name: np.zeros(BINS, np.int64) for name in kept}
    for name, values in _runs(model, batches, kept):
        low, high = bounds[name]
        counts[name] += np.histogram(np.clip(values, low, high), BINS, (low, high))[0]
    return {
        name: (c, np.linspace(*bounds[name], BINS + 1)) for name, c in counts.items() if c.any()
    }


def resolvable(low: float, high: float) -> bool:
    """Whether BINS bins of float32 values fit between low and high. A tensor whose whole
    range is a few float32 steps (onnx.sqrt_newton's tangents near 5e18: numpy's histogram
    cannot make 2,048 bins of it) keeps its min/max: no narrower range exists on its grid."""
    step = float(np.spacing(np.float32(max(abs(low), abs(high)))))
    return high - low > BINS * step


def choose(counts: np.ndarray, edges: np.ndarray, method: str) -> tuple[float, float]:
    """The range the method keeps of a histogram."""
    if method == "percentile":
        cdf = np.cumsum(counts) / counts.sum()
        tail = (100.0 - PERCENTILE) / 100.0
        low = edges[int(np.searchsorted(cdf, tail, side="left"))]
        high = edges[int(np.searchsorted(cdf, 1.0 - tail, side="left")) + 1]
        return float(low), float(high)
    if method == "mse":
        errors = [squared_error(counts, edges, a * edges[0], a * edges[-1]) for a in SHRINK]
        best = float(SHRINK[int(np.argmin(errors))])
        return float(best * edges[0]), float(best * edges[-1])
    raise AssertionError(f"no range for method {method}")


def squared_error(counts: np.ndarray, edges: np.ndarray, low: float, high: float) -> float:
    """The histogram's squared error on TFLite's int8 grid for the range [low, high]: 0 in
    the range, 256 levels, the zero point an integer. A bin's values are taken as spread
    evenly over it (SPREAD points): a narrowed range's step can be as fine as a bin."""
    low, high = min(low, 0.0), max(high, 0.0)
    scale = (high - low) / 255.0
    if scale <= 0:
        return float("inf")
    zero = np.clip(np.round(-128 - low / scale), -128, 127)
    width = edges[1] - edges[0]
    values = edges[:-1, None] + width * (np.arange(SPREAD) + 0.5) / SPREAD
    levels = np.clip(np.round(values / scale) + zero, -128, 127)
    error = (values - (levels - zero) * scale) ** 2
    return float(np.sum(counts[:, None] * error) / SPREAD)
