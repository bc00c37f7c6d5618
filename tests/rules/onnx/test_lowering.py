"""The lowering rules (onnx.maxpool_edge_pad, pad_with_concat, split_groups, gather_to_slice,
slice_rank, split_slice, lower_matmul, resize_to_matmul, sqrt_newton): each construct becomes
the ops named in the rule, with onnxruntime's outputs on the original graph, and every case it
must not touch is kept."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from edgeflow.rules.onnx.conv_pool import (
    MaxPoolEdgePad,
    PadWithConcat,
    ShuffleToConv,
    SplitGroups,
)
from edgeflow.rules.onnx.indexing import GatherToSlice, SliceRank, SplitSlice
from edgeflow.rules.onnx.linear import LowerMatMul, ResizeToMatMul, SqrtNewton, _interpolation
from edgeflow.rules.onnx.norm import ChannelLayerNorm
from tests.rules.onnx.helpers import apply, model, ops, run
from tests.rules.sites import outcomes

RNG = np.random.default_rng(0)


def same_outputs(before, after, feeds, atol: float = 0.0, rtol: float = 0.0) -> None:
    for want, got in zip(run(before, feeds), run(after, feeds), strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize(
    ("kernel", "strides", "pads", "ceil"),
    [
        ([3, 3], [2, 2], [1, 1, 1, 1], 0),
        ([3, 2], [1, 2], [2, 0, 1, 1], 0),
        ([3, 3], [2, 1], [1, 1, 1, 1], 1),
    ],  # ceil_mode without a partial window
)
def test_padded_maxpool_repeats_edges_exactly(kernel, strides, pads, ceil) -> None:
    node = helper.make_node(
        "MaxPool", ["x"], ["y"], kernel_shape=kernel, strides=strides, pads=pads, ceil_mode=ceil
    )
    m = model([node], [("x", T.FLOAT, [1, 3, 9, 8])], [("y", T.FLOAT, None)])
    result = apply(MaxPoolEdgePad, m)
    assert result.changed and result.matches == 1
    after = ops(result.model)
    assert after["MaxPool"] == 1 and after["Concat"] >= 1 and "Pad" not in after
    pool = next(n for n in result.model.graph.node if n.op_type == "MaxPool")
    assert not any(a.name == "pads" for a in pool.attribute)
    # All-negative inputs: a zero pad would win every border window; edge copies must not.
    x = -np.abs(RNG.standard_normal((1, 3, 9, 8))).astype(np.float32) - 1
    same_outputs(m, result.model, {"x": x})


def test_maxpool_kept_when_edge_copies_would_change_it() -> None:
    dilated = helper.make_node(
        "MaxPool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], dilations=[2, 2]
    )
    m = model([dilated], [("x", T.FLOAT, [1, 2, 9, 9])], [("y", T.FLOAT, None)])
    result = apply(MaxPoolEdgePad, m)
    assert not result.changed and outcomes(result) == [("kept", "y")]  # dilated pooling
    # ceil_mode's last window would start in the end padding (stride 3 over 6 + 1 pad)
    alone = helper.make_node(
        "MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[3, 3], pads=[0, 0, 1, 1], ceil_mode=1
    )
    m = model([alone], [("x", T.FLOAT, [1, 2, 6, 6])], [("y", T.FLOAT, None)])
    result = apply(MaxPoolEdgePad, m)
    assert not result.changed and outcomes(result) == [("kept", "y")]


@pytest.mark.parametrize(
    ("size", "kernel", "strides", "pads"),
    [(10, [3, 3], [2, 2], [0] * 4), (8, [3, 3], [2, 2], [1] * 4), (9, [2, 2], [2, 2], [0] * 4)],
)
def test_a_ceil_mode_partial_window_becomes_a_whole_window_of_edge_copies(
    size, kernel, strides, pads
) -> None:
    """onnx2tf writes a MaxPool whose ceil_mode adds a partial last window as PAD + MAX_POOL_2D
    that computes it wrong (0.44 of the range off in the targets' probes). With more edge
    copies at the end and ceil_mode 0, the same windows hold the same maxima."""
    node = helper.make_node(
        "MaxPool", ["x"], ["y"], kernel_shape=kernel, strides=strides, pads=pads, ceil_mode=1
    )
    m = model([node], [("x", T.FLOAT, [1, 3, size, size])], [("y", T.FLOAT, None)])
    for ceil_mode_only in (False, True):
        result = apply(MaxPoolEdgePad, m, ceil_mode_only=ceil_mode_only)
        assert result.changed and result.matches == 1
        pool = next(n for n in result.model.graph.node if n.op_type == "MaxPool")
        assert {a.name for a in pool.attribute} == {"kernel_shape", "strides"}
        x = -np.abs(RNG.standard_normal((1, 3, size, size))).astype(np.float32) - 1
        same_outputs(m, result.model, {"x": x})


def test_ceil_mode_only_keeps_pools_without_a_partial_window() -> None:
    padded = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    m = model([padded], [("x", T.FLOAT, [1, 2, 8, 8])], [("y", T.FLOAT, None)])
    result = apply(MaxPoolEdgePad, m, ceil_mode_only=True)
    assert not result.changed and result.matches == 0
    assert apply(MaxPoolEdgePad, m).changed


def test_explicit_padding_becomes_concatenated_zeros_and_same_padding_is_kept() -> None:
    """A stride-2 depthwise Conv with pads 1 on an even input (TensorFlow's SAME pads 0 and 1:
    onnx2tf would write a PAD) and a zero Pad node become Concats of zeros; a stride-1 Conv
    with pads 1 (SAME) and a wrap Pad are kept."""
    dw = RNG.standard_normal((4, 1, 3, 3)).astype(np.float32)
    w = RNG.standard_normal((4, 4, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "dw"], ["a"], group=4, strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["a", "w"], ["b"], pads=[1, 1, 1, 1]),  # SAME: kept
        helper.make_node("Pad", ["b", "pads"], ["c"]),
        helper.make_node("Pad", ["c", "pads"], ["y"], mode="wrap"),  # kept
    ]
    pads = np.array([0, 0, 2, 0, 0, 0, 1, 3], np.int64)
    m = model(
        nodes,
        [("x", T.FLOAT, [1, 4, 16, 16])],
        [("y", T.FLOAT, None)],
        {"dw": dw, "w": w, "pads": pads},
        opset=19,
    )
    result = apply(PadWithConcat, m)
    assert result.matches == 2
    assert outcomes(result) == [("changed", "a"), ("changed", "c"), ("kept", "y")]
    after = ops(result.model)
    assert after["Pad"] == 1 and after["Conv"] == 2 and after["Concat"] == 4  # 2 axes each
    convs = [n for n in result.model.graph.node if n.op_type == "Conv"]
    pads_of = [[list(a.ints) for a in n.attribute if a.name == "pads"] for n in convs]
    assert pads_of == [[], [[1, 1, 1, 1]]]  # no pads on the first any more
    x = RNG.standard_normal((1, 4, 16, 16)).astype(np.float32)
    same_outputs(m, result.model, {"x": x})  # exact: the same zeros


@pytest.mark.parametrize("opset", [10, 13, 18])
@pytest.mark.parametrize("mode", ["reflect", "edge"])
def test_reflect_and_edge_padding_become_slices_and_concats(opset, mode) -> None:
    """Arm NN's parser has no MIRROR_PAD: the tensor's own rows, mirrored or repeated."""
    pads = [0, 1, 4, 3, 0, 2, 1, 3]  # reflect takes at most n - 1 rows: 4 of 5, 3 of 4
    if opset < 11:
        node = helper.make_node("Pad", ["x"], ["y"], mode=mode, pads=pads)
        inits = {}
    else:
        node = helper.make_node("Pad", ["x", "pads"], ["y"], mode=mode)
        inits = {"pads": np.array(pads, np.int64)}
    m = model([node], [("x", T.FLOAT, [1, 3, 5, 4])], [("y", T.FLOAT, None)], inits, opset=opset)
    result = apply(PadWithConcat, m)
    after = ops(result.model)
    assert result.matches == 1 and "Pad" not in after
    assert after["Concat"] == 3  # one per padded axis
    # reflect: one slice per padded row; edge: one per side, repeated
    assert after["Slice"] == (sum(pads) if mode == "reflect" else 6)
    x = RNG.standard_normal((1, 3, 5, 4)).astype(np.float32)
    want, got = run(m, {"x": x})[0], run(result.model, {"x": x})[0]
    assert got.shape == want.shape == (1, 6, 10, 10)
    np.testing.assert_array_equal(got, want)  # exact: the same values


@pytest.mark.parametrize("opset", [10, 17])
def test_a_pad_value_other_than_zero_becomes_blocks_of_that_value(opset) -> None:
    """onnx2tf writes a Pad with a value other than 0 as PADV2 (Arm NN 22's parser has none),
    and drops the value of an opset-10 Pad (its `value` attribute): concatenated blocks of
    the value keep it, exactly."""
    pads = [0, 0, 1, 2, 0, 0, 2, 1]
    if opset < 11:
        node = helper.make_node("Pad", ["x"], ["y"], pads=pads, value=1.5)
        inits = {}
    else:
        node = helper.make_node("Pad", ["x", "pads", "value"], ["y"])
        inits = {"pads": np.array(pads, np.int64), "value": np.array(1.5, np.float32)}
    m = model([node], [("x", T.FLOAT, [1, 3, 5, 4])], [("y", T.FLOAT, None)], inits, opset=opset)
    result = apply(PadWithConcat, m)
    assert result.changed and "Pad" not in ops(result.model)
    x = RNG.standard_normal((1, 3, 5, 4)).astype(np.float32)
    (want,), (got,) = run(m, {"x": x}), run(result.model, {"x": x})
    np.testing.assert_array_equal(got, want)
    assert float(got[0, 0, 0, 0]) == 1.5


@pytest.mark.parametrize("value", [0.0, 1.5])
def test_large_blocks_are_computed_not_stored(value) -> None:
    """A block of more than MAX_STORED_FILL values is the tensor's first rows times 0 (plus
    the value): the same values, and no constant of its size in the file (PLCMOS's padded
    convolutions over 625 frames stored 239 KB of zeros on armnn, 0.2x its weights)."""
    from edgeflow.rules.onnx.conv_pool import MAX_STORED_FILL

    shape = [1, 32, 200, 8]  # a column of 32 x 200 = 6,400 values per side
    node = helper.make_node("Pad", ["x", "pads", "value"], ["y"])
    # a row before (256 values: stored), a column before and after (6,432 each: computed)
    pads = np.array([0, 0, 1, 1, 0, 0, 0, 1], np.int64)
    inits = {"pads": pads, "value": np.array(value, np.float32)}
    m = model([node], [("x", T.FLOAT, shape)], [("y", T.FLOAT, None)], inits)
    result = apply(PadWithConcat, m)
    sizes = [int(np.prod(i.dims)) for i in result.model.graph.initializer]
    assert max(sizes) <= MAX_STORED_FILL
    assert ops(result.model)["Mul"] == 2
    x = RNG.standard_normal(shape).astype(np.float32)
    (want,), (got,) = run(m, {"x": x}), run(result.model, {"x": x})
    np.testing.assert_array_equal(got, want)


def test_reflect_padding_wider_than_the_axis_is_kept() -> None:
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect")
    m = model(
        [node],
        [("x", T.FLOAT, [1, 2, 3, 8])],
        [("y", T.FLOAT, [1, 2, 9, 8])],
        {"pads": np.array([0, 0, 3, 0, 0, 0, 3, 0], np.int64)},
    )
    result = apply(PadWithConcat, m)
    assert not result.changed and outcomes(result) == [("kept", "y")]  # 3 rows mirror 2


@pytest.mark.parametrize(
    ("starts", "ends", "axes", "steps", "slices"),
    [
        ([1, 2], [5, 9], [1, 3], None, 2),  # the target probe: channels and width
        ([0, 1, 4], [3, 99, -9], [2, 1, -1], [1, 2, -1], 3),  # steps, negatives, reversed
        ([0, 1], [2**62, 4], None, None, 1),  # the whole first axis: no Slice for it
    ],
)
def test_a_slice_over_several_axes_becomes_one_slice_per_axis(
    starts, ends, axes, steps, slices
) -> None:
    names = ["x", "starts", "ends"]
    inits = {"starts": np.array(starts), "ends": np.array(ends)}
    for name, value in (("axes", axes), ("steps", steps)):
        names.append(name if value is not None else "")
        if value is not None:
            inits[name] = np.array(value)
    while not names[-1]:
        names.pop()
    m = model(
        [helper.make_node("Slice", names, ["y"])],
        [("x", T.FLOAT, [2, 6, 10, 7])],
        [("y", T.FLOAT, None)],
        inits,
    )
    result = apply(SplitSlice, m)
    assert result.matches == 1 and ops(result.model) == {"Slice": slices}
    for node in result.model.graph.node:
        assert inits_of(result.model)[node.input[1]].size == 1  # slice_one_axis holds
    x = RNG.standard_normal((2, 6, 10, 7)).astype(np.float32)
    want, got = run(m, {"x": x})[0], run(result.model, {"x": x})[0]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_one_axis_and_computed_slices_are_kept() -> None:
    nodes = [
        helper.make_node("Slice", ["x", "s1", "e1", "a1"], ["a"]),  # one axis: not the construct
        helper.make_node("Slice", ["x", "s2", "e", "a2"], ["b"]),  # computed ends
    ]
    inits = {"s1": np.array([1]), "e1": np.array([3]), "a1": np.array([1])}
    inits |= {"s2": np.array([0, 1]), "a2": np.array([1, 2])}
    m = model(
        nodes,
        [("x", T.FLOAT, [2, 6, 10, 7]), ("e", T.INT64, [2])],
        [("a", T.FLOAT, None), ("b", T.FLOAT, [2, "c", "h", 7])],
        inits,
    )
    result = apply(SplitSlice, m)
    assert not result.changed and outcomes(result) == [("kept", "b")]


def inits_of(m) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}


def test_grouped_conv_splits_per_group_and_depthwise_is_kept() -> None:
    w = RNG.standard_normal((12, 2, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(12).astype(np.float32)
    dw = RNG.standard_normal((12, 1, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node(
            "Conv", ["x", "w", "b"], ["h"], group=3, pads=[1, 1, 1, 1], strides=[2, 1]
        ),
        helper.make_node("Conv", ["h", "dw"], ["y"], group=12),
    ]
    m = model(
        nodes, [("x", T.FLOAT, [1, 6, 7, 7])], [("y", T.FLOAT, None)], {"w": w, "b": b, "dw": dw}
    )
    result = apply(SplitGroups, m)
    assert outcomes(result) == [("changed", "h")]  # the depthwise Conv: no site at all
    assert ops(result.model) == {"Split": 1, "Conv": 4, "Concat": 1}
    x = RNG.standard_normal((1, 6, 7, 7)).astype(np.float32)
    same_outputs(m, result.model, {"x": x}, atol=1e-5)


@pytest.mark.parametrize(
    ("indices", "axis", "want"),
    [
        (np.arange(6).reshape(1, 6, 1), 1, {"Reshape": 1}),  # timm's as_strided: a view
        (np.array([1, 3, 5]), 1, {"Slice": 1, "Reshape": 1}),
        (np.array(2), 0, {"Slice": 1, "Reshape": 1}),  # x[2]
        (np.array([-2, -1]), 2, {"Slice": 1, "Reshape": 1}),
    ],
)
def test_gather_of_a_constant_run_is_a_slice(indices, axis, want) -> None:
    node = helper.make_node("Gather", ["x", "i"], ["y"], axis=axis)
    m = model([node], [("x", T.FLOAT, [4, 6, 5])], [("y", T.FLOAT, None)], {"i": indices})
    result = apply(GatherToSlice, m)
    assert result.changed and ops(result.model) == want
    same_outputs(m, result.model, {"x": RNG.standard_normal((4, 6, 5)).astype(np.float32)})


def test_a_whole_axis_gather_after_a_reshape_is_no_change() -> None:
    """timm's ConvNeXt head: ReduceMean [1, C, 1, 1] -> Reshape [C] -> Gather -> [1, C, 1, 1]."""
    nodes = [
        helper.make_node("Reshape", ["x", "flat"], ["f"]),
        helper.make_node("Gather", ["f", "i"], ["y"], axis=0),
    ]
    inits = {"flat": np.array([6]), "i": np.arange(6).reshape(1, 6, 1, 1)}
    m = model(nodes, [("x", T.FLOAT, [1, 6, 1, 1])], [("y", T.FLOAT, None)], inits)
    result = apply(GatherToSlice, m)
    assert [n.op_type for n in result.model.graph.node] == ["Identity"]
    assert result.model.graph.node[0].input[0] == "x"
    same_outputs(m, result.model, {"x": RNG.standard_normal((1, 6, 1, 1)).astype(np.float32)})


@pytest.mark.parametrize(("index", "want"), [(-1, "b"), (0, "a")])
def test_a_gather_from_one_input_of_a_concat_reads_that_input(index: int, want: str) -> None:
    """torch's stacked LSTM: h_n = Concat(h_0, h_1) [2, 1, 32], then h_n[-1]; onnx2tf 1.28.8
    converted that Gather to the wrong shape. The Concat goes, the Gather reads the input."""
    nodes = [
        helper.make_node("Concat", ["a", "b"], ["c"], axis=0),
        helper.make_node("Gather", ["c", "i"], ["y"], axis=0),
    ]
    inputs = [("a", T.FLOAT, [1, 1, 32]), ("b", T.FLOAT, [1, 1, 32])]
    m = model(nodes, inputs, [("y", T.FLOAT, None)], {"i": np.array(index)})
    result = apply(GatherToSlice, m)
    assert result.changed and ops(result.model) == {"Reshape": 1}
    assert result.model.graph.node[0].input[0] == want
    feeds = {k: RNG.standard_normal((1, 1, 32)).astype(np.float32) for k in "ab"}
    same_outputs(m, result.model, feeds)
    assert not apply(GatherToSlice, result.model).changed  # idempotent


def test_a_gather_across_concat_inputs_keeps_the_concat() -> None:
    nodes = [
        helper.make_node("Concat", ["a", "b"], ["c"], axis=0),
        helper.make_node("Gather", ["c", "i"], ["y"], axis=0),
    ]
    inputs = [("a", T.FLOAT, [2, 3]), ("b", T.FLOAT, [2, 3])]
    m = model(nodes, inputs, [("y", T.FLOAT, None)], {"i": np.array([1, 2])})
    result = apply(GatherToSlice, m)
    assert ops(result.model) == {"Concat": 1, "Slice": 1, "Reshape": 1}
    same_outputs(m, result.model, {k: RNG.standard_normal((2, 3)).astype(np.float32) for k in "ab"})


def test_gather_of_scattered_indices_is_kept() -> None:
    node = helper.make_node("Gather", ["x", "i"], ["y"], axis=0)
    m = model([node], [("x", T.FLOAT, [4, 3])], [("y", T.FLOAT, None)], {"i": np.array([0, 2, 3])})
    result = apply(GatherToSlice, m)
    assert not result.changed and outcomes(result) == [("kept", "y")]  # not evenly spaced


def test_five_d_unbind_slices_a_view_of_at_most_four_dims() -> None:
    """mobilevit's qkv: Reshape to 5-D, Transpose, then Slice + Squeeze per q, k, v."""
    shape = [2, 8, 3, 4, 5]  # batch*patches, tokens, qkv, heads, head dim
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[2, 0, 3, 1, 4])]
    outputs = []
    for i in range(3):
        nodes.append(helper.make_node("Slice", ["t", f"s{i}", f"e{i}", "ax"], [f"p{i}"]))
        nodes.append(helper.make_node("Squeeze", [f"p{i}", "ax"], [f"q{i}"]))
        outputs.append((f"q{i}", T.FLOAT, None))
    # and a strided 5-D slice on a middle axis, kept 5-D at its output
    nodes.append(helper.make_node("Slice", ["x", "s0", "e9", "ax3", "st"], ["z"]))
    outputs.append(("z", T.FLOAT, None))
    inits = {f"s{i}": np.array([i]) for i in range(3)}
    inits |= {f"e{i}": np.array([i + 1]) for i in range(3)}
    inits |= {"ax": np.array([0]), "e9": np.array([9]), "ax3": np.array([3]), "st": np.array([2])}
    m = model(nodes, [("x", T.FLOAT, shape)], outputs, inits)
    result = apply(SliceRank, m)
    assert result.matches == 4
    assert "Squeeze" not in ops(result.model)
    from edgeflow.rules.onnx._edit import Edit

    e = Edit(result.model)
    for node in result.model.graph.node:
        if node.op_type == "Slice":
            assert len(e.shape(node.input[0]) or [9] * 5) <= 4
    same_outputs(m, result.model, {"x": RNG.standard_normal(shape).astype(np.float32)})


