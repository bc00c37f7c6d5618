"""Pairing the tensors of two conversions of one model (edgeflow.targets.taps): operator by
operator where their operators are the same, else by the runs of operators both have and by
tensor name."""

from __future__ import annotations

from edgeflow.targets.taps import TfliteGraph, TfliteOp, align, align_runs, same_names


def _graph(ops: list[tuple[str, tuple[int, ...]]], names: list[str] | None = None) -> TfliteGraph:
    """A chain: tensor 0 the input, operator k writes tensor k + 1 of the given shape; a
    name "CONV_2D/RELU" is a CONV_2D with a fused RELU."""
    chain = []
    for k, (name, _) in enumerate(ops):
        builtin, _, activation = name.partition("/")
        chain.append(TfliteOp(builtin, (k,), (k + 1,), activation))
    shapes = [(1, 8), *(shape for _, shape in ops)]
    names = names or [f"t{k}" for k in range(len(shapes))]
    return TfliteGraph(chain, names, shapes, [0], [len(ops)])


FLOAT32 = [
    ("RESHAPE", (1, 8, 8)),
    ("UNIDIRECTIONAL_SEQUENCE_LSTM", (1, 8, 16)),
    ("STRIDED_SLICE", (1, 16)),
    ("FULLY_CONNECTED", (1, 10)),
]
INT8 = [  # the same model with its LSTM as a loop, int8 around it
    ("RESHAPE", (8, 1, 8)),
    ("FULLY_CONNECTED", (8, 64)),
    ("DEQUANTIZE", (8, 64)),
    ("WHILE", (1, 16)),
    ("QUANTIZE", (1, 16)),
    ("FULLY_CONNECTED", (1, 10)),
]


def test_operators_that_differ_align_by_their_common_runs_and_shapes() -> None:
    floats, quants = _graph(FLOAT32), _graph(INT8)
    assert align(floats.ops, quants.ops) is None
    # the head only: the RESHAPEs write other shapes, the input projection is not the head
    assert align_runs(floats, quants) == {4: 6}


def test_an_operator_only_one_file_has_leaves_the_runs_around_it_aligned() -> None:
    float32 = [("CONV_2D/RELU", (1, 4, 4, 8)), ("MEAN", (1, 8)), ("FULLY_CONNECTED", (1, 10))]
    int8 = [("CONV_2D", (1, 4, 4, 8)), ("RELU", (1, 4, 4, 8)), *float32[1:]]  # not fused
    assert align(_graph(float32).ops, _graph(int8).ops) is None
    # the convolution's outputs differ (one before its ReLU): not paired
    assert align_runs(_graph(float32), _graph(int8)) == {2: 3, 3: 4}
    assert align_runs(_graph(float32), _graph(float32)) == {1: 1, 2: 2, 3: 3}


def test_tensors_pair_by_name_where_operator_and_shape_agree() -> None:
    floats = _graph(FLOAT32, ["in", "rows", "lstm", "last", "logits"])
    names = ["in", "rows", "proj", "tfl.dequantize", "last", "tfl.quantize", "logits"]
    quants = _graph(INT8, names)
    # "rows" is (1, 8, 8) in one file and (8, 1, 8) in the other, "last" written by a
    # STRIDED_SLICE in one and a WHILE in the other; the input is no operator's output
    assert same_names(floats, quants) == {4: 6}
