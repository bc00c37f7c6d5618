"""tf_load: the head of the TensorFlow pipelines; load the Keras model or SavedModel, check
it against the recipe's signature, record its outputs on the evaluation split (the reference),
and write the canonical SavedModel that both conversion paths start from."""

from __future__ import annotations

from collections.abc import Sequence

from edgeflow.core.errors import EdgeflowError
from edgeflow.core.savedmodel import GraphOpsRefused
from edgeflow.stages.base import Stage, StageContext
from edgeflow.stages.load import save_reference


def run(ctx: StageContext) -> None:
    import numpy as np

    from edgeflow.data import load_samples
    from edgeflow.frameworks import tensorflow as tfw
    from edgeflow.verify.runners import BatchAxes, WithConstants, batching, run_all
    from edgeflow.verify.stream import run_stream

    source = ctx.recipe.source
    try:
        model = tfw.load(source)
    except GraphOpsRefused as exc:  # read again here: the folder may have changed since
        title = "the SavedModel's graph reaches outside the model"
        raise EdgeflowError(
            located(ctx, [("source.model", exc.message, exc.hint)], title)
        ) from None
    problems = tfw.signature_problems(model, source.inputs)
    if problems:
        raise EdgeflowError(located(ctx, problems), "declare the model's own inputs")
    names = tfw.output_names(model, source.outputs)
    samples = load_samples(ctx.recipe.evaluation, source.inputs, "evaluation", source.state)
    runner = WithConstants.of(tfw.TfRunner(model), source.inputs)
    extra: dict[str, object] = {}
    axes = BatchAxes.of(ctx.recipe.evaluation.outputs, names)  # outputs batch-first
    if source.state:  # step by step, the state fed back
        streamed = run_stream(runner, samples, source, names, axes)
        outputs, extra["steps"] = streamed.outputs, streamed.steps
    else:
        outputs = run_all(runner, samples, *batching(source), "reference outputs", axes)
    saved = ctx.output("saved_model")
    tfw.save_canonical(model, source.inputs, names, saved)
    # the canonical SavedModel computes what the source does (it is what gets converted)
    if source.state:  # one step from the initial state
        from edgeflow.verify.runners import deployment_batch
        from edgeflow.verify.stream import first_step

        feeds = first_step(samples, source, deployment_batch(source))
    else:
        feeds, _ = next(samples.batches(*batching(source)))
    wanted = runner.run(feeds)
    for signature in (k for k in tfw.signatures(saved) if k in (tfw.SIGNATURE, tfw.LOOPS)):
        canonical = tfw.SavedModelRunner(saved, names, signature)
        for name, want, got in zip(names, wanted, canonical.run(feeds), strict=True):
            if want.shape != got.shape or not np.allclose(want, got, rtol=1e-5, atol=1e-6):
                raise AssertionError(f"the canonical SavedModel's {signature} changed '{name}'")
    parameters = int(model.keras.count_params()) if model.keras is not None else None
    save_reference(
        ctx,
        outputs,
        model.what,
        len(samples),
        names,
        framework=f"tensorflow {tfw.require().__version__}",
        parameters=parameters,
        **extra,
    )


def located(
    ctx: StageContext,
    problems: Sequence[tuple[str, str, str | None]],
    title: str = "the recipe does not match the model",
) -> str:
    """Problems the model shows (its signature, its graph) at their keys in the recipe file,
    every one."""
    from edgeflow.core.loader import locate, read_yaml

    path = ctx.loaded.path
    tree = read_yaml(path)
    found = [locate(tree, path, {}, key, message, hint) for key, message, hint in problems]
    return f"{title}:\n" + "\n".join(p.render() for p in found)


STAGE = Stage(
    name="tf_load",
    description="Load the TensorFlow model, record reference outputs, and write the SavedModel "
    "both conversion paths start from.",
    run=run,
    produces={
        "reference": "reference.npz",
        "source": "source.json",
        "saved_model": "saved_model",
    },
    reads=("source", "evaluation"),  # source: the model file or folder, or the builder's code
    tools=("tensorflow", "keras", "numpy"),
    isolated=True,
)
