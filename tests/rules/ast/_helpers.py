"""What every ast.* rule test checks: the original is untouched, numbers agree, idempotence."""

from __future__ import annotations

import copy
from typing import Any

import torch

from edgeflow.rules.ast._source import rewritten_sources
from edgeflow.rules.base import AstRule, RewriteContext, RuleResult
from edgeflow.schema.sections import TensorSpec


def specs(*shapes: tuple[int, ...], dtype: str = "float32") -> list[TensorSpec]:
    return [TensorSpec(name=f"x{i}", shape=list(s), dtype=dtype) for i, s in enumerate(shapes)]  # type: ignore[arg-type]


def inputs(spec_list: list[TensorSpec], seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Random inputs of the declared shapes (normal, so that signs vary)."""
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(s.shape, generator=gen) for s in spec_list)


def apply(
    rule: type[AstRule], model: torch.nn.Module, spec_list: list[TensorSpec], **options: Any
) -> RuleResult[Any]:
    return rule().apply(model, rule.Options(**options), RewriteContext(spec_list))


def check(
    rule: type[AstRule],
    model: torch.nn.Module,
    spec_list: list[TensorSpec],
    seeds: int = 5,
    atol: float = 1e-6,
    **options: Any,
) -> RuleResult[Any]:
    """Apply the rule and check: it changed something, the original module is untouched, the
    rewritten module computes the same on random inputs, and applying it again is a no-op."""
    model.eval()
    before_classes = [type(m) for m in model.modules()]
    before_state = copy.deepcopy(model.state_dict())
    result = apply(rule, model, spec_list, **options)
    assert result.changed, result.sites
    assert [type(m) for m in model.modules()] == before_classes
    for key, value in model.state_dict().items():
        assert torch.equal(value, before_state[key]), key
    again = apply(rule, result.model, spec_list, **options)
    assert not again.changed, again.sites
    assert rewritten_sources(again.model) == rewritten_sources(result.model)
    with torch.no_grad():
        for seed in range(seeds):
            args = inputs(spec_list, seed)
            expected = model(*args)
            once, twice = result.model(*args), again.model(*args)
            torch.testing.assert_close(once, expected, atol=atol, rtol=1e-5, check_dtype=False)
            torch.testing.assert_close(twice, once, atol=0, rtol=0)
    return result


def max_abs_diff(a: Any, b: Any) -> float:
    if isinstance(a, tuple | list):
        return max(max_abs_diff(x, y) for x, y in zip(a, b, strict=True))
    return float((a.double() - b.double()).abs().max())
