"""The native path of a TensorFlow source: TensorFlow's own TFLite converter on the canonical
SavedModel (edgeflow.frameworks.tensorflow), for the tflite, tflite_micro and armnn backends.

No ONNX and no layout change: the .tflite takes the source's own tensors (a Keras model's
NHWC images as they are), matched by the signature's names. float32; fp16 (float16 weights);
int8_weights (int8 weights, float activations: _tflite_weights);
int8 full-integer, calibrated on the recipe's samples (the representative dataset), int8 I/O;
int16 activations with int8 weights (16x8), int16 I/O. TensorFlow ops without a TFLite
builtin fail the conversion (no Select TF ops: none of these runtimes has the Flex delegate);
the converter's message names them, and so does the error.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeflow.core.errors import EdgeflowError
from edgeflow.frameworks import tensorflow as tfw
from edgeflow.targets import (
    _onnx2tf,
    _tflite_layout,
    _tflite_traps,
    _tflite_unroll,
    _tflite_weights,
    emitted,
)
from edgeflow.targets._tflite_deps import require
from edgeflow.targets._tflite_quant import (
    calibrated_on,
    looped_int8,
    sixteen_by_eight,
    whole_batches,
)

if TYPE_CHECKING:
    from edgeflow.data import Samples
    from edgeflow.schema.sections import Quantization, TensorSpec
    from edgeflow.targets.profile import TargetProfile

ARTIFACT = "model.tflite"
# TensorFlow 2.21's converter, for a TF op with no builtin: "'tf.Erfinv' op is neither a
# custom op nor a flex op"
UNLOWERED = re.compile(r"'tf\.(\w+)' op is neither a custom op nor a flex op")


@dataclass(frozen=True)
class NativeJob:
    saved_model: Path  # the canonical SavedModel (tf_load)
    out_dir: Path
    profile: TargetProfile
    quantization: Quantization
    inputs: list[TensorSpec]  # the fed inputs
    output_names: list[str]
    calibration: Samples | None  # for int8


# Where the converter's MLIR error (from a SavedModel) puts each op, on the line of its
# "'tf.Erfinv' op is neither ..." error: loc(callsite(fused["Erfinv:", "functional_1/erfinv_1/
# erfinv/Erfinv@__inference_serve_117"] at ...)): the node name holds the Keras layer's.
_NODE = r'fused\["{op}:", "([^"@]*)'


@dataclass(frozen=True)
class UnloweredOp:
    op: str  # the TensorFlow op type, e.g. Erfinv
    node: str  # its node name in the SavedModel's graph (a Keras model's: layer names)


class Unlowered(EdgeflowError):
    """TensorFlow ops the converter has no TFLite builtin for, with their nodes."""

    def __init__(self, message: str, hint: str, found: list[UnloweredOp]) -> None:
        super().__init__(message, hint)
        self.found = found

    @property
    def ops(self) -> list[str]:
        return sorted({u.op for u in self.found})


def unlowered(text: str) -> list[UnloweredOp]:
    """The ops the converter's error names, each with its node."""
    found: dict[tuple[str, str], UnloweredOp] = {}
    for line in text.splitlines():
        for op in UNLOWERED.findall(line):
            node = re.search(_NODE.format(op=re.escape(op)), line)
            key = (op, node.group(1) if node else "")
            found.setdefault(key, UnloweredOp(*key))
    named = {op for op, node in found if node}
    return [u for key, u in found.items() if key[1] or key[0] not in named]


