"""Probe graphs: one small ONNX graph per operator, to ask a runtime what it takes.

`python -m edgeflow.targets.derive tflite_micro` converts and runs every probe on the real
runtimes (edgeflow.targets.trial) and writes the operators the runtime ran into the profile.
A probe with a `checker` is a variant of its operator's main probe (grouped, dilated, padded,
5-D, ...): when the main probe runs and the variant does not, the profile gets that checker
for the operator. A probe without one at another opset, where the op has another version,
asks about that version: the profile then lists the versions whose probes ran (`kernels`).
tests/targets/opzoo.py builds its cases with the same helpers; its cases
(other shapes, types and patterns) are what the profiles are then held against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

NP: dict[int, Any] = {
    T.FLOAT: np.float32,
    T.DOUBLE: np.float64,
    T.INT64: np.int64,
    T.INT32: np.int32,
    T.INT8: np.int8,
    T.UINT8: np.uint8,
    T.BOOL: np.bool_,
    T.FLOAT16: np.float16,
}


@dataclass
class Case:
    name: str
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray] = field(default_factory=dict)
    op: str = ""  # the operator a probe asks about (its first node's type by default)
    checker: str = ""  # a variant's checker: added to the op when the variant alone fails
    # asks only which TFLite operators the runtime takes (a fused activation): it adds to the
    # profile's `builtins`, not to an ONNX operator's verdict
    emitted_only: bool = False


def const(name: str, value: Any, dtype: Any = np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def single(
    name: str,
    op: str,
    inputs: Sequence[tuple[str, Any, Sequence[Any]]],
    consts: dict[str, Any] | None = None,
    attrs: dict[str, Any] | None = None,
    opset: int = 17,
    out_type: int | list[int] | None = None,
    extra_inputs: list[str] | None = None,
    outputs: int = 1,
    positive: bool = False,
    checker: str = "",
) -> Case:
    """One node `op` on graph inputs (name, type, shape; a str dim is dynamic) + constants.
    Feeds are normal with std 2 (positive: |x| + 0.5, or + 1 for integers: for Log, Sqrt,
    Div, ...)."""
    rng = np.random.default_rng(0)
    consts = consts or {}
    inits = [v if isinstance(v, onnx.TensorProto) else const(k, v) for k, v in consts.items()]
    names = [n for n, _, _ in inputs] + list(consts) + (extra_inputs or [])
    out_names = [f"y{i}" for i in range(outputs)]
    node = helper.make_node(op, names, out_names, **(attrs or {}))
    elems = out_type if isinstance(out_type, list) else [out_type or inputs[0][1]] * outputs
    graph = helper.make_graph(
        [node],
        name,
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(o, e, None) for o, e in zip(out_names, elems, strict=True)],
        inits,
    )
    model = typed_outputs(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))
    feeds: dict[str, np.ndarray] = {}
    for n, t, s in inputs:
        shape = [d if isinstance(d, int) else 2 for d in s]
        value: Any = rng.standard_normal(shape) * 2
        if t == T.BOOL:
            value = value > 0
        elif positive:
            value = np.abs(value) + (0.5 if t in (T.FLOAT, T.DOUBLE, T.FLOAT16) else 1)
        feeds[n] = value.astype(NP[t])
    return Case(name, model, feeds, op, checker)


def typed_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """Graph outputs with the shapes ONNX shape inference gives them (the checker wants one)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        return model
    known = {v.name: v for v in (*inferred.graph.value_info, *inferred.graph.output)}
    for i, out in enumerate(model.graph.output):
        if out.name in known and known[out.name].type.tensor_type.HasField("shape"):
            model.graph.output[i].CopyFrom(known[out.name])
    return model


def _if_probe() -> Case:
    """If on a condition computed from the input: Relu or Neg of x."""
    branches = [
        helper.make_graph(
            [helper.make_node(op, ["x"], [out])],
            name,
            [],
            [helper.make_tensor_value_info(out, T.FLOAT, [1, 6, 10, 10])],
        )
        for op, name, out in (("Relu", "then", "a"), ("Neg", "else", "b"))
    ]
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
        helper.make_node("Greater", ["m", "zero"], ["c"]),
        helper.make_node("If", ["c"], ["y0"], then_branch=branches[0], else_branch=branches[1]),
    ]
    graph = helper.make_graph(
        nodes,
        "if",
        [helper.make_tensor_value_info("x", T.FLOAT, [1, 6, 10, 10])],
        [helper.make_tensor_value_info("y0", T.FLOAT, [1, 6, 10, 10])],
        [const("zero", 0.0)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 6, 10, 10)).astype(np.float32)}
    return Case("If", model, feeds, "If")


