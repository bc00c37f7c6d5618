"""Files of opset 11 and up, and files whose declared shapes are stale or missing."""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import helper, numpy_helper

from .common import I64, F, Input, _file, conv, image, ints, make, node, vi, w

# --------------------------------------------------------------------------- opset 11-12


@_file("pytorch_inits_as_inputs_op11_ir6", "PyTorch 1.x keep_initializers_as_inputs=True, "
       "opset 11: Pad-11 (pads input), Clip-11 (inputs)")  # fmt: skip
def _inits_inputs11(rng):
    x, decl = image(c=3, hw=8)
    n1, i1 = conv(rng, "p", "c1", 3, 6, pads=[0, 0, 0, 0])
    inits = [ints("pads", [0, 0, 1, 1, 0, 0, 1, 1]),
             numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
             numpy_helper.from_array(np.array(6.0, np.float32), "hi")]  # fmt: skip
    nodes = [
        node("Pad", ["input", "pads"], ["p"], mode="edge"),
        *n1,
        node("Clip", ["c1", "lo", "hi"], ["output"]),
    ]
    model = make(nodes, [x], [vi("output", [1, 6, 8, 8])], inits + i1, opset=11, ir=6,
                 inits_as_inputs=True)  # fmt: skip
    return model, [decl]


@_file("resize_linear_op11_ir6", "opset 11: Resize linear (roi, scales), align_corners and "
       "half_pixel")  # fmt: skip
