"""fx.remove_dropout: drop Dropout layers and calls, which are identities at inference."""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

from edgeflow.rules.base import FxRule, RewriteContext, RuleOptions, RuleResult, Site
from edgeflow.rules.fixes import Fix
from edgeflow.rules.fx._graph import arg, finish, label, module_of, to_graph_module

if TYPE_CHECKING:
    from torch.fx import GraphModule, Node


TRAINING = "removed, though in training mode: it was random at inference, now eval semantics"


class RemoveDropout(FxRule):
    """Every dropout's users read its input instead (eval semantics)."""

    name = "fx.remove_dropout"
    description = "Remove Dropout modules and dropout calls (eval semantics)."
    fixes = (Fix.op("Dropout"),)
    example = ("h = self.drop(self.fc(x))", "h = self.fc(x)")

    class Options(RuleOptions):
        pass

    def apply(self, model: Any, opts: Any, ctx: RewriteContext) -> RuleResult[Any]:
        gm, how = to_graph_module(model, ctx)
        sites: list[Site] = []
        for node in list(gm.graph.nodes):
            found = _dropout(gm, node)
            if found is None:
                continue
            out, training = found
            if out is None:
                sites.append(Site.kept(label(node), "its mask output is used"))
                continue
            name = label(node, module_of(gm, node))
            out.replace_all_uses_with(node.args[0])
            for user in list(node.users):
                gm.graph.erase_node(user)
            gm.graph.erase_node(node)
            sites.append(Site.changed(name, TRAINING if training else "removed (inactive)"))
        if not sites:
            sites.append(Site.not_applicable("no dropout in the graph"))
        return finish(model, gm, how, sites)


def _dropout(gm: GraphModule, node: Node) -> tuple[Node | None, bool] | None:
    """(the node carrying the dropout's output or None, whether it is active), or None when
    `node` is no dropout."""
    import torch
    import torch.nn.functional as F
    from torch.nn.modules.dropout import _DropoutNd

    aten = torch.ops.aten
    module = module_of(gm, node)
    if isinstance(module, _DropoutNd):
        return node, module.training
    if node.op != "call_function":
        return None
    functional = {F.dropout, F.dropout1d, F.dropout2d, F.dropout3d}
    functional |= {F.alpha_dropout, F.feature_alpha_dropout}
    if node.target in functional:
        return node, bool(arg(node, 2, "training", True))
    ops = {
        torch.dropout, torch.dropout_, torch.feature_dropout, torch.feature_dropout_,
        torch.alpha_dropout, torch.alpha_dropout_,
        torch.feature_alpha_dropout, torch.feature_alpha_dropout_,
    }  # fmt: skip
    for name in ("dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout"):
        ops |= {getattr(aten, name).default, getattr(aten, name + "_").default}
    if node.target in ops:
        return node, bool(arg(node, 2, "train", True))
    if node.target is aten.native_dropout.default:
        users = list(node.users)
        if len(users) == 1 and users[0].target is operator.getitem and users[0].args[1] == 0:
            return users[0], bool(arg(node, 2, "train", True))
        return None, True
    return None
