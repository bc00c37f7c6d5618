"""ingest: the head of the ONNX pipeline; bind the recipe's signature to the source file (its
constants folded in as initializers, its fed inputs pinned to the declared static shapes) and
record the source's outputs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeflow.core.errors import EdgeflowError, first_line
from edgeflow.core.onnxfile import check_onnx_file
from edgeflow.core.onnxgraph import copy_model, name_outputs
from edgeflow.core.onnxoutputs import type_outputs
from edgeflow.core.onnxsession import checking_session
from edgeflow.schema.sections import TensorSpec
from edgeflow.schema.signatures import SHAPE_HINT, shape_clash
from edgeflow.stages._normalise import (
    evaluated,
    fold_constants,
    initializer_inputs,
    quantized,
    reinfer_shapes,
    upgrade_opset,
)
from edgeflow.stages.base import Stage, StageContext
from edgeflow.stages.load import save_reference

if TYPE_CHECKING:
    import onnx


class _OnSamples:
    """The source file's onnxruntime session run on the evaluation samples: what onnxruntime
    raises is the model failing on the data (a located EdgeflowError, its first line);
    an error in edgeflow's code around the runs (joining the outputs) stays a bug with its
    traceback."""

    def __init__(self, inner: Any, name: str) -> None:
        self.inner, self.name = inner, name

    def run(self, feeds: dict[str, Any]) -> list[Any]:
        try:
            return list(self.inner.run(feeds))
        except Exception as exc:  # onnxruntime's errors are not typed
            raise EdgeflowError(
                f"onnxruntime cannot run {self.name} on the evaluation samples: {first_line(exc)}",
                "check source.inputs (shapes, dtypes) against the model's inputs",
            ) from exc


def run(ctx: StageContext) -> None:
    import onnx

    from edgeflow.data import load_samples
    from edgeflow.verify.runners import BatchAxes, OnnxRunner, WithConstants, batching, run_all
    from edgeflow.verify.stream import run_stream, step_samples

    source = ctx.recipe.source
    path = ctx.inputs["onnx"]
    check_onnx_file(path)  # an ONNX source's was checked at validate; it may have changed since
    original = onnx.load(str(path))
    declared = {s.name: s for s in source.inputs}
    model = copy_model(original)
    notes = initializer_inputs(model, set(declared))
    session, problem = _file_session(path)  # what the source computes, where it loads
    model, upgraded = upgrade_opset(model, path.name, problem)
    notes += upgraded
    as_is = session is not None
    if session is None:
        if not upgraded:
            raise EdgeflowError(f"onnxruntime cannot load {path.name}: {problem}")
        session = checking_session(model)  # the file moved to the opset ingest chose
    _check_signature(model, session, source, path.name)
    signed = bind(model, source.inputs, source.dynamic_batch is not None)
    notes += reinfer_shapes(signed)
    signed, folded = fold_constants(signed)
    notes += folded
    typed = type_outputs(signed, path.name)
    renamed = name_outputs(signed, source.outputs) if source.outputs else {}
    held = quantized(signed)
    if held:
        listed = ", ".join(f"{op} x{n}" for op, n in held.items())
        notes.append(f"the file is quantized already ({listed})")
    samples = load_samples(ctx.recipe.evaluation, source.inputs, "evaluation", source.state)
    constants = {s.name: s.constant() for s in source.inputs if s.value is not None}
    names = source.outputs or [o.name for o in session.get_outputs()]
    extra: dict[str, object] = {"typed_outputs": typed, "renamed": renamed, "normalised": notes}
    if held:
        extra["quantized_ops"] = held
    axes = BatchAxes.of(ctx.recipe.evaluation.outputs, names)
    runner = WithConstants(_OnSamples(OnnxRunner(session), path.name), constants)
    if source.state:  # step by step, the state fed back
        streamed = run_stream(runner, samples, source, names, axes)
        outputs, extra["steps"] = streamed.outputs, streamed.steps
        steps = step_samples(samples, streamed, source)
    else:
        outputs = run_all(runner, samples, *batching(source), "reference outputs", axes)
        steps = samples
    if constants or notes:  # the bound, normalised graph computes what the file does
        feeds, _ = next(steps.batches(*batching(source)))
        want = runner.run(feeds) if as_is else evaluated(original, {**feeds, **constants})
        if want is None:
            notes.append("the opset conversion is unchecked: onnx's reference evaluator "
                         "cannot run the file either")  # fmt: skip
        else:
            _check_same(want, signed, feeds, path.name, notes)
    for note in notes:
        ctx.warn(f"ingest: {path.name}: {note}")
    onnx.save(signed, str(ctx.output("onnx")))
    save_reference(ctx, outputs, path.name, len(samples), names, **extra)


def _file_session(path: Path) -> tuple[Any, str | None]:
    """onnxruntime on the file as it is, or why it cannot load it (None, the reason)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # its "upgrade your model" warnings: ingest's notes say it
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]), None
    except Exception as exc:  # onnxruntime's errors are not typed
        return None, str(exc)


