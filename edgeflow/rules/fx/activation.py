"""fx.replace_activation: swap an activation for an equivalent or cheaper formulation.

GELU's tanh approximation differs from exact (erf) GELU by at most 4.73e-4 per activation,
at |x| = 2.70 (measured in float64 on a 1e-5 grid over [-10, 10]); the other exact pairs differ
by float32 rounding only (silu: 2.4e-7 on randn inputs; hardswish, hardsigmoid: 0).
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, model_validator

from edgeflow.rules.base import FxRule, RewriteContext, RuleOptions, RuleResult, Site
from edgeflow.rules.fixes import Fix
from edgeflow.rules.fx._graph import arg, finish, label, module_of, order, to_graph_module
from edgeflow.schema.sections import user_error

if TYPE_CHECKING:
    from torch.fx import GraphModule, Node

# (from, to) -> the formula `to` computes
PAIRS: dict[tuple[str, str], str] = {
    ("silu", "x_sigmoid"): "x * sigmoid(x)",
    ("gelu", "gelu_tanh"): "0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))",
    ("relu", "relu6"): "min(max(x, 0), 6)",
    ("hardswish", "x_relu6"): "x * relu6(x + 3) / 6",
    ("hardsigmoid", "relu6"): "relu6(x + 3) / 6",
}
GELU_TANH_MAX_ABS_ERROR = 4.73e-4


def _supported() -> str:
    return ", ".join(f"{a} -> {b}" for a, b in PAIRS)


class ReplaceActivation(FxRule):
    """Every matching activation module or call is replaced by the target formula."""

    name = "fx.replace_activation"
    description = "Replace an activation: silu, gelu, relu, hardswish, hardsigmoid."
    fixes = (Fix.op("Gelu"), Fix.op("Erf"), Fix.op("HardSwish"), Fix.op("HardSigmoid"))
    fix_options: ClassVar[dict[Fix, dict[str, Any]]] = {
        Fix.op("Gelu"): {"from": "gelu", "to": "gelu_tanh"},
        Fix.op("Erf"): {"from": "gelu", "to": "gelu_tanh"},  # exact GELU exports as Erf
        Fix.op("HardSwish"): {"from": "hardswish", "to": "x_relu6"},
        Fix.op("HardSigmoid"): {"from": "hardsigmoid", "to": "relu6"},
    }
    example = ("y = F.silu(x)", "y = x * torch.sigmoid(x)")

    class Options(RuleOptions):
        """from: the activation to replace; to: its replacement (silu -> x_sigmoid,
        gelu -> gelu_tanh, relu -> relu6, hardswish -> x_relu6, hardsigmoid -> relu6)."""

        from_: Literal["silu", "gelu", "relu", "hardswish", "hardsigmoid"] = Field(alias="from")
        to: str

        @model_validator(mode="after")
        def _pair_is_supported(self) -> ReplaceActivation.Options:
            if (self.from_, self.to) not in PAIRS:
                choices = [b for a, b in PAIRS if a == self.from_]
                raise user_error(
                    f"cannot replace {self.from_} with '{self.to}' (supported: {_supported()})",
                    f"write to: {choices[0]}",
                    at="to",
                )
            return self

    def tolerance(self, opts: Any) -> float | None:
        if opts.from_ == "relu":
            return None  # relu6 clips at 6: a different function on purpose
        if opts.from_ == "gelu":
            return 1e-3  # about twice the per-activation error, for amplification downstream
        return 1e-5

    def apply(self, model: Any, opts: Any, ctx: RewriteContext) -> RuleResult[Any]:
        gm, how = to_graph_module(model, ctx)
        sites: list[Site] = []
        formula = PAIRS[opts.from_, opts.to]
        for node in list(gm.graph.nodes):
            found = _site(gm, node, opts.from_)
            if found is None:
                continue
            x, inplace = found
            name = label(node, module_of(gm, node))
            if inplace and not _inplace_is_safe(gm, node, x, order(gm)):
                sites.append(Site.kept(name, "it works in place on a tensor read elsewhere"))
                continue
            aten = type(node.target).__name__ == "OpOverload"
            with gm.graph.inserting_before(node):
                new = _build(gm.graph, x, (opts.from_, opts.to), aten)
            node.replace_all_uses_with(new)
            gm.graph.erase_node(node)
            sites.append(Site.changed(name, f"{opts.from_} replaced with {formula}"))
        if not sites:
            sites.append(Site.not_applicable(f"no {opts.from_} in the graph"))
        return finish(model, gm, how, sites)


def _site(gm: GraphModule, node: Node, kind: str) -> tuple[Node, bool] | None:
    """(input, works in place) when `node` is a `kind` activation, else None."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    module = module_of(gm, node)
    if module is not None:
        types = {
            "silu": nn.SiLU, "gelu": nn.GELU, "relu": nn.ReLU,
            "hardswish": nn.Hardswish, "hardsigmoid": nn.Hardsigmoid,
        }  # fmt: skip
        if type(module) is not types[kind] or getattr(module, "approximate", "none") != "none":
            return None
        return node.args[0], bool(getattr(module, "inplace", False))  # type: ignore[return-value]
    aten = torch.ops.aten
    if node.op == "call_method":
        if kind == "relu" and node.target in ("relu", "relu_"):
            return node.args[0], node.target == "relu_"  # type: ignore[return-value]
        return None
    if node.op != "call_function":
        return None
    # target -> True (in place), False, or None (read the `inplace` argument)
    functions: dict[str, dict[Any, bool | None]] = {
        "silu": {F.silu: None, aten.silu.default: False, aten.silu_.default: True},
        "gelu": {F.gelu: False, aten.gelu.default: False},
        "relu": {
            F.relu: None, torch.relu: False, torch.relu_: True,
            aten.relu.default: False, aten.relu_.default: True,
        },
        "hardswish": {
            F.hardswish: None, torch._C._nn.hardswish: False, torch._C._nn.hardswish_: True,
            aten.hardswish.default: False, aten.hardswish_.default: True,
        },
        "hardsigmoid": {
            F.hardsigmoid: None, torch._C._nn.hardsigmoid: False,
            torch._C._nn.hardsigmoid_: True,
            aten.hardsigmoid.default: False, aten.hardsigmoid_.default: True,
        },
    }  # fmt: skip
    table = functions[kind]
    if node.target not in table:
        return None
    if kind == "gelu" and arg(node, 1, "approximate", "none") != "none":
        return None
    inplace = table[node.target]
    if inplace is None:
        inplace = bool(arg(node, 1, "inplace", False))
    return node.args[0], inplace  # type: ignore[return-value]


