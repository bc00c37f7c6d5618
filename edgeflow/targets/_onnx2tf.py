"""ONNX -> .tflite with onnx2tf, offline; shared by the tflite and tflite_micro backends.

onnx2tf 1.28.8 traps handled here (see /work/shared/TOOLCHAIN.md): it rewrites its input
file (we convert a copy in a temporary folder); for 4-D 3-channel inputs it downloads a sample
file from GitHub even for float conversion (we place a file of that name in its working
folder, which it reads instead); int8 calibration comes only from NHWC .npy files; a failed
int8 conversion is only a warning in its log (we check that the file exists and quote the log);
Constant nodes, outputs named like internal tensors, names TensorFlow refuses as scopes and a
constant TopK K make it fail (`_onnx2tf_copy.prepare`, `_scalar_topk_k`). When a conversion
fails and onnx2tf writes its automatic parameter-replacement JSON ("Conversion failed. An
automatic replacement JSON has been generated: ... try running the conversion again with:
-prf ..."), the conversion is retried once with that file (`param_replacement_file`), and
the file is kept beside the artifact.
Inputs of rank 3-5 become channel-last; the recorded layout lets runners feed NCHW data.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeflow.core import islands, progress
from edgeflow.core.errors import EdgeflowError, first_line
from edgeflow.schema.source import batch_size
from edgeflow.targets import (
    _tflite_fc,
    _tflite_islands,
    _tflite_ranges,
    _tflite_traps,
    _tflite_unroll,
    _tflite_weights,
)
from edgeflow.targets._onnx2tf_copy import prepare, scope_safe, tf_name
from edgeflow.targets._onnx2tf_recurrent import (
    SEQUENCE_OP,
    float_from_saved_model,
    has_sequence_ops,
    sequence_layers,
    unclip_sequence_lstm,
)
from edgeflow.targets._tflite_deps import require
from edgeflow.targets._tflite_layout import io_layout
from edgeflow.targets.base import ConvertJob
from edgeflow.targets.registry import tflite_runtime

ARTIFACT = "model.tflite"
# onnx2tf's output file suffix for each quantization mode (full integer: int8 in and out).
SUFFIX = {
    "none": "float32",
    "fp16": "float16",
    "int8": "full_integer_quant",
    "int8_weights": "dynamic_range_quant",
}
# The sample file onnx2tf downloads into its working directory when it is absent.
SAMPLE_FILE = "calibration_image_sample_data_20x128x128x3_float32.npy"
# Import name -> pip package, for "install it" messages.
LOG_TAIL = 25
# The build's copy of the parameter-replacement JSON onnx2tf generated on a failed conversion.
AUTO_JSON = "onnx2tf_auto.json"
# onnx2tf 1.28.8 (onnx2tf.py, after a conversion error): the file it wrote,
# <output folder>/<model stem>_auto.json, in its warning.
AUTO_MESSAGE = re.compile(r"An automatic replacement JSON has been generated: (\S+)")


def suffix(quantization: Any) -> str:
    """onnx2tf's file suffix for the artifact this quantization asks for."""
    if quantization.mode == "int8" and quantization.activations == "int16":
        return "full_integer_quant_with_int16_act"
    return SUFFIX[quantization.mode]


