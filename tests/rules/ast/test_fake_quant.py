"""ast.freeze_fake_quant: FakeQuantize modules -> fixed Q/DQ with the learned parameters."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import onnx
import pytest
import torch
from torch import nn
from torch.ao.quantization import (
    FakeQuantize,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    disable_observer,
)

from edgeflow.core.errors import EdgeflowError
from edgeflow.ops.quant import FrozenFakeQuant
from edgeflow.rules.ast.fake_quant import FreezeFakeQuant
from edgeflow.rules.base import Status
from tests.rules.ast._helpers import apply, check, inputs, specs
from tests.rules.sites import outcomes, wheres

SPECS = specs((4, 6))


class Tiny(nn.Module):
    """Input and output activations (int8 and uint8) and a 7-bit per-channel weight."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 5)
        self.act_in = FakeQuantize(
            observer=MovingAverageMinMaxObserver, quant_min=-128, quant_max=127,
            dtype=torch.qint8, qscheme=torch.per_tensor_affine,
        )  # fmt: skip
        self.weight = FakeQuantize(
            observer=MovingAveragePerChannelMinMaxObserver, quant_min=-64, quant_max=63,
            dtype=torch.qint8, qscheme=torch.per_channel_symmetric, ch_axis=0,
        )  # fmt: skip
        self.act_out = FakeQuantize(
            observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255,
            dtype=torch.quint8, qscheme=torch.per_tensor_affine,
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.linear(self.act_in(x), self.weight(self.linear.weight), self.linear.bias)
        return self.act_out(torch.relu(y))


def trained() -> Tiny:
    """Observers have seen data (scales learned), then are frozen, as after QAT."""
    torch.manual_seed(0)
    model = Tiny()
    with torch.no_grad():
        for seed in range(3):
            model(inputs(SPECS, seed)[0] * 3)
    model.apply(disable_observer)
    return model.eval()


def test_numbers_equal_the_fake_quantize_modules_and_idempotence() -> None:
    model = trained()
    result = check(FreezeFakeQuant, model, SPECS, atol=0.0)
    assert result.matches == 3
    assert outcomes(result) == [
        ("changed", "act_in"),
        ("changed", "weight"),
        ("changed", "act_out"),
    ]
    frozen = [m for m in result.model.modules() if isinstance(m, FrozenFakeQuant)]
    assert [m.quant_range for m in frozen] == [(-128, 127), (-64, 63), (0, 255)]
    assert frozen[1].narrow and not frozen[0].narrow
    assert frozen[0].scale_value == pytest.approx(float(model.act_in.scale))


def test_export_fails_before_and_gives_qdq_after(tmp_path: Path) -> None:
    model = trained()
    with pytest.raises(Exception):  # noqa: B017 - the exporter's own error types vary
        torch.export.export(model, inputs(SPECS), strict=True)
    rewritten = apply(FreezeFakeQuant, model, SPECS).model
    torch.export.export(rewritten, inputs(SPECS))
    path = tmp_path / "m.onnx"
    torch.onnx.export(rewritten, inputs(SPECS), str(path), dynamo=False, opset_version=17)
    ops = Counter(n.op_type for n in onnx.load(str(path)).graph.node)
    assert ops["QuantizeLinear"] == 3 and ops["DequantizeLinear"] == 3


def test_observers_still_on_and_types_onnx_lacks() -> None:
    model = Tiny().eval()  # observers never frozen
    result = apply(FreezeFakeQuant, model, SPECS)
    assert wheres(result, Status.CHANGED) == ["act_in", "weight", "act_out"]  # frozen anyway
    odd = trained()
    odd.act_out.dtype = torch.qint32
    with pytest.raises(EdgeflowError, match=r"act_out quantizes to torch.qint32"):
        apply(FreezeFakeQuant, odd, SPECS)
    assert outcomes(apply(FreezeFakeQuant, nn.Linear(6, 5), SPECS)) == [("not_applicable", "")]
