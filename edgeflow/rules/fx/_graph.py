"""Helpers shared by the fx.* rules: get a GraphModule to rewrite, read its constants, tidy it.

A rule works on either kind of graph: `torch.fx.symbolic_trace`'s (submodules as call_module
nodes, torch functions as call_function nodes) or, when symbolic tracing fails, the unlifted
module of `torch.export.export` (aten call_function nodes reading parameters via get_attr).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from edgeflow.core.errors import EdgeflowError
from edgeflow.rules.base import GraphOrigin, RewriteContext, RuleResult, Site

if TYPE_CHECKING:
    import torch
    from torch.fx import GraphModule, Node

GIVEN = "GraphModule"
SYMBOLIC = "symbolic_trace"
EXPORT = "torch.export"


class NotConstant(ValueError):
    """An operand that should be a parameter or buffer is computed in the graph."""


def to_graph_module(
    module: torch.nn.Module, ctx: RewriteContext
) -> tuple[GraphModule, GraphOrigin]:
    """A copy of `module` as a GraphModule, and how it was obtained: a GraphModule is copied as
    is; otherwise symbolic_trace, or torch.export's graph on the declared inputs when that fails.
    """
    import torch
    from torch import fx

    if isinstance(module, fx.GraphModule):
        return copy.deepcopy(module), GraphOrigin(GIVEN, "the previous rule's graph")
    try:
        return fx.symbolic_trace(copy.deepcopy(module)), GraphOrigin(SYMBOLIC)
    except Exception as exc:  # symbolic_trace raises whatever forward raises on a Proxy
        traced = first_line(exc)
    try:
        exported = torch.export.export(copy.deepcopy(module), ctx.example_inputs())
    except Exception as exc:  # torch.export raises many types; all mean "no graph"
        raise EdgeflowError(
            f"cannot get a graph of {type(module).__name__}: symbolic_trace failed ({traced}) "
            f"and torch.export failed ({first_line(exc)})",
            "add fx.wrap_leaf for helper functions symbolic_trace cannot trace, "
            "or make forward traceable with ast.* rules",
        ) from exc
    gm = exported.module()
    for sub in gm.modules():  # the graph has the module's semantics; say so to exporters
        sub.training = module.training
    note = "specialised to the declared input shapes, so no dynamic batch"
    return gm, GraphOrigin(EXPORT, f"{note} (symbolic_trace failed: {traced})")


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def arg(node: Node, index: int, name: str, default: Any = None) -> Any:
    """Argument `index` (keyword `name`) of a call node, or `default`."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def set_arg(node: Node, index: int, name: str, value: Any) -> None:
    """Set argument `index` (keyword `name`) of a call node, positionally when it can be."""
    if len(node.args) > index:
        node.update_arg(index, value)
    elif name in node.kwargs or len(node.args) < index:
        node.update_kwarg(name, value)
    else:
        node.args = (*node.args, value)


def module_of(gm: GraphModule, node: Node) -> torch.nn.Module | None:
    """The submodule a call_module node calls, else None."""
    return gm.get_submodule(str(node.target)) if node.op == "call_module" else None


def calls(gm: GraphModule, target: str) -> int:
    """How many call_module nodes call the submodule `target`."""
    return sum(1 for n in gm.graph.nodes if n.op == "call_module" and n.target == target)


def constant(gm: GraphModule, value: Any) -> torch.Tensor | None:
    """The tensor a get_attr node reads (None for None); NotConstant for anything else."""
    import torch

    if value is None:
        return None
    if getattr(value, "op", None) == "get_attr":
        found = _resolve(gm, str(value.target))
        if isinstance(found, torch.Tensor):
            return found
    raise NotConstant(f"{value} is not a parameter or buffer")


def _resolve(gm: GraphModule, qualified: str) -> Any:
    obj: Any = gm
    for part in qualified.split("."):
        obj = getattr(obj, part)
    return obj


def add_constant(gm: GraphModule, before: Node, like: str, tensor: torch.Tensor) -> Node:
    """Register `tensor` as a new parameter next to attribute `like` (e.g. "conv.weight" gives
    "conv.weight_fused") and read it with a get_attr node placed before `before`."""
    import torch

    owner_path, _, attr = like.rpartition(".")
    owner = gm.get_submodule(owner_path)
    name, i = f"{attr}_fused", 1
    while hasattr(owner, name):
        name, i = f"{attr}_fused{i}", i + 1
    owner.register_parameter(name, torch.nn.Parameter(tensor.detach(), requires_grad=False))
    with gm.graph.inserting_before(before):
        return gm.graph.get_attr(f"{owner_path}.{name}" if owner_path else name)


def shape(node: Any) -> tuple[int, ...] | None:
    """The output shape recorded on a node (torch.export's meta, or ShapeProp's), if any."""
    meta = getattr(node, "meta", {})
    val = meta.get("val")
    if val is None and "tensor_meta" in meta:
        val = meta["tensor_meta"]
    found = getattr(val, "shape", None)
    return tuple(found) if found is not None else None


def propagate_shapes(gm: GraphModule, ctx: RewriteContext) -> None:
    """Record output shapes on every node by running the graph on the declared inputs."""
    from torch.fx.passes.shape_prop import ShapeProp

    ShapeProp(gm).propagate(*ctx.example_inputs())


def order(gm: GraphModule) -> dict[Node, int]:
    """Each node's position in the graph."""
    return {n: i for i, n in enumerate(gm.graph.nodes)}


def label(node: Node, module: torch.nn.Module | None = None) -> str:
    """A node as sites name it: "bn (BatchNorm2d)" or "batch_norm (aten.batch_norm)"."""
    if module is not None:
        return f"{node.target} ({type(module).__name__})"
    target = node.target
    name = str(target) if not callable(target) else getattr(target, "__name__", str(target))
    if type(target).__name__ == "OpOverload":
        name = str(target).rsplit(".", 1)[0]
    stack = node.meta.get("nn_module_stack")  # torch.export: the module the op came from
    if stack:
        path = str(list(stack.values())[-1][0])
        name += f" in {path}" if path else ""
    return f"{node.name} ({name})"


def tidy(gm: GraphModule) -> None:
    """Drop get_attr nodes, submodules and tensors nothing uses any more; lint and recompile."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op == "get_attr" and not node.users:
            graph.erase_node(node)
    gm.delete_all_unused_submodules()
    read = {str(n.target) for n in graph.nodes if n.op == "get_attr"}
    called = {str(n.target) for n in graph.nodes if n.op == "call_module"}
    owners: dict[int, torch.nn.Module] = {}
    used: dict[tuple[int, str], bool] = {}  # (owner, attribute): used under any of its paths
    for path, owner in gm.named_modules(remove_duplicate=False):
        prefix = f"{path}." if path else ""
        inside_called = path in called or any(path.startswith(c + ".") for c in called)
        owners[id(owner)] = owner
        for attr in [*owner._parameters, *owner._buffers]:
            full = prefix + attr
            hit = inside_called or full in read or any(full.startswith(r + ".") for r in read)
            used[id(owner), attr] = used.get((id(owner), attr), False) or hit
    for (key, attr), hit in used.items():
        if not hit:
            delattr(owners[key], attr)
    graph.lint()
    gm.recompile()


def finish(
    original: Any, gm: GraphModule, graph: GraphOrigin, sites: list[Site]
) -> RuleResult[Any]:
    """The rule's result: the tidied graph when a site changed, else the input unchanged."""
    result = RuleResult(gm, sites=sites, graph=graph)
    if not result.changed:
        return RuleResult(original, sites=sites)
    tidy(gm)
    result.sources["graph"] = gm.code
    return result