def _embedding_probe() -> Case:
    """Gather as an embedding lookup: a constant table [20, 8] read at int32 ids the graph is
    given [1, 5] (a token model's first node; constant indices become slices,
    onnx.gather_to_slice)."""
    table = np.random.default_rng(0).standard_normal((20, 8)).astype(np.float32)
    node = helper.make_node("Gather", ["table", "ids"], ["y0"], axis=0)
    graph = helper.make_graph(
        [node],
        "Gather",
        [helper.make_tensor_value_info("ids", T.INT32, [1, 5])],
        [helper.make_tensor_value_info("y0", T.FLOAT, [1, 5, 8])],
        [numpy_helper.from_array(table, "table")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"ids": np.array([[3, 0, 19, 7, 3]], np.int32)}
    return Case("Gather", model, feeds, "Gather")


def _fused(name: str, op: str, inputs: list[Any], consts: dict[str, Any], low: float) -> Case:
    """`op` then Clip(low, 1): onnx2tf fuses the Clip into the op as an activation option
    (RELU_N1_TO_1 for low -1), which some runtimes refuse though they take the op."""
    model = single(name, op, inputs, consts).model
    graph = model.graph
    graph.node[0].output[0] = "pre"
    graph.node.append(helper.make_node("Clip", ["pre", "low", "high"], ["y0"]))
    graph.initializer.extend([const("low", low), const("high", 1.0)])
    graph.output[0].type.tensor_type.ClearField("shape")
    model = typed_outputs(model)
    rng = np.random.default_rng(0)
    feeds = {n: (rng.standard_normal(s) * 2).astype(np.float32) for n, _, s in inputs}
    return Case(name, model, feeds, op, emitted_only=True)


def _batch_first(case: Case) -> Case:
    """The probe's [steps, batch, features] input taken as [batch, steps, features] through
    a Transpose, as torch exports a batch_first recurrent layer."""
    graph = case.model.graph
    x = graph.input[0]
    dims = x.type.tensor_type.shape.dim
    dims[0].dim_value, dims[1].dim_value = dims[1].dim_value, dims[0].dim_value
    graph.node[0].input[0] = "steps"
    graph.node.insert(0, helper.make_node("Transpose", [x.name], ["steps"], perm=[1, 0, 2]))
    feeds = {x.name: np.ascontiguousarray(case.feeds[x.name].transpose(1, 0, 2))}
    return Case(case.name, case.model, feeds, case.op, case.checker)


def probes() -> list[Case]:
    """The probe set: main probes in float32 with typical attributes, then variants."""
    x = [("x", T.FLOAT, [1, 6, 10, 10])]
    x2 = [*x, ("x2", T.FLOAT, [1, 6, 10, 10])]
    seq = [("x", T.FLOAT, [2, 5, 12])]  # (batch, tokens, features)
    rng = np.random.default_rng(7)
    w = rng.standard_normal((8, 6, 3, 3)).astype(np.float32)
    ones6, zeros6 = np.ones(6), np.zeros(6)
    ones7 = np.ones(7) / 2
    i64 = np.int64
    found: list[Case] = []
    unary: tuple[str, ...] = (
        "Abs",
        "Neg",
        "Exp",
        "Sin",
        "Cos",
        "Tanh",
        "Sigmoid",
        "Relu",
        "Floor",
        "Ceil",
    )
    unary += ("Round", "Sign", "Erf", "Softplus", "Softsign", "HardSigmoid", "HardSwish", "Elu")
    unary += ("Selu", "Celu", "Identity")
    found += [single(op, op, x) for op in unary]
    found += [single(op, op, x, positive=True) for op in ("Log", "Sqrt", "Reciprocal")]
    found += [
        single("Mish", "Mish", x, opset=18),
        single("Gelu", "Gelu", x, opset=20),
        single("LeakyRelu", "LeakyRelu", x, attrs={"alpha": 0.2}),
        single("ThresholdedRelu", "ThresholdedRelu", x, attrs={"alpha": 0.5}),
        single("PRelu", "PRelu", x, {"slope": np.full((6, 1, 1), 0.25, np.float32)}),
        single("Clip", "Clip", x, {"lo": 0.0, "hi": 6.0}),
        single("Dropout", "Dropout", x),
    ]
    for op in ("Add", "Sub", "Mul", "Max", "Min", "Sum", "Mean"):
        found.append(single(op, op, x2))
    found.append(single("Div", "Div", x2, positive=True))  # no divisor near 0
    found.append(single("Pow", "Pow", x, {"e": np.float32(2.0)}, positive=True))
    for op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"):
        found.append(single(op, op, x2, out_type=T.BOOL))
    b2 = [("x", T.BOOL, [1, 6, 10, 10]), ("x2", T.BOOL, [1, 6, 10, 10])]
    found += [single(op, op, b2) for op in ("And", "Or", "Xor")]
    found.append(single("Not", "Not", b2[:1]))
    found.append(single("Where", "Where", [("c", T.BOOL, [1, 6, 10, 10]), *x2], out_type=T.FLOAT))
    # convolutions, pooling, normalisation
    found += [
        single("Conv", "Conv", x, {"w": w, "b": np.ones(8)}, {"pads": [1, 1, 1, 1]}),
        single(
            "ConvTranspose",
            "ConvTranspose",
            x,
            {"w": rng.standard_normal((6, 4, 2, 2)).astype(np.float32)},
            {"strides": [2, 2]},
        ),
        single("MaxPool", "MaxPool", x, attrs={"kernel_shape": [2, 2], "strides": [2, 2]}),
        single("AveragePool", "AveragePool", x, attrs={"kernel_shape": [2, 2], "strides": [2, 2]}),
        single("GlobalAveragePool", "GlobalAveragePool", x),
        single("GlobalMaxPool", "GlobalMaxPool", x),
        single("LpNormalization", "LpNormalization", x, attrs={"axis": 1}),
        single("LRN", "LRN", x, attrs={"size": 3}),
        single(
            "BatchNormalization",
            "BatchNormalization",
            x,
            {"g": ones6, "b": zeros6, "m": zeros6 + 0.1, "v": ones6 * 2},
        ),
        single("InstanceNormalization", "InstanceNormalization", x, {"g": ones6, "b": zeros6}),
        single(
            "LayerNormalization",
            "LayerNormalization",
            seq,
            {"g": np.ones(12), "b": np.zeros(12)},
            {"axis": -1},
        ),
    ]
    # matmul, attention
    found += [
        single("MatMul", "MatMul", seq, {"w": rng.standard_normal((12, 7))}),
        single("Gemm", "Gemm", [("x", T.FLOAT, [2, 12])], {"w": np.ones((12, 7)), "c": np.ones(7)}),
        single("Softmax", "Softmax", seq, attrs={"axis": -1}),
        single("LogSoftmax", "LogSoftmax", seq, attrs={"axis": -1}),
        single("Einsum", "Einsum", seq, {"w": np.ones((12, 3))}, {"equation": "bij,jk->bik"}),
    ]
    # recurrent layers as torch exports a batch_first layer: [batch, steps, features]
    # transposed to [steps, batch, features], weights constant, Y, Y_h (and Y_c)
    for op, gates in (("LSTM", 4), ("GRU", 3)):
        weights = {
            "W": rng.standard_normal((1, gates * 16, 8)).astype(np.float32) * 0.3,
            "R": rng.standard_normal((1, gates * 16, 16)).astype(np.float32) * 0.3,
            "B": rng.standard_normal((1, 2 * gates * 16)).astype(np.float32) * 0.1,
        }
        attrs: dict[str, Any] = {"hidden_size": 16}
        if op == "GRU":
            attrs["linear_before_reset"] = 1  # as torch.nn.GRU exports it
        inputs = [("x", T.FLOAT, [5, 1, 8])]
        found.append(_batch_first(single(op, op, inputs, weights, attrs, outputs=2)))
        if op == "LSTM":  # its final cell state read too
            probe = single("LSTM final cell", op, inputs, weights, attrs, outputs=3)
            found.append(replace(_batch_first(probe), checker="no_final_cell_state"))
    # shapes and layouts
    found += [
        single("Reshape", "Reshape", x, {"shape": const("shape", [1, 6, -1], i64)}),
        single("Flatten", "Flatten", x),
        single("Transpose", "Transpose", x, attrs={"perm": [0, 2, 3, 1]}),
        single("Squeeze", "Squeeze", [("x", T.FLOAT, [1, 6, 1, 10])], {"a": const("a", [2], i64)}),
        single("Unsqueeze", "Unsqueeze", [("x", T.FLOAT, [4, 12])], {"a": const("a", [1], i64)}),
        single("Concat", "Concat", x2, attrs={"axis": 1}),
        single("Split", "Split", x, attrs={"axis": 1, "num_outputs": 2}, opset=18, outputs=2),
        single(
            "Slice",
            "Slice",
            x,
            {"s": const("s", [2], i64), "e": const("e", [9], i64), "a": const("a", [3], i64)},
        ),
        _embedding_probe(),
        single(
            "GatherElements",
            "GatherElements",
            seq,
            {"i": const("i", np.zeros((2, 5, 3)), i64)},
            {"axis": 2},
        ),
        single("GatherND", "GatherND", seq, {"i": const("i", [[0, 1], [1, 4]], i64)}),
        single(
            "Expand",
            "Expand",
            [("x", T.FLOAT, [1, 6, 1, 10])],
            {"s": const("s", [1, 6, 4, 10], i64)},
        ),
        single("Tile", "Tile", x, {"r": const("r", [1, 2, 1, 1], i64)}),
        single("Pad", "Pad", x, {"p": const("p", [0, 0, 1, 2, 0, 0, 1, 2], i64)}),
        single(
            "Resize",
            "Resize",
            x,
            {"roi": np.zeros(0), "scales": [1, 1, 2, 2]},
            attrs={"mode": "nearest"},
        ),
        single(
            "DepthToSpace", "DepthToSpace", [("x", T.FLOAT, [1, 8, 4, 4])], attrs={"blocksize": 2}
        ),
        single("SpaceToDepth", "SpaceToDepth", x, attrs={"blocksize": 2}),
        single("Cast", "Cast", x, attrs={"to": T.INT32}, out_type=T.INT32),
        single("Trilu", "Trilu", seq),
        single("CumSum", "CumSum", seq, {"ax": const("ax", 2, i64)}),
    ]
    # reductions, arg and top-k
    for op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2"):
        found.append(single(op, op, x, {"axes": const("axes", [2, 3], i64)}, opset=18))
    found += [
        single(
            "ReduceLogSumExp", "ReduceLogSumExp", x, {"axes": const("axes", [1], i64)}, opset=18
        ),
        single(
            "ReduceSumSquare", "ReduceSumSquare", x, {"axes": const("axes", [1], i64)}, opset=18
        ),
        single("ArgMax", "ArgMax", x, attrs={"axis": 1}, out_type=T.INT64),
        single("ArgMin", "ArgMin", x, attrs={"axis": 1}, out_type=T.INT64),
        single(
            "TopK",
            "TopK",
            seq,
            {"k": const("k", [3], i64)},
            outputs=2,
            out_type=[T.FLOAT, T.INT64],
        ),
        single("NonZero", "NonZero", x, out_type=T.INT64),
        _if_probe(),
    ]
    # other input types: an op's dtypes are those of its probes that ran
    for dtype, name in ((T.INT64, "int64"), (T.INT32, "int32"), (T.INT8, "int8")):
        ints = [("x", dtype, [2, 16]), ("x2", dtype, [2, 16])]
        for op in ("Add", "Sub", "Mul", "Div"):
            found.append(single(f"{op} {name}", op, ints, positive=op == "Div", opset=14))
        found += [single(f"{op} {name}", op, ints[:1], opset=14) for op in ("Neg", "Abs", "Relu")]
        found.append(single(f"Concat {name}", "Concat", ints, attrs={"axis": 1}))
        found.append(
            single(f"Cast {name}", "Cast", ints[:1], attrs={"to": T.FLOAT}, out_type=T.FLOAT)
        )
        # what a token model does to its int64 ids and attention mask before they meet floats
        axis, rows = const("a", [1], i64), const("s", [4, 16], i64)
        found += [
            single(f"Unsqueeze {name}", "Unsqueeze", ints[:1], {"a": axis}),
            single(f"Squeeze {name}", "Squeeze", [("x", dtype, [2, 1, 16])], {"a": axis}),
            single(f"Reshape {name}", "Reshape", ints[:1], {"shape": const("shape", [4, 8], i64)}),
            single(f"Transpose {name}", "Transpose", ints[:1], attrs={"perm": [1, 0]}),
            single(f"Expand {name}", "Expand", [("x", dtype, [1, 16])], {"s": rows}),
            single(f"Equal {name}", "Equal", ints, out_type=T.BOOL),
        ]
    found.append(
        single(
            "MaxPool int8",
            "MaxPool",
            [("x", T.INT8, [1, 6, 10, 10])],
            attrs={"kernel_shape": [2, 2]},
        )
    )
    # variants: when the main probe runs and one of these does not, the op gets the checker
    dw = rng.standard_normal((6, 1, 3, 3)).astype(np.float32)
    grouped = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    five_d = [("x", T.FLOAT, [1, 2, 3, 4, 5])]
    chw = rng.uniform(0.5, 2.0, (6, 10, 10)).astype(np.float32)  # also a divisor
    c11 = rng.standard_normal((1, 6, 1, 1)).astype(np.float32)
    six_d = [("x", T.FLOAT, [1, 2, 2, 3, 2, 2])]
    found += [
        single("Conv depthwise", "Conv", x, {"w": dw}, {"group": 6}, checker="not_depthwise"),
        single("Conv grouped", "Conv", x, {"w": grouped}, {"group": 3}, checker="not_grouped"),
        single(
            "ConvTranspose with bias",
            "ConvTranspose",
            x,
            {"w": rng.standard_normal((6, 4, 2, 2)).astype(np.float32), "b": np.ones(4)},
            {"strides": [2, 2], "kernel_shape": [2, 2]},
            checker="no_bias",
        ),
        single(
            "Gemm without bias",
            "Gemm",
            [("x", T.FLOAT, [2, 12])],
            {"w": np.ones((12, 7))},
            checker="has_bias",
        ),
        single("Conv dilated", "Conv", x, {"w": w}, {"dilations": [2, 2]}, checker="dilations_one"),
        single(
            "MaxPool padded",
            "MaxPool",
            x,
            attrs={"kernel_shape": [3, 3], "pads": [1] * 4},
            checker="pads_zero",
        ),
        single(
            "MaxPool ceil",
            "MaxPool",
            x,
            attrs={"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
            checker="no_partial_window",
        ),
        single(
            "AveragePool ceil",
            "AveragePool",
            x,
            attrs={"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
            checker="no_partial_window",
        ),
        single(
            "AveragePool padded",
            "AveragePool",
            x,
            attrs={"kernel_shape": [3, 3], "pads": [1] * 4},
            checker="pads_zero",
        ),
        single(
            "Pad reflect",
            "Pad",
            x,
            {"p": const("p", [0, 0, 1, 1, 0, 0, 1, 1], i64)},
            {"mode": "reflect"},
            checker="pad_constant",
        ),
        single(
            "Pad edge",
            "Pad",
            x,
            {"p": const("p", [0, 0, 1, 1, 0, 0, 1, 1], i64)},
            {"mode": "edge"},
            checker="pad_constant",
        ),
        single(
            "Pad value",
            "Pad",
            x,
            {"p": const("p", [0, 0, 1, 2, 0, 0, 1, 2], i64), "v": 1.5},
            checker="pad_value_zero",
        ),
        # Pad before opset 11 takes its pads and value as attributes (onnx2tf drops the value)
        single("Pad-2", "Pad", x, attrs={"pads": [0, 0, 1, 2, 0, 0, 1, 2], "value": 1.5}, opset=10),
        single("Pad-11", "Pad", x, {"p": const("p", [0, 0, 1, 2, 0, 0, 1, 2], i64)}, opset=11),
        # operator options onnx2tf writes: a Clip(-1, 1) fused into the op before it
        _fused(
            "Gemm fused Clip",
            "Gemm",
            [("x", T.FLOAT, [2, 12])],
            {"w": np.ones((12, 7)) / 4, "b": ones7},
            -1.0,
        ),
        _fused("Conv fused Clip", "Conv", x, {"w": w / 4, "b": np.ones(8)}, -1.0),
        single(
            "Pad axes",
            "Pad",
            x,
            {"p": const("p", [1, 1, 1, 1], i64), "v": 0.0, "axes": const("axes", [2, 3], i64)},
            opset=18,
            checker="pad_all_axes",
        ),
        single(
            "Resize linear",
            "Resize",
            x,
            {"roi": np.zeros(0), "scales": [1, 1, 2, 2]},
            {"mode": "linear"},
            checker="resize_nearest",
        ),
        single(
            "Cast to int64",
            "Cast",
            x,
            attrs={"to": T.INT64},
            out_type=T.INT64,
            checker="cast_not_to_int64",
        ),
        single("Softmax axis 1", "Softmax", seq, attrs={"axis": 1}, checker="axis_last"),
        single(
            "Gather int64 constant indices",
            "Gather",
            x,
            {"i": const("i", [0, 3, 5], i64)},
            attrs={"axis": 1},
            checker="computed_int32_indices",
        ),
        single(
            "ReduceL2 2-D",
            "ReduceL2",
            [("x", T.FLOAT, [4, 16])],
            {"axes": const("axes", [1], i64)},
            opset=18,
            checker="rank_at_least_3",
        ),
        # attention's scores and weighted values: a MatMul of two computed tensors (batched)
        single(
            "MatMul batched",
            "MatMul",
            [("x", T.FLOAT, [1, 4, 8, 16]), ("x2", T.FLOAT, [1, 4, 16, 8])],
            checker="constant_weights",
        ),
        # a constant below the other input's rank ([C, H, W] against [N, C, H, W]), and a
        # Sum or Mean over inputs of different shapes
        *(
            single(f"{op} rank-3 constant", op, x, {"c": chw}, checker="same_rank")
            for op in ("Add", "Sub", "Mul", "Div", "Max", "Min")
        ),
        *(
            single(f"{op} broadcast", op, x, {"c": c11}, checker="same_shapes")
            for op in ("Sum", "Mean")
        ),
        # Older versions whose meaning differs (before 13, Softmax flattens from `axis` on):
        # a plain probe at another version of the op decides whether that version is listed.
        single("Softmax-11 axis 1", "Softmax", seq, attrs={"axis": 1}, opset=11),
        single("LogSoftmax-11 axis 1", "LogSoftmax", seq, attrs={"axis": 1}, opset=11),
        single(
            "Transpose 5-D",
            "Transpose",
            five_d,
            attrs={"perm": [0, 2, 1, 4, 3]},
            checker="rank_at_most_4",
        ),
        single(
            "Transpose 6-D",
            "Transpose",
            six_d,
            attrs={"perm": [0, 2, 1, 3, 5, 4]},
            checker="rank_at_most_5",
        ),
        single(
            "Slice two axes",
            "Slice",
            x,
            {
                "s": const("s", [1, 2], i64),
                "e": const("e", [5, 9], i64),
                "a": const("a", [1, 3], i64),
            },
            checker="slice_one_axis",
        ),
        single(
            "Slice 5-D",
            "Slice",
            five_d,
            {"s": const("s", [1], i64), "e": const("e", [3], i64), "a": const("a", [2], i64)},
            checker="rank_at_most_4",
        ),
        single(
            "Add 5-D", "Add", [*five_d, ("x2", T.FLOAT, [1, 2, 3, 4, 5])], checker="rank_at_most_4"
        ),
        single(
            "Concat 5-D",
            "Concat",
            [*five_d, ("x2", T.FLOAT, [1, 2, 3, 4, 5])],
            attrs={"axis": 2},
            checker="rank_at_most_4",
        ),
        single(
            "Reshape 5-D",
            "Reshape",
            x,
            {"shape": const("shape", [1, 2, 3, 10, 10], i64)},
            checker="rank_at_most_4",
        ),
    ]
    return found
