"""ast.float64_to_float32: float64 in model source becomes float32."""

from __future__ import annotations

import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from torch import float64, nn

from edgeflow.rules.ast.float64 import Float64ToFloat32
from tests.rules.ast._helpers import apply, check, inputs, specs
from tests.rules.sites import line_of, outcomes

SPECS = specs((1, 1, 8, 8))


class DoubleConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.register_buffer("scale", torch.tensor(0.5, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float64:
            x = x * 1
        w = self.conv.weight.double()
        y = F.conv2d(x.to(torch.float64), w, self.conv.bias.to(dtype=torch.double))
        return self.finish(y) + torch.zeros(1, dtype=float)

    def finish(self, y: torch.Tensor) -> torch.Tensor:
        return (y * self.scale).to(float64)


AFTER_FORWARD = """\
def forward(self, x: torch.Tensor) -> torch.Tensor:
    if x.dtype == torch.float64:
        x = x * 1
    w = self.conv.weight.float()
    y = F.conv2d(x.to(torch.float32), w, self.conv.bias.to(dtype=torch.float32))
    return self.finish(y) + torch.zeros(1, dtype=torch.float32)
"""
AFTER_FINISH = """\
def finish(self, y: torch.Tensor) -> torch.Tensor:
    return (y * self.scale).to(torch.float32)
"""


def test_source_before_after_and_numbers() -> None:
    torch.manual_seed(0)
    result = check(Float64ToFloat32, DoubleConv(), SPECS, atol=1e-5)
    assert result.sources == {
        "DoubleConv.forward": AFTER_FORWARD,
        "DoubleConv.finish": AFTER_FINISH,
    }
    assert result.matches == 6  # 5 sites + 1 float64 buffer
    assert outcomes(result) == [
        ("kept", line_of(DoubleConv, "== torch.float64")),
        ("changed", "DoubleConv.forward"),
        ("changed", "DoubleConv.finish"),
        ("changed", "scale"),  # the float64 buffer
    ]
    out = result.model(*inputs(SPECS))
    assert out.dtype == torch.float32


def test_parameters_option_off_keeps_buffers() -> None:
    result = apply(Float64ToFloat32, DoubleConv(), SPECS, parameters=False)
    assert result.model.scale.dtype == torch.float64


def test_nothing_to_do_says_so() -> None:
    result = apply(Float64ToFloat32, nn.Sequential(nn.Linear(2, 2)), specs((1, 2)))
    assert not result.changed
    assert outcomes(result) == [("not_applicable", "")]


def _ort_session(model: nn.Module, path: str) -> ort.InferenceSession:
    torch.onnx.export(model, inputs(SPECS), path, dynamo=False)
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"])


@pytest.mark.filterwarnings("ignore")
def test_onnxruntime_rejects_before_and_runs_after(tmp_path) -> None:
    torch.manual_seed(0)
    model = DoubleConv().eval()
    with pytest.raises(Exception, match=r"NOT_IMPLEMENTED.*Conv"):
        _ort_session(model, str(tmp_path / "before.onnx"))
    rewritten = apply(Float64ToFloat32, model, SPECS).model
    session = _ort_session(rewritten, str(tmp_path / "after.onnx"))
    x = inputs(SPECS)[0]
    [got] = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    torch.testing.assert_close(torch.from_numpy(got), model(x).float(), atol=1e-5, rtol=1e-5)
