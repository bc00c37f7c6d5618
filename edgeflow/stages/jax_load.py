"""jax_load: the head of the JAX pipeline; build the function and its parameters, record
their outputs on the evaluation split (the reference)."""

from __future__ import annotations

from edgeflow.stages.base import Stage, StageContext
from edgeflow.stages.load import save_reference


def run(ctx: StageContext) -> None:
    from edgeflow.data import load_samples
    from edgeflow.frameworks import jax as jaxw
    from edgeflow.schema.sections import default_output_names
    from edgeflow.verify.runners import BatchAxes, WithConstants, batching, run_all
    from edgeflow.verify.stream import run_stream

    source = ctx.recipe.source
    model = jaxw.load_source(source)
    inputs = [s.name for s in source.inputs]  # apply_fn's positional order
    runner = WithConstants.of(jaxw.JaxRunner(model, inputs), source.inputs)
    samples = load_samples(ctx.recipe.evaluation, source.inputs, "evaluation", source.state)
    extra: dict[str, object] = {}
    axes = BatchAxes.of(ctx.recipe.evaluation.outputs, source.outputs)  # outputs batch-first
    if source.state:  # step by step, the state fed back
        streamed = run_stream(runner, samples, source, source.outputs, axes)
        outputs, extra["steps"] = streamed.outputs, streamed.steps
    else:
        outputs = run_all(runner, samples, *batching(source), "reference outputs", axes)
    names = source.outputs or default_output_names(len(outputs))
    save_reference(
        ctx,
        outputs,
        str(source.model),
        len(samples),
        names,
        framework=jaxw.version(),
        parameters=jaxw.parameter_count(model),
        **extra,
    )


STAGE = Stage(
    name="jax_load",
    description="Build the JAX function and its parameters; record reference outputs.",
    run=run,
    produces={"reference": "reference.npz", "source": "source.json"},
    reads=("source", "evaluation"),  # source: the builder's code and its arguments
    tools=("jax", "jaxlib", "flax", "numpy"),
    isolated=True,
)
