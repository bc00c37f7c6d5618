"""load: build the PyTorch module with its weights; record its outputs on the evaluation split."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgeflow.core.errors import EdgeflowError
from edgeflow.stages.base import Stage, StageContext

if TYPE_CHECKING:  # imported where used: the edgeflow process itself never needs numpy
    import numpy as np

    from edgeflow.checkpoint import WeightsError


def run(ctx: StageContext) -> None:
    from edgeflow.checkpoint import WeightsError
    from edgeflow.data import load_samples
    from edgeflow.source import ModuleRunner, build_module, run_module
    from edgeflow.verify.runners import BatchAxes, batching
    from edgeflow.verify.stream import run_stream

    recipe = ctx.recipe
    source = recipe.source
    notes: list[str] = []
    try:
        module = build_module(source, notes)
    except WeightsError as exc:  # at the key that picks the weights
        raise EdgeflowError(located(ctx, exc), exc.hint) from exc
    for note in notes:
        ctx.warn(note)
    samples = load_samples(recipe.evaluation, source.inputs, "evaluation", source.state)
    detections = recipe.evaluation.metric == "detections"
    limit = recipe.verify.detections.max_detections if detections else None
    extra: dict[str, object] = {"weights_note": notes[0]} if notes else {}
    axes = BatchAxes.of(recipe.evaluation.outputs, source.outputs)  # outputs batch-first
    if source.state:  # step by step, the state fed back
        runner = ModuleRunner(module, source.inputs)
        streamed = run_stream(runner, samples, source, source.outputs, axes)
        outputs, extra["steps"] = streamed.outputs, streamed.steps
    else:
        outputs = run_module(module, samples, source.inputs, batching(source), limit, axes)
    parameters = int(sum(p.numel() for p in module.parameters()))
    save_reference(
        ctx,
        outputs,
        str(source.model),
        len(samples),
        source.outputs,
        parameters=parameters,
        **extra,
    )


def located(ctx: StageContext, exc: WeightsError) -> str:
    """The weights' problem at its recipe key: `file:line:col: key: message`."""
    from edgeflow.core.loader import locate, read_yaml

    path = ctx.loaded.path
    return locate(read_yaml(path), path, {}, exc.key, exc.message, None).render()


def save_reference(
    ctx: StageContext,
    outputs: list[np.ndarray],
    model: str,
    samples: int,
    names: list[str] | None,
    **extra: object,
) -> None:
    """Write the source model's outputs, batch-first (the verify stage's reference), and a
    summary; a source that outputs NaN or Inf on the user's own data cannot be a reference."""
    import numpy as np

    from edgeflow.verify.compare import non_finite_samples

    for i, output in enumerate(outputs):
        bad = non_finite_samples(output)
        if bad.any():
            name = f" '{names[i]}'" if names and i < len(names) else ""
            raise EdgeflowError(
                f"the source model {model} outputs NaN or Inf on {int(bad.sum())} of "
                f"{len(bad)} evaluation samples (output {i}{name}; first at sample "
                f"{int(bad.argmax())}): there is nothing finite to compare an artifact with",
                "run the model on those samples in Python: check its weights and that the "
                "data is scaled as the model expects",
            )
    from edgeflow.schema.sections import default_output_names

    # the names beside the arrays: what evaluation.outputs and the report call each output
    named = names if names and len(names) == len(outputs) else default_output_names(len(outputs))
    np.savez(ctx.output("reference"), *outputs, names=np.array(named))
    summary = {
        "model": model,
        "inputs": [s.model_dump(mode="json") for s in ctx.recipe.source.inputs],
        "output_shapes": [list(o.shape[1:]) for o in outputs],
        "evaluation_samples": samples,
        **extra,
    }
    ctx.write_json("source", summary)


STAGE = Stage(
    name="load",
    description="Build the PyTorch module, load its weights, record reference outputs.",
    run=run,
    produces={"reference": "reference.npz", "source": "source.json"},
    reads=("source", "evaluation", "verify.detections.max_detections"),  # source: its state too
    tools=("torch", "numpy"),
    isolated=True,
)
