"""What every fx rule test checks: structure, numerics, idempotence, an untouched input."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn

from edgeflow.rules.base import FxRule, RewriteContext, RuleResult
from edgeflow.rules.fx._graph import EXPORT
from edgeflow.schema.sections import TensorSpec

SAMPLES = 3  # random input batches compared, besides the declared example inputs


def gate(x: torch.Tensor) -> torch.Tensor:
    """symbolic_trace cannot branch on a traced shape; torch.export specialises the shape."""
    if x.shape[-1] > 4:
        return x * 1.5
    return x


def ctx_for(*shapes: list[int]) -> RewriteContext:
    return RewriteContext([TensorSpec(name=f"x{i}", shape=s) for i, s in enumerate(shapes)])


def random_inputs(ctx: RewriteContext, seed: int) -> tuple[torch.Tensor, ...]:
    """Normal inputs of the declared shapes (wider than example_inputs' [0, 1))."""
    gen = torch.Generator().manual_seed(seed)
    return tuple(2 * torch.randn(s.shape, generator=gen) for s in ctx.inputs)


def apply(rule: type[FxRule], options: dict[str, Any], model: Any, ctx: RewriteContext) -> Any:
    return rule().apply(model, rule.Options.model_validate(options), ctx)


def randomize_batchnorms(model: nn.Module) -> nn.Module:
    """Non-trivial running statistics and affine parameters, so folding is visible."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)
                m.weight.uniform_(0.5, 2)
                m.bias.uniform_(-1, 1)
    return model


def check_rule(
    rule: type[FxRule],
    options: dict[str, Any],
    model: nn.Module,
    ctx: RewriteContext,
    atol: float = 1e-5,
    rtol: float = 1e-5,
) -> RuleResult[Any]:
    """Apply the rule and assert: it changed something, the input is untouched, the result
    computes the same outputs (atol/rtol on the declared and SAMPLES random inputs), and a
    second application changes nothing."""
    before = {k: v.clone() for k, v in model.state_dict().items()}
    code = model.code if isinstance(model, fx.GraphModule) else None
    result = apply(rule, options, model, ctx)
    assert result.changed and result.matches > 0, result.sites
    assert isinstance(result.model, fx.GraphModule) and result.model is not model
    assert result.sources == {"graph": result.model.code}
    after = model.state_dict()
    assert before.keys() == after.keys()
    for key, value in before.items():
        assert torch.equal(value, after[key]), f"input module's {key} changed"
    if code is not None:
        assert model.code == code, "input GraphModule's code changed"
    assert_same_outputs(model, result.model, ctx, atol, rtol)
    again = apply(rule, options, result.model, ctx)
    assert not again.changed and again.matches == 0 and again.sites, again.sites
    assert again.model is result.model
    return result


def assert_same_outputs(
    expected: nn.Module, actual: nn.Module, ctx: RewriteContext, atol: float, rtol: float
) -> float:
    """The largest abs difference found; asserts it is within atol + rtol * |expected|."""
    worst = 0.0
    batches = [ctx.example_inputs()] + [random_inputs(ctx, s) for s in range(SAMPLES)]
    with torch.no_grad():
        for args in batches:
            want, got = expected(*args), actual(*args)
            torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
            for w, g in zip(_flat(want), _flat(got), strict=True):
                worst = max(worst, float((w - g).abs().max()))
    return worst


def _flat(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for v in value for t in _flat(v)]


def ops(gm: fx.GraphModule) -> Counter[str]:
    """Call nodes by kind: module class name, aten overload, function name or .method."""
    found: Counter[str] = Counter()
    for node in gm.graph.nodes:
        if node.op == "call_module":
            found[type(gm.get_submodule(node.target)).__name__] += 1
        elif node.op == "call_function":
            target = node.target
            is_aten = isinstance(target, torch._ops.OpOverload)
            found[str(target) if is_aten else getattr(target, "__name__", str(target))] += 1
        elif node.op == "call_method":
            found["." + node.target] += 1
    return found


def is_export_graph(result: RuleResult[Any]) -> bool:
    return result.graph is not None and result.graph.kind == EXPORT


def onnx_export(gm: fx.GraphModule, ctx: RewriteContext, path: Path) -> list[str]:
    """Export with the dynamo exporter into one file, run it in onnxruntime, compare with the
    graph module; return the ONNX op types."""
    import onnx
    import onnxruntime as ort

    args = ctx.example_inputs()
    torch.onnx.export(gm, args, str(path), dynamo=True, external_data=False, verbose=False)
    assert [p.name for p in path.parent.iterdir() if p.suffix == ".data"] == []
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args, strict=True)}
    with torch.no_grad():
        want = _flat(gm(*args))
    got = session.run(None, feeds)
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(torch.from_numpy(g), w, atol=1e-5, rtol=1e-5)
    return [n.op_type for n in model.graph.node]
