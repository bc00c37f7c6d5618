"""ingest: the head of the ONNX pipeline; bind the recipe's signature to the source file (its
constants folded in as initializers, its fed inputs pinned to the declared static shapes) and
record the source's outputs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgeflow.core.errors import EdgeflowError, first_line
from edgeflow.core.onnxfile import check_onnx_file
from edgeflow.core.onnxgraph import name_outputs
from edgeflow.core.onnxoutputs import type_outputs
from edgeflow.core.signatures import SHAPE_HINT, shape_clash
from edgeflow.core.specs import TensorSpec
from edgeflow.stages.base import Stage, StageContext
from edgeflow.stages.load import save_reference

if TYPE_CHECKING:
    import onnx


def run(ctx: StageContext) -> None:
    import numpy as np
    import onnx
    import onnxruntime as ort

    from edgeflow.data import load_samples
    from edgeflow.verify.runners import BatchAxes, OnnxRunner, WithConstants, batching, run_all
    from edgeflow.verify.stream import run_stream, step_samples

    source = ctx.recipe.source
    path = ctx.inputs["onnx"]
    check_onnx_file(path)  # an ONNX source's was checked at validate; it may have changed since
    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise EdgeflowError(f"onnxruntime cannot load {path.name}: {exc}") from exc
    declared = {s.name: s for s in source.inputs}
    actual = {i.name: i for i in session.get_inputs()}
    if set(declared) != set(actual):
        raise EdgeflowError(
            f"source.inputs names {sorted(declared)} but {path.name} has inputs {sorted(actual)}",
            "name source.inputs after the model's graph inputs",
        )
    if not session.get_outputs():
        raise EdgeflowError(f"{path.name} has no graph outputs", "export the model again")
    if source.outputs is not None and len(source.outputs) != len(session.get_outputs()):
        raise EdgeflowError(
            f"source.outputs names {len(source.outputs)} output(s), {path.name} has "
            f"{len(session.get_outputs())} ({', '.join(o.name for o in session.get_outputs())})",
            "name each graph output once, in the file's order",
        )
    for name, spec in declared.items():
        problem = shape_clash(list(actual[name].shape), spec)
        if problem:
            raise EdgeflowError(f"source.inputs: {name}: {problem} in {path.name}", SHAPE_HINT)
    model = onnx.load(str(path))
    signed = bind(model, source.inputs, source.dynamic_batch is not None)
    typed = type_outputs(signed, path.name)
    renamed = name_outputs(signed, source.outputs) if source.outputs else {}
    samples = load_samples(ctx.recipe.evaluation, source.inputs, "evaluation", source.state)
    constants = {s.name: s.constant() for s in source.inputs if s.value is not None}
    names = source.outputs or [o.name for o in session.get_outputs()]
    extra: dict[str, object] = {"typed_outputs": typed, "renamed": renamed}
    try:
        runner = WithConstants(OnnxRunner(session), constants)
        if source.state:  # step by step, the state fed back
            axes = BatchAxes.of(ctx.recipe.evaluation.outputs, names)
            streamed = run_stream(runner, samples, source, names, axes)
            outputs, extra["steps"] = streamed.outputs, streamed.steps
            steps = step_samples(samples, streamed, source)
        else:
            axes = BatchAxes.of(ctx.recipe.evaluation.outputs, names)
            outputs = run_all(runner, samples, *batching(source), "reference outputs", axes)
            steps = samples
    except EdgeflowError:
        raise
    except Exception as exc:  # onnxruntime's errors are not typed: the model fails on the data
        raise EdgeflowError(
            f"onnxruntime cannot run {path.name} on the evaluation samples: {first_line(exc)}",
            "check source.inputs (shapes, dtypes) against the model's inputs",
        ) from exc
    if constants:  # the bound graph computes what the source does with the constants fed
        feeds, _ = next(steps.batches(*batching(source)))
        bound = ort.InferenceSession(signed.SerializeToString(), providers=["CPUExecutionProvider"])
        for want, got in zip(runner.run(feeds), bound.run(None, feeds), strict=True):
            if want.shape != got.shape or not np.allclose(want, got, rtol=1e-5, atol=1e-6):
                raise AssertionError(f"binding {sorted(constants)} changed {path.name}'s outputs")
    onnx.save(signed, str(ctx.output("onnx")))
    save_reference(ctx, outputs, path.name, len(samples), names, **extra)


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