def test_matmul_by_a_weight_becomes_gemm_with_the_following_bias() -> None:
    w = RNG.standard_normal((6, 5)).astype(np.float32)
    w2 = RNG.standard_normal((5, 3)).astype(np.float32)
    bias = RNG.standard_normal(5).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Add", ["bias", "h"], ["hb"]),
        helper.make_node("MatMul", ["hb", "w2"], ["y"]),  # no bias: Gemm with zeros
    ]
    inits = {"w": w, "w2": w2, "bias": bias}
    m = model(nodes, [("x", T.FLOAT, [2, 4, 6])], [("y", T.FLOAT, None)], inits)
    result = apply(LowerMatMul, m)
    assert result.matches == 2
    assert ops(result.model) == {"Transpose": 4, "Reshape": 4, "Conv": 2}  # 3-D: 1x1 Convs
    biases = {t.name: t for t in result.model.graph.initializer}
    for gemm in (n for n in result.model.graph.node if n.op_type == "Conv"):
        # FULLY_CONNECTED with a bias; never all zeros, which TensorFlow's converter drops
        assert len(gemm.input) == 3 and numpy_helper.to_array(biases[gemm.input[2]]).all()
    x = RNG.standard_normal((2, 4, 6)).astype(np.float32)
    same_outputs(m, result.model, {"x": x}, atol=1e-5)


