"""onnx.equalize_channels: on models built here with channels of chosen weight ranges, the
rewritten model computes what the original does (onnxruntime), each pair's per-channel ranges
become the geometric mean the paper's scales give, per-tensor int8 weights lose less, and every
pair it must not touch (a residual, a branch, Relu6, HardSigmoid) is kept."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from edgeflow.core.onnxgraph import same_graph
from edgeflow.rules.onnx.equalize import EqualizeChannels
from tests.rules.onnx.helpers import apply, model, run
from tests.rules.sites import outcomes

RNG = np.random.default_rng(0)


def ranged(shape: tuple[int, ...], ranges: np.ndarray, axis: int) -> np.ndarray:
    """Random weights whose slices along `axis` have largest |w| exactly `ranges`."""
    w = RNG.uniform(-1, 1, shape)
    peak = np.abs(w).max(axis=tuple(d for d in range(len(shape)) if d != axis), keepdims=True)
    view = [1] * len(shape)
    view[axis] = len(ranges)
    return (w / peak * ranges.reshape(view)).astype(np.float32)


def spread(n: int, low: float = 0.01, high: float = 4.0) -> np.ndarray:
    """n channel ranges, log-spaced over [low, high], shuffled."""
    return RNG.permutation(np.geomspace(low, high, n))


def weights(m: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}


def out_ranges(w: np.ndarray) -> np.ndarray:  # a Conv's output channels
    return np.abs(w).reshape(w.shape[0], -1).max(axis=1)


def in_ranges(w: np.ndarray) -> np.ndarray:  # a (non-grouped) Conv's input channels
    return np.abs(w).max(axis=(0, 2, 3))


def same_outputs(before: onnx.ModelProto, after: onnx.ModelProto, x: np.ndarray) -> float:
    """The largest output difference relative to the output range (asserted below 1e-5)."""
    (want,), (got,) = run(before, {"x": x}), run(after, {"x": x})
    relative = float(np.abs(got - want).max() / np.ptp(want))
    assert relative < 1e-5, relative
    return relative


def conv(x: str, w: str, b: str, y: str, **attrs: Any) -> onnx.NodeProto:
    return helper.make_node("Conv", [x, w, b] if b else [x, w], [y], name=y, **attrs)


A, B = spread(8), spread(8, 0.05, 2.0)  # W1's output ranges, W2's input ranges


def conv_relu_conv(
    between: list[onnx.NodeProto] | None = None, extra: dict[str, Any] | None = None
) -> onnx.ModelProto:
    """x [1, 3, 8, 8] -> Conv h (8 channels, ranges A) -> `between` (Relu) -> Conv y
    (reads the 8 with ranges B); `extra`: more initializers (a Clip's bounds)."""
    nodes = [conv("x", "w1", "b1", "h", pads=[1, 1, 1, 1])]
    nodes += between if between is not None else [helper.make_node("Relu", ["h"], ["r"])]
    nodes.append(conv(nodes[-1].output[0], "w2", "b2", "y"))
    inits = {
        "w1": ranged((8, 3, 3, 3), A, 0),
        "b1": RNG.uniform(-1, 1, 8).astype(np.float32),
        "w2": ranged((4, 8, 3, 3), B, 1),
        "b2": RNG.uniform(-1, 1, 4).astype(np.float32),
        **{k: np.asarray(v, np.float32) for k, v in (extra or {}).items()},
    }
    return model(nodes, [("x", T.FLOAT, [1, 3, 8, 8])], [("y", T.FLOAT, None)], inits)


X = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)


def test_conv_relu_conv_ranges_become_their_geometric_mean() -> None:
    m = conv_relu_conv()
    result = apply(EqualizeChannels, m)  # checker, idempotence, input untouched
    assert outcomes(result) == [("changed", "h"), ("kept", "y")]  # y: a graph output
    same_outputs(m, result.model, X)
    w = weights(result.model)
    np.testing.assert_allclose(out_ranges(w["w1"]), np.sqrt(A * B), rtol=1e-6)
    np.testing.assert_allclose(in_ranges(w["w2"]), np.sqrt(A * B), rtol=1e-6)
    before = weights(m)
    scale = np.sqrt(A / B)  # s_i = sqrt(r1_i / r2_i): the bias follows its channel
    np.testing.assert_allclose(w["b1"], before["b1"] / scale, rtol=1e-6)
    np.testing.assert_array_equal(w["b2"], before["b2"])
    # W1's channel ranges spanned a factor 400 (0.01 .. 4), now that of sqrt(A * B)
    spans = [float(np.ptp(out_ranges(v["w1"])) / out_ranges(v["w1"]).min()) for v in (before, w)]
    expected = np.ptp(np.sqrt(A * B)) / np.sqrt(A * B).min()
    assert spans == pytest.approx([399.0, expected], rel=1e-5) and expected < 50


