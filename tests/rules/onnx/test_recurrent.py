"""onnx.unroll_recurrent: LSTM and GRU unrolled per time step match onnxruntime's kernels."""

from __future__ import annotations

import io
import warnings
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as T
from onnx import helper

from edgeflow.rules.base import RewriteContext
from edgeflow.rules.onnx.recurrent import UnrollRecurrent
from tests.rules.onnx.helpers import apply, feeds, model, ops, run, specs

STEPS, BATCH, SIZE, HIDDEN = 8, 2, 5, 16


def recurrent(
    op: str,
    direction: str = "forward",
    layout: int = 0,
    initial: bool = False,
    peepholes: bool = False,
    outputs: tuple[str, ...] = ("Y", "Y_h", "Y_c"),
    **attrs: Any,
) -> onnx.ModelProto:
    """One LSTM/GRU node with random constant weights; initial_h/c as graph inputs."""
    rng = np.random.default_rng(1)
    gates, dirs = {"LSTM": 4, "GRU": 3}[op], 2 if direction == "bidirectional" else 1
    weights = {
        "W": rng.standard_normal((dirs, gates * HIDDEN, SIZE)) * 0.4,
        "R": rng.standard_normal((dirs, gates * HIDDEN, HIDDEN)) * 0.4,
        "B": rng.standard_normal((dirs, 2 * gates * HIDDEN)) * 0.3,
    }
    if peepholes:
        weights["P"] = rng.standard_normal((dirs, 3 * HIDDEN)) * 0.3
    weights = {k: v.astype(np.float32) for k, v in weights.items()}
    x = [BATCH, STEPS, SIZE] if layout else [STEPS, BATCH, SIZE]
    state = [BATCH, dirs, HIDDEN] if layout else [dirs, BATCH, HIDDEN]
    inputs = [("x", T.FLOAT, x)]
    names = ["x", "W", "R", "B", ""]
    if initial:
        inputs.append(("h0", T.FLOAT, state))
        names.append("h0")
        if op == "LSTM":
            inputs.append(("c0", T.FLOAT, state))
            names.append("c0")
    if peepholes:
        names += [""] * (7 - len(names)) + ["P"]
    outs = [o for o in outputs if op == "LSTM" or o != "Y_c"]
    wired = [o if o in outs else "" for o in ("Y", "Y_h", "Y_c")[: 3 if op == "LSTM" else 2]]
    while wired and not wired[-1]:
        wired.pop()
    node = helper.make_node(
        op, names, wired, hidden_size=HIDDEN, direction=direction, layout=layout, **attrs
    )
    y = [BATCH, STEPS, dirs, HIDDEN] if layout else [STEPS, dirs, BATCH, HIDDEN]
    shapes = {"Y": y, "Y_h": state, "Y_c": state}
    return model([node], inputs, [(o, T.FLOAT, shapes[o]) for o in outs], weights, opset=17)


def check(m: onnx.ModelProto, reference: onnx.ModelProto | None = None) -> onnx.ModelProto:
    """Unroll m and compare with onnxruntime running m, or for layout 1 (which onnxruntime
    lacks) the same op in layout 0 (`reference`) on transposed inputs and outputs."""
    result = apply(UnrollRecurrent, m)
    assert result.changed, result.sites
    assert not {"LSTM", "GRU"} & set(ops(result.model))
    if m.graph.node[0].op_type in ("LSTM", "GRU"):  # the bare op: only cell math is left
        cell = {"Gemm", "MatMul", "Add", "Sub", "Mul", "Sigmoid", "Tanh"}
        assert set(ops(result.model)) <= cell | {"Slice", "Reshape", "Concat"}
    for seed in range(3):
        inputs = feeds(specs(m), seed=seed, scale=1.0)
        got = run(result.model, inputs)
        if reference is None:
            want = run(m, inputs)
        else:  # batch-major inputs and outputs
            swapped = {k: v.transpose(1, 0, 2) for k, v in inputs.items()}
            want = [
                y.transpose(2, 0, 1, 3) if y.ndim == 4 else y.transpose(1, 0, 2)
                for y in run(reference, swapped)
            ]
        assert len(want) == len(got)
        for a, b in zip(want, got, strict=True):
            assert a.shape == b.shape
            np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)
    return result.model


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("initial", [False, True])
def test_lstm(direction: str, initial: bool) -> None:
    check(recurrent("LSTM", direction, 0, initial))


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_layout_1(op: str) -> None:
    check(recurrent(op, "bidirectional", 1, True), recurrent(op, "bidirectional", 0, True))


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("linear_before_reset", [0, 1])
@pytest.mark.parametrize("initial", [False, True])
def test_gru(direction: str, linear_before_reset: int, initial: bool) -> None:
    check(recurrent("GRU", direction, 0, initial, linear_before_reset=linear_before_reset))