def convert(job: ConvertJob, target: str, mix: Any = None, quantize: Any = None) -> dict[str, Any]:
    """Convert job.onnx with onnx2tf into job.out_dir/model.tflite; return the convert info.

    `mix(out folder, io layout) -> (model bytes or None, record)` (quantization.fallback,
    edgeflow.targets._tflite_fallback) may replace the int8 file with a mixed one; `quantize`
    (see `outputs`) makes it where onnx2tf cannot calibrate. job.check judges each file
    written before a runtime loads it."""
    from edgeflow.targets import emitted

    mode, q = job.quantization.mode, job.quantization
    mixed = None
    with outputs(job, target, quantize) as (out, run):
        produced = out / f"model_{suffix(q)}.tflite"
        shutil.copyfile(produced, job.out_dir / ARTIFACT)
        loops = for_runtime(job.out_dir / ARTIFACT, target)
        job.check(job.out_dir / ARTIFACT)
        if run.replacement is not None:  # a build artifact: what made the conversion work
            shutil.copyfile(run.replacement, job.out_dir / AUTO_JSON)
        float32 = out / "model_float32.tflite"
        float32_bytes = float32.read_bytes()
        eight = mode == "int8" and q.activations != "int16"  # 16x8 keeps DIV float itself
        kept = _tflite_traps.kept_float(float32_bytes, target) if eight else []
        layout = io_layout(job.onnx, job.out_dir / ARTIFACT, float32, target, job.kept_layout)
        if mix is not None:
            model, mixed = mix(out, layout, list(run.float_nodes))
            if model is not None:
                (job.out_dir / ARTIFACT).write_bytes(model)
                for_runtime(job.out_dir / ARTIFACT, target)
                job.check(job.out_dir / ARTIFACT)
                layout = io_layout(
                    job.onnx, job.out_dir / ARTIFACT, float32, target, job.kept_layout
                )
    info: dict[str, Any] = {
        "artifact": ARTIFACT,
        "files": [ARTIFACT, *([AUTO_JSON] if run.replacement is not None else [])],
        "converter": f"onnx2tf {_version('onnx2tf')}, tensorflow {_version('tensorflow')}",
        "convert_seconds": round(run.seconds, 3),
        "operators": emitted.operators(job.out_dir / ARTIFACT, target),
        "io": layout,
    }
    if run.retry is not None:
        info["retry"] = run.retry
    if mode == "int8_weights":
        artifact = (job.out_dir / ARTIFACT).read_bytes()
        info["int8_weights"] = _tflite_weights.record(float32_bytes, artifact, q.per_channel)
    if mode == "int8":
        # inputs a float island reads: _tflite_quant.quantize gives such a build float32 I/O
        read = _tflite_islands.read_by(float32_bytes, run.float_nodes)[0] if eight else []
        info["int8"] = int8_record(q, _usable(job), read)
        if q.per_channel and job.dense_per_tensor:
            info["int8"]["per_channel_dense"] = False
            info["int8"]["scheme"] += (
                f"; fully-connected weights per-tensor ({target}'s int8 fully-connected "
                "kernels take no per-channel weights), convolutions per-channel"
            )
        if loops:  # _tflite_quant.loop_nodes (a 16x8 build has none: sequence_layers)
            info["int8"]["scheme"] += _tflite_unroll.int8_note(loops, target)
        for trap in kept:  # _tflite_quant.quantize keeps them float
            info["int8"][trap.key] = trap.names
            info["int8"]["scheme"] += f"; {trap.note}"
        if eight and job.keep_float:  # what was asked, where the graph has none of it too
            none = islands.record({}, [], job.keep_float)
            info["int8"]["float_islands"] = run.islands or none
        if mixed is not None:
            info["fallback"] = mixed
            if mixed["float_layers"]:
                info["int8"]["scheme"] += (
                    f"; {len(mixed['float_layers'])} operators float (TensorFlow's MLIR "
                    "quantizer, denylisted_nodes), DEQUANTIZE/QUANTIZE around them"
                )
    return info


def for_runtime(artifact: Path, target: str) -> int:
    """The converted .tflite as the target's runtime takes it, in place: its loops unrolled
    (_tflite_unroll) and its kept-dims FULLY_CONNECTEDs flattened (_tflite_fc) where the
    runtime lacks them; returns the number of loops the file had. Every path that hands a
    runtime a converted file calls it (convert, the fallback's mix, the native path, trials)."""
    loops = _tflite_unroll.for_target(artifact, target)
    _tflite_fc.for_target(artifact, target)
    return loops


# Writes the .tflite files from onnx2tf's Keras model into its output folder (float_files).
Files = Callable[[Any, Path], None]


@dataclass
class Run:
    """How onnx2tf converted: seconds (both attempts), the retry with its replacement JSON
    (a record for convert.json) and that file, while the output folder exists."""

    seconds: float
    retry: dict[str, Any] | None = None
    replacement: Path | None = None
    # quantization.keep_float: the .tflite operators of the float islands (their output
    # names) and convert.json's record of them (_tflite_islands)
    float_nodes: tuple[str, ...] = ()
    islands: dict[str, Any] | None = None


