"""What the foreign files share: the record of a file, the registry, the graph helpers.

Small ONNX files written the way older and other exporters write them, built in code.

Each builder returns a `Foreign`: the model (opset 5-18, IR 3-8, seeded random weights), the
inputs a user would declare in a recipe (static shapes; a bound constant's `value`), and which
runtime can run the file as it is (`runs`: "onnxruntime", "reference" for onnx's reference
evaluator only, or "" where neither does, as with opsets onnxruntime no longer has kernels
for). Nothing here is a published model. `FILES` maps each name to its builder; the
builders are in early.py (opset 5-10, and IR 3/4 nets) and recent.py (opset 11 and up).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F, I64, I32, U8, I8 = (TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32,
                       TensorProto.UINT8, TensorProto.INT8)  # fmt: skip
Dim = int | str | None  # a static size, a symbolic name, None for no dim_value


@dataclass(frozen=True)
class Input:
    """One input as a recipe declares it."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    batch_axis: int | None = 0
    value: Any = None  # a bound constant (the recipe's `value:`)


@dataclass
class Foreign:
    """A foreign file: the model, the recipe's inputs, what it imitates, what runs it."""

    name: str
    style: str
    model: onnx.ModelProto
    inputs: tuple[Input, ...]
    runs: str = "onnxruntime"
    checker: bool = True  # False: onnx.checker refuses it though runtimes load it


Builder = Callable[[], Foreign]
FILES: dict[str, Builder] = {}


def _file(
    name: str, style: str, runs: str = "onnxruntime", checker: bool = True
) -> Callable[[Any], Builder]:
    def register(body: Callable[[np.random.Generator], tuple[Any, ...]]) -> Builder:
        def build() -> Foreign:
            rng = np.random.default_rng(zlib.crc32(name.encode()))
            model, inputs = body(rng)
            return Foreign(name, style, model, tuple(inputs), runs, checker)

        build.__doc__ = style
        FILES[name] = build
        return build

    return register


# --------------------------------------------------------------------------- helpers


def w(rng: np.random.Generator, name: str, *shape: int, scale: float = 0.5) -> Any:
    """A float32 initializer of seeded normal values."""
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def ints(name: str, values: Sequence[int] | int, dtype: Any = np.int64) -> Any:
    return numpy_helper.from_array(np.asarray(values, dtype=dtype), name)


def vi(name: str, shape: Sequence[Dim] | None, elem: int = F) -> Any:
    """A value_info; shape None: a tensor type without a shape."""
    if shape is None:
        return helper.make_tensor_value_info(name, elem, None)
    return helper.make_tensor_value_info(name, elem, list(shape))


def node(op: str, ins: Sequence[str], outs: Sequence[str], name: str = "", **attrs: Any) -> Any:
    return helper.make_node(op, list(ins), list(outs), name=name or f"{op}_{outs[0]}", **attrs)


def make(
    nodes: Sequence[Any],
    inputs: Sequence[Any],
    outputs: Sequence[Any],
    inits: Sequence[Any] = (),
    opset: int = 11,
    ir: int = 6,
    inits_as_inputs: bool | None = None,
    value_info: Sequence[Any] = (),
    extra_opsets: Sequence[Any] = (),
    producer: str = "",
) -> onnx.ModelProto:
    """A model; IR < 4 (and `inits_as_inputs`) lists every initializer as a graph input too."""
    graph_inputs = list(inputs)
    if inits_as_inputs if inits_as_inputs is not None else ir < 4:
        graph_inputs += [vi(t.name, list(t.dims), t.data_type) for t in inits]
    graph = helper.make_graph(list(nodes), "graph", graph_inputs, list(outputs), list(inits),
                              value_info=list(value_info))  # fmt: skip
    opsets = [helper.make_opsetid("", opset), *extra_opsets]
    model = helper.make_model(graph, opset_imports=opsets, producer_name=producer or "foreign")
    model.ir_version = ir
    return model


def image(name: str = "input", c: int = 3, hw: int = 16) -> tuple[Any, Input]:
    """An NCHW float image input and its recipe declaration."""
    return vi(name, [1, c, hw, hw]), Input(name, (1, c, hw, hw))


def conv(
    rng: np.random.Generator, x: str, y: str, cin: int, cout: int, k: int = 3, **attrs: Any
) -> tuple[list[Any], list[Any]]:
    """Conv with a seeded weight and bias: (nodes, initializers)."""
    group = attrs.get("group", 1)
    pads = attrs.pop("pads", [k // 2] * 4)
    inits = [w(rng, f"{y}.weight", cout, cin // group, k, k), w(rng, f"{y}.bias", cout)]
    return [node("Conv", [x, inits[0].name, inits[1].name], [y], kernel_shape=[k, k],
                 pads=pads, **attrs)], inits  # fmt: skip


def bn_inits(rng: np.random.Generator, prefix: str, c: int) -> list[Any]:
    var = numpy_helper.from_array(rng.uniform(0.5, 2.0, c).astype(np.float32), f"{prefix}.var")
    return [w(rng, f"{prefix}.scale", c), w(rng, f"{prefix}.B", c), w(rng, f"{prefix}.mean", c),
            var]  # fmt: skip
