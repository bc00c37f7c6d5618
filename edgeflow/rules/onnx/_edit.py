"""Node-by-node rewriting of a model's main graph, for rules that replace one construct with
an equivalent formulation a runtime takes (onnx.maxpool_edge_pad, onnx.lower_matmul, ...).

A rule writes `replace(node, edit) -> str | None`: it either emits replacement nodes through
`edit` (which must end by writing the node's outputs) and returns None, or returns the reason
it keeps the node ('' for a node that is not the construct at all: nothing to report).
`rewrite_nodes` runs it over the graph and makes the RuleResult.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from edgeflow.core.onnxgraph import Namer, constant_value, copy_model, opset_version
from edgeflow.rules.base import RuleResult

if TYPE_CHECKING:
    import numpy as np
    import onnx


class Edit:
    """What a replacement may read (static shapes, constants, consumers) and emit (nodes,
    initializers with fresh names)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        import onnx
        from onnx import numpy_helper

        self.opset = opset_version(model)
        self.namer = Namer(model)
        self.initializers: list[Any] = []
        self.nodes: list[Any] = []
        self.removed: set[str] = set()  # node outputs whose nodes a replacement took over
        self.prefix = ""
        graph = model.graph
        self.constants: dict[str, np.ndarray] = {
            t.name: numpy_helper.to_array(t) for t in graph.initializer
        }
        for node in graph.node:
            if node.op_type == "Constant":
                value = constant_value(node)
                if value is not None:
                    self.constants[node.output[0]] = value
        try:
            inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
        except onnx.shape_inference.InferenceError:  # advisory: rules then skip the node
            inferred = model
        self.shapes: dict[str, list[int] | None] = {}
        self.dtypes: dict[str, int] = {}
        for value in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output):
            t = value.type.tensor_type
            self.dtypes[value.name] = t.elem_type
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
            static = t.HasField("shape") and all(d >= 0 for d in dims)
            self.shapes[value.name] = dims if static else None
        for name, array in self.constants.items():
            self.shapes[name] = list(array.shape)
        self.producers = {name: node for node in graph.node for name in node.output}
        self.consumers: dict[str, list[Any]] = {}
        for node in graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.graph_outputs = {v.name for v in graph.output}

    def shape(self, name: str) -> list[int] | None:
        """The tensor's static shape, None when shape inference does not know every dim."""
        return self.shapes.get(name)

    def only_consumer(self, name: str) -> Any | None:
        """The single node reading a tensor that is not a graph output, else None."""
        readers = self.consumers.get(name, [])
        if len(readers) != 1 or name in self.graph_outputs:
            return None
        return readers[0]

    def op(self, op_type: str, *inputs: str, out: str = "", **attrs: Any) -> str:
        from onnx import helper

        name = out or self.namer(f"{self.prefix}/{op_type}")
        node_name = self.namer(f"{self.prefix}/{op_type}_node")
        self.nodes.append(helper.make_node(op_type, list(inputs), [name], node_name, **attrs))
        return name

    def ops(self, op_type: str, inputs: list[str], outputs: int, **attrs: Any) -> list[str]:
        """A node with several outputs (Split)."""
        from onnx import helper

        names = [self.namer(f"{self.prefix}/{op_type}") for _ in range(outputs)]
        node_name = self.namer(f"{self.prefix}/{op_type}_node")
        self.nodes.append(helper.make_node(op_type, inputs, names, node_name, **attrs))
        return names

    def array(self, value: np.ndarray, base: str = "const") -> str:
        from onnx import numpy_helper

        name = self.namer(f"{self.prefix}/{base}")
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def ints(self, values: list[int]) -> str:
        import numpy as np

        return self.array(np.array(values, np.int64), "ints")

    def scalar(self, value: float, like: str) -> str:
        """A scalar of the element type of tensor `like`."""
        import numpy as np
        from onnx import helper

        np_type = helper.tensor_dtype_to_np_dtype(self.dtypes.get(like) or 1)
        return self.array(np.array(value, np_type), "scalar")

    def reshape(self, x: str, shape: list[int], out: str = "") -> str:
        return self.op("Reshape", x, self.ints(shape), out=out)

    def slice(self, x: str, axis: int, start: int, end: int, step: int = 1) -> str:
        inputs = [self.ints([start]), self.ints([end]), self.ints([axis])]
        if step != 1:
            inputs.append(self.ints([step]))
        return self.op("Slice", x, *inputs)

    def gemm(self, x: str, weight: np.ndarray, bias: np.ndarray | None, out: str = "") -> str:
        """x [M, K] @ weight [K, N] + bias, always with a bias (see _kept_bias)."""
        bias = _kept_bias(bias, weight)
        return self.op("Gemm", x, self.array(weight, "weight"), self.array(bias, "bias"), out=out)

    def linear(
        self,
        x: str,
        shape: list[int],
        axis: int,
        weight: np.ndarray,
        bias: np.ndarray | None,
        out: str = "",
    ) -> str:
        """Multiply one axis of a static tensor by weight [K, N] (+ bias) as a 1x1 Conv:
        the axis moves to the channel position, the dims after it become one spatial dim.
        For ranks above 2 this, not Gemm between Reshapes: TensorFlow's converter fuses those
        Reshapes into a FULLY_CONNECTED with keep_num_dims, whose output shape Arm NN 22
        refuses."""
        import numpy as np

        rank = len(shape)
        perm = [0, axis, *[d for d in range(1, rank) if d != axis]] if axis else list(range(rank))
        moved = [shape[d] for d in perm]
        if perm != list(range(rank)):
            x = self.op("Transpose", x, perm=perm)
        x = self.reshape(x, [moved[0], moved[1], int(np.prod(moved[2:], dtype=np.int64)), 1])
        kernel = self.array(np.ascontiguousarray(weight.T)[:, :, None, None], "weight")
        y = self.op(
            "Conv", x, kernel, self.array(_kept_bias(bias, weight), "bias"), kernel_shape=[1, 1]
        )
        result = [moved[0], weight.shape[1], *moved[2:]]
        if perm == list(range(rank)):
            return self.reshape(y, result, out=out)
        back = [perm.index(d) for d in range(rank)]
        return self.op("Transpose", self.reshape(y, result), out=out, perm=back)

    def reduce_mean(self, x: str, axes: list[int], keepdims: int, out: str = "") -> str:
        if self.opset >= 18:
            return self.op("ReduceMean", x, self.ints(axes), out=out, keepdims=keepdims)
        return self.op("ReduceMean", x, out=out, axes=axes, keepdims=keepdims)