def _build(graph: Any, x: Node, pair: tuple[str, str], aten_form: bool) -> Node:
    """The nodes computing pair's formula from x: aten ops in an exported graph, torch ops
    otherwise."""
    import torch
    import torch.nn.functional as F

    a = torch.ops.aten
    call = graph.call_function
    mul: Any
    add: Any
    div: Any
    sigmoid: Any
    gelu: Any
    if aten_form:
        mul, add, div = a.mul.Tensor, a.add.Tensor, a.div.Tensor
        sigmoid, gelu = a.sigmoid.default, a.gelu.default

        def relu6(v: Any) -> Node:
            return call(a.hardtanh.default, (v, 0.0, 6.0))
    else:
        mul, add, div = operator.mul, operator.add, operator.truediv
        sigmoid, gelu = torch.sigmoid, F.gelu

        def relu6(v: Any) -> Node:
            return call(F.relu6, (v,))

    if pair == ("silu", "x_sigmoid"):
        return call(mul, (x, call(sigmoid, (x,))))
    if pair == ("gelu", "gelu_tanh"):
        return call(gelu, (x,), {"approximate": "tanh"})
    if pair == ("relu", "relu6"):
        return relu6(x)
    if pair == ("hardswish", "x_relu6"):
        return call(div, (call(mul, (x, relu6(call(add, (x, 3))))), 6))
    if pair == ("hardsigmoid", "relu6"):
        return call(div, (relu6(call(add, (x, 3))), 6))
    raise AssertionError(f"no formula for {pair}")


# Ops whose output may share memory with their first input, by name (torch functions and
# Tensor methods); aten ops say so in their schema.
_ALIASING = {
    "getitem", "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "transpose",
    "permute", "squeeze", "unsqueeze", "expand", "expand_as", "narrow", "select", "t",
    "split", "chunk", "unbind", "detach", "contiguous", "as_strided", "diagonal", "movedim",
    "swapaxes", "unfold", "real", "imag", "dropout", "alpha_dropout", "feature_alpha_dropout",
    "dropout1d", "dropout2d", "dropout3d", "iadd", "isub", "imul", "itruediv",
}  # fmt: skip


def _aliased_input(gm: GraphModule, node: Node) -> Node | None:
    """The input `node`'s output may alias (a view or an in-place result), else None."""
    from torch import nn
    from torch.nn.modules.dropout import _DropoutNd

    first: Any = node.args[0] if node.args else None
    if not hasattr(first, "users"):
        return None
    module = module_of(gm, node)
    if module is not None:
        plain = (nn.Identity, nn.Flatten, nn.Unflatten, _DropoutNd)
        return first if isinstance(module, plain) or getattr(module, "inplace", False) else None
    target = node.target
    if type(target).__name__ == "OpOverload":
        returns = target._schema.returns  # type: ignore[union-attr]
        return first if any(r.alias_info is not None for r in returns) else None
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    if name in _ALIASING or name.endswith("_") or node.kwargs.get("inplace") is True:
        return first
    return None


def _inplace_is_safe(gm: GraphModule, node: Node, x: Node, positions: dict[Node, int]) -> bool:
    """Whether an in-place activation on x may compute out of place instead: no tensor that x
    may alias is read after it, and x is no parameter or buffer."""
    chain: list[Node] = []
    current: Node | None = x
    while current is not None and current not in chain:
        if current.op == "get_attr":
            return False
        chain.append(current)
        current = _aliased_input(gm, current)
    here = positions[node]
    return not any(
        positions[user] > here for member in chain for user in member.users if user is not node
    )