def _check_signature(model: onnx.ModelProto, session: Any, source: Any, file: str) -> None:
    """The recipe's inputs and outputs against the (normalised) file's."""
    declared = {s.name: s for s in source.inputs}
    actual = {v.name: v for v in model.graph.input}
    if set(declared) != set(actual):
        raise EdgeflowError(
            f"source.inputs names {sorted(declared)} but {file} has inputs {sorted(actual)}",
            "name source.inputs after the model's graph inputs",
        )
    outputs = session.get_outputs()
    if not outputs:
        raise EdgeflowError(f"{file} has no graph outputs", "export the model again")
    if source.outputs is not None and len(source.outputs) != len(outputs):
        raise EdgeflowError(
            f"source.outputs names {len(source.outputs)} output(s), {file} has "
            f"{len(outputs)} ({', '.join(o.name for o in outputs)})",
            "name each graph output once, in the file's order",
        )
    for name, spec in declared.items():
        dims = [
            d.dim_value if d.HasField("dim_value") else d.dim_param or None
            for d in actual[name].type.tensor_type.shape.dim
        ]
        problem = shape_clash(dims, spec)
        if problem:
            raise EdgeflowError(f"source.inputs: {name}: {problem} in {file}", SHAPE_HINT)


def _check_same(
    want: list[Any], signed: onnx.ModelProto, feeds: dict[str, Any], file: str, notes: list[str]
) -> None:
    """What ingest made computes what the file does (on the first batch of the samples); a
    difference from onnx's version converter is the user's to know of, any other is a bug."""
    import numpy as np

    got = checking_session(signed).run(None, feeds)
    for index, (expected, have) in enumerate(zip(want, got, strict=True)):
        if expected.shape == have.shape and np.allclose(expected, have, rtol=1e-4, atol=1e-5):
            continue
        diff = (
            float(np.max(np.abs(expected.astype(np.float64) - have)))
            if expected.shape == have.shape
            else f"shape {list(have.shape)} for {list(expected.shape)}"
        )
        if any("version converter" in n for n in notes):
            raise EdgeflowError(
                f"{file}: the file moved to another opset computes something else (output "
                f"{index}: max |difference| {diff}): {'; '.join(notes)}",
                "export the model again at a recent opset (onnx's version converter changed it)",
            )
        raise AssertionError(f"ingest changed what {file} computes (output {index}: {diff})")


def bind(model: onnx.ModelProto, specs: list[TensorSpec], dynamic: bool) -> onnx.ModelProto:
    """A copy of `model` with each constant input an initializer (its graph input removed)
    and each fed input's dims the declared static ones (`dynamic`: but the batch axis's);
    output dims of -1 or 0 become unknown (shape inference fills them in)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    from edgeflow.core.onnxgraph import copy_model

    out = copy_model(model)
    graph = out.graph
    by_name = {s.name: s for s in specs}
    kept = []
    for value in graph.input:
        spec = by_name.get(value.name)
        if spec is None:
            kept.append(value)
            continue
        want = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(spec.dtype))
        have = value.type.tensor_type.elem_type
        if have != want:
            raise EdgeflowError(
                f"source.inputs: {spec.name} is {onnx.TensorProto.DataType.Name(have).lower()} "
                f"in the model, dtype declares {spec.dtype}",
                "declare the model's own dtype",
            )
        if spec.value is not None:
            graph.initializer.append(numpy_helper.from_array(spec.constant(), spec.name))
            continue
        dims = value.type.tensor_type.shape.dim
        for axis, size in enumerate(spec.shape):
            if axis < len(dims) and dynamic and axis == spec.batch_axis:
                continue
            if axis == len(dims):
                dims.add()
            dims[axis].dim_value = size  # also clears a dim_param
        kept.append(value)
    del graph.input[:]
    graph.input.extend(kept)
    for value in (*graph.output, *graph.value_info):
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_value") and dim.dim_value <= 0:
                dim.Clear()
    return out


STAGE = Stage(
    name="ingest",
    description="Bind the recipe's input signature to the source ONNX model; record its "
    "reference outputs in onnxruntime.",
    run=run,
    consumes=("onnx",),
    produces={"onnx": "model.onnx", "reference": "reference.npz", "source": "source.json"},
    reads=("source.inputs", "source.outputs", "source.state", "source.dynamic_batch", "evaluation"),
    tools=("onnxruntime", "onnx", "numpy"),
    isolated=True,
)