def convert(job: NativeJob, target: str, check: Any) -> dict[str, Any]:
    """Write job.out_dir/model.tflite with TensorFlow's converter; return the convert info.
    `check(artifact)` (the precheck of its builtins) runs before any runtime loads it."""
    tf = require("tensorflow", target)
    q = job.quantization
    # a Keras model's recurrent layers as loops, where it has them
    has_loops = tfw.LOOPS in tfw.signatures(job.saved_model)
    signature = tfw.LOOPS if has_loops else tfw.SIGNATURE
    converter = tf.lite.TFLiteConverter.from_saved_model(
        str(job.saved_model), signature_keys=[signature]
    )
    # int8 with loops: converted float, then quantized with the loops kept float
    looped = q.mode == "int8" and q.activations != "int16" and has_loops
    # per-tensor fully-connected weights where the runtime takes no per-channel ones
    dense = not job.profile.per_channel_dense
    # int8_weights: the float32 file too, whose weights its own are compared with
    unreduced = _run(converter, "none") if q.mode == "int8_weights" else None
    if q.mode in ("fp16", "int8_weights"):
        _tflite_weights.reduced(converter, tf, q.mode, q.per_channel)
    elif q.mode == "int8" and not looped:
        calibrated_on(converter, tf, lambda: representative(job), q.per_channel, dense)
        if q.activations == "int16":
            sixteen_by_eight(converter, tf)
        else:
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
            converter.inference_input_type = converter.inference_output_type = tf.int8
    start = time.perf_counter()
    model = _run(converter, q.mode)
    compared: list[str] = []
    kept: list[_tflite_traps.Kept] = []
    if looped:
        kept = _tflite_traps.kept_float(model, target)
        model, compared = looped_int8(model, _positional(job, model), q.per_channel, target, dense)
    elif q.mode == "int8" and q.activations != "int16" and _tflite_traps.trapped(model, target):
        # a trap of the target's int8 kernels (_tflite_traps): quantized again from the float
        # model, as looped_int8 does, the trapped operators float
        plain = tf.lite.TFLiteConverter.from_saved_model(
            str(job.saved_model), signature_keys=[signature]
        )
        float32 = _run(plain, "none")
        kept = _tflite_traps.kept_float(float32, target)
        model, compared = looped_int8(
            float32, _positional(job, float32), q.per_channel, target, dense
        )
    seconds = time.perf_counter() - start
    artifact = job.out_dir / ARTIFACT
    artifact.write_bytes(model)
    loops = _onnx2tf.for_runtime(artifact, target)
    check(artifact)
    info: dict[str, Any] = {
        "artifact": ARTIFACT,
        "files": [ARTIFACT],
        "path": "native",
        "converter": f"tensorflow {tf.__version__} TFLiteConverter (from the SavedModel)",
        "convert_seconds": round(seconds, 3),
        "operators": emitted.operators(artifact, target),
        "io": io_layout(artifact, [s.name for s in job.inputs], job.output_names, target),
    }
    if unreduced is not None:
        info["int8_weights"] = _tflite_weights.record(unreduced, model, q.per_channel)
    if q.mode == "int8":
        info["int8"] = _onnx2tf.int8_record(q, _onnx2tf.usable(job.calibration, job.inputs))
        if looped:
            info["int8"]["scheme"] += _tflite_unroll.int8_note(loops, target)
        for trap in kept:  # _tflite_quant.quantize keeps them float
            info["int8"][trap.key] = trap.names
            info["int8"]["scheme"] += f"; {trap.note}"
        if compared:  # _tflite_quant.looped_int8
            info["int8"]["scheme"] += (
                "; float32 I/O, an input compared for equality (a mask value) and the "
                f"comparison float ({', '.join(compared)})"
            )
    return info


def _run(converter: Any, mode: str) -> bytes:
    try:
        with _onnx2tf._contained():
            return bytes(converter.convert())
    except Exception as exc:  # TensorFlow's converter raises its own ConverterError types
        text = str(exc)
        found = unlowered(text)
        if found:
            ops = sorted({u.op for u in found})
            raise Unlowered(
                f"TensorFlow's TFLite converter has no builtin for {len(ops)} TensorFlow "
                f"op(s): {', '.join(ops)} (Select TF ops would need the Flex delegate, which "
                "these runtimes do not have)",
                "express them with other ops in the model, or set convert.via: onnx to try "
                "tf2onnx and the ONNX rules",
                found,
            ) from None
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        said = next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else "")
        raise EdgeflowError(
            f"TensorFlow's TFLite converter failed ({mode}): {type(exc).__name__}: {said[:300]}",
            "see docs/debugging.md; convert.via: onnx takes the other path",
        ) from None


def representative(job: NativeJob) -> Iterator[dict[str, np.ndarray]]:
    """Calibration batches of the model's batch size, by input name, in the source's layout."""
    for feeds in whole_batches(job.calibration, job.inputs):
        yield {s.name: np.asarray(feeds[s.name], s.dtype) for s in job.inputs}


def _positional(job: NativeJob, float32: bytes) -> Iterator[list[np.ndarray]]:
    """`representative`'s batches in the float file's input order."""
    litert = require("ai_edge_litert.interpreter", "tflite")
    details = litert.Interpreter(model_content=float32).get_input_details()
    order = _tflite_layout.input_order([s.name for s in job.inputs], details)
    for feeds in representative(job):
        yield [feeds[name] for name in order]


def io_layout(artifact: Path, inputs: list[str], outputs: list[str], target: str) -> dict[str, Any]:
    """Each input and output by its signature name: its .tflite position, no permutation."""
    litert = require("ai_edge_litert.interpreter", target)
    interp = litert.Interpreter(model_path=str(artifact))
    in_details, out_details = interp.get_input_details(), interp.get_output_details()
    order = _tflite_layout.input_order(inputs, in_details)
    shapes = [tuple(int(d) for d in det["shape"]) for det in in_details]
    layout_in = [
        {"name": name, "index": pos, "perm": list(range(len(shapes[pos])))}
        for pos, name in enumerate(order)
    ]
    positions = _tflite_layout.output_order(interp, out_details, outputs)
    layout_out = [
        {"name": name, "index": pos, "perm": list(range(len(out_details[pos]["shape"])))}
        for name, pos in zip(outputs, positions, strict=True)
    ]
    return {"inputs": layout_in, "outputs": layout_out}
