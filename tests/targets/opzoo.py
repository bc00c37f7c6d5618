"""An operator zoo: small ONNX graphs, one op or pattern each, to hold the precheck's verdicts
against what the real runtimes do with them (tests/targets/test_agreement.py).

Cases cover convolutions, pooling, activations, normalisations, reshapes and transposes,
reductions, matmul/attention, resize, pad, slicing, dynamic shapes, control flow, float64,
int64 and int8 (QDQ and integer ops), including types and versions a runtime has no kernel for.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from edgeflow.targets.probes import Case, single, typed_outputs
from edgeflow.targets.probes import const as _const

__all__ = ["DW", "Case", "W", "X", "_const", "cases", "single"]

X = [("x", T.FLOAT, [1, 4, 8, 8])]
W = {"w": np.random.default_rng(1).standard_normal((4, 4, 3, 3)).astype(np.float32)}
DW = {"w": np.random.default_rng(1).standard_normal((4, 1, 3, 3)).astype(np.float32)}


def _if_case() -> Case:
    then = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"])],
        "then",
        [],
        [helper.make_tensor_value_info("a", T.FLOAT, None)],
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["b"])],
        "else",
        [],
        [helper.make_tensor_value_info("b", T.FLOAT, None)],
    )
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["c"]),
        helper.make_node("If", ["c"], ["y0"], then_branch=then, else_branch=other),
    ]
    graph = helper.make_graph(
        nodes,
        "if",
        [helper.make_tensor_value_info("x", T.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y0", T.FLOAT, None)],
        [_const("zero", 0.0)],
    )
    model = typed_outputs(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    return Case("If", model, {"x": np.ones((2, 3), np.float32)})


def _qdq_conv(symmetric: bool) -> Case:
    """QuantizeLinear -> DequantizeLinear around a Conv: how int8 models reach a runtime."""
    rng = np.random.default_rng(2)
    zero = 0 if symmetric else 3
    inits = [
        _const("s", 0.05),
        numpy_helper.from_array(np.array(zero, np.int8), "z"),
        numpy_helper.from_array(rng.integers(-50, 50, (4, 4, 3, 3)).astype(np.int8), "wq"),
        _const("ws", 0.02),
        numpy_helper.from_array(np.array(0, np.int8), "wz"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"]),
        helper.make_node("Conv", ["xd", "wd"], ["y0"], pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", T.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y0", T.FLOAT, None)],
        inits,
    )
    model = typed_outputs(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    feeds = {"x": rng.standard_normal((1, 4, 8, 8)).astype(np.float32)}
    return Case(f"QDQ Conv ({'symmetric' if symmetric else 'zero point 3'})", model, feeds)


def _nonzero_divisor(case: Case) -> Case:
    case.feeds["x2"] = np.full_like(case.feeds["x2"], 3)  # integer division by 0 raises
    return case


def cases() -> list[Case]:
    i8 = [("x", T.INT8, [1, 4, 8, 8])]
    f64 = [("x", T.DOUBLE, [1, 4, 8, 8])]
    i64 = [("x", T.INT64, [2, 8])]
    h16 = [("x", T.FLOAT16, [1, 4, 8, 8])]
    return [
        # convolutions
        single("Conv", "Conv", X, W, {"pads": [1, 1, 1, 1]}),
        single("Conv dilated", "Conv", X, W, {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
        single("Conv depthwise", "Conv", X, DW, {"pads": [1, 1, 1, 1], "group": 4}),
        single("ConvTranspose", "ConvTranspose", X, W, {"strides": [2, 2]}),
        single("Conv float64", "Conv", f64, {"w": _const("w", W["w"], np.float64)}),
        # pooling
        single("MaxPool", "MaxPool", X, attrs={"kernel_shape": [2, 2], "strides": [2, 2]}),
        single("MaxPool padded", "MaxPool", X, attrs={"kernel_shape": [3, 3], "pads": [1] * 4}),
        single("AveragePool", "AveragePool", X, attrs={"kernel_shape": [2, 2]}),
        single("GlobalAveragePool", "GlobalAveragePool", X),
        single("MaxPool int8", "MaxPool", i8, attrs={"kernel_shape": [2, 2]}),
        # activations
        *(single(op, op, X) for op in ("Relu", "Sigmoid", "Tanh", "HardSwish", "HardSigmoid")),
        *(single(op, op, X) for op in ("Erf", "Softplus", "Elu", "Selu")),
        single("Mish (opset 18)", "Mish", X, opset=18),
        single("Gelu (opset 20)", "Gelu", X, opset=20),
        single("LeakyRelu", "LeakyRelu", X, attrs={"alpha": 0.1}),
        single("PRelu", "PRelu", X, {"slope": np.full((4, 1, 1), 0.2, np.float32)}),
        single("Relu int8", "Relu", i8, opset=13),
        single("Relu int8 (opset 14)", "Relu", i8, opset=14),
        single("Sigmoid float64", "Sigmoid", f64),
        single("Erf float64", "Erf", f64),
        # normalisations
        single(
            "BatchNormalization",
            "BatchNormalization",
            X,
            {"g": np.ones(4), "b": np.zeros(4), "m": np.zeros(4), "v": np.ones(4)},
        ),
        single(
            "LayerNormalization",
            "LayerNormalization",
            X,
            {"g": np.ones(8), "b": np.zeros(8)},
            {"axis": -1},
        ),
        single(
            "InstanceNormalization",
            "InstanceNormalization",
            X,
            {"g": np.ones(4), "b": np.zeros(4)},
        ),
        # reshapes and transposes
        single("Reshape", "Reshape", X, {"shape": _const("shape", [1, -1], np.int64)}),
        single("Transpose", "Transpose", X, attrs={"perm": [0, 2, 3, 1]}),
        single("Flatten", "Flatten", X),
        single("Concat", "Concat", [*X, ("x2", T.FLOAT, [1, 4, 8, 8])], attrs={"axis": 1}),
        single("Split", "Split", X, attrs={"axis": 1, "num_outputs": 2}, opset=18, outputs=2),
        single(
            "Transpose 6-D",
            "Transpose",
            [("x", T.FLOAT, [1, 2, 2, 2, 2, 2])],
            attrs={"perm": [0, 2, 1, 3, 5, 4]},
        ),
        # reductions
        single("ReduceMean", "ReduceMean", X, attrs={"axes": [2, 3]}),
        single("ReduceMax", "ReduceMax", X, attrs={"axes": [1]}),
        single("ReduceSum", "ReduceSum", X, {"axes": _const("axes", [1], np.int64)}),
        single("ArgMax", "ArgMax", X, attrs={"axis": 1}, out_type=T.INT64),
        single("ReduceMean int8", "ReduceMean", i8, attrs={"axes": [1]}),
        # matmul / attention
        single("MatMul", "MatMul", [("x", T.FLOAT, [2, 8, 16])], {"w": np.ones((16, 4))}),
        single("Gemm", "Gemm", [("x", T.FLOAT, [2, 16])], {"w": np.ones((16, 4))}),
        single("Softmax", "Softmax", [("x", T.FLOAT, [2, 4, 8])], attrs={"axis": -1}),
        single(
            "MatMul int8",
            "MatMul",
            [("x", T.INT8, [2, 16])],
            {"w": _const("w", np.ones((16, 4)), np.int8)},
        ),
        single(
            "MatMulInteger",
            "MatMulInteger",
            [("x", T.INT8, [2, 16])],
            {"w": _const("w", np.ones((16, 4)), np.int8)},
            out_type=T.INT32,
        ),
        single(
            "Einsum",
            "Einsum",
            [("x", T.FLOAT, [2, 3]), ("x2", T.FLOAT, [3, 4])],
            attrs={"equation": "ij,jk->ik"},
        ),
        # resize, pad, slicing
        single(
            "Resize nearest",
            "Resize",
            X,
            {"roi": np.zeros(0), "scales": [1, 1, 2, 2]},
            attrs={"mode": "nearest"},
        ),
        single(
            "Resize linear",
            "Resize",
            X,
            {"roi": np.zeros(0), "scales": [1, 1, 2, 2]},
            attrs={"mode": "linear"},
        ),
        single("Pad", "Pad", X, {"pads": _const("pads", [0, 0, 1, 1, 0, 0, 1, 1], np.int64)}),
        single(
            "Pad reflect",
            "Pad",
            X,
            {"pads": _const("pads", [0, 0, 1, 1, 0, 0, 1, 1], np.int64)},
            attrs={"mode": "reflect"},
        ),
        single(
            "Slice",
            "Slice",
            X,
            {
                "st": _const("st", [1], np.int64),
                "en": _const("en", [3], np.int64),
                "ax": _const("ax", [1], np.int64),
            },
        ),
        single("Gather", "Gather", X, {"idx": _const("idx", [0, 2], np.int64)}, attrs={"axis": 1}),
        # dynamic shapes, data-dependent sizes
        single("Relu dynamic batch", "Relu", [("x", T.FLOAT, ["batch", 4])]),
        single("NonZero", "NonZero", X, out_type=T.INT64),
        single(
            "TopK",
            "TopK",
            [("x", T.FLOAT, [2, 16])],
            {"k": _const("k", [3], np.int64)},
            outputs=2,
            out_type=[T.FLOAT, T.INT64],
        ),
        # control flow
        _if_case(),
        # float64 and int64
        single("Add float64", "Add", [*f64, ("x2", T.DOUBLE, [1, 4, 8, 8])]),
        single("Add int64", "Add", [*i64, ("x2", T.INT64, [2, 8])]),
        single("Mul int64", "Mul", [*i64, ("x2", T.INT64, [2, 8])]),
        _nonzero_divisor(single("Div int64", "Div", [*i64, ("x2", T.INT64, [2, 8])])),
        single("Cast float->int64", "Cast", X, attrs={"to": T.INT64}, out_type=T.INT64),
        single("Neg int8", "Neg", i8),
        single("Abs int8 (opset 12)", "Abs", i8, opset=12),
        single("Add int8", "Add", [*i8, ("x2", T.INT8, [1, 4, 8, 8])], opset=13),
        single("Add int8 (opset 14)", "Add", [*i8, ("x2", T.INT8, [1, 4, 8, 8])], opset=14),
        single("Sqrt int64", "Sqrt", i64),
        single("Floor float64", "Floor", f64),
        # float16: valid ONNX, but a CPU runtime may have no kernel for it
        *(single(f"{op} float16", op, h16) for op in ("Relu", "Sigmoid", "Tanh", "Exp")),
        *(single(f"{op} float16", op, h16) for op in ("Clip", "Round", "Softmax")),
        single("Conv float16", "Conv", h16, {"w": _const("w", W["w"], np.float16)}),
        single("MatMul float16", "MatMul", h16, {"w": _const("w", np.ones((8, 4)), np.float16)}),
        single("Max float16", "Max", [*h16, ("x2", T.FLOAT16, [1, 4, 8, 8])]),
        single("ReduceMean float16", "ReduceMean", h16, attrs={"axes": [1]}),
        single("ArgMax float16", "ArgMax", h16, attrs={"axis": 1}, out_type=T.INT64),
        single(
            "LayerNormalization float16",
            "LayerNormalization",
            h16,
            {"g": _const("g", np.ones(8), np.float16), "b": _const("b", np.zeros(8), np.float16)},
        ),
        single("AveragePool float64", "AveragePool", f64, attrs={"kernel_shape": [2, 2]}),
        single("Gelu float64 (opset 20)", "Gelu", f64, opset=20),
        single("CumSum int64", "CumSum", i64, {"ax": _const("ax", 1, np.int64)}),
        single("CumSum float16", "CumSum", h16, {"ax": _const("ax", 1, np.int64)}),
        single("Pow int64", "Pow", [*i64, ("x2", T.INT64, [2, 8])]),
        # int8 (QDQ and integer ops)
        _qdq_conv(symmetric=True),
        _qdq_conv(symmetric=False),
        single(
            "QuantizeLinear",
            "QuantizeLinear",
            X,
            {"s": 0.1, "z": _const("z", 0, np.int8)},
            out_type=T.INT8,
        ),
    ]
