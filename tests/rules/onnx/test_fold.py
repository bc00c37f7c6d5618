"""onnx.fold_constants: constant subgraphs (TorchScript's F.pad pads) become initializers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto as T
from onnx import helper

from edgeflow.rules.base import Status
from edgeflow.rules.onnx.fold import FoldConstants
from tests.rules.onnx.helpers import apply, model, ops, run
from tests.rules.sites import wheres


class PaddedFrontEnd(torch.nn.Module):
    """Reflect padding of [1, T] audio, then a strided Conv1d by a DFT-like basis: the STFT
    front end of a voice-activity detector (silero-vad's shape)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.register_buffer("basis", torch.randn(10, 1, 16))

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        padded = torch.nn.functional.pad(audio, (0, 8), mode="reflect")
        return torch.nn.functional.conv1d(padded.unsqueeze(1), self.basis, stride=8)


def padded_front_end(tmp_path: Path) -> onnx.ModelProto:
    path = tmp_path / "front.onnx"
    torch.onnx.export(
        PaddedFrontEnd(), (torch.randn(1, 64),), str(path), dynamo=False, opset_version=17
    )
    return onnx.load(str(path))


def test_torchscript_pads_fold_to_a_constant_and_shapes_become_static(tmp_path: Path) -> None:
    m = padded_front_end(tmp_path)
    assert "ConstantOfShape" in ops(m)
    unknown = onnx.shape_inference.infer_shapes(m).graph.output[0].type.tensor_type.shape
    assert [d.dim_value for d in unknown.dim] == [0, 10, 0]  # no static size after the Pad
    result = apply(FoldConstants, m)  # checker, idempotence, input untouched
    assert (
        {"Pad", "Unsqueeze", "Conv"}
        <= set(ops(result.model))
        <= {
            "Pad",
            "Unsqueeze",
            "Conv",
            "Constant",  # Unsqueeze's axes: a value, kept
        }
    )
    assert len(wheres(result, Status.CHANGED)) == result.matches >= 6
    [pad] = [n for n in result.model.graph.node if n.op_type == "Pad"]
    pads = {t.name: onnx.numpy_helper.to_array(t) for t in result.model.graph.initializer}
    np.testing.assert_array_equal(pads[pad.input[1]], [0, 0, 0, 8])
    inferred = onnx.shape_inference.infer_shapes(result.model).graph.output[0].type.tensor_type
    assert [d.dim_value for d in inferred.shape.dim] == [1, 10, 8]
    feeds = {m.graph.input[0].name: np.random.default_rng(0).standard_normal((1, 64))}
    feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
    np.testing.assert_array_equal(run(result.model, feeds)[0], run(m, feeds)[0])


def test_random_ops_large_outputs_and_graph_outputs_stay() -> None:
    nodes = [
        helper.make_node("RandomNormal", [], ["r"], shape=[2], seed=1.0),
        helper.make_node("ConstantOfShape", ["n"], ["big"]),
        helper.make_node("ReduceSum", ["big"], ["s"], keepdims=0),
        helper.make_node("Add", ["x", "r"], ["a"]),
        helper.make_node("Add", ["a", "s"], ["y0"]),
        helper.make_node("Neg", ["c"], ["z"]),  # a graph output: kept as the node it is
        helper.make_node("DequantizeLinear", ["q", "scale"], ["w"]),  # a QAT weight
        helper.make_node("Add", ["y0", "w"], ["y"]),
    ]
    inits = {
        "n": np.array([64], np.int64),
        "c": np.ones(2, np.float32),
        "q": np.array([3, -5], np.int8),
        "scale": np.array(0.25, np.float32),
    }
    m = model(
        nodes,
        [("x", T.FLOAT, [2])],
        [("y", T.FLOAT, [2]), ("z", T.FLOAT, [2])],
        inits,
    )
    small = apply(FoldConstants, m, max_elements=16)
    assert not small.changed and wheres(small, Status.KEPT) == ["big"]
    folded = apply(FoldConstants, m)
    assert wheres(folded, Status.CHANGED) == ["big", "s"]
    assert ops(folded.model) == {"RandomNormal": 1, "Add": 3, "Neg": 1, "DequantizeLinear": 1}


def test_a_sequence_is_not_folded_into_a_tensor() -> None:
    """SequenceEmpty has no inputs, so all its inputs are constant, but its value is a
    sequence, which no initializer holds: kept (TorchScript's list feeding a Loop)."""
    from onnx import TensorProto, helper

    from edgeflow.rules.onnx.fold import fold

    nodes = [
        helper.make_node("SequenceEmpty", [], ["seq"], dtype=TensorProto.FLOAT),
        helper.make_node("SequenceInsert", ["seq", "x"], ["seq2"]),
        helper.make_node("ConcatFromSequence", ["seq2"], ["y"], axis=0),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    model = helper.make_model(
        helper.make_graph(nodes, "seq", [x], [y]), opset_imports=[helper.make_opsetid("", 17)]
    )
    sites = fold(model, 1 << 18)
    assert [n.op_type for n in model.graph.node] == [
        "SequenceEmpty",
        "SequenceInsert",
        "ConcatFromSequence",
    ]
    assert [s.message for s in sites] == ["SequenceEmpty makes a sequence or optional"]
