"""verify: run the artifact in the target's real runtime and compare it with the source model."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgeflow.core.errors import EdgeflowError
from edgeflow.stages.base import Stage, StageContext
from edgeflow.stages.convert import RUNTIMES
from edgeflow.targets.base import NotVerified

if TYPE_CHECKING:  # imported where used: the edgeflow process itself never needs numpy
    import numpy as np


def run(ctx: StageContext) -> None:

    from edgeflow.data import load_samples
    from edgeflow.postprocess import HostChained, load_host
    from edgeflow.targets import backend
    from edgeflow.verify.compare import percentile
    from edgeflow.verify.judge import Comparison, accuracy_of
    from edgeflow.verify.runners import (
        BatchAxes,
        batching,
        deployment_batch,
        latency_ms,
        run_all,
    )
    from edgeflow.verify.stream import drift, first_step, last_steps, run_stream

    recipe, profile = ctx.recipe, ctx.profile
    source = recipe.source
    samples = load_samples(recipe.evaluation, source.inputs, "evaluation", source.state)
    if samples.labels is None and recipe.evaluation.metric == "top1":
        raise EdgeflowError(
            f"evaluation dataset {recipe.evaluation.dataset} has no 'label' array",
            "top-1 accuracy needs labels: return a 'label' array from the dataset, or set "
            "evaluation.metric: agreement and remove verify.max_accuracy_drop to compare with "
            "the source model only",
        )
    reference, names = read_reference(ctx.inputs["reference"], recipe.source.outputs)
    _declared_outputs_exist(recipe.evaluation.outputs, names)
    convert_info = ctx.read("convert").dump()
    try:
        runner = backend(profile).open_runner(ctx.inputs["artifact"], convert_info)
        if "host" in convert_info:  # the artifact, then the generated host post-processing
            runner = HostChained(runner, load_host(ctx.inputs["artifact"]))
    except NotVerified as exc:  # the runtime cannot run here: say so, compare nothing
        ctx.write(
            "verify",
            {
                "runtime": profile.backend,
                "samples": len(samples),
                "metric": recipe.evaluation.metric,
                "not_verified": str(exc),
                "accuracy": None,
                "agreement": None,
                "latency_ms": None,
                "size_bytes": convert_info["size_bytes"],
                "extra": {},
            },
        )
        return
    stream = None
    axes = BatchAxes.of(recipe.evaluation.outputs, names)  # the reference is batch-first too
    if source.state:  # step by step, the state fed back, as the source was run
        outputs = run_stream(runner, samples, source, names, axes).outputs
    else:
        outputs = run_all(runner, samples, *batching(source), "evaluation", axes)
    comparison = Comparison.of(recipe.evaluation, recipe.verify, source.inputs, names)
    try:
        agreement = comparison.agreement(reference, outputs)
    except ValueError as exc:
        raise EdgeflowError(f"the artifact's outputs do not match the source's: {exc}") from exc
    if samples.steps is not None:
        stream = drift(reference, outputs, names, samples.steps)
        feeds = first_step(samples, source, deployment_batch(source))  # latency: one step
    else:
        feeds, _ = next(samples.batches(deployment_batch(source), fixed=True))
    runs = recipe.verify.latency_runs
    times = latency_ms(runner, feeds, recipe.verify.warmup_runs, runs)
    steps = None
    if "onnx_reference" in ctx.inputs:  # a TensorFlow source through ONNX: what each step added
        from edgeflow.verify.compare import step_errors

        via, _ = read_reference(ctx.inputs["onnx_reference"], names)
        steps = {
            "onnx_to_artifact": step_errors(via, outputs, names),
            "source_to_artifact": step_errors(reference, outputs, names),
        }
    extra = runner.extra_metrics() if hasattr(runner, "extra_metrics") else {}
    accuracy = None  # agreement, detections: compared with the source model only
    if samples.labels is not None and recipe.evaluation.metric == "top1":
        ref, out = reference, outputs
        if samples.steps is not None and samples.labels.ndim == 1:  # a label per sequence
            ref = [last_steps(r, samples.steps) for r in reference]
            out = [last_steps(o, samples.steps) for o in outputs]
        accuracy = accuracy_of(agreement, ref, out, samples.labels)
    ctx.write(
        "verify",
        {
            "runtime": profile.backend,
            "samples": len(samples),
            "metric": recipe.evaluation.metric,
            "accuracy": accuracy,
            "agreement": agreement,
            "latency_ms": {
                "p50": percentile(times, 50),
                "p90": percentile(times, 90),
                "runs": runs,
                "warmup": recipe.verify.warmup_runs,
                "samples": [round(t, 6) for t in times],  # for the report's latency plot
            },
            "size_bytes": convert_info["size_bytes"],
            "extra": extra,
            "stream": stream,  # a stateful model's per-step error and its drift
            **({"steps": steps} if steps is not None else {}),
        },
    )


def read_reference(path: Any, declared: list[str] | None) -> tuple[list[np.ndarray], list[str]]:
    """The source model's outputs (arr_0, arr_1, ...) and their names: those the load or
    ingest stage stored beside them, else the recipe's source.outputs or the export's."""
    import numpy as np

    from edgeflow.schema.sections import default_output_names

    with np.load(path) as ref:
        count = sum(1 for f in ref.files if f.startswith("arr_"))
        reference = [ref[f"arr_{i}"] for i in range(count)]
        stored = [str(n) for n in ref["names"]] if "names" in ref.files else None
    names = stored or declared or default_output_names(count)
    return reference, names if len(names) == count else default_output_names(count)


def _declared_outputs_exist(declared: dict[str, Any], names: list[str]) -> None:
    from edgeflow.core.suggest import did_you_mean

    for name in declared:
        if name not in names:
            raise EdgeflowError(
                f"evaluation.outputs.{name}: the model has no output '{name}' (its outputs: "
                f"{', '.join(names)})",
                did_you_mean(name, names) or "name the outputs as source.outputs does",
            )


STAGE = Stage(
    name="verify",
    description="Run the artifact in its runtime; accuracy, agreement, latency and size.",
    run=run,
    consumes=("artifact", "convert", "reference"),
    optional=("onnx_reference",),  # the ONNX model's outputs (tf_export): the step's error
    produces={"verify": "verify.json"},
    reads=(
        "evaluation",
        "source.inputs",
        "source.outputs",
        "source.state",
        "source.dynamic_batch",
        "verify.latency_runs",
        "verify.warmup_runs",
        "verify.detections",
        "verify.task_metric",  # computed here, from the outputs
        "target",
    ),
    tools=(*RUNTIMES, "numpy"),
    isolated=True,
)