def per_tensor_int8(m: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every Conv/Gemm weight rounded to symmetric per-tensor int8."""
    out = onnx.ModelProto()
    out.CopyFrom(m)
    for t in out.graph.initializer:
        if t.name.startswith("w"):
            w = numpy_helper.to_array(t)
            step = np.abs(w).max() / 127
            t.CopyFrom(numpy_helper.from_array((np.round(w / step) * step).astype(w.dtype), t.name))
    return out


def test_per_tensor_int8_weights_lose_less() -> None:
    m = conv_relu_conv()
    equalized = apply(EqualizeChannels, m).model
    (want,) = run(m, {"x": X})
    errors = [
        float(np.abs(run(per_tensor_int8(v), {"x": X})[0] - want).max() / np.ptp(want))
        for v in (m, equalized)
    ]
    assert errors[1] < errors[0] / 3, errors  # measured: 0.0117 -> 0.0029


def test_a_depthwise_chain_is_swept_to_one_range_per_channel() -> None:
    """conv -> dw conv -> relu -> conv: channel i's three ranges converge to their
    geometric mean (the product of the three is what scaling keeps)."""
    a, d, c = spread(6), spread(6, 0.1, 3.0), spread(6, 0.02, 1.0)
    nodes = [
        conv("x", "w1", "b1", "h"),
        conv("h", "wd", "bd", "d", group=6, pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["d"], ["r"]),
        conv("r", "w3", "", "y"),
    ]
    inits = {
        "w1": ranged((6, 3, 1, 1), a, 0),
        "b1": RNG.uniform(-1, 1, 6).astype(np.float32),
        "wd": ranged((6, 1, 3, 3), d, 0),
        "bd": RNG.uniform(-1, 1, 6).astype(np.float32),
        "w3": ranged((5, 6, 1, 1), c, 1),
    }
    m = model(nodes, [("x", T.FLOAT, [1, 3, 8, 8])], [("y", T.FLOAT, None)], inits)
    result = apply(EqualizeChannels, m)
    assert outcomes(result) == [("changed", "h"), ("changed", "d"), ("kept", "y")]
    same_outputs(m, result.model, X)
    w = weights(result.model)
    target = np.cbrt(a * d * c)
    for found in (out_ranges(w["w1"]), out_ranges(w["wd"]), in_ranges(w["w3"])):
        np.testing.assert_allclose(found, target, rtol=3e-3)  # threshold 1e-3 per pair


def test_grouped_conv_scales_each_input_channel_in_its_group() -> None:
    """8 channels into a Conv of 2 groups: input channel i is column i % 4 of group i // 4."""
    nodes = [
        conv("x", "w1", "b1", "h"),
        helper.make_node("Relu", ["h"], ["r"]),
        conv("r", "w2", "", "y", group=2),
    ]
    inits = {"w1": ranged((8, 3, 1, 1), A, 0), "b1": np.zeros(8, np.float32)}
    # group 0 (rows 0-2) reads channels 0-3, group 1 (rows 3-5) channels 4-7
    inits["w2"] = np.concatenate([ranged((3, 4, 1, 1), B[:4], 1), ranged((3, 4, 1, 1), B[4:], 1)])
    m = model(nodes, [("x", T.FLOAT, [1, 3, 8, 8])], [("y", T.FLOAT, None)], inits)
    result = apply(EqualizeChannels, m)
    assert outcomes(result)[0] == ("changed", "h")
    same_outputs(m, result.model, X)
    w = weights(result.model)
    np.testing.assert_allclose(out_ranges(w["w1"]), np.sqrt(A * B), rtol=1e-6)
    found = np.concatenate(
        [np.abs(w["w2"][:3]).max(axis=(0, 2, 3)), np.abs(w["w2"][3:]).max(axis=(0, 2, 3))]
    )
    np.testing.assert_allclose(found, np.sqrt(A * B), rtol=1e-6)


def test_gemm_relu_gemm_and_matmul_add_relu_matmul() -> None:
    """Gemm (transB, as torch's Linear) -> Relu -> MatMul + Add -> LeakyRelu -> Gemm."""
    r2 = spread(8, 0.05, 2.0)
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="g1", transB=1),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["m"], name="m2"),
        helper.make_node("Add", ["m", "b2"], ["a"]),
        helper.make_node("LeakyRelu", ["a"], ["l"], alpha=0.1),
        helper.make_node("Gemm", ["l", "w3", "b3"], ["y"], name="g3"),
    ]
    inits = {
        "w1": ranged((8, 5), A, 0),  # [N, K]: output channel j is row j
        "b1": RNG.uniform(-1, 1, 8).astype(np.float32),
        "w2": ranged((8, 6), B, 0),  # [K, N]: input channel k is row k, output n column n
        "b2": RNG.uniform(-1, 1, 6).astype(np.float32),
        "w3": ranged((6, 3), r2[:6], 0),  # [K, N]: input channel k is row k
        "b3": RNG.uniform(-1, 1, 3).astype(np.float32),
    }
    m = model(nodes, [("x", T.FLOAT, [4, 5])], [("y", T.FLOAT, None)], inits)
    result = apply(EqualizeChannels, m)
    assert outcomes(result) == [("changed", "g1"), ("changed", "m2"), ("kept", "g3")]
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    same_outputs(m, result.model, x)
    w = weights(result.model)
    np.testing.assert_allclose(np.abs(w["w1"]).max(axis=1), np.abs(w["w2"]).max(axis=1), rtol=3e-3)
    np.testing.assert_allclose(np.abs(w["w2"]).max(axis=0), np.abs(w["w3"]).max(axis=1), rtol=3e-3)


