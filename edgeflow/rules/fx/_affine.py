"""Eval-mode BatchNorm as a per-channel affine map, and the conv / linear ops it folds into.

Both graph forms are read: call_module BatchNorm / Conv / Linear nodes (symbolic_trace), and
call_function nodes (F.batch_norm, aten.batch_norm, aten._native_batch_norm_legit_no_training,
F.conv*d, aten.conv*d, aten.convolution, F.linear, aten.linear) whose tensors are get_attr nodes.
Folding is computed in float64 and cast back to the weight's dtype.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgeflow.rules.base import Site
from edgeflow.rules.fx._graph import (
    NotConstant,
    add_constant,
    arg,
    calls,
    constant,
    label,
    module_of,
    set_arg,
)

if TYPE_CHECKING:
    import torch
    from torch.fx import GraphModule, Node


@dataclass
class BatchNorm:
    """An eval BatchNorm: y = x * scale + shift per channel (dim 1), in float64."""

    node: Node
    out: Node  # the node carrying y: `node`, or getitem 0 of a tuple-returning aten op
    scale: torch.Tensor
    shift: torch.Tensor
    label: str

    @property
    def input(self) -> Node:
        return self.node.args[0]  # type: ignore[return-value]

    def bypass(self, gm: GraphModule, value: Node) -> None:
        """Make every user of y read `value` instead, and erase the BatchNorm."""
        self.out.replace_all_uses_with(value)
        for user in list(self.node.users):
            gm.graph.erase_node(user)
        gm.graph.erase_node(self.node)


@dataclass
class LinearOp:
    """A conv or linear op with constant weight (out, in/groups, *kernel) and bias."""

    node: Node
    kind: str  # "conv" or "linear"
    weight: torch.Tensor
    bias: torch.Tensor | None
    groups: int
    zero_padding: bool
    label: str
    install: Callable[[torch.Tensor, torch.Tensor], None]


def batch_norms(gm: GraphModule, sites: list[Site]) -> Iterator[BatchNorm]:
    """Every usable eval BatchNorm in the graph; unusable ones are added to `sites`, kept."""
    for node in list(gm.graph.nodes):
        bn = batch_norm(gm, node)
        if isinstance(bn, str):
            sites.append(Site.kept(label(node, module_of(gm, node)), bn))
        elif bn is not None:
            yield bn


def batch_norm(gm: GraphModule, node: Node) -> BatchNorm | str | None:
    """The eval BatchNorm `node` computes, why it cannot be used, or None if it is none."""
    import torch
    from torch.nn.modules.batchnorm import _BatchNorm

    aten = torch.ops.aten
    module = module_of(gm, node)
    out = node
    if isinstance(module, _BatchNorm):
        if module.training:
            return "it is in training mode (it normalises with batch statistics)"
        if module.running_mean is None or module.running_var is None:
            return "it has no running statistics (track_running_stats=False)"
        tensors: list[Any] = [
            module.weight,
            module.bias,
            module.running_mean,
            module.running_var,
        ]
        eps = module.eps
    elif node.op != "call_function":
        return None
    elif node.target is torch.nn.functional.batch_norm:
        if arg(node, 5, "training", False):
            return "it is called with training=True"
        names = ((3, "weight"), (4, "bias"), (1, "running_mean"), (2, "running_var"))
        tensors = [arg(node, i, n) for i, n in names]
        eps = arg(node, 7, "eps", 1e-5)
    elif node.target in (aten.batch_norm.default, torch.batch_norm):
        if arg(node, 5, "training", False):
            return "it is called with training=True"
        tensors = [arg(node, i, "") for i in range(1, 5)]
        eps = arg(node, 7, "eps", 1e-5)
    elif node.target is aten._native_batch_norm_legit_no_training.default:
        users = list(node.users)
        if len(users) != 1 or users[0].target is not operator.getitem or users[0].args[1] != 0:
            return "its saved statistics outputs are used"
        out = users[0]
        tensors = [arg(node, i, "") for i in range(1, 5)]
        eps = arg(node, 6, "eps", 1e-5)
    else:
        return None
    if module is None:
        try:
            tensors = [constant(gm, t) for t in tensors]
        except NotConstant:
            return "its parameters are computed in the graph, not constants"
    weight, bias, mean, var = tensors
    if mean is None or var is None:
        return "it has no running statistics"
    scale = 1.0 / torch.sqrt(var.detach().double() + float(eps))
    if weight is not None:
        scale = scale * weight.detach().double()
    shift = -mean.detach().double() * scale
    if bias is not None:
        shift = shift + bias.detach().double()
    return BatchNorm(node, out, scale, shift, label(node, module))


def linear_op(gm: GraphModule, node: Node) -> LinearOp | str | None:
    """The conv / linear op `node` computes, why it cannot be used, or None if it is none."""
    from torch import nn

    module = module_of(gm, node)
    if isinstance(module, nn.Conv1d | nn.Conv2d | nn.Conv3d | nn.Linear):
        if calls(gm, str(node.target)) > 1:
            return f"{node.target} is called more than once"
        mod = module

        def install_module(weight: torch.Tensor, bias: torch.Tensor) -> None:
            mod.weight = nn.Parameter(weight, requires_grad=False)
            mod.bias = nn.Parameter(bias, requires_grad=False)

        if isinstance(module, nn.Linear):
            return LinearOp(
                node, "linear", module.weight, module.bias, 1, True, label(node, module),
                install_module,
            )  # fmt: skip
        zero = module.padding == "valid" or not _any(module.padding)
        return LinearOp(
            node, "conv", module.weight, module.bias, module.groups, zero, label(node, module),
            install_module,
        )  # fmt: skip
    if node.op != "call_function":
        return None
    kind = _function_kind(node)
    if kind is None:
        return None
    try:
        weight = constant(gm, arg(node, 1, "weight"))
        bias = constant(gm, arg(node, 2, "bias"))
    except NotConstant:
        return "its weight or bias is computed in the graph, not a constant"
    assert weight is not None
    if kind == "transposed":
        return "it is a transposed convolution"
    groups: Any = 1
    padding: Any = 0
    if kind == "conv":
        groups = arg(node, 8 if _is_convolution(node) else 6, "groups", 1)
        padding = arg(node, 4, "padding", 0)
    zero = padding == "valid" or (not isinstance(padding, str) and not _any(padding))
    like = str(arg(node, 1, "weight").target)

    def install_function(new_weight: torch.Tensor, new_bias: torch.Tensor) -> None:
        old = [arg(node, 1, "weight"), arg(node, 2, "bias")]
        set_arg(node, 1, "weight", add_constant(gm, node, like, new_weight))
        bias_like = str(old[1].target) if old[1] is not None else like.rpartition(".")[0] + ".bias"
        set_arg(node, 2, "bias", add_constant(gm, node, bias_like.lstrip("."), new_bias))

    return LinearOp(node, kind, weight, bias, groups, zero, label(node), install_function)


def _any(padding: Any) -> bool:
    return any(padding) if isinstance(padding, list | tuple) else bool(padding)


def _is_convolution(node: Node) -> bool:
    import torch

    return node.target is torch.ops.aten.convolution.default


def _function_kind(node: Node) -> str | None:
    import torch
    import torch.nn.functional as F

    aten = torch.ops.aten
    convs = {
        F.conv1d, F.conv2d, F.conv3d,
        aten.conv1d.default, aten.conv2d.default, aten.conv3d.default,
        aten.conv1d.padding, aten.conv2d.padding, aten.conv3d.padding,
    }  # fmt: skip
    if node.target in convs:
        return "conv"
    if node.target is aten.convolution.default:
        return "transposed" if arg(node, 6, "transposed", False) else "conv"
    if node.target in (F.linear, aten.linear.default):
        return "linear"
    return None


def fold_after(op: LinearOp, bn: BatchNorm) -> None:
    """Install weights computing bn(op(x)): scale each output channel, shift the bias."""
    w = op.weight.detach().double()
    b = op.bias.detach().double() if op.bias is not None else w.new_zeros(w.shape[0])
    view = (-1,) + (1,) * (w.dim() - 1)
    new_w = w * bn.scale.view(view)
    new_b = b * bn.scale + bn.shift
    op.install(new_w.to(op.weight.dtype), new_b.to(op.weight.dtype))


def fold_before(op: LinearOp, bn: BatchNorm) -> None:
    """Install weights computing op(bn(x)): scale each input channel, fold the shift into the
    bias. Exact for linear ops and for convolutions without zero padding and groups == 1."""
    w = op.weight.detach().double()
    b = op.bias.detach().double() if op.bias is not None else w.new_zeros(w.shape[0])
    view = (1, -1) + (1,) * (w.dim() - 2)
    new_w = w * bn.scale.view(view)
    new_b = b + (w * bn.shift.view(view)).flatten(1).sum(1)
    op.install(new_w.to(op.weight.dtype), new_b.to(op.weight.dtype))


def channels_match(op: LinearOp, bn: BatchNorm, after: bool) -> bool:
    """Whether the BatchNorm's channel count is the op's output (after) or input channels."""
    dim = 0 if after else 1
    return int(op.weight.shape[dim]) == int(bn.scale.numel()) and (after or op.groups == 1)
