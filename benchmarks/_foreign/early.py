"""Files of early exporters: opsets 5-10, IR 3-5 (builders register themselves in FILES)."""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from .common import Input, _file, bn_inits, conv, image, ints, make, node, vi, w

# --------------------------------------------------------------------------- early exporters


@_file("avgpool_add_mul_op6_ir3", "early PyTorch, opset 6: AveragePool-1, Add/Mul with broadcast",
       runs="")  # fmt: skip
def _avgpool_add_mul(rng):
    x, decl = image()
    inits = [w(rng, "bias", 3), w(rng, "gain", 3)]
    nodes = [
        node("AveragePool", ["input"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        node("Add", ["p", "bias"], ["a"], broadcast=1, axis=1),
        node("Mul", ["a", "gain"], ["output"], broadcast=1, axis=1),
    ]
    return make(nodes, [x], [vi("output", [1, 3, 8, 8])], inits, opset=6, ir=3), [decl]


@_file("cnn_consumed_inputs_op5_ir3", "opset 5: Relu and BatchNormalization with consumed_inputs",
       runs="")  # fmt: skip
def _consumed_inputs(rng):
    x, decl = image()
    nodes, inits = conv(rng, "input", "c1", 3, 4)
    inits += bn_inits(rng, "bn", 4)
    nodes += [
        node("BatchNormalization", ["c1", *[t.name for t in inits[-4:]]], ["b1"],
             consumed_inputs=[0, 0, 0, 1, 1], epsilon=1e-5, is_test=1, spatial=1),
        node("Relu", ["b1"], ["r1"], consumed_inputs=[0]),
        node("MaxPool", ["r1"], ["output"], kernel_shape=[2, 2], strides=[2, 2]),
    ]  # fmt: skip
    return make(nodes, [x], [vi("output", [1, 4, 8, 8])], inits, opset=5, ir=3), [decl]


@_file("conv_bn_dropout_op6_ir3", "opset 6: BatchNormalization(spatial, is_test), Dropout(is_test)",
       runs="")  # fmt: skip
def _conv_bn_op6(rng):
    x, decl = image()
    nodes, inits = conv(rng, "input", "c1", 3, 6)
    inits += bn_inits(rng, "bn", 6)
    nodes += [
        node("BatchNormalization", ["c1", *[t.name for t in inits[-4:]]], ["b1"],
             epsilon=1e-5, is_test=1, spatial=1),
        node("Relu", ["b1"], ["r1"]),
        node("Dropout", ["r1"], ["d1"], is_test=1, ratio=0.5),
        node("GlobalAveragePool", ["d1"], ["output"]),
    ]  # fmt: skip
    return make(nodes, [x], [vi("output", [1, 6, 1, 1])], inits, opset=6, ir=3), [decl]


@_file("gemm_broadcast_op6_ir3", "opset 6: Flatten + Gemm(broadcast=1), Clip(min, max) attributes",
       runs="reference")  # fmt: skip
def _gemm_op6(rng):
    x, decl = image(c=2, hw=8)
    inits = [w(rng, "fc.W", 10, 128, scale=0.1), w(rng, "fc.b", 10)]
    nodes = [
        node("Flatten", ["input"], ["f"], axis=1),
        node("Gemm", ["f", "fc.W", "fc.b"], ["g"], broadcast=1, transB=1),
        node("Clip", ["g"], ["output"], min=-1.0, max=1.0),
    ]
    return make(nodes, [x], [vi("output", [1, 10])], inits, opset=6, ir=3), [decl]


@_file("conv_relu_pool_op7_ir3", "opset 7 CNN, IR 3: every initializer also a graph input")
def _conv_op7(rng):
    x, decl = image()
    n1, i1 = conv(rng, "input", "c1", 3, 8, strides=[2, 2])
    n2, i2 = conv(rng, "r1", "c2", 8, 8)
    nodes = [*n1, node("Relu", ["c1"], ["r1"]), *n2, node("Relu", ["c2"], ["r2"]),
             node("MaxPool", ["r2"], ["output"], kernel_shape=[2, 2], strides=[2, 2])]  # fmt: skip
    return make(nodes, [x], [vi("output", [1, 8, 4, 4])], i1 + i2, opset=7, ir=3), [decl]


@_file(
    "constant_nodes_op7_ir3", "Caffe2-era: weights as Constant nodes, AveragePool count_include_pad"
)
def _constant_nodes(rng):
    x, decl = image()
    wt = (rng.standard_normal((4, 3, 3, 3)) * 0.5).astype(np.float32)
    bt = rng.standard_normal(4).astype(np.float32)
    nodes = [
        node("Constant", [], ["W"], value=numpy_helper.from_array(wt, "W")),
        node("Constant", [], ["B"], value=numpy_helper.from_array(bt, "B")),
        node("Conv", ["input", "W", "B"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        node("Sigmoid", ["c"], ["s"]),
        node("AveragePool", ["s"], ["output"], kernel_shape=[3, 3], strides=[2, 2],
             pads=[1, 1, 1, 1], count_include_pad=1),
    ]  # fmt: skip
    return make(nodes, [x], [vi("output", [1, 4, 8, 8])], opset=7, ir=3), [decl]


@_file("upsample_attr_op7_ir3", "opset 7: Upsample with scales as an attribute (nearest)")
def _upsample7(rng):
    x, decl = image(c=3, hw=8)
    n1, i1 = conv(rng, "input", "c1", 3, 4)
    nodes = [*n1, node("Upsample", ["c1"], ["output"], mode="nearest", scales=[1.0, 1.0, 2.0, 2.0])]
    return make(nodes, [x], [vi("output", [1, 4, 16, 16])], i1, opset=7, ir=3), [decl]


@_file("lstm_op7_ir3", "opset 7 LSTM, time-major [T, B, C], initializers as inputs")
def _lstm(rng):
    t, c, hid = 6, 8, 12
    inits = [w(rng, "W", 1, 4 * hid, c, scale=0.3), w(rng, "R", 1, 4 * hid, hid, scale=0.3),
             w(rng, "B", 1, 8 * hid, scale=0.1)]  # fmt: skip
    nodes = [node("LSTM", ["seq", "W", "R", "B"], ["Y", "Y_h"], hidden_size=hid),
             node("Squeeze", ["Y"], ["output"], axes=[1])]  # fmt: skip
    model = make(nodes, [vi("seq", [t, 1, c])], [vi("output", [t, 1, hid])], inits, opset=7, ir=3)
    return model, [Input("seq", (t, 1, c), batch_axis=1)]


@_file("gru_op7_ir3", "opset 7 GRU (linear_before_reset, as PyTorch exports it), batch-first in")
def _gru(rng):
    t, c, hid = 5, 6, 8
    inits = [w(rng, "W", 1, 3 * hid, c, scale=0.3), w(rng, "R", 1, 3 * hid, hid, scale=0.3),
             w(rng, "B", 1, 6 * hid, scale=0.1)]  # fmt: skip
    nodes = [
        node("Transpose", ["seq"], ["tm"], perm=[1, 0, 2]),
        node("GRU", ["tm", "W", "R", "B"], ["Y", "Y_h"], hidden_size=hid, linear_before_reset=1),
        node("Squeeze", ["Y_h"], ["output"], axes=[0]),
    ]
    model = make(nodes, [vi("seq", [1, t, c])], [vi("output", [1, hid])], inits, opset=7, ir=3)
    return model, [Input("seq", (1, t, c))]


@_file("elementwise_op7_ir3", "opset 7: Sub, Div, Max, Min, Exp, Abs, Sqrt, Tanh, LeakyRelu, Elu")
def _elementwise7(rng):
    x = vi("x", [1, 16])
    inits = [w(rng, "a", 16), w(rng, "b", 1, 16)]
    nodes = [
        node("Sub", ["x", "a"], ["s"]), node("Abs", ["s"], ["ab"]),
        node("Sqrt", ["ab"], ["sq"]), node("Div", ["sq", "b"], ["d"]),
        node("Tanh", ["d"], ["t"]), node("Max", ["t", "x"], ["mx"]),
        node("Min", ["mx", "b"], ["mn"]), node("Exp", ["mn"], ["e"]),
        node("LeakyRelu", ["s"], ["lr"], alpha=0.1), node("Elu", ["lr"], ["el"], alpha=1.0),
        node("Add", ["e", "el"], ["output"]),
    ]  # fmt: skip
    return make(nodes, [x], [vi("output", [1, 16])], inits, opset=7, ir=3), [Input("x", (1, 16))]


@_file("sum_mean_max_op8_ir3", "opset 8: variadic Sum/Mean/Max with broadcasting, MaxPool-8")
def _variadic8(rng):
    x, decl = image(c=4, hw=8)
    inits = [w(rng, "a", 4, 1, 1), w(rng, "b", 1, 8, 8)]
    nodes = [
        node("Sum", ["input", "a", "b"], ["s"]), node("Mean", ["input", "s"], ["m"]),
        node("Max", ["m", "a"], ["mx"]),
        node("MaxPool", ["mx"], ["output"], kernel_shape=[2, 2], strides=[2, 2], storage_order=0),
    ]  # fmt: skip
    return make(nodes, [x], [vi("output", [1, 4, 4, 4])], inits, opset=8, ir=3), [decl]


# --------------------------------------------------------------------------- opset 9-10


@_file("alexnet_constantofshape_op9_ir4", "opset-9 classic CNN: LRN, Dropout, biases by "
       "ConstantOfShape, weights scaled in-graph, Flatten-by-Shape chain")  # fmt: skip
def _alexnet_cos(rng):
    x, decl = image(hw=16)
    inits = [w(rng, "conv1.w", 8, 3, 3, 3), w(rng, "conv2.w", 8, 8, 3, 3, scale=0.2),
             w(rng, "fc.w", 10, 32, scale=0.2), ints("c8", [8]), ints("c10", [10])]  # fmt: skip
    one = numpy_helper.from_array(np.array([1.0], np.float32), "v")
    bias = numpy_helper.from_array(np.array([0.1], np.float32), "v")
    nodes = [
        node("ConstantOfShape", ["c8"], ["b1"], value=bias),
        node("ConstantOfShape", ["c8"], ["b2"], value=bias),
        node("ConstantOfShape", ["c10"], ["ones"], value=one),
        node("Mul", ["ones", "ones"], ["b3"]),
        node("Conv", ["input", "conv1.w", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
             strides=[2, 2]),
        node("Relu", ["c1"], ["r1"]),
        node("LRN", ["r1"], ["n1"], size=3, alpha=1e-4, beta=0.75, bias=1.0),
        node("MaxPool", ["n1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        node("Conv", ["p1", "conv2.w", "b2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        node("Relu", ["c2"], ["r2"]),
        node("MaxPool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
        node("Shape", ["p2"], ["sh"]),
        node("Gather", ["sh", "zero"], ["n"], axis=0),
        node("Unsqueeze", ["n"], ["n1d"], axes=[0]),
        node("Concat", ["n1d", "minus1"], ["flat_shape"], axis=0),
        node("Reshape", ["p2", "flat_shape"], ["f"]),
        node("Dropout", ["f"], ["d"], ratio=0.5),
        node("Gemm", ["d", "fc.w", "b3"], ["output"], transB=1),
    ]  # fmt: skip
    inits += [ints("zero", 0), ints("minus1", [-1])]
    return make(nodes, [x], [vi("output", [1, 10])], inits, opset=9, ir=4), [decl]


@_file("resnet_block_op9_ir4", "opset-9 residual block: Conv+BN(no spatial)+Relu, Add, global pool")
def _resnet9(rng):
    x, decl = image(c=4, hw=8)
    n1, i1 = conv(rng, "input", "c1", 4, 4)
    n2, i2 = conv(rng, "r1", "c2", 4, 4)
    b1, b2 = bn_inits(rng, "bn1", 4), bn_inits(rng, "bn2", 4)
    nodes = [
        *n1,
        node("BatchNormalization", ["c1", *[t.name for t in b1]], ["n1"]),
        node("Relu", ["n1"], ["r1"]),
        *n2,
        node("BatchNormalization", ["c2", *[t.name for t in b2]], ["n2"]),
        node("Add", ["n2", "input"], ["s"]),
        node("Relu", ["s"], ["r2"]),
        node("GlobalAveragePool", ["r2"], ["g"]),
        node("Flatten", ["g"], ["output"]),
    ]
    inits = i1 + i2 + b1 + b2
    return make(nodes, [x], [vi("output", [1, 4])], inits, opset=9, ir=4), [decl]


@_file("convtranspose_op9_ir4", "opset-9 decoder: ConvTranspose stride 2, output_padding, Sigmoid")
def _convtranspose(rng):
    x, decl = image(c=4, hw=8)
    inits = [w(rng, "up.w", 4, 3, 3, 3, scale=0.3), w(rng, "up.b", 3)]
    nodes = [node("ConvTranspose", ["input", "up.w", "up.b"], ["u"], kernel_shape=[3, 3],
                  strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]),
             node("Sigmoid", ["u"], ["output"])]  # fmt: skip
    return make(nodes, [x], [vi("output", [1, 3, 16, 16])], inits, opset=9, ir=4), [decl]


@_file("upsample_scales_op9_ir4", "opset 9: Upsample with scales as an input (bilinear)")
def _upsample9(rng):
    x, decl = image(c=3, hw=8)
    inits = [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
    n1, i1 = conv(rng, "input", "c1", 3, 4)
    nodes = [*n1, node("Upsample", ["c1", "scales"], ["output"], mode="linear")]
    return make(nodes, [x], [vi("output", [1, 4, 16, 16])], inits + i1, opset=9, ir=4), [decl]


@_file("pad_attr_slice_attr_op9_ir4", "opset 9: Pad with pads as an attribute (reflect), Slice-1")
def _pad_slice9(rng):
    x, decl = image(c=3, hw=12)
    n1, i1 = conv(rng, "p", "c1", 3, 4, pads=[0, 0, 0, 0])
    nodes = [
        node("Pad", ["input"], ["p"], mode="reflect", pads=[0, 0, 1, 1, 0, 0, 1, 1]),
        *n1,
        node("Slice", ["c1"], ["output"], axes=[2, 3], starts=[2, 1], ends=[10, -1]),
    ]
    return make(nodes, [x], [vi("output", [1, 4, 8, 10])], i1, opset=9, ir=4), [decl]


@_file("depthwise_relu6_op9_ir4", "MobileNet-v1 style, opset 9: depthwise Conv, Clip(0, 6) attrs")
def _depthwise9(rng):
    x, decl = image(c=8, hw=8)
    n1, i1 = conv(rng, "input", "dw", 8, 8, group=8)
    n2, i2 = conv(rng, "r1", "pw", 8, 12, k=1)
    nodes = [*n1, node("Clip", ["dw"], ["r1"], min=0.0, max=6.0), *n2,
             node("Clip", ["pw"], ["output"], min=0.0, max=6.0)]  # fmt: skip
    return make(nodes, [x], [vi("output", [1, 12, 8, 8])], i1 + i2, opset=9, ir=4), [decl]


@_file("paddle_style_minus1_op9_ir4", "Paddle2ONNX: -1 batch, '@' and '.tmp_' names, MatMul + Add")
def _paddle(rng):
    inits = [
        w(rng, "fc_0.w_0", 64, 10, scale=0.2),
        w(rng, "fc_0.b_0", 10),
        ints("shape@0", [-1, 64]),
    ]
    nodes = [node("Reshape", ["image", "shape@0"], ["reshape2_0.tmp_0"]),
             node("MatMul", ["reshape2_0.tmp_0", "fc_0.w_0"], ["fc_0.tmp_0"]),
             node("Add", ["fc_0.tmp_0", "fc_0.b_0"], ["fc_0.tmp_1@@out"]),
             node("Softmax", ["fc_0.tmp_1@@out"], ["softmax_0.tmp_0"], axis=1)]  # fmt: skip
    model = make(nodes, [vi("image", [-1, 1, 8, 8])], [vi("softmax_0.tmp_0", [-1, 10])], inits,
                 opset=9, ir=4, producer="PaddlePaddle")  # fmt: skip
    return model, [Input("image", (1, 1, 8, 8))]


@_file("prelu_where_op9_ir4", "opset 9: PRelu per channel, Where on a comparison, Expand")
def _prelu9(rng):
    x, decl = image(c=4, hw=6)
    inits = [
        w(rng, "slope", 4, 1, 1, scale=0.2),
        ints("shape", [1, 4, 6, 6]),
        numpy_helper.from_array(np.array(0.25, np.float32), "thr"),
        w(rng, "alt", 1, 4, 1, 1),
    ]
    nodes = [
        node("PRelu", ["input", "slope"], ["p"]),
        node("Greater", ["p", "thr"], ["m"]),
        node("Expand", ["alt", "shape"], ["e"]),
        node("Where", ["m", "p", "e"], ["output"]),
    ]
    return make(nodes, [x], [vi("output", [1, 4, 6, 6])], inits, opset=9, ir=4), [decl]


@_file("maxpool_ceil_pads_op10_ir5", "opset 10: MaxPool and AveragePool with ceil_mode and pads")
def _ceil10(rng):
    x, decl = image(c=3, hw=11)
    nodes = [node("MaxPool", ["input"], ["m"], kernel_shape=[3, 3], strides=[2, 2],
                  pads=[1, 1, 1, 1], ceil_mode=1),
             node("AveragePool", ["m"], ["output"], kernel_shape=[2, 2], strides=[2, 2],
                  ceil_mode=1, count_include_pad=0)]  # fmt: skip
    return make(nodes, [x], [vi("output", [1, 3, 3, 3])], opset=10, ir=5), [decl]


@_file("resize_nearest_slice_op10_ir5", "opset 10: Resize(scales) nearest, Slice with inputs")
def _resize10(rng):
    x, decl = image(c=3, hw=8)
    n1, i1 = conv(rng, "input", "c1", 3, 4)
    inits = [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
             ints("st", [1, 1]), ints("en", [15, 15]), ints("ax", [2, 3])]  # fmt: skip
    nodes = [
        *n1,
        node("Resize", ["c1", "scales"], ["r"], mode="nearest"),
        node("Slice", ["r", "st", "en", "ax"], ["output"]),
    ]
    return make(nodes, [x], [vi("output", [1, 4, 14, 14])], i1 + inits, opset=10, ir=5), [decl]


@_file("qlinearconv_op10_ir5", "pre-quantized (onnxruntime static): QuantizeLinear, QLinearConv, "
       "DequantizeLinear")  # fmt: skip
def _qlinearconv(rng):
    x, decl = image(c=3, hw=8)
    wq = rng.integers(-60, 60, (4, 3, 3, 3)).astype(np.int8)
    inits = [
        numpy_helper.from_array(np.array(0.02, np.float32), "x_scale"),
        numpy_helper.from_array(np.array(128, np.uint8), "x_zp"),
        numpy_helper.from_array(wq, "w_q"),
        numpy_helper.from_array(np.array(0.01, np.float32), "w_scale"),
        numpy_helper.from_array(np.array(0, np.int8), "w_zp"),
        numpy_helper.from_array(np.array(0.05, np.float32), "y_scale"),
        numpy_helper.from_array(np.array(128, np.uint8), "y_zp"),
        numpy_helper.from_array(rng.integers(-500, 500, 4).astype(np.int32), "bias_q"),
    ]
    nodes = [node("QuantizeLinear", ["input", "x_scale", "x_zp"], ["xq"]),
             node("QLinearConv", ["xq", "x_scale", "x_zp", "w_q", "w_scale", "w_zp", "y_scale",
                                  "y_zp", "bias_q"], ["yq"], kernel_shape=[3, 3],
                  pads=[1, 1, 1, 1]),
             node("DequantizeLinear", ["yq", "y_scale", "y_zp"], ["output"])]  # fmt: skip
    return make(nodes, [x], [vi("output", [1, 4, 8, 8])], inits, opset=10, ir=5), [decl]


# --------------------------------------------------------------------------- more IR-3/4 nets


@_file("vgg_block_op8_ir3", "opset 8 VGG block: Conv-Relu-Conv-Relu-MaxPool, Flatten, Gemm, "
       "Softmax")  # fmt: skip
def _vgg8(rng):
    x, decl = image(c=3, hw=8)
    n1, i1 = conv(rng, "input", "c1", 3, 4)
    n2, i2 = conv(rng, "r1", "c2", 4, 4)
    inits = [w(rng, "fc.w", 5, 64, scale=0.2), w(rng, "fc.b", 5)]
    nodes = [*n1, node("Relu", ["c1"], ["r1"]), *n2, node("Relu", ["c2"], ["r2"]),
             node("MaxPool", ["r2"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             node("Flatten", ["p"], ["f"]), node("Gemm", ["f", "fc.w", "fc.b"], ["g"], transB=1),
             node("Softmax", ["g"], ["output"])]  # fmt: skip
    return make(nodes, [x], [vi("output", [1, 5])], i1 + i2 + inits, opset=8, ir=3), [decl]


@_file("shuffle_reshape_transpose_op9_ir4", "ShuffleNet channel shuffle: Reshape/Transpose/Reshape "
       "then a depthwise Conv")  # fmt: skip
def _shuffle9(rng):
    x, decl = image(c=8, hw=4)
    inits = [ints("s5", [1, 2, 4, 4, 4]), ints("s4", [1, 8, 4, 4])]
    n1, i1 = conv(rng, "sh", "output", 8, 8, group=8)
    nodes = [node("Reshape", ["input", "s5"], ["r5"]),
             node("Transpose", ["r5"], ["t5"], perm=[0, 2, 1, 3, 4]),
             node("Reshape", ["t5", "s4"], ["sh"]), *n1]  # fmt: skip
    return make(nodes, [x], [vi("output", [1, 8, 4, 4])], inits + i1, opset=9, ir=4), [decl]


@_file("inception_concat_op7_ir3", "Inception block, opset 7: 1x1/3x3/5x5 branches and a pooled "
       "branch concatenated")  # fmt: skip
def _inception(rng):
    x, decl = image(c=4, hw=8)
    a, ia = conv(rng, "input", "a", 4, 2, k=1)
    b, ib = conv(rng, "input", "b", 4, 2, k=3)
    c, ic = conv(rng, "input", "c", 4, 2, k=5)
    d, id_ = conv(rng, "pool", "d", 4, 2, k=1)
    nodes = [*a, *b, *c, node("MaxPool", ["input"], ["pool"], kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1]), *d,
             node("Concat", ["a", "b", "c", "d"], ["cat"], axis=1),
             node("Relu", ["cat"], ["output"])]  # fmt: skip
    return make(nodes, [x], [vi("output", [1, 8, 8, 8])], ia + ib + ic + id_, opset=7, ir=3), [decl]


@_file("densenet_concat_bn_op9_ir4", "DenseNet layer, opset 9: BN-Relu-Conv and a growing Concat, "
       "AveragePool transition")  # fmt: skip
def _densenet(rng):
    x, decl = image(c=4, hw=8)
    b1 = bn_inits(rng, "bn1", 4)
    c1, i1 = conv(rng, "r1", "c1", 4, 2)
    b2 = bn_inits(rng, "bn2", 6)
    c2, i2 = conv(rng, "r2", "c2", 6, 4, k=1)
    nodes = [
        node("BatchNormalization", ["input", *[t.name for t in b1]], ["n1"]),
        node("Relu", ["n1"], ["r1"]),
        *c1,
        node("Concat", ["input", "c1"], ["cat"], axis=1),
        node("BatchNormalization", ["cat", *[t.name for t in b2]], ["n2"]),
        node("Relu", ["n2"], ["r2"]),
        *c2,
        node("AveragePool", ["c2"], ["output"], kernel_shape=[2, 2], strides=[2, 2]),
    ]
    inits = b1 + i1 + b2 + i2
    return make(nodes, [x], [vi("output", [1, 4, 4, 4])], inits, opset=9, ir=4), [decl]


@_file("multi_io_op10_ir5", "two inputs and two outputs (an image and a feature vector), Gemm "
       "with alpha/beta, Mul broadcast")  # fmt: skip
def _multi_io(rng):
    x, decl = image(c=3, hw=6)
    n1, i1 = conv(rng, "input", "c1", 3, 4)
    inits = [w(rng, "fw", 5, 4, scale=0.3), w(rng, "fb", 1, 4)]
    nodes = [*n1, node("GlobalAveragePool", ["c1"], ["g"]), node("Flatten", ["g"], ["gf"]),
             node("Gemm", ["feat", "fw", "fb"], ["fe"], alpha=0.5, beta=2.0),
             node("Mul", ["gf", "fe"], ["mix"]), node("Tanh", ["mix"], ["output_b"]),
             node("Relu", ["c1"], ["output_a"])]  # fmt: skip
    outputs = [vi("output_a", [1, 4, 6, 6]), vi("output_b", [1, 4])]
    model = make(nodes, [x, vi("feat", [1, 5])], outputs, i1 + inits, opset=10, ir=5)
    return model, [decl, Input("feat", (1, 5))]


@_file("conv1d_audio_op11_ir6", "a 1-D audio net, opset 11: Conv1d, MaxPool1d, Unsqueeze, "
       "ReduceMean over time")  # fmt: skip
def _conv1d(rng):
    inits = [w(rng, "k1", 4, 1, 5, scale=0.4), w(rng, "b1", 4), w(rng, "k2", 6, 4, 3, scale=0.4)]
    nodes = [node("Unsqueeze", ["wave"], ["w3"], axes=[1]),
             node("Conv", ["w3", "k1", "b1"], ["c1"], kernel_shape=[5], strides=[2], pads=[2, 2]),
             node("Relu", ["c1"], ["r1"]),
             node("MaxPool", ["r1"], ["p1"], kernel_shape=[2], strides=[2]),
             node("Conv", ["p1", "k2"], ["c2"], kernel_shape=[3], pads=[1, 1]),
             node("ReduceMean", ["c2"], ["output"], axes=[2], keepdims=0)]  # fmt: skip
    model = make(nodes, [vi("wave", [1, 64])], [vi("output", [1, 6])], inits, opset=11)
    return model, [Input("wave", (1, 64))]


@_file("yolo_head_op11_ir6", "a detector head, opset 11: Conv, Sigmoid, Reshape/Transpose to "
       "[1, anchors, 5+C], Slice along the last axis, Concat")  # fmt: skip
def _yolo(rng):
    x, decl = image(c=4, hw=4)
    n1, i1 = conv(rng, "input", "h", 4, 14, k=1)  # 2 anchors x (5 + 2 classes)
    inits = [
        ints("s", [1, 2, 7, 16]),
        ints("st0", [0]),
        ints("en4", [4]),
        ints("en7", [7]),
        ints("st4", [4]),
        ints("ax", [2]),
        ints("s2", [1, 32, 7]),
    ]
    nodes = [*n1, node("Reshape", ["h", "s"], ["r"]),
             node("Transpose", ["r"], ["t"], perm=[0, 1, 3, 2]),
             node("Reshape", ["t", "s2"], ["flat"]),
             node("Slice", ["flat", "st0", "en4", "ax"], ["box"]),
             node("Slice", ["flat", "st4", "en7", "ax"], ["conf"]),
             node("Sigmoid", ["conf"], ["sconf"]),
             node("Concat", ["box", "sconf"], ["output"], axis=2)]  # fmt: skip
    return make(nodes, [x], [vi("output", [1, 32, 7])], i1 + inits, opset=11), [decl]


@_file("matmul_bias_relu_op7_ir3", "an old MLP, opset 7: MatMul + Add + Relu, Reshape input "
       "flattening, initializers as inputs")  # fmt: skip
def _mlp7(rng):
    inits = [
        w(rng, "w1", 32, 16, scale=0.3),
        w(rng, "b1", 16),
        w(rng, "w2", 16, 4, scale=0.3),
        ints("flat", [1, 32]),
    ]
    nodes = [node("Reshape", ["x", "flat"], ["xf"]), node("MatMul", ["xf", "w1"], ["m1"]),
             node("Add", ["m1", "b1"], ["a1"]), node("Relu", ["a1"], ["r1"]),
             node("MatMul", ["r1", "w2"], ["output"])]  # fmt: skip
    model = make(nodes, [vi("x", [1, 2, 16])], [vi("output", [1, 4])], inits, opset=7, ir=3)
    return model, [Input("x", (1, 2, 16))]