def test_matmul_of_a_dynamic_batch_2d_input_becomes_gemm() -> None:
    """Paddle-style: x [-1, 6] (a Reshape to [batch, -1]) @ W + b. Before, kept ("the input
    shape is not static"), and the armnn precheck refused the MatMul that onnx2tf and Arm NN
    then ran as a FULLY_CONNECTED with a bias."""
    w = RNG.standard_normal((6, 5)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Add", ["h", "bias"], ["y"]),
    ]
    inits = {"w": w, "bias": RNG.standard_normal(5).astype(np.float32)}
    m = model(nodes, [("x", T.FLOAT, ["batch", 6])], [("y", T.FLOAT, None)], inits)
    result = apply(LowerMatMul, m)
    assert result.matches == 1 and ops(result.model) == {"Gemm": 1}
    same_outputs(m, result.model, {"x": RNG.standard_normal((3, 6)).astype(np.float32)}, atol=1e-5)
    three_d = model(nodes, [("x", T.FLOAT, ["batch", 2, 6])], [("y", T.FLOAT, None)], inits)
    assert outcomes(apply(LowerMatMul, three_d)) == [("kept", "h")]
    # the rank of a Reshape to a computed shape (Shape -> Gather -> Concat([b, -1])), which
    # shape inference leaves unknown, is the length of that shape
    reshaped = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "axes"], ["b1"]),
        helper.make_node("Concat", ["b1", "rest"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w"], ["h"]),
        helper.make_node("Add", ["h", "bias"], ["y"]),
    ]
    extra = {"zero": np.array(0), "axes": np.array([0]), "rest": np.array([-1])}
    m = model(reshaped, [("x", T.FLOAT, [1, 2, 3])], [("y", T.FLOAT, None)], inits | extra)
    result = apply(LowerMatMul, m)
    assert result.matches == 1 and "Gemm" in ops(result.model)
    same_outputs(
        m, result.model, {"x": RNG.standard_normal((1, 2, 3)).astype(np.float32)}, atol=1e-5
    )


def test_attention_matmuls_become_mul_and_mean() -> None:
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Softmax", ["s"], ["a"], axis=-1),
        helper.make_node("MatMul", ["a", "v"], ["y"]),
    ]
    shapes = {"q": [1, 2, 7, 4], "k": [1, 2, 7, 4], "v": [1, 2, 7, 3]}
    m = model(nodes, [(n, T.FLOAT, s) for n, s in shapes.items()], [("y", T.FLOAT, None)])
    result = apply(LowerMatMul, m)
    assert result.matches == 2 and "MatMul" not in ops(result.model)
    assert ops(result.model)["ReduceMean"] == 2
    feeds = {n: RNG.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    same_outputs(m, result.model, feeds, atol=1e-5, rtol=1e-5)
    tiny = apply(LowerMatMul, m, max_elements=50)
    assert not tiny.changed and [s for s, _ in outcomes(tiny)] == ["kept", "kept"]


@pytest.mark.parametrize(
    "mode", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"]
)
@pytest.mark.parametrize(("size", "out"), [((5, 6), (10, 12)), ((8, 8), (3, 13)), ((4, 4), (4, 9))])
def test_linear_resize_as_interpolation_matrices(mode, size, out) -> None:
    shape = [1, 3, *size]
    node = helper.make_node(
        "Resize", ["x", "", "", "sizes"], ["y"], mode="linear", coordinate_transformation_mode=mode
    )
    m = model(
        [node],
        [("x", T.FLOAT, shape)],
        [("y", T.FLOAT, None)],
        {"sizes": np.array([1, 3, *out])},
    )
    result = apply(ResizeToMatMul, m)
    assert result.changed and "Resize" not in ops(result.model)
    changed_axes = sum(a != b for a, b in zip(size, out, strict=True))
    assert ops(result.model).get("Conv", 0) == changed_axes  # an unchanged axis needs none
    x = RNG.standard_normal(shape).astype(np.float32)
    same_outputs(m, result.model, {"x": x}, atol=1e-5)


def test_resize_by_scales_and_kept_modes() -> None:
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")
    m = model(
        [node],
        [("x", T.FLOAT, [1, 2, 6, 5])],
        [("y", T.FLOAT, None)],
        {"scales": np.array([1, 1, 2.5, 1.5], np.float32)},
    )
    result = apply(ResizeToMatMul, m)
    same_outputs(
        m, result.model, {"x": RNG.standard_normal((1, 2, 6, 5)).astype(np.float32)}, atol=1e-5
    )
    nearest = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")
    m2 = model(
        [nearest],
        [("x", T.FLOAT, [1, 2, 6, 5])],
        [("y", T.FLOAT, None)],
        {"scales": np.array([1, 1, 2, 2], np.float32)},
    )
    kept = apply(ResizeToMatMul, m2)
    assert not kept.changed and outcomes(kept) == [("kept", "y")]  # only linear Resize
    rows = _interpolation(4, 9, 9 / 4, "half_pixel")
    np.testing.assert_allclose(rows.sum(axis=1), 1.0)  # every output a convex combination


def test_sqrt_from_tangents_and_heron_matches_on_all_of_float32() -> None:
    """Measured: relative error at most 1.47e-7 from 1e-45 (denormal) to 3.4e38, exactly 0 at
    0; the default tolerance 1e-6 is then a bound that holds on any input."""
    v = np.logspace(-45, 38.5, 20001).astype(np.float32)
    v = np.concatenate([[0.0], v[np.isfinite(v) & (v > 0)]]).astype(np.float32).reshape(1, -1)
    m = model(
        [helper.make_node("Sqrt", ["x"], ["y"])],
        [("x", T.FLOAT, list(v.shape))],
        [("y", T.FLOAT, None)],
    )
    result = apply(SqrtNewton, m)
    assert set(ops(result.model)) == {"Add", "Mul", "Div", "Min"}
    got = run(result.model, {"x": v})[0].astype(np.float64)
    want = np.sqrt(v.astype(np.float64))
    assert got[0, 0] == 0.0
    worst = float((np.abs(got - want)[0, 1:] / want[0, 1:]).max())
    assert 5e-8 < worst < 2e-7, worst
    assert SqrtNewton().tolerance(SqrtNewton.Options()) == 1e-6
    narrow = apply(SqrtNewton, m, low=-4, high=4, step=1)  # fewer tangents, for a known range
    assert ops(narrow.model)["Min"] == 8
    assert SqrtNewton().tolerance(SqrtNewton.Options(low=-4, high=4, step=1)) is None
    got = run(narrow.model, {"x": v})[0]
    inside = (v >= 1e-4) & (v <= 1e4)
    np.testing.assert_allclose(got[inside], np.sqrt(v[inside].astype(np.float64)), rtol=2e-7)


def test_sqrt_newton_keeps_its_contract_where_log_amplifies_forty_decades() -> None:
    """y = Log(Sqrt(Exp(92 x - 46))): on the contract's probes (random x in [0, 1), and 0)
    Sqrt sees 1e-20 .. 1e20 and Log turns its relative error into an absolute one; the
    former [1e-12, 1e12] start was off by orders of magnitude there (the armnn builds'
    'output 1 changes by 0.000133')."""
    from edgeflow.rules import contract
    from tests.rules.onnx.helpers import specs

    m = model(
        [
            helper.make_node("Mul", ["x", "a"], ["ax"]),
            helper.make_node("Add", ["ax", "b"], ["z"]),
            helper.make_node("Exp", ["z"], ["power"]),
            helper.make_node("Sqrt", ["power"], ["magnitude"]),
            helper.make_node("Log", ["magnitude"], ["y"]),
        ],
        [("x", T.FLOAT, [1, 64])],
        [("y", T.FLOAT, [1, 64])],
        {"a": np.array(92.0, np.float32), "b": np.array(-46.0, np.float32)},
    )
    feeds = contract.probes(specs(m))
    rule = SqrtNewton()
    after = apply(SqrtNewton, m).model
    before_out, after_out = contract.onnx_outputs(m, feeds), contract.onnx_outputs(after, feeds)
    assert contract.difference(before_out, after_out, rule.tolerance(rule.Options())) is None
    assert before_out.per_probe is not None and after_out.per_probe is not None
    for old, new in zip(before_out.per_probe, after_out.per_probe, strict=True):
        assert float(np.abs(new[0] - old[0]).max()) < 1e-5  # Log of a 1.5e-7 relative error
    coarse = apply(SqrtNewton, m, low=-12, high=12, step=1, iterations=3).model
    assert contract.difference(before_out, contract.onnx_outputs(coarse, feeds), 1e-6)


def test_channel_shuffle_becomes_a_permutation_conv() -> None:
    nodes = [
        helper.make_node("Reshape", ["x", "s5"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["t", "s4"], ["y"]),
        # a chain that moves values across space is kept
        helper.make_node("Reshape", ["x", "s5b"], ["r2"]),
        helper.make_node("Transpose", ["r2"], ["t2"], perm=[0, 1, 2, 4, 3]),
        helper.make_node("Reshape", ["t2", "s4"], ["z"]),
    ]
    inits = {
        "s5": np.array([1, 2, 6, 5, 5]),
        "s5b": np.array([1, 12, 1, 5, 5]),
        "s4": np.array([1, 12, 5, 5]),
    }
    m = model(
        nodes, [("x", T.FLOAT, [1, 12, 5, 5])], [("y", T.FLOAT, None), ("z", T.FLOAT, None)], inits
    )
    result = apply(ShuffleToConv, m)
    assert result.matches == 1 and [s for s, _ in outcomes(result)] == ["changed", "kept"]
    assert ops(result.model) == {"Conv": 1, "Reshape": 2, "Transpose": 1}
    same_outputs(m, result.model, {"x": RNG.standard_normal((1, 12, 5, 5)).astype(np.float32)})


def test_layernorm2d_between_transposes_normalises_the_channel_axis() -> None:
    """timm's LayerNorm2d as exported: Transpose, LayerNormalization, Transpose back."""
    c = 6
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
        helper.make_node("LayerNormalization", ["t", "g", "b"], ["n"], axis=-1, epsilon=1e-6),
        helper.make_node("Transpose", ["n"], ["y"], perm=[0, 3, 1, 2]),
    ]
    inits = {
        "g": RNG.standard_normal(c).astype(np.float32),
        "b": RNG.standard_normal(c).astype(np.float32),
    }
    m = model(nodes, [("x", T.FLOAT, [1, c, 5, 4])], [("y", T.FLOAT, None)], inits)
    result = apply(ChannelLayerNorm, m)
    after = ops(result.model)
    assert result.matches == 1 and "Transpose" not in after and "LayerNormalization" not in after
    x = (RNG.standard_normal((1, c, 5, 4)) * 3 + 1).astype(np.float32)
    same_outputs(m, result.model, {"x": x}, atol=1e-5)