def _resize11(rng):
    x, decl = image(c=4, hw=6)
    empty = numpy_helper.from_array(np.zeros(0, np.float32), "roi")
    inits = [empty, numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
    nodes = [node("Resize", ["input", "roi", "scales"], ["a"], mode="linear",
                  coordinate_transformation_mode="align_corners"),
             node("Resize", ["input", "roi", "scales"], ["b"], mode="linear",
                  coordinate_transformation_mode="half_pixel"),
             node("Sub", ["a", "b"], ["output"])]  # fmt: skip
    return make(nodes, [x], [vi("output", [1, 4, 12, 12])], inits, opset=11, ir=6), [decl]


@_file("concat_split_squeeze_op11_ir6", "opset 11: Split(split attr), Concat, Squeeze/Unsqueeze "
       "axes attrs, Transpose")  # fmt: skip
def _split11(rng):
    x, decl = image(c=6, hw=4)
    nodes = [node("Split", ["input"], ["a", "b", "c"], axis=1, split=[1, 2, 3]),
             node("Concat", ["c", "a", "b"], ["cat"], axis=1),
             node("Transpose", ["cat"], ["t"], perm=[0, 2, 3, 1]),
             node("Unsqueeze", ["t"], ["u"], axes=[1]),
             node("Squeeze", ["u"], ["s"], axes=[1]),
             node("Tanh", ["s"], ["output"])]  # fmt: skip
    return make(nodes, [x], [vi("output", [1, 4, 4, 6])], opset=11, ir=6), [decl]


@_file("softmax_3d_op11_ir6", "opset 11 Softmax on a 3-D tensor, axis=1 (the old flattening "
       "semantics), LogSoftmax")  # fmt: skip
def _softmax11(rng):
    inits = [w(rng, "proj", 8, 6)]
    nodes = [
        node("MatMul", ["tokens", "proj"], ["m"]),
        node("Softmax", ["m"], ["sm"], axis=1),
        node("LogSoftmax", ["m"], ["ls"], axis=2),
        node("Add", ["sm", "ls"], ["output"]),
    ]
    model = make(nodes, [vi("tokens", [1, 5, 8])], [vi("output", [1, 5, 6])], inits, opset=11)
    return model, [Input("tokens", (1, 5, 8))]


@_file("reduce_ops_op11_ir6", "opset 11: ReduceMean/ReduceMax/ReduceSum/ReduceL2 with axes attrs")
def _reduce11(rng):
    x, decl = image(c=4, hw=6)
    nodes = [
        node("ReduceMean", ["input"], ["m"], axes=[2, 3], keepdims=1),
        node("ReduceMax", ["input"], ["mx"], axes=[1], keepdims=1),
        node("ReduceSum", ["mx"], ["s"], axes=[2, 3], keepdims=1),
        node("ReduceL2", ["input"], ["l2"], axes=[2, 3], keepdims=1),
        node("Add", ["m", "l2"], ["a"]),
        node("Mul", ["a", "s"], ["output"]),
    ]
    return make(nodes, [x], [vi("output", [1, 4, 1, 1])], opset=11, ir=6), [decl]


@_file("dynamic_quant_convinteger_op11_ir6", "pre-quantized (onnxruntime dynamic): "
       "DynamicQuantizeLinear, ConvInteger, MatMulInteger")  # fmt: skip
def _convinteger(rng):
    x, decl = image(c=3, hw=6)
    inits = [numpy_helper.from_array(rng.integers(0, 255, (4, 3, 3, 3)).astype(np.uint8), "w_q"),
             numpy_helper.from_array(np.array(128, np.uint8), "w_zp"),
             numpy_helper.from_array(np.array(0.004, np.float32), "w_scale"),
             numpy_helper.from_array(rng.integers(0, 255, (144, 5)).astype(np.uint8), "fc_q"),
             numpy_helper.from_array(np.array(127, np.uint8), "fc_zp"),
             ints("flat", [1, 144])]  # fmt: skip
    nodes = [node("DynamicQuantizeLinear", ["input"], ["xq", "xs", "xz"]),
             node("ConvInteger", ["xq", "w_q", "xz", "w_zp"], ["ci"], kernel_shape=[3, 3],
                  pads=[1, 1, 1, 1]),
             node("Cast", ["ci"], ["cf"], to=F), node("Mul", ["xs", "w_scale"], ["sc"]),
             node("Mul", ["cf", "sc"], ["conv"]), node("Relu", ["conv"], ["r"]),
             node("Reshape", ["r", "flat"], ["f"]),
             node("DynamicQuantizeLinear", ["f"], ["fq", "fs", "fz"]),
             node("MatMulInteger", ["fq", "fc_q", "fz", "fc_zp"], ["mi"]),
             node("Cast", ["mi"], ["mf"], to=F), node("Mul", ["fs", "w_scale"], ["fsc"]),
             node("Mul", ["mf", "fsc"], ["output"])]  # fmt: skip
    return make(nodes, [x], [vi("output", [1, 5])], inits, opset=11, ir=6), [decl]


@_file("if_sample_rate_op11_ir6", "streaming audio: a 0-D int64 sample rate that an If branches "
       "on (bound with value: 16000), a state input and output")  # fmt: skip
def _if_rate(rng):
    n, hid = 32, 8
    then_w, else_w = w(rng, "w16k", n, hid, scale=0.3), w(rng, "w8k", n, hid, scale=0.3)
    then_g = helper.make_graph([node("MatMul", ["audio", "w16k"], ["feat_t"])], "then", [],
                               [vi("feat_t", [1, hid])], [then_w])  # fmt: skip
    else_g = helper.make_graph([node("MatMul", ["audio", "w8k"], ["feat_e"])], "else", [],
                               [vi("feat_e", [1, hid])], [else_w])  # fmt: skip
    inits = [ints("rate16k", 16000), w(rng, "U", hid, hid, scale=0.3)]
    nodes = [
        node("Equal", ["sample_rate", "rate16k"], ["is16k"]),
        node("If", ["is16k"], ["feat"], then_branch=then_g, else_branch=else_g),
        node("MatMul", ["state", "U"], ["rec"]),
        node("Add", ["feat", "rec"], ["pre"]),
        node("Tanh", ["pre"], ["new_state"]),
        node("Identity", ["new_state"], ["output"]),
    ]
    inputs = [vi("audio", [1, n]), vi("sample_rate", [], I64), vi("state", [1, hid])]
    model = make(nodes, inputs, [vi("output", [1, hid]), vi("new_state", [1, hid])], inits,
                 opset=11, ir=6)  # fmt: skip
    decls = [Input("audio", (1, n)), Input("sample_rate", (), "int64", None, 16000),
             Input("state", (1, hid))]  # fmt: skip
    return model, decls


@_file("constant_subgraphs_op11_ir6", "constants computed in the graph: Range, Tile, Expand, "
       "Shape of an initializer, ConstantOfShape")  # fmt: skip
def _const_subgraphs(rng):
    inits = [numpy_helper.from_array(np.array(0.0, np.float32), "start"),
             numpy_helper.from_array(np.array(16.0, np.float32), "limit"),
             numpy_helper.from_array(np.array(1.0, np.float32), "delta"),
             ints("reps", [1, 1]), w(rng, "table", 4, 16), ints("two", [2, 16])]  # fmt: skip
    nodes = [node("Range", ["start", "limit", "delta"], ["pos"]),
             node("Unsqueeze", ["pos"], ["pos2"], axes=[0]),
             node("Shape", ["table"], ["tshape"]),
             node("ConstantOfShape", ["tshape"], ["zeros"],
                  value=numpy_helper.from_array(np.array([0.01], np.float32), "v")),
             node("Add", ["table", "zeros"], ["table2"]),
             node("ReduceMean", ["table2"], ["row"], axes=[0], keepdims=1),
             node("Tile", ["row", "reps"], ["row2"]),
             node("Expand", ["pos2", "two"], ["pos3"]),
             node("Mul", ["pos3", "row2"], ["emb"]),
             node("ReduceSum", ["emb"], ["emb1"], axes=[0], keepdims=1),
             node("Mul", ["x", "emb1"], ["output"])]  # fmt: skip
    model = make(nodes, [vi("x", [1, 16])], [vi("output", [1, 16])], inits, opset=11, ir=6)
    return model, [Input("x", (1, 16))]


@_file("tf2onnx_nhwc_colon_names_op11_ir6", "tf2onnx: NHWC input with ':0' and '/' names, "
       "Transposes around a Conv, Relu6 as Clip")  # fmt: skip
def _tf2onnx(rng):
    inits = [w(rng, "conv1/kernel:0", 4, 3, 3, 3), w(rng, "conv1/bias:0", 4),
             numpy_helper.from_array(np.array(0.0, np.float32), "Const:0"),
             numpy_helper.from_array(np.array(6.0, np.float32), "Const_1:0")]  # fmt: skip
    nodes = [
        node("Transpose", ["input_1:0"], ["conv1/Conv2D__6:0"], perm=[0, 3, 1, 2]),
        node(
            "Conv",
            ["conv1/Conv2D__6:0", "conv1/kernel:0", "conv1/bias:0"],
            ["conv1/BiasAdd:0"],
            kernel_shape=[3, 3],
            pads=[1, 1, 1, 1],
        ),
        node("Clip", ["conv1/BiasAdd:0", "Const:0", "Const_1:0"], ["conv1/Relu6:0"]),
        node("Transpose", ["conv1/Relu6:0"], ["Identity:0"], perm=[0, 2, 3, 1]),
    ]
    model = make(nodes, [vi("input_1:0", ["unk__12", 8, 8, 3])],
                 [vi("Identity:0", ["unk__13", 8, 8, 4])], inits, opset=11, ir=6,
                 producer="tf2onnx")  # fmt: skip
    return model, [Input("input_1:0", (1, 8, 8, 3))]


@_file("keras2onnx_at_names_op12_ir7", "keras2onnx-style names with '@', ':' and '/', Gemm, "
       "Softmax, opset 12")  # fmt: skip
def _keras(rng):
    inits = [w(rng, "dense/kernel@0:0", 12, 6, scale=0.3), w(rng, "dense/bias@0:0", 6)]
    nodes = [node("Gemm", ["dense_input:0", "dense/kernel@0:0", "dense/bias@0:0"],
                  ["dense/BiasAdd@0:0"]),
             node("Relu", ["dense/BiasAdd@0:0"], ["dense/Relu@0:0"]),
             node("Softmax", ["dense/Relu@0:0"], ["dense/Softmax:0"], axis=-1)]  # fmt: skip
    model = make(nodes, [vi("dense_input:0", ["N", 12])], [vi("dense/Softmax:0", ["N", 6])],
                 inits, opset=12, ir=7, producer="keras2onnx")  # fmt: skip
    return model, [Input("dense_input:0", (1, 12))]


@_file("layernorm_decomposed_op12_ir7", "a transformer block as opset-12 exporters write it: "
       "LayerNorm as ReduceMean/Sub/Pow/Sqrt/Div, batched MatMul, Erf GELU")  # fmt: skip
def _layernorm12(rng):
    d = 8
    inits = [w(rng, "ln.g", d), w(rng, "ln.b", d), w(rng, "fc1", d, 16, scale=0.3),
             w(rng, "fc2", 16, d, scale=0.3),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
             numpy_helper.from_array(np.array(1.4142135, np.float32), "sqrt2"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]  # fmt: skip
    nodes = [node("ReduceMean", ["x"], ["mu"], axes=[-1]), node("Sub", ["x", "mu"], ["xc"]),
             node("Pow", ["xc", "two"], ["sq"]), node("ReduceMean", ["sq"], ["var"], axes=[-1]),
             node("Add", ["var", "eps"], ["ve"]), node("Sqrt", ["ve"], ["sd"]),
             node("Div", ["xc", "sd"], ["xn"]), node("Mul", ["xn", "ln.g"], ["xg"]),
             node("Add", ["xg", "ln.b"], ["ln"]), node("MatMul", ["ln", "fc1"], ["h"]),
             node("Div", ["h", "sqrt2"], ["hs"]), node("Erf", ["hs"], ["er"]),
             node("Add", ["er", "one"], ["e1"]), node("Mul", ["h", "e1"], ["he"]),
             node("Mul", ["he", "half"], ["gelu"]), node("MatMul", ["gelu", "fc2"], ["o"]),
             node("Add", ["o", "x"], ["output"])]  # fmt: skip
    model = make(nodes, [vi("x", [1, 6, d])], [vi("output", [1, 6, d])], inits, opset=12, ir=7)
    return model, [Input("x", (1, 6, d))]


@_file(
    "instancenorm_op12_ir7", "opset 12: InstanceNormalization, HardSigmoid, Softplus (style nets)"
)
def _instnorm(rng):
    x, decl = image(c=4, hw=8)
    n1, i1 = conv(rng, "input", "c1", 4, 4)
    inits = [w(rng, "in.s", 4), w(rng, "in.b", 4)]
    nodes = [*n1, node("InstanceNormalization", ["c1", "in.s", "in.b"], ["n"], epsilon=1e-5),
             node("HardSigmoid", ["n"], ["hs"], alpha=0.2, beta=0.5),
             node("Softplus", ["hs"], ["output"])]  # fmt: skip
    return make(nodes, [x], [vi("output", [1, 4, 8, 8])], i1 + inits, opset=12, ir=7), [decl]


@_file("gather_embedding_op12_ir7", "opset 12: an int64 token input, Gather embedding, mean pool")
def _embedding(rng):
    inits = [w(rng, "emb", 20, 8), w(rng, "head", 8, 3)]
    nodes = [
        node("Gather", ["emb", "tokens"], ["e"], axis=0),
        node("ReduceMean", ["e"], ["m"], axes=[1], keepdims=0),
        node("MatMul", ["m", "head"], ["output"]),
    ]
    model = make(nodes, [vi("tokens", [1, 7], I64)], [vi("output", [1, 3])], inits, opset=12, ir=7)
    return model, [Input("tokens", (1, 7), "int64")]


# --------------------------------------------------------------------------- declared shapes


def _small_cnn(rng: np.random.Generator, out: str = "output") -> tuple[list[Any], list[Any]]:
    """Conv(3->4) -> Relu -> GlobalAveragePool -> `out` [1, 4, 1, 1] on a 1x3x8x8 `input`."""
    n1, i1 = conv(rng, "input", "c1", 3, 4)
    return [*n1, node("Relu", ["c1"], ["r1"]), node("GlobalAveragePool", ["r1"], [out])], i1


@_file("stale_value_info_op11_ir6", "a declared intermediate shape that contradicts inference "
       "(value_info left from before a graph edit)")  # fmt: skip
def _stale_vi(rng):
    x, decl = image(c=3, hw=8)
    nodes, inits = _small_cnn(rng)
    stale = [vi("c1", [1, 4, 16, 16]), vi("r1", [1, 4, 16, 16])]
    model = make(nodes, [x], [vi("output", [1, 4, 1, 1])], inits, opset=11, value_info=stale)
    return model, [decl]


@_file("wrong_output_rank_op11_ir6", "a declared output rank that is wrong: [1, 4] for a "
       "[1, 4, 1, 1] GlobalAveragePool")  # fmt: skip
def _wrong_rank(rng):
    x, decl = image(c=3, hw=8)
    nodes, inits = _small_cnn(rng)
    return make(nodes, [x], [vi("output", [1, 4])], inits, opset=11), [decl]


@_file("wrong_output_dims_op9_ir4", "a declared output of the right rank and wrong sizes "
       "([1, 10] for [1, 4, 8, 8] flattened to [1, 256])")  # fmt: skip
def _wrong_dims(rng):
    x, decl = image(c=3, hw=8)
    n1, i1 = conv(rng, "input", "c1", 3, 4)
    nodes = [*n1, node("Flatten", ["c1"], ["output"], axis=1)]
    return make(nodes, [x], [vi("output", [1, 10])], i1, opset=9, ir=4), [decl]


@_file("output_without_shape_op12_ir7", "graph outputs declared with a type and no shape, and one "
       "with no type (onnx.checker refuses both; onnxruntime runs it)", checker=False)  # fmt: skip
def _no_shape(rng):
    x, decl = image(c=3, hw=8)
    nodes, inits = _small_cnn(rng, "pooled")
    nodes.append(node("Flatten", ["pooled"], ["output"], axis=1))
    untyped = helper.make_empty_tensor_value_info("pooled")
    model = make(nodes, [x], [vi("output", None), untyped], inits, opset=12, ir=7)
    return model, [decl]


@_file("negative_batch_op9_ir4", "an old exporter's -1 batch dim in the input and output types")
def _negative(rng):
    nodes, inits = _small_cnn(rng)
    model = make(nodes, [vi("input", [-1, 3, 8, 8])], [vi("output", [-1, 4, 1, 1])], inits,
                 opset=9, ir=4)  # fmt: skip
    return model, [Input("input", (1, 3, 8, 8))]


@_file("symbolic_dims_op11_ir6", "a fully convolutional net with symbolic batch, height and width")
def _symbolic(rng):
    n1, i1 = conv(rng, "input", "c1", 3, 4)
    n2, i2 = conv(rng, "r1", "output", 4, 2, k=1)
    nodes = [*n1, node("Relu", ["c1"], ["r1"]), *n2]
    model = make(
        nodes,
        [vi("input", ["batch_size", 3, "height", "width"])],
        [vi("output", ["batch_size", 2, "height", "width"])],
        i1 + i2,
        opset=11,
    )
    return model, [Input("input", (1, 3, 12, 12))]


@_file("intermediate_no_dims_op10_ir5", "value_info of intermediates with a rank and no sizes "
       "(dim_param '?'), Dropout-10 with a mask output nobody reads")  # fmt: skip
def _unknown_dims(rng):
    x, decl = image(c=3, hw=8)
    nodes, inits = _small_cnn(rng, "g")
    nodes += [node("Dropout", ["g"], ["output", "mask"], ratio=0.1)]
    info = [vi("c1", ["?", "?", "?", "?"]), vi("r1", [None, None, None, None])]
    model = make(nodes, [x], [vi("output", [1, 4, 1, 1])], inits, opset=10, ir=5, value_info=info)
    return model, [decl]


# --------------------------------------------------------------------------- opset 13 and up


@_file("split_squeeze_inputs_op13_ir7", "opset 13: Split, Squeeze, Unsqueeze and ReduceSum with "
       "their axes and sizes as inputs, Softmax over one axis")  # fmt: skip
def _op13(rng):
    x, decl = image(c=4, hw=4)
    inits = [ints("sizes", [1, 3]), ints("ax1", [1])]
    nodes = [node("Split", ["input", "sizes"], ["a", "b"], axis=1),
             node("ReduceSum", ["b", "ax1"], ["s"], keepdims=1),
             node("Add", ["a", "s"], ["t"]), node("Squeeze", ["t", "ax1"], ["q"]),
             node("Unsqueeze", ["q", "ax1"], ["u"]),
             node("Softmax", ["u"], ["output"], axis=3)]  # fmt: skip
    return make(nodes, [x], [vi("output", [1, 1, 4, 4])], inits, opset=13, ir=7), [decl]


@_file("resize_sizes_op13_ir7", "opset 13: Resize by sizes (nearest, asymmetric, floor), "
       "as torchvision's interpolate exports")  # fmt: skip
def _resize13(rng):
    x, decl = image(c=3, hw=5)
    n1, i1 = conv(rng, "input", "c1", 3, 4)
    inits = [ints("sizes", [1, 4, 10, 10])]
    nodes = [
        *n1,
        node(
            "Resize",
            ["c1", "", "", "sizes"],
            ["output"],
            mode="nearest",
            coordinate_transformation_mode="asymmetric",
            nearest_mode="floor",
        ),
    ]
    return make(nodes, [x], [vi("output", [1, 4, 10, 10])], i1 + inits, opset=13, ir=7), [decl]


@_file("gru_lstm_stack_op14_ir7", "opset 14: LSTM (layout=0) then GRU, bidirectional LSTM")
def _rnn14(rng):
    t, c, h = 4, 6, 5
    inits = [w(rng, "lw", 2, 4 * h, c, scale=0.3), w(rng, "lr", 2, 4 * h, h, scale=0.3),
             w(rng, "gw", 1, 3 * h, 2 * h, scale=0.3), w(rng, "gr", 1, 3 * h, h, scale=0.3),
             ints("shp", [t, 1, 2 * h])]  # fmt: skip
    nodes = [node("LSTM", ["seq", "lw", "lr"], ["ly"], hidden_size=h, direction="bidirectional"),
             node("Transpose", ["ly"], ["lt"], perm=[0, 2, 1, 3]),
             node("Reshape", ["lt", "shp"], ["lf"]),
             node("GRU", ["lf", "gw", "gr"], ["gy", "output"], hidden_size=h)]  # fmt: skip
    model = make(nodes, [vi("seq", [t, 1, c])], [vi("output", [1, 1, h])], inits, opset=14, ir=7)
    return model, [Input("seq", (t, 1, c), batch_axis=1)]


@_file("layernorm_op17_ir8", "opset 17: LayerNormalization, Gelu as Erf, ReduceMean-13")
def _ln17(rng):
    d = 8
    inits = [w(rng, "g", d), w(rng, "b", d), w(rng, "fc", d, d, scale=0.3)]
    nodes = [node("LayerNormalization", ["x", "g", "b"], ["n"], axis=-1, epsilon=1e-5),
             node("MatMul", ["n", "fc"], ["m"]), node("Sigmoid", ["m"], ["sg"]),
             node("Mul", ["m", "sg"], ["output"])]  # fmt: skip
    model = make(nodes, [vi("x", [1, 4, d])], [vi("output", [1, 4, d])], inits, opset=17, ir=8)
    return model, [Input("x", (1, 4, d))]


@_file("reduce_axes_input_op18_ir8", "opset 18: ReduceMean/ReduceMax with axes as an input, "
       "Pad with axes")  # fmt: skip
def _reduce18(rng):
    x, decl = image(c=4, hw=6)
    inits = [ints("ax", [2, 3]), ints("pads", [1, 1, 1, 1]), ints("pax", [2, 3])]
    nodes = [node("Pad", ["input", "pads", "", "pax"], ["p"], mode="constant"),
             node("ReduceMean", ["p", "ax"], ["m"], keepdims=1),
             node("ReduceMax", ["p", "ax"], ["mx"], keepdims=1),
             node("Sub", ["mx", "m"], ["output"])]  # fmt: skip
    return make(nodes, [x], [vi("output", [1, 4, 1, 1])], inits, opset=18, ir=8), [decl]
