"""fx.fuse_conv_bn: fold eval-mode BatchNorm into the convolution that feeds it."""

from __future__ import annotations

from typing import Any

from edgeflow.rules.base import FxRule, RewriteContext, RuleOptions, RuleResult, Site
from edgeflow.rules.fixes import Fix
from edgeflow.rules.fx._affine import batch_norms, channels_match, fold_after, linear_op
from edgeflow.rules.fx._graph import finish, to_graph_module


class FuseConvBn(FxRule):
    """conv -> BatchNorm becomes one conv with scaled weights and a shifted bias."""

    name = "fx.fuse_conv_bn"
    description = "Fold eval-mode BatchNorm into the preceding Conv1d/2d/3d."
    fixes = (Fix.op("BatchNormalization"),)
    example = (
        "conv = self.conv(x); bn = self.bn(conv)",
        "conv = self.conv(x)  # conv.weight *= gamma/sqrt(var+eps); bias shifted",
    )

    class Options(RuleOptions):
        pass

    def apply(self, model: Any, opts: Any, ctx: RewriteContext) -> RuleResult[Any]:
        from torch.fx import Node

        gm, how = to_graph_module(model, ctx)
        sites: list[Site] = []
        for bn in batch_norms(gm, sites):
            producer = bn.input
            conv = linear_op(gm, producer) if isinstance(producer, Node) else None
            if conv is None or isinstance(conv, str) or conv.kind != "conv":
                why = conv if isinstance(conv, str) else "its input is not a convolution"
                sites.append(Site.kept(bn.label, why))
            elif len(producer.users) != 1:
                sites.append(Site.kept(bn.label, f"{conv.label}'s output has other users"))
            elif not channels_match(conv, bn, after=True):
                sites.append(Site.kept(bn.label, f"channel counts differ from {conv.label}"))
            else:
                fold_after(conv, bn)
                bn.bypass(gm, producer)
                sites.append(Site.changed(bn.label, f"folded into {conv.label}"))
        if not sites:
            sites.append(Site.not_applicable("no BatchNorm in the graph"))
        return finish(model, gm, how, sites)