class _Failed(EdgeflowError):
    """onnx2tf.convert raised: the error, its first line (`reason`), its whole log and how
    long it ran."""

    def __init__(self, message: str, hint: str, reason: str, log: str, seconds: float) -> None:
        super().__init__(message, hint)
        self.reason, self.log, self.seconds = reason, log, seconds


@contextlib.contextmanager
def outputs(job: ConvertJob, target: str, quantize: Any = None) -> Iterator[tuple[Path, Run]]:
    """Run onnx2tf on a copy of job.onnx; yield (its output folder, how it ran) while the
    folder exists. It holds model_float32.tflite and the file the quantization asks for
    (`suffix`; checked: onnx2tf only warns when an int8 conversion fails).

    onnx2tf calibrates every input in windows of axis 0, and in int8 converts the model seven
    times (float32, float16, dynamic range, two int8 and two 16x8 files): where an input is
    batched on another axis (a state [layers, batch, features]), or the model has a recurrent
    layer (unrolled, a 3-layer LSTM over 160 steps took 80 s CPU so), onnx2tf writes the
    float model only and `quantize(job, out folder, target, why) -> bytes`
    (edgeflow.targets._tflite_quant.own_int8) makes the int8 file from its float32 file; so
    too for quantization.method percentile or mse (ranges edgeflow sets, _tflite_ranges),
    and where onnx2tf's int8 file fell into a trap of the target's int8 kernels
    (_tflite_traps)."""
    mode, q = job.quantization.mode, job.quantization
    ranged = mode == "int8" and q.method in _tflite_ranges.METHODS  # edgeflow's own ranges
    if mode == "int8" and q.method != "minmax" and not (ranged and q.activations == "int8"):
        raise EdgeflowError(
            f"target {target}: quantization.method '{q.method}' is not available with "
            f"{q.activations} activations: the TFLite family calibrates with minmax, or for "
            "int8 activations percentile or mse",
            "set quantization.method: minmax",
        )
    with _contained():
        require("onnx2tf", target)  # fail early; the import costs seconds and ~550 MB
    with tempfile.TemporaryDirectory(prefix="edgeflow-onnx2tf-") as tmp:
        work = Path(tmp)
        source = work / "model.onnx"
        # a copy: onnx2tf rewrites the file it reads
        # a runtime without 0-D tensors gets a 0-D output as [1] (_onnx2tf_copy._rank1_outputs)
        rank1 = not tflite_runtime(target).rank0_outputs
        prepare(job.onnx, source, rank1_outputs=rank1)
        _write_sample_file(work / SAMPLE_FILE)
        options: dict[str, Any] = {}
        if job.kept_layout:  # a channel-last source: its inputs as declared, not transposed
            options["keep_shape_absolutely_input_names"] = [scope_safe(n) for n in job.kept_layout]
        recurrent = has_sequence_ops(source)
        why = (
            "an input batched on an axis other than 0"
            if any(s.batch_axis != 0 for s in job.inputs)
            else "a recurrent layer"
            if recurrent
            else "an integer input (onnx2tf calibrates every input as float32)"
            if any(not s.dtype.startswith("float") for s in job.inputs)
            else "quantization.float_outputs"
            if q.float_outputs
            else f"quantization.method {q.method}"
            if ranged
            else f"per-tensor fully-connected weights in a per-channel build ({target})"
            if mode == "int8" and q.per_channel and job.dense_per_tensor
            else "quantization.keep_float"
            if mode == "int8" and islands_asked(job)
            else ""
        )
        own_calibration = quantize is not None and mode == "int8" and bool(why)
        onnx2tf_int8 = mode == "int8" and not own_calibration
        if onnx2tf_int8:
            options |= {
                "output_integer_quantized_tflite": True,
                "quant_type": "per-channel" if q.per_channel else "per-tensor",
                "custom_input_op_name_np_data_path": _calibration_files(job, work),
                "input_quant_dtype": "int8",
                "output_quant_dtype": "int8",
            }
        sixteen = mode == "int8" and q.activations == "int16"
        with _contained(), sequence_layers(target, mode, sixteen) as routes:
            # onnx2tf's own int8 run writes every file; else it stops at its Keras model and
            # edgeflow writes the float files the build reads (`float_files`)
            files = None
            if not onnx2tf_int8:
                files = functools.partial(
                    float_files, mode=mode, per_channel=q.per_channel, routes=routes
                )
            run, log = _convert_or_retry(source, work, options, target, files)
        produced = work / "out" / f"model_{suffix(q)}.tflite"
        fused = SEQUENCE_OP in routes.values()
        if onnx2tf_int8 and fused:  # its float32 file: a loop
            with _contained():
                float_from_saved_model(work / "out", "none", q.per_channel)
        for written in (work / "out").glob("*.tflite") if fused else ():
            unclip_sequence_lstm(written)  # the clip TensorFlow adds to a fused LSTM
        if own_calibration and islands_asked(job) and not sixteen:
            float32 = work / "out" / "model_float32.tflite"
            layout = io_layout(job.onnx, float32, float32, target, job.kept_layout)
            names, run.islands = _tflite_islands.locate(job, work / "out", layout)
            run.float_nodes = tuple(names)
        if own_calibration:  # calibrated unclipped, as it will run
            produced.write_bytes(quantize(job, work / "out", target, why, run.float_nodes))
        elif onnx2tf_int8 and quantize is not None and not sixteen and produced.is_file():
            trap = _tflite_traps.trapped(produced.read_bytes(), target)
            if trap:  # edgeflow's own quantization keeps the trapped operators float
                produced.write_bytes(quantize(job, work / "out", target, trap))
        if not produced.is_file():
            raise EdgeflowError(
                f"onnx2tf wrote no {produced.name} (quantization mode {mode}); "
                f"its log ends:\n{_tail(log)}",
                "int8 fails when an operator has no int8 kernel; see docs/debugging.md",
            )
        yield work / "out", run


