"""TensorFlow's calibrator and quantizers, where edgeflow calibrates instead of onnx2tf: the
fallback's calibration and MLIR quantization (edgeflow.targets._tflite_fallback), and the int8
/ 16x8 builds of models with an input batched on another axis than 0 (onnx2tf cuts every
input's calibration data in windows of axis 0: a [layers, batch, hidden] state cannot be
calibrated through it) or with a recurrent layer (onnx2tf's int8 run converts the model seven
times over, see _onnx2tf.outputs). Each calibrates onnx2tf's float32 file itself, the model
the runtime will run; the native TensorFlow path (_tf_native) sets its converter with
`calibrated_on`."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeflow.core import progress
from edgeflow.core.errors import EdgeflowError, first_line
from edgeflow.schema.source import batch_size
from edgeflow.targets import _onnx2tf, _tflite_islands, _tflite_ranges, _tflite_traps
from edgeflow.targets._tflite_deps import require
from edgeflow.targets._tflite_layout import input_order
from edgeflow.targets.base import ConvertJob

if TYPE_CHECKING:
    from edgeflow.data import Samples
    from edgeflow.schema.sections import TensorSpec

Feeds = dict[str, np.ndarray]


def own_int8(
    job: ConvertJob, out: Path, target: str, why: str, float_nodes: Sequence[str] = ()
) -> bytes:
    """The int8 model of onnx2tf's float32 file in `out`, calibrated on batches cut on each
    input's own batch axis: TensorFlow's calibrator and MLIR quantizer as the fallback uses
    them, or for int16 activations its 16x8 quantizer, with the I/O types onnx2tf would give.
    `why`: what needed it, for the error; `float_nodes`: operators (output names) kept
    float (quantization.keep_float's islands; int8 activations only)."""
    if job.quantization.float_outputs:
        return float_outputs(job, out, target, why, float_nodes)
    if job.quantization.activations != "int16":
        return quantize(
            calibrate(job, out, why),
            job.quantization.per_channel,
            list(float_nodes),
            target=target,
            dense_per_tensor=job.dense_per_tensor,
        )
    tf = require("tensorflow", target)
    float32 = _float32(out)
    return _guarded(
        lambda: _calibrator(float32).calibrate_and_quantize(
            lambda: positional(job, float32),
            tf.int16,
            tf.int16,
            False,  # no float operator left
            activations_type=tf.int16,
            bias_type=tf.int64,
            disable_per_channel=not job.quantization.per_channel,
        ),
        f"{why}: TensorFlow's quantizer could not quantize it to 16x8",
        "",
    )


def calibrate(job: ConvertJob, out: Path, why: str = "quantization.fallback") -> bytes:
    """onnx2tf's float32 file in `out`, with the range of every tensor over the calibration
    batches recorded: what TensorFlow's converter calibrates for a representative dataset,
    without converting the model again (`why`: what needed edgeflow's own calibration, for
    the error). Measured on a 2-layer LSTM of 150 unrolled over 400 steps: 0.6 s, where
    converting its SavedModel again with calibration took 18 s, the int8 file the same.
    Every activation's min/max is then the one its values take, run with every tensor kept
    (_tflite_ranges.observed: TensorFlow's calibrator records some with another tensor's);
    quantization.method percentile or mse: each activation's range as it sets it
    (_tflite_ranges), min/max otherwise."""
    float32 = _float32(out)
    hint = "build without quantization.fallback to keep onnx2tf's own int8 file"
    calibrated = _guarded(
        lambda: _calibrator(float32).calibrate(lambda: positional(job, float32)),
        f"{why}: TensorFlow's calibrator could not run it",
        hint if why == "quantization.fallback" else "",
    )
    calibrated = _tflite_ranges.observed(calibrated, positional(job, float32))
    method = job.quantization.method
    if method not in _tflite_ranges.METHODS:
        return calibrated
    return _tflite_ranges.ranged(calibrated, positional(job, float32), method)


def _float32(out: Path) -> bytes:
    return (out / "model_float32.tflite").read_bytes()


def _calibrator(model: bytes) -> Any:
    """TensorFlow's calibrator (the one its converter runs) on the float model, with the
    intermediate tensors a fused LSTM's calibration records added."""
    require("tensorflow", "tflite")
    from tensorflow.lite.python.optimize import calibrator

    return calibrator.Calibrator(calibrator.add_intermediate_tensors(model))


def positional(job: ConvertJob, float32: bytes) -> Iterator[list[np.ndarray]]:
    """Calibration batches as onnx2tf's float32 file takes them: whole batches of the
    model's batch size, each input cut on its own batch axis and laid out as the file has
    it, in the file's input order and of its input types (an integer input stays one)."""
    litert = require("ai_edge_litert.interpreter", "tflite")
    details = litert.Interpreter(model_content=float32).get_input_details()
    specs = {s.name: s for s in job.inputs}
    order = input_order(list(specs), details)
    dtypes = [d["dtype"] for d in details]  # in the order input_order gives the names
    for feeds in whole_batches(job.calibration, job.inputs):
        yield [
            np.asarray(feeds[name], dtype).transpose(job.input_perm(specs[name]))
            for name, dtype in zip(order, dtypes, strict=True)
        ]


def _guarded(call: Callable[[], Any], what: str, hint: str) -> bytes:
    """What TensorFlow's calibrator or quantizer returns, or an EdgeflowError: `what`, and
    its first line. edgeflow's own errors from the calibration batches it feeds (too few
    samples; an AssertionError is a bug) pass through as they are."""
    try:
        with _onnx2tf._contained():
            return bytes(call())
    except (EdgeflowError, AssertionError):
        raise
    except Exception as exc:  # TensorFlow's own error types
        raise EdgeflowError(
            f"{what} (onnx2tf's float32 file): {type(exc).__name__}: {first_line(exc)}",
            hint or "see docs/debugging.md",
        ) from None


def calibrated_on(
    converter: Any,
    tf: Any,
    batches: Callable[[], Iterator[Feeds]],
    per_channel: bool,
    dense_per_tensor: bool = False,
) -> None:
    """Set TensorFlow's converter to quantize with these calibration batches (its
    representative dataset, as tensors), per channel or not (`dense_per_tensor`: not for
    the fully-connected layers)."""

    def dataset() -> Iterator[dict[str, Any]]:
        for batch in batches():
            yield {name: tf.constant(data) for name, data in batch.items()}

    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = dataset
    converter._experimental_disable_per_channel = not per_channel
    converter._experimental_disable_per_channel_quantization_for_dense_layers = dense_per_tensor


def sixteen_by_eight(converter: Any, tf: Any) -> None:
    """TensorFlow's 16x8 mode: int8 weights, int16 activations, int16 I/O."""
    converter.target_spec.supported_ops = [
        tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8
    ]
    converter.inference_input_type = converter.inference_output_type = tf.int16


def whole_batches(calibration: Samples | None, inputs: list[TensorSpec]) -> Iterator[Feeds]:
    """The calibration samples in whole batches of the model's batch size (a short last one
    left out); an error when there is not even one. What TensorFlow's converter calibrates
    on (its representative dataset), counted as the calibration's progress."""
    if calibration is None:
        raise AssertionError("int8 conversion without calibration samples")
    batch = batch_size(inputs)
    usable = _onnx2tf.usable(calibration, inputs)
    if usable == 0:
        raise EdgeflowError(
            f"int8 calibration needs at least {batch} samples (the model's batch size); "
            f"got {len(calibration)}",
            "raise calibration.samples",
        )
    batches = (feeds for feeds, size in calibration.batches(batch, fixed=True) if size == batch)
    yield from progress.track(batches, "calibration", usable // batch, unit="batches")


def quantize(
    calibrated: bytes,
    per_channel: bool,
    float_nodes: list[str],
    float_io: bool = False,
    target: str = "",
    dense_per_tensor: bool = False,
) -> bytes:
    """The calibrated model quantized to int8 (int8 I/O), `float_nodes` (output tensor
    names) kept float (where one reads a model input, with float32 I/O:
    _tflite_islands.read_by), and every operator inside a loop (`loop_nodes`) and every operator an
    int8 kernel of `target` has a trap for (_tflite_traps: a DIV by a computed divisor with
    what computes it, a SOFTMAX TFLite Micro aborts on, a ONE_HOT); with `float_io`, the
    inputs and outputs float32 (QUANTIZE and DEQUANTIZE in the model); with
    `dense_per_tensor`, per-tensor weights for the fully-connected layers of a per-channel
    model."""
    tf = require("tensorflow", "tflite")
    from tensorflow.lite.python import convert

    read, moves = _tflite_islands.read_by(calibrated, float_nodes)
    float_io = float_io or bool(read)
    trapped = _tflite_traps.float_nodes(calibrated, target)
    float_nodes = [*float_nodes, *moves, *loop_nodes(calibrated), *trapped]
    io = tf.float32 if float_io else tf.int8
    return bytes(
        convert.mlir_quantize(
            calibrated,
            disable_per_channel=not per_channel,
            disable_per_channel_for_dense_layers=dense_per_tensor,
            fully_quantize=not float_io,
            input_data_type=io,
            output_data_type=io,
            denylisted_nodes=float_nodes or None,
        )
    )


def looped_int8(
    float32: bytes,
    batches: Iterator[list[np.ndarray]],
    per_channel: bool,
    target: str = "",
    dense_per_tensor: bool = False,
) -> tuple[bytes, list[str]]:
    """The int8 model of a float .tflite with WHILE loops (the native path's Keras recurrent
    layers), its loops float (`loop_nodes`), calibrated on `batches` (in the file's input
    order): TensorFlow's converter quantizes a loop's tensors with one scale for every step.
    Where an input is compared for equality (a Keras Masking layer's mask value), the I/O
    stays float32 and the comparison float (`compared_inputs`, returned): int8 input moves
    the value off its grid (sleepecg's mask value -1 came in as -1.013, no step was masked,
    and the output's SQNR was 7.7 dB; so, 44.7 dB)."""
    calibrated = _guarded(
        lambda: _calibrator(float32).calibrate(lambda: batches),
        "int8: TensorFlow's calibrator could not run the float model",
        "",
    )
    compared = compared_inputs(calibrated)
    model = quantize(calibrated, per_channel, compared, bool(compared), target, dense_per_tensor)
    return model, compared


def compared_inputs(model: bytes) -> list[str]:
    """The output tensor names of the main subgraph's EQUAL and NOT_EQUAL operators that read
    a model input."""
    schema = require("ai_edge_litert.schema_py_generated", "tflite")
    root = schema.Model.GetRootAs(model, 0)
    graph = root.Subgraphs(0)
    comparisons = {schema.BuiltinOperator.EQUAL, schema.BuiltinOperator.NOT_EQUAL}
    inputs = set(graph.InputsAsNumpy().tolist())
    names = []
    for i in range(graph.OperatorsLength()):
        op = graph.Operators(i)
        code = root.OperatorCodes(op.OpcodeIndex())
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        if builtin in comparisons and inputs & set(op.InputsAsNumpy().tolist()):
            names.append(graph.Tensors(op.Outputs(0)).Name().decode())
    return names


def loop_nodes(model: bytes) -> list[str]:
    """The output tensor names of every operator outside the main subgraph: the bodies and
    conditions of WHILE loops (a recurrent layer looped over its steps,
    frameworks.tf_recurrent). The int8 quantizer gives a tensor in a loop one scale for every
    step, where the steps of an unrolled layer each get their own: on PLCMOS's GRUs over 625
    frames, whose gate inputs span +-2.6 in most steps and +-90 in a few, the output's SQNR
    was 13.7 dB (unrolled, 34.4 dB); with the loops kept float and everything else int8,
    47.4 dB."""
    schema = require("ai_edge_litert.schema_py_generated", "tflite")
    root = schema.Model.GetRootAs(model, 0)
    names = []
    for g in range(1, root.SubgraphsLength()):
        graph = root.Subgraphs(g)
        for i in range(graph.OperatorsLength()):
            op = graph.Operators(i)
            for k in range(op.OutputsLength()):
                names.append(graph.Tensors(op.Outputs(k)).Name().decode())
    return names


def output_writers(model: bytes, target: str) -> list[str]:
    """The output tensor names of the operators that compute the model's outputs
    (quantization.float_outputs, as denylisted_nodes): each output's writer and, through the
    operators that only move values, the one before it."""
    from edgeflow.targets._tflite_graph import tflite_graph

    graph = tflite_graph(model, target)
    writer = {t: op for op in graph.ops for t in op.outputs}
    found: list[str] = []
    for tensor in graph.outputs:
        op = writer.get(tensor)
        while op is not None:
            found.append(graph.written_name(op.outputs[0]))
            if op.name not in _tflite_islands.MOVES or not op.inputs:
                break
            op = writer.get(op.inputs[0])
    return list(dict.fromkeys(found))


def float_outputs(
    job: ConvertJob, out: Path, target: str, why: str, float_nodes: Sequence[str] = ()
) -> bytes:
    """quantization.float_outputs: onnx2tf's float32 file in `out` calibrated and quantized
    by TensorFlow's MLIR quantizer with the operators writing the outputs float and float32
    I/O (QUANTIZE after the inputs, int8 inside, DEQUANTIZE before the float operators)."""
    calibrated = calibrate(job, out, why)
    writers = [*output_writers(_float32(out), target), *float_nodes]
    dense = job.dense_per_tensor
    return quantize(calibrated, job.quantization.per_channel, writers, True, target, dense)