def test_residual_and_branch_are_left_alone() -> None:
    """Relu's output also feeds an Add (a residual); h is also a graph output (a branch)."""
    nodes = [
        conv("x", "w1", "b1", "h", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["h"], ["r"]),
        conv("r", "w2", "b2", "c", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["r", "c"], ["y"]),
    ]
    inits = {
        "w1": ranged((8, 3, 3, 3), A, 0),
        "b1": np.zeros(8, np.float32),
        "w2": ranged((8, 8, 3, 3), B, 1),
        "b2": np.zeros(8, np.float32),
    }
    residual = model(nodes, [("x", T.FLOAT, [1, 3, 8, 8])], [("y", T.FLOAT, None)], inits)
    result = apply(EqualizeChannels, residual)
    assert outcomes(result) == [("kept", "h"), ("kept", "c")]  # r has 2 readers; c: Add
    assert same_graph(result.model, residual)
    branch = conv_relu_conv()
    branch.graph.output.append(helper.make_tensor_value_info("h", T.FLOAT, [1, 8, 8, 8]))
    result = apply(EqualizeChannels, branch)
    assert outcomes(result) == [("kept", "h"), ("kept", "y")] and same_graph(result.model, branch)


def clip(low: float | None, high: float | None) -> list[onnx.NodeProto]:
    return [
        helper.make_node(
            "Clip", ["h", "lo" if low is not None else "", "hi" if high is not None else ""], ["r"]
        )
    ]


@pytest.mark.parametrize(
    ("between", "extra", "changed"),
    [
        (clip(0.0, 6.0), {"lo": 0.0, "hi": 6.0}, False),  # Relu6: its bound would move
        (clip(0.0, None), {"lo": 0.0}, True),  # Relu as Clip
        ([helper.make_node("HardSigmoid", ["h"], ["r"])], {}, False),
        ([helper.make_node("Sigmoid", ["h"], ["r"])], {}, False),
        (
            [helper.make_node("PRelu", ["h", "slope"], ["r"])],
            {"slope": RNG.uniform(0, 1, (8, 1, 1))},
            True,
        ),
        (
            [helper.make_node("MaxPool", ["h"], ["r"], kernel_shape=[2, 2], strides=[2, 2])],
            {},
            True,
        ),
        ([], {}, True),  # nothing between
    ],
    ids=["relu6", "clip_min_0", "hardsigmoid", "sigmoid", "prelu", "maxpool", "none"],
)
def test_only_positive_homogeneous_ops_between(between, extra, changed) -> None:
    m = conv_relu_conv(between, extra)
    result = apply(EqualizeChannels, m)
    assert outcomes(result)[0] == ("changed" if changed else "kept", "h")
    same_outputs(m, result.model, X)