def islands_asked(job: ConvertJob) -> bool:
    """Whether the build keeps float islands the graph was found to have."""
    return any(island.kind in job.keep_float for island in job.float_islands)


def _convert_or_retry(
    source: Path, work: Path, options: dict[str, Any], target: str, files: Files | None
) -> tuple[Run, str]:
    """onnx2tf into work/out; where it fails and writes its automatic replacement JSON, once
    more with that file (what its message asks for), on the model file as it left it (it
    names nodes in place, and the JSON names them so). Returns (how it ran, the last log).
    Nothing else is retried: the same inputs give the same JSON, so the cache key (the ONNX
    model, onnx2tf's version, edgeflow's code) holds both attempts. `files`: see
    _run_onnx2tf."""
    out = work / "out"
    try:
        seconds, log = _run_onnx2tf(source, out, options, target, files)
        return Run(seconds), log
    except _Failed as failed:
        generated = _generated_json(failed.log, out)
        if generated is None:
            raise EdgeflowError(failed.message, failed.hint) from None
        first = failed
    kept = work / AUTO_JSON
    shutil.copyfile(generated, kept)
    shutil.rmtree(out, ignore_errors=True)  # the retry writes a fresh folder
    replacement = json.loads(kept.read_text(encoding="utf-8"))
    retry: dict[str, Any] = {
        "reason": first.reason,
        "param_replacement_file": AUTO_JSON,
        "operations": [str(op.get("op_name", "")) for op in replacement.get("operations", [])],
    }
    options = {**options, "param_replacement_file": str(kept)}
    try:
        seconds, log = _run_onnx2tf(source, out, options, target, files)
    except _Failed as again:
        ops = ", ".join(retry["operations"]) or "none"
        raise EdgeflowError(
            f"onnx2tf failed to convert the model ({retry['reason']}), wrote a parameter "
            f"replacement JSON (operations on: {ops}), and failed again when retried with it "
            f"({again.reason}); its log ends:\n{_tail(again.log)}\n"
            f"the JSON it generated:\n{kept.read_text(encoding='utf-8').strip()}",
            "see docs/debugging.md; rewrite rules can replace operators onnx2tf lacks",
        ) from None
    retry["converted"] = True
    return Run(first.seconds + seconds, retry, kept), log


