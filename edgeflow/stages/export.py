"""export: torch.onnx.export the module to one self-contained ONNX file."""

from __future__ import annotations

from collections import Counter

from edgeflow.core.errors import EdgeflowError, first_line
from edgeflow.core.onnxgraph import name_outputs
from edgeflow.schema.sections import default_output_names, fed_inputs
from edgeflow.stages.base import Stage, StageContext


def run(ctx: StageContext) -> None:
    import onnx
    import torch

    from edgeflow.source import bound_module, example_inputs, flat_tensors
    from edgeflow.stages._rewritten import rewritten_module, specs_of

    source, options = ctx.recipe.source, ctx.recipe.export
    auto = ctx.read_json("rewrite").get("auto")  # the rules `rewrites: auto` chose
    chosen = specs_of(auto["chosen"]) if auto else ()
    module, _, _ = rewritten_module(ctx.recipe, ctx.loaded.path.parent, False, chosen)
    module = bound_module(module, source.inputs)  # constants traced as constants
    dynamic = source.dynamic_batch
    # torch.export specialises dimensions of size 1, so a dynamic batch is traced at size >= 2.
    args = example_inputs(fed_inputs(source.inputs), max(2, dynamic.min) if dynamic else None)
    with torch.inference_mode():
        result = module(*args)
    n_out = len(flat_tensors(result))
    input_names = [s.name for s in fed_inputs(source.inputs)]
    output_names = source.outputs or default_output_names(n_out)
    # The exporter's own names for internal tensors may be the recipe's (the dynamo exporter
    # calls an nn.Embedding's output `embedding`, then writes that name twice): export with
    # placeholders, then name_outputs frees the recipe's names.
    placeholders = [f"edgeflow_output_{i}" for i in range(n_out)]
    if len(output_names) != n_out:
        raise EdgeflowError(
            f"source.outputs: the module returns {n_out} tensor(s), {len(output_names)} named "
            f"({', '.join(output_names)})",
            "name each tensor the module returns once, in its order",
        )
    kwargs: dict = {}
    if dynamic is not None:
        axes = {s.name: s.batch_axis for s in fed_inputs(source.inputs)}
        if options.exporter == "dynamo":
            batch = torch.export.Dim("batch", min=dynamic.min, max=dynamic.max)
            kwargs["dynamic_shapes"] = tuple(
                {} if axes[name] is None else {axes[name]: batch} for name in input_names
            )
        else:
            kwargs["dynamic_axes"] = {
                name: {axes[name]: "batch"} for name in input_names if axes[name] is not None
            } | {name: {0: "batch"} for name in placeholders}
    if options.exporter == "dynamo":
        kwargs.update(dynamo=True, external_data=False, verbose=False)
    else:
        kwargs.update(dynamo=False)
    path = ctx.output("onnx")
    try:
        torch.onnx.export(
            module,
            args,
            str(path),
            opset_version=options.opset,
            input_names=input_names,
            output_names=placeholders,
            **kwargs,
        )
    except Exception as exc:
        raise EdgeflowError(
            f"torch.onnx.export ({options.exporter}) failed: {first_line(exc)}",
            "`edgeflow explain RECIPE` names the rules that fix the construct named above "
            "(+rewrites=[auto] tries them), or try export.exporter=torchscript",
        ) from exc
    model = onnx.load(str(path))  # raises if it refers to external data that is not there
    extra = sorted(p.name for p in ctx.out_dir.iterdir() if p.suffix == ".data")
    if extra:
        raise AssertionError(f"export wrote external data {extra}; expected one file")
    renamed = name_outputs(model, output_names)
    onnx.save(model, str(path))
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    ctx.write_json(
        "export",
        {
            "exporter": options.exporter,
            "opset": opset,
            "inputs": input_names,
            "outputs": output_names,
            "renamed": renamed,  # internal tensors that held a name of source.outputs
            "nodes": len(model.graph.node),
            "ops": dict(Counter(n.op_type for n in model.graph.node)),
        },
    )


STAGE = Stage(
    name="export",
    description="Export the PyTorch module to a self-contained ONNX file.",
    run=run,
    consumes=("rewrite",),
    produces={"onnx": "model.onnx", "export": "export.json"},
    reads=("source", "export", "rewrites"),
    tools=("torch", "onnx", "onnxscript"),
    rule_levels=("ast", "fx"),
    isolated=True,
)