def test_conv_to_gemm_through_global_pool_and_flatten() -> None:
    """digits_cnn's tail: Conv -> Relu -> ReduceMean(H, W) -> Reshape [1, C] -> Gemm."""
    nodes = [
        conv("x", "w1", "b1", "h"),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("ReduceMean", ["r", "axes"], ["p"], keepdims=1),
        helper.make_node("Reshape", ["p", "shape"], ["f"]),
        helper.make_node("Gemm", ["f", "w2", "b2"], ["y"], name="fc", transB=1),
    ]
    inits = {
        "w1": ranged((8, 3, 3, 3), A, 0),
        "b1": RNG.uniform(-1, 1, 8).astype(np.float32),
        "axes": np.array([2, 3], np.int64),
        "shape": np.array([1, 8], np.int64),
        "w2": ranged((4, 8), B, 1),
        "b2": np.zeros(4, np.float32),
    }
    m = model(nodes, [("x", T.FLOAT, [1, 3, 8, 8])], [("y", T.FLOAT, None)], inits)
    result = apply(EqualizeChannels, m)
    assert outcomes(result) == [("changed", "h"), ("kept", "fc")]
    same_outputs(m, result.model, X)
    w = weights(result.model)
    np.testing.assert_allclose(np.abs(w["w2"]).max(axis=0), np.sqrt(A * B), rtol=1e-6)


def test_a_reshape_that_mixes_channels_is_kept() -> None:
    nodes = [
        conv("x", "w1", "b1", "h"),
        helper.make_node("Reshape", ["h", "shape"], ["f"]),  # [1, 8, 6, 6] -> [1, 4, 12, 6]
        conv("f", "w2", "", "y"),
    ]
    inits = {
        "w1": ranged((8, 3, 3, 3), A, 0),
        "b1": np.zeros(8, np.float32),
        "shape": np.array([1, 4, 12, 6], np.int64),
        "w2": ranged((2, 4, 1, 1), np.ones(4), 1),
    }
    m = model(nodes, [("x", T.FLOAT, [1, 3, 8, 8])], [("y", T.FLOAT, None)], inits)
    result = apply(EqualizeChannels, m)
    assert outcomes(result) == [("kept", "h"), ("kept", "y")]


def test_power_of_two_scales_are_bit_exact() -> None:
    m = conv_relu_conv()
    result = apply(EqualizeChannels, m, power_of_two=True)
    assert EqualizeChannels().tolerance(EqualizeChannels.Options(power_of_two=True)) == 0.0
    (want,), (got,) = run(m, {"x": X}), run(result.model, {"x": X})
    np.testing.assert_array_equal(got, want)
    w, before = weights(result.model), weights(m)
    scale = before["w1"] / np.where(w["w1"] == 0, 1, w["w1"])
    exponents = np.log2(scale[w["w1"] != 0])
    np.testing.assert_array_equal(exponents, np.round(exponents))  # powers of two
    ratio = out_ranges(w["w1"]) / in_ranges(w["w2"])
    assert ratio.min() >= 0.5 and ratio.max() <= 2.0  # within a factor 2, was 1/20 .. 20
    assert (A / B).min() < 0.5 or (A / B).max() > 2.0


def test_shared_weights_and_no_layers() -> None:
    m = conv_relu_conv()
    m.graph.node.append(conv("x", "w1", "", "z", pads=[1, 1, 1, 1]))  # w1 read twice
    m.graph.output.append(helper.make_tensor_value_info("z", T.FLOAT, [1, 8, 8, 8]))
    result = apply(EqualizeChannels, m)
    assert outcomes(result) == [("kept", "h"), ("kept", "y"), ("kept", "z")]
    relu = model(
        [helper.make_node("Relu", ["x"], ["y"])], [("x", T.FLOAT, [2])], [("y", T.FLOAT, [2])]
    )
    assert outcomes(apply(EqualizeChannels, relu)) == [("not_applicable", "")]