def _kept_bias(bias: np.ndarray | None, weight: np.ndarray) -> np.ndarray:
    """The bias, or float32's smallest normal number (2^-126) where it is missing or all zero:
    TensorFlow's converter drops a zero bias, and Arm NN 22 rejects a FULLY_CONNECTED without
    one. Adding 2^-126 changes no sum larger than 2e-31 in magnitude."""
    import numpy as np

    if bias is None or not bias.any():
        return np.full(weight.shape[1], np.finfo(weight.dtype).tiny, weight.dtype)
    return bias


Replace = Callable[[Any, Edit], "str | None"]


def rewrite_nodes(
    model: onnx.ModelProto, op_types: set[str], replace: Replace, what: str
) -> RuleResult[onnx.ModelProto]:
    """Offer every main-graph node of `op_types` (default domain) to `replace`; a replaced
    node's nodes go where it was. `what` names a match in the reasons ('MaxPool with pads')."""
    out = copy_model(model)
    edit = Edit(out)
    nodes: list[Any] = []
    kept: list[str] = []
    matches = 0
    for node in out.graph.node:
        if node.output and node.output[0] in edit.removed:
            continue
        if node.op_type not in op_types or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        edit.nodes, edit.prefix = [], node.name or node.output[0]
        why = replace(node, edit)
        if why is not None:  # kept; '' when the node is not the construct at all
            if why:
                kept.append(f"kept {node.op_type} '{edit.prefix}': {why}")
            nodes.append(node)
            continue
        matches += 1
        nodes.extend(edit.nodes)
    if not matches:
        return RuleResult(copy_model(model), False, 0, kept or [f"no {what}"])
    # original nodes a replacement took over that came before it (a Reshape feeding it)
    originals = {id(n) for n in out.graph.node}
    nodes = [
        n
        for n in nodes
        if id(n) not in originals or not (n.output and all(o in edit.removed for o in n.output))
    ]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(edit.initializers)
    _drop_unread_initializers(out, set().union(*(_reads(n) for n in nodes)))
    _drop_stale_value_info(out)
    return RuleResult(out, True, matches, [f"{what} x{matches}", *kept])


def _reads(node: Any) -> set[str]:
    from edgeflow.core.onnxgraph import node_reads

    return set(node_reads(node))


def _drop_unread_initializers(model: onnx.ModelProto, read: set[str]) -> None:
    """Forget the weights of replaced nodes (the replacement made its own copies)."""
    keep = read | {v.name for v in (*model.graph.output, *model.graph.input)}
    kept = [t for t in model.graph.initializer if t.name in keep]
    if len(kept) != len(model.graph.initializer):
        del model.graph.initializer[:]
        model.graph.initializer.extend(kept)


def _drop_stale_value_info(model: onnx.ModelProto) -> None:
    """Forget value_info of tensors no node produces any more (a later shape inference
    recomputes the rest)."""
    produced = {name for node in model.graph.node for name in node.output}
    kept = [v for v in model.graph.value_info if v.name in produced]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)


def attr(node: Any, name: str, default: Any) -> Any:
    from onnx import helper

    found = next((a for a in node.attribute if a.name == name), None)
    if found is None:
        return default
    value = helper.get_attribute_value(found)
    return value.decode() if isinstance(value, bytes) else value