def _generated_json(log: str, out: Path) -> Path | None:
    """The replacement JSON a failed onnx2tf run says it wrote (or left in its output
    folder), if it is there."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", log)
    named = [Path(m) for m in AUTO_MESSAGE.findall(plain)]
    found = [p for p in (*named, *sorted(out.glob("*_auto.json"))) if p.is_file()]
    return found[0] if found else None


def _run_onnx2tf(
    source: Path, out: Path, options: dict[str, Any], target: str, files: Files | None = None
) -> tuple[float, str]:
    """onnx2tf.convert inside its working folder, output captured: (seconds, log). With
    `files`, onnx2tf stops at its Keras model (disable_model_save) and `files(model, out)`
    writes the .tflite files from it, in the same time and log."""
    log = io.StringIO()
    with _contained(), _inside(source.parent):
        onnx2tf = require("onnx2tf", target)
        start = time.perf_counter()
        with (
            contextlib.redirect_stdout(log),
            contextlib.redirect_stderr(log),
            _scalar_topk_k(),
            progress.task("onnx2tf conversion"),  # one call: what runs, and for how long
        ):
            try:
                model = onnx2tf.convert(
                    input_onnx_file_path=str(source),
                    output_folder_path=str(out),
                    verbosity="warn",
                    disable_model_save=files is not None,
                    **options,
                )
                if files is not None:
                    files(model, out)
            except (Exception, SystemExit) as exc:  # onnx2tf calls sys.exit(1) on errors
                raise _Failed(
                    f"onnx2tf failed to convert the model ({type(exc).__name__}: {exc}); "
                    f"its log ends:\n{_tail(log.getvalue())}",
                    "see docs/debugging.md; rewrite rules can replace operators onnx2tf lacks",
                    f"{type(exc).__name__}: {first_line(exc)}",
                    log.getvalue(),
                    time.perf_counter() - start,
                ) from None
        return time.perf_counter() - start, log.getvalue()


def float_files(
    model: Any, out: Path, mode: str, per_channel: bool, routes: dict[str, str]
) -> None:
    """The float-activation files onnx2tf writes, from the Keras model it returns:
    model_float32.tflite, and the file of an fp16 or int8_weights build
    (_tflite_weights.FILES), converted as onnx2tf converts them (TensorFlow's converter on a
    concrete function of the model, TFLite builtins and Select TF ops), or, where a recurrent
    node took the SEQUENCE_OP route (`routes`, see sequence_layers), from a SavedModel of it
    (whose LSTM layers the converter fuses: float_from_saved_model). Left out: the
    SavedModel otherwise, and the float16 file of a float32 or int8 build, which onnx2tf
    writes in every run (an armnn float32 build of a 3-layer LSTM of 256 unrolled over 160
    steps: 35.0 s CPU with them, 19.3 s without)."""
    import tensorflow as tf

    out.mkdir(parents=True, exist_ok=True)
    if SEQUENCE_OP in routes.values():
        tf.saved_model.save(model, str(out))  # as onnx2tf saves it
        float_from_saved_model(out, mode, per_channel)
        return
    run = tf.function(
        lambda *inputs: model(inputs),
        input_signature=[tf.TensorSpec(t.shape, t.dtype, t.name) for t in model.inputs],
    )
    converter = tf.lite.TFLiteConverter.from_concrete_functions([run.get_concrete_function()])
    converter.target_spec.supported_ops = [
        tf.lite.OpsSet.TFLITE_BUILTINS,
        tf.lite.OpsSet.SELECT_TF_OPS,
    ]
    _tflite_weights.write(converter, tf, out, mode, per_channel)


@contextlib.contextmanager
def _scalar_topk_k() -> Iterator[None]:
    """onnx2tf 1.28.8's TopK calls `int(k)` on the constant K, a 1-element 1-D array (as the
    ONNX spec has it), which NumPy 2.4 refuses ("only 0-dimensional arrays can be converted to
    Python scalars"): every TopK with a constant K fails. While onnx2tf runs, its TopK
    reads K as the 0-D array holding the same value."""
    module: Any = importlib.import_module("onnx2tf.ops.TopK")
    original = module.get_constant_or_variable

    def scalar_k(*args: Any, **kwargs: Any) -> Any:
        value = original(*args, **kwargs)
        if isinstance(value, np.ndarray) and value.shape == (1,):
            return value.reshape(())
        return value

    module.get_constant_or_variable = scalar_k
    try:
        yield
    finally:
        module.get_constant_or_variable = original


@contextlib.contextmanager
def _contained() -> Iterator[None]:
    """Undo what importing and running onnx2tf changes process-wide: the recursion limit
    (2**31-1), warning filters (all ignored), environment variables, Python/NumPy seeds."""
    limit, environ = sys.getrecursionlimit(), dict(os.environ)
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        with warnings.catch_warnings():
            yield
    finally:
        sys.setrecursionlimit(limit)
        os.environ.clear()
        os.environ.update(environ)
        random.setstate(py_state)
        np.random.set_state(np_state)


def _calibration_files(job: ConvertJob, work: Path) -> list[list[Any]]:
    """One NHWC float32 .npy per input; mean 0 and std 1 keep the values as they are."""
    if job.calibration is None:
        raise AssertionError("int8 conversion without calibration samples")
    other = [f"'{s.name}' (batch_axis {s.batch_axis})" for s in job.inputs if s.batch_axis != 0]
    if other:
        raise EdgeflowError(
            f"int8 calibration through onnx2tf takes inputs batched on axis 0; {', '.join(other)}"
            " is not",
            "build int8 for onnxruntime_micro, or give these inputs their batch on axis 0",
        )
    batch, usable = batch_size(job.inputs), _usable(job)
    if usable == 0:
        raise EdgeflowError(
            f"int8 calibration needs at least {batch} samples (the model's batch size); "
            f"got {len(job.calibration)}",
            "raise calibration.samples",
        )
    entries = []
    for i, spec in enumerate(job.inputs):
        data = np.asarray(job.calibration.inputs[spec.name][:usable], dtype=np.float32)
        path = work / f"calibration_{i}.npy"
        np.save(path, data.transpose(job.input_perm(spec)))
        entries.append([tf_name(spec.name), str(path), 0.0, 1.0])
    return entries


def _usable(job: ConvertJob) -> int:
    """How many calibration samples onnx2tf uses: whole batches of the model's batch size."""
    return usable(job.calibration, job.inputs)


def usable(calibration: Any, inputs: list[Any]) -> int:
    """How many of the calibration samples a TFLite converter calibrates on: whole batches
    of the model's batch size."""
    total = len(calibration) if calibration is not None else 0
    return total - total % batch_size(inputs)


def int8_record(
    quantization: Any, samples: int, float_inputs: Sequence[str] = ()
) -> dict[str, Any]:
    """convert.json's int8 entry for a TFLite converter's full-integer build
    (`float_inputs`: the model inputs a float island reads, which make its I/O float32)."""
    q = quantization
    islands_io = (
        f"float32 I/O (a float island reads the input{'s' * (len(float_inputs) > 1)} "
        f"{', '.join(float_inputs)}: an int8 grid would merge its values)"
    )
    record = {
        "per_channel": q.per_channel,
        "method": q.method,  # ranges: TensorFlow's min/max, or edgeflow's (_tflite_ranges)
        "calibration_samples": samples,
        "scheme": (
            "TFLite 16x8: symmetric int8 weights, symmetric int16 activations and I/O"
            if q.activations == "int16"
            else "TFLite int8: symmetric weights, asymmetric int8 activations, float32 I/O "
            "with the operators writing the outputs float (quantization.float_outputs)"
            if q.float_outputs
            else f"TFLite int8: symmetric weights, asymmetric int8 activations, {islands_io}"
            if float_inputs
            else "TFLite int8: symmetric weights, asymmetric int8 activations, int8 I/O (the "
            "outputs on a 256-level grid over their calibrated range; "
            "quantization.float_outputs: true keeps them float)"
        ),
        "ignored": [k for k in ("symmetric", "reduce_range") if getattr(q, k) is True],
    }
    if float_inputs and not q.float_outputs:
        record["float_inputs"] = list(float_inputs)
    return record


def _write_sample_file(path: Path) -> None:
    """A local stand-in for the file onnx2tf would download (values in [0, 1), fixed seed)."""
    rng = np.random.default_rng(0)
    np.save(path, rng.random((20, 32, 32, 3), dtype=np.float32))


@contextlib.contextmanager
def _inside(folder: Path) -> Iterator[None]:
    """onnx2tf looks for its sample file in the current directory."""
    previous = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(previous)


def _tail(log: str) -> str:
    plain = re.sub(r"\x1b\[[0-9;]*m", "", log)  # onnx2tf colours its messages
    lines = [ln for ln in plain.strip().splitlines() if ln.strip()]
    return "\n".join(lines[-LOG_TAIL:])


def _version(dist: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
