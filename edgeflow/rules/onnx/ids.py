"""onnx.ids_as_float: integer graph inputs (token ids, attention masks) fed as float32, for
runtimes with no integer tensors, CAST or GATHER."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from edgeflow.core.onnxgraph import copy_model
from edgeflow.rules.base import OnnxRule, RewriteContext, RuleOptions, RuleResult, Site
from edgeflow.rules.fixes import Fix
from edgeflow.rules.onnx._edit import Edit, rewrite_nodes

if TYPE_CHECKING:
    import onnx

FLOAT = 1
INTEGERS = frozenset({2, 3, 4, 5, 6, 7, 12, 13})  # uint8 int8 uint16 int16 int32 int64 uint32/64
# ops that only move an input's values (its first input), whatever their type
SHAPING = frozenset({"Unsqueeze", "Reshape", "Squeeze", "Expand", "Flatten", "Transpose"})
EXACT = 2**24  # every integer up to this magnitude is a float32


class IdsAsFloat(OnnxRule):
    """Exact for ids in [0, rows) below 2**24. A token model's inputs are integers (int64
    `input_ids` and `attention_mask`), read by an embedding lookup (a Gather from a weight
    table) and by a Cast of the mask to float. Arm NN 22's TfLite parser has no int64 tensor,
    no CAST and no GATHER, so such a model cannot run there as exported.

    Each integer graph input whose every reader is such a lookup or a Cast to float (through
    Unsqueeze, Reshape, Squeeze, Expand, Flatten or Transpose) becomes a float32 input: the
    Casts become Identity, and each lookup a one-hot product,
    `onehot = Min(Relu(ids - r + 1), Relu(r - ids + 1))` for r = 0 .. rows-1 (1 where
    ids == r, else 0, for integer ids), times the table as a MatMul (FULLY_CONNECTED after
    onnx.lower_matmul). The build feeds the recipe's integer samples as float32 (exact below
    2**24). An id outside [0, rows) gives a zero row where Gather would fail or wrap; the
    cost is `rows` multiply-adds per id and output channel, and a [ids, rows] one-hot tensor.
    An input with any other reader (an Equal, an Add of int64s, a graph output) is kept, and
    the rule says which reader keeps it. In an int8 build the lookup is the `embeddings`
    float island (quantization.keep_float): an int8 grid over the ids would merge them.
    A default rewrite of armnn."""

    name = "onnx.ids_as_float"
    description = (
        "Feed integer inputs (token ids, masks) as float32: Casts to float dropped, "
        "embedding Gathers as one-hot MatMuls."
    )
    fixes = (Fix.op("Gather"), Fix.op("Cast"), Fix.finding("int64"))
    runs_before: ClassVar[dict[str, str]] = {
        "onnx.lower_matmul": "it writes the one-hot MatMul that lower_matmul lowers"
    }

    class Options(RuleOptions):
        pass

    example: ClassVar[tuple[str, str] | None] = (
        "ids: int64[1, 4]; e = Gather(table[100, 8], ids); m = Cast(mask: int64, to=float)",
        "ids: float[1, 4]; e = MatMul(Min(Relu(ids[..., None] - arange(100) + 1), "
        "Relu(arange(100) - ids[..., None] + 1)), table); m = Identity(mask: float)",
    )

    def tolerance(self, opts: Any) -> float | None:
        return 0.0

    def apply(
        self, model: onnx.ModelProto, opts: Options, ctx: RewriteContext
    ) -> RuleResult[onnx.ModelProto]:
        edit = Edit(model)  # read only: the rewrite works on rewrite_nodes' copy
        integer = [v.name for v in model.graph.input if v.type.tensor_type.elem_type in INTEGERS]
        if not integer:
            return RuleResult(copy_model(model), sites=[Site.not_applicable("no integer inputs")])
        converted: dict[str, set[str]] = {}  # input -> its shaped copies
        kept: list[Site] = []
        for name in integer:
            copies, why = _readers(edit, name)
            if why:
                kept.append(Site.kept(name, why))
            else:
                converted[name] = copies
        if not converted:
            return RuleResult(copy_model(model), sites=kept)
        values = set().union(*converted.values())

        def replace(node: Any, e: Edit) -> str | None:
            if node.op_type == "Cast":
                if node.input[0] not in values:
                    return ""
                e.op("Identity", node.input[0], out=node.output[0])
                return None
            if len(node.input) < 2 or node.input[1] not in values:
                return ""
            _one_hot_lookup(e, node)
            return None

        result = rewrite_nodes(model, {"Gather", "Cast"}, replace, "integer input's reader")
        out = result.model
        for value in out.graph.input:
            if value.name in converted:
                value.type.tensor_type.elem_type = FLOAT
        stale = values - set(converted)  # the shaped copies' int types: inferred again
        infos = [v for v in out.graph.value_info if v.name not in stale]
        del out.graph.value_info[:]
        out.graph.value_info.extend(infos)
        fed = Site.changed(", ".join(converted), "fed as float32")
        return RuleResult(out, matches=len(converted), sites=[fed, *result.sites, *kept])


def _readers(e: Edit, name: str) -> tuple[set[str], str]:
    """The input `name` and its shaped copies, and '' where every other reader is a Cast to
    float or an embedding lookup; else why the input stays an integer."""
    from edgeflow.core.onnxgraph import node_reads

    values, todo = {name}, [name]
    while todo:
        value = todo.pop()
        if value in e.graph_outputs:
            return values, f"'{value}' is a graph output"
        for node in e.model.graph.node:  # a Loop's or If's body reading it by name
            if value in node_reads(node) and value not in node.input:
                return values, f"'{value}' is read inside {node.op_type} '{node.name}'"
        shape = e.shape(value)
        if shape is None:
            return values, f"'{value}' has no static shape"
        for node in e.consumers.get(value, []):
            where = f"'{value}' is read by {node.op_type} '{node.name or node.output[0]}'"
            if node.op_type in SHAPING and node.input[0] == value:
                values.add(node.output[0])
                todo.append(node.output[0])
            elif node.op_type == "Cast":
                to = next(a.i for a in node.attribute if a.name == "to")
                if to != FLOAT:
                    return values, f"{where} (to a type other than float)"
            elif node.op_type == "Gather" and node.input[1] == value:
                why = _lookup(e, node)
                if why:
                    return values, f"{where}: {why}"
            else:
                return values, f"{where}: only Casts to float and embedding lookups are rewritten"
    return values, ""


def _lookup(e: Edit, node: Any) -> str:
    """'' for a Gather from a float32 constant table along its first axis, else why not."""
    table = e.folded(node.input[0])
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    if table is None or table.ndim == 0 or table.dtype.name != "float32":
        return "the table is not a float32 constant"
    if axis not in (0, -table.ndim):
        return f"it gathers along axis {axis}, not the table's rows"
    if table.shape[0] > EXACT:
        return f"{table.shape[0]} rows: ids past 2**24 are not float32 integers"
    return ""


def _one_hot_lookup(e: Edit, node: Any) -> None:
    """The Gather `node` as a one-hot row selection times its table."""
    import numpy as np

    table = e.folded(node.input[0])
    ids_shape = e.shape(node.input[1])
    assert table is not None and ids_shape is not None  # checked by _readers
    rows = table.shape[0]
    # every operand at least 3-D and of one rank: what the TFLite family's broadcasting
    # kernels take (the precheck's same_rank), so the rewrite adds no finding of its own
    rank = max(3, len(ids_shape) + 1)
    lead = [1] * (rank - 1 - len(ids_shape))
    ids = e.reshape(node.input[1], [*lead, *ids_shape, 1])
    r = e.array(np.arange(rows, dtype=np.float32).reshape([1] * (rank - 1) + [rows]), "rows")
    one = e.array(np.ones([1] * rank, np.float32), "one")
    above = e.op("Relu", e.op("Add", e.op("Sub", ids, r), one))  # ids - r + 1
    below = e.op("Relu", e.op("Add", e.op("Sub", r, ids), one))  # r - ids + 1
    onehot = e.op("Min", above, below)
    flat = e.array(table.reshape(rows, -1), "table")
    if table.ndim == 2 and not lead:
        e.op("MatMul", onehot, flat, out=node.output[0])
        return
    picked = e.op("MatMul", onehot, flat)
    e.reshape(picked, [*ids_shape, *table.shape[1:]], out=node.output[0])
