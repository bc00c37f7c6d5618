"""Fake quantization with frozen parameters: what a QAT model's FakeQuantize modules compute in
inference, as a module every exporter turns into ONNX QuantizeLinear/DequantizeLinear.

torch.ao.quantization's FakeQuantize decides at run time whether to observe and whether to
quantize (`if self.observer_enabled[0] == 1:`): a branch on a tensor that torch.export cannot
capture and the TorchScript tracer bakes in. `FrozenFakeQuant` holds the learned scale and zero
point as constants and always fake-quantizes, which exports as a Q/DQ pair (opset >= 13 for
per-channel).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

# The ranges ONNX QuantizeLinear quantizes to (int8, uint8). A narrower trained range (7-bit
# weights, as x86 int8 kernels without VNNI need) is kept by clamping before quantizing.
ONNX_RANGES = {"qint8": (-128, 127), "quint8": (0, 255)}


class FrozenFakeQuant(nn.Module):
    """x -> dequantize(quantize(x)) with fixed scale and zero point (per tensor or channel)."""

    scale: Tensor
    zero_point: Tensor
    low: Tensor
    high: Tensor

    def __init__(
        self,
        scale: Tensor,
        zero_point: Tensor,
        quant_range: tuple[int, int],
        onnx_range: tuple[int, int],
        axis: int | None,
    ) -> None:
        super().__init__()
        self.quant_range, self.onnx_range, self.axis = quant_range, onnx_range, axis
        self.narrow = quant_range != onnx_range
        zero = zero_point.detach().float()
        low, high = (quant_range[0] - zero) * scale, (quant_range[1] - zero) * scale
        if axis is None:  # Python numbers: the exporters see constants, not tensors to read
            self.scale_value = float(scale.reshape(-1)[0])
            self.zero_point_value = int(zero_point.reshape(-1)[0])
            self.low_value, self.high_value = float(low.reshape(-1)[0]), float(high.reshape(-1)[0])
        else:
            self.register_buffer("scale", scale.detach().clone().float())
            self.register_buffer("zero_point", zero_point.detach().clone().to(torch.int32))
            self.register_buffer("low", low.float())
            self.register_buffer("high", high.float())

    def forward(self, x: Tensor) -> Tensor:
        lo, hi = self.onnx_range
        if self.axis is None:
            if self.narrow:
                x = torch.clamp(x, self.low_value, self.high_value)
            return torch.fake_quantize_per_tensor_affine(
                x, self.scale_value, self.zero_point_value, lo, hi
            )
        if self.narrow:
            shape = [-1 if d == self.axis else 1 for d in range(x.dim())]
            x = torch.minimum(torch.maximum(x, self.low.reshape(shape)), self.high.reshape(shape))
        return torch.fake_quantize_per_channel_affine(
            x, self.scale, self.zero_point, self.axis, lo, hi
        )

    def extra_repr(self) -> str:
        where = "per tensor" if self.axis is None else f"per channel (axis {self.axis})"
        return f"{where}, range {list(self.quant_range)}"
