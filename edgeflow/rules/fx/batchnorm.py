"""fx.remove_batchnorm: remove BatchNorm layers that do nothing, or fold them where exact.

An eval BatchNorm computes x * scale + shift per channel. It is an identity when every
|scale - 1| and |shift| is at most `atol`; it is then removed. With `fold: true` any other eval
BatchNorm is folded into the conv / linear op before it (output channels), or else into the
linear op, or conv without padding and with groups == 1, after it (input channels).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from edgeflow.rules.base import FxRule, RewriteContext, RuleOptions, RuleResult, Site
from edgeflow.rules.fixes import Fix
from edgeflow.rules.fx._affine import (
    BatchNorm,
    LinearOp,
    batch_norms,
    channels_match,
    fold_after,
    fold_before,
    linear_op,
)
from edgeflow.rules.fx._graph import finish, propagate_shapes, shape, to_graph_module

if TYPE_CHECKING:
    from torch.fx import GraphModule, Node


class RemoveBatchnorm(FxRule):
    """Identity BatchNorms are removed; with fold, others are folded into a neighbour."""

    name = "fx.remove_batchnorm"
    description = "Remove identity BatchNorm layers; with fold: true, fold the others."
    fixes = (Fix.op("BatchNormalization"),)
    example = (
        "h = self.bn(self.fc(x))  # bn: mean 0, var 1, weight 1, bias 0",
        "h = self.fc(x)",
    )

    class Options(RuleOptions):
        """fold: also fold non-identity BatchNorms into the Linear/Conv before or after them
        where that is exact; atol: the largest |scale - 1| and |shift| of a BatchNorm that is
        removed as an identity."""

        fold: bool = False
        # Largest |scale - 1| and |shift| of a BatchNorm removed as an identity.
        atol: float = Field(1e-5, ge=0)

    def tolerance(self, opts: Any) -> float | None:
        # An identity within atol changes an activation of magnitude m by about atol * (m + 1):
        # this assumes activations below ~10 where a BatchNorm is removed.
        return max(1e-5, 10 * float(opts.atol))

    def apply(self, model: Any, opts: Any, ctx: RewriteContext) -> RuleResult[Any]:
        gm, how = to_graph_module(model, ctx)
        shapes_known = False
        sites: list[Site] = []
        for bn in batch_norms(gm, sites):
            scale_err = float((bn.scale - 1).abs().max())
            shift_err = float(bn.shift.abs().max())
            errors = f"max |scale - 1| {scale_err:.2g}, max |shift| {shift_err:.2g}"
            if scale_err <= opts.atol and shift_err <= opts.atol:
                bn.bypass(gm, bn.input)
                sites.append(Site.changed(bn.label, f"removed: an identity ({errors})"))
                continue
            if not opts.fold:
                why = f"not an identity ({errors}); fold: true folds it into a conv / linear op"
                sites.append(Site.kept(bn.label, why))
                continue
            if not shapes_known and not _has_shapes(gm):
                propagate_shapes(gm, ctx)
            shapes_known = True
            sites.append(_fold(gm, bn))
        if not sites:
            sites.append(Site.not_applicable("no BatchNorm in the graph"))
        return finish(model, gm, how, sites)


def _has_shapes(gm: GraphModule) -> bool:
    return all(shape(n) is not None for n in gm.graph.nodes if n.op.startswith("call"))


def _fold(gm: GraphModule, bn: BatchNorm) -> Site:
    """Fold bn into the op before it, else the op after it: what was done, or why not."""
    why: list[str] = []
    before = _neighbour(gm, bn.input)
    if isinstance(before, LinearOp):
        problem = _fold_problem(before, bn, after=True)
        if not problem:
            fold_after(before, bn)
            bn.bypass(gm, before.node)
            into = f"folded into the preceding {before.label} (output channels)"
            return Site.changed(bn.label, into)
        why.append(problem)
    elif isinstance(before, str):
        why.append(f"the op before it: {before}")
    users = list(bn.out.users)
    after = _neighbour(gm, users[0]) if len(users) == 1 else None
    if isinstance(after, LinearOp) and after.node.args[0] is bn.out:
        problem = _fold_problem(after, bn, after=False)
        if not problem:
            fold_before(after, bn)
            bn.bypass(gm, bn.input)
            into = f"folded into the following {after.label} (input channels)"
            return Site.changed(bn.label, into)
        why.append(problem)
    elif isinstance(after, str):
        why.append(f"the op after it: {after}")
    detail = "; ".join(why) or "no conv / linear op next to it"
    return Site.kept(bn.label, f"cannot fold it: {detail}")


def _neighbour(gm: GraphModule, node: Any) -> LinearOp | str | None:
    return linear_op(gm, node) if hasattr(node, "op") else None


def _fold_problem(op: LinearOp, bn: BatchNorm, after: bool) -> str:
    """Why bn cannot be folded into op (after: op feeds bn), or "" when it can."""
    if after and len(op.node.users) != 1:
        return f"{op.label}'s output has other users"
    if not channels_match(op, bn, after):
        return f"{op.label} has other channel counts or groups"
    if not after and op.kind == "conv" and not op.zero_padding:
        return f"{op.label} pads its input (the padding would not be normalised)"
    if op.kind == "linear":
        node: Node = op.node if after else bn.out
        dims = shape(node)
        if dims is None or len(dims) != 2:
            rank = len(dims) if dims else None
            return f"{op.label}'s features are not BatchNorm's channel dim (rank {rank})"
    return ""
