"""The one node builder of the onnx.* rules: nodes and initializers with fresh names.

A rule that replaces a node (`_edit.Edit`, `decompose.Emitter`) sets `prefix` to that node's
name, so what it emits is named after it ('pool/Concat', 'pool/ints_1'); the Namer of
edgeflow.core.onnxgraph keeps every name clear of the model's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from edgeflow.core.onnxgraph import Namer, opset_version

if TYPE_CHECKING:
    import numpy as np
    import onnx


class Builder:
    """Emits nodes (into `nodes`) and initializers (into `initializers`) with fresh names."""

    def __init__(self, model: onnx.ModelProto, namer: Namer | None = None) -> None:
        self.opset = opset_version(model)
        self.namer = namer or Namer(model)
        self.initializers: list[Any] = []
        self.nodes: list[Any] = []
        self.prefix = ""
        self._made: dict[tuple[str, tuple[int, ...], bytes], str] = {}  # value -> its name

    def op(self, op_type: str, *inputs: str, out: str = "", **attrs: Any) -> str:
        return self.ops(op_type, list(inputs), 1, outs=[out], **attrs)[0]

    def ops(
        self, op_type: str, inputs: list[str], outputs: int, outs: Sequence[str] = (), **attrs: Any
    ) -> list[str]:
        """A node with `outputs` outputs (Split), named `outs` where given, else fresh."""
        from onnx import helper

        given = [*outs, *[""] * (outputs - len(outs))]
        names = [name or self.namer(f"{self.prefix}/{op_type}") for name in given]
        node_name = self.namer(f"{self.prefix}/{op_type}_node")
        self.nodes.append(helper.make_node(op_type, inputs, names, node_name, **attrs))
        return names

    def initializer(self, value: np.ndarray, base: str) -> str:
        """An initializer holding `value`, named `base` (or `base_1`, ...); a value this
        builder already made is that initializer (an unrolled loop's weights are stored once,
        not once per step)."""
        import hashlib

        import numpy as np
        from onnx import numpy_helper

        value = np.asarray(value)
        data = np.ascontiguousarray(value).tobytes()
        key = (value.dtype.str, value.shape, hashlib.blake2b(data, digest_size=16).digest())
        if key not in self._made:
            name = self._made[key] = self.namer(base)
            self.initializers.append(numpy_helper.from_array(value, name))
        return self._made[key]

    def array(self, value: np.ndarray, base: str = "const") -> str:
        return self.initializer(value, f"{self.prefix}/{base}")

    def ints(self, values: list[int]) -> str:
        import numpy as np

        return self.array(np.array(values, np.int64), "ints")

    def reshape(self, x: str, shape: list[int], out: str = "") -> str:
        return self.op("Reshape", x, self.ints(shape), out=out)

    def slice(self, x: str, axis: int, start: int, end: int, step: int = 1) -> str:
        inputs = [self.ints([start]), self.ints([end]), self.ints([axis])]
        if step != 1:
            inputs.append(self.ints([step]))
        return self.op("Slice", x, *inputs)

    def reduce_mean(self, x: str, axes: list[int], keepdims: int = 1, out: str = "") -> str:
        if self.opset >= 18:
            return self.op("ReduceMean", x, self.ints(axes), out=out, keepdims=keepdims)
        return self.op("ReduceMean", x, out=out, axes=axes, keepdims=keepdims)

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


def _kept_bias(bias: np.ndarray | None, weight: np.ndarray) -> np.ndarray:
    """The bias, or float32's smallest normal number (2^-126) where it is missing or all zero:
    TensorFlow's converter drops a zero bias, and Arm NN 22 rejects a FULLY_CONNECTED without
    one. Adding 2^-126 changes no sum larger than 2e-31 in magnitude."""
    import numpy as np

    if bias is None or not bias.any():
        return np.full(weight.shape[1], np.finfo(weight.dtype).tiny, weight.dtype)
    return bias


def attr(node: Any, name: str, default: Any) -> Any:
    """A node attribute's value (strings decoded), or `default` when the node lacks it."""
    from onnx import helper

    found = next((a for a in node.attribute if a.name == name), None)
    if found is None:
        return default
    value = helper.get_attribute_value(found)
    return value.decode() if isinstance(value, bytes) else value