def test_lstm_peepholes_and_partial_outputs() -> None:
    check(recurrent("LSTM", "bidirectional", 0, True, peepholes=True))
    check(recurrent("LSTM", outputs=("Y_h",)))
    check(recurrent("GRU", outputs=("Y",)))


def test_kept_with_reasons() -> None:
    clipped = UnrollRecurrent().apply(
        recurrent("LSTM", clip=3.0), UnrollRecurrent.Options(), RewriteContext([])
    )
    assert not clipped.changed and "clip" in str(clipped.sites)
    long = apply(UnrollRecurrent, recurrent("GRU"), max_steps=4)
    assert not long.changed and "max_steps" in str(long.sites)


class Tagger(torch.nn.Module):
    def __init__(self, cell: type) -> None:
        super().__init__()
        self.rnn = cell(SIZE, HIDDEN, batch_first=True)
        self.head = torch.nn.Linear(HIDDEN, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.rnn(x)
        return self.head(y[:, -1])


@pytest.mark.parametrize("cell", [torch.nn.LSTM, torch.nn.GRU], ids=["lstm", "gru"])
def test_torch_export_zero_state_is_dropped(cell: type) -> None:
    """torch writes the zero initial state as Expand(zeros, Shape(x)...): left unread."""
    torch.manual_seed(0)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Tagger(cell).eval(),
            (torch.randn(1, STEPS, SIZE),),
            buffer,
            dynamo=False,
            opset_version=17,
            input_names=["x"],
            output_names=["y"],
        )
    unrolled = check(onnx.load_from_string(buffer.getvalue()))
    assert not {"Expand", "Shape"} & set(ops(unrolled))


def test_a_long_sequence_is_assembled_by_concats_of_at_most_ten_inputs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """TFLite Micro's CONCATENATION takes at most 10 inputs: a 13-step Y failed to prepare."""
    import tests.rules.onnx.test_recurrent as this

    monkeypatch.setattr(this, "STEPS", 23)
    unrolled = check(recurrent("LSTM", "bidirectional"))
    widths = [len(n.input) for n in unrolled.graph.node if n.op_type == "Concat"]
    assert max(widths) <= 10 and len(widths) > 3


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_every_step_reads_the_same_weights(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A weight each step reads is stored once: a 3-layer LSTM over 160 steps had grown from
    5.5 MB to 351 MB, each step's weights an initializer of their own. The unrolled model's
    float weights stay within the source's (biases split per gate, and Gemm's kept bias,
    add at most a few hundred values), however many steps."""
    import tests.rules.onnx.test_recurrent as this

    sizes = {}
    for steps in (8, 64):
        monkeypatch.setattr(this, "STEPS", steps)
        m = recurrent(op, "bidirectional", 0, True)
        unrolled = apply(UnrollRecurrent, m).model
        floats = [t for t in unrolled.graph.initializer if t.data_type == T.FLOAT]
        sizes[steps] = (len(floats), sum(int(np.prod(t.dims)) for t in floats))
    source = sum(int(np.prod(t.dims)) for t in m.graph.initializer)
    assert sizes[8] == sizes[64]  # independent of the sequence length
    assert sizes[64][1] <= source + 8 * HIDDEN * 2, (sizes, source)
