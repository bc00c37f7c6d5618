"""ast.freeze_fake_quant: a QAT model's FakeQuantize modules -> frozen Q/DQ that export.

Every `torch.ao.quantization` fake-quantize module (FakeQuantize, FusedMovingAvgObsFakeQuantize,
... any FakeQuantizeBase with `scale` and `zero_point`) in a deep copy of the model becomes an
`edgeflow.ops.quant.FrozenFakeQuant` with the learned scale and zero point: the same numbers as
the module in eval mode with its observer off, but no run-time branch, so it exports to ONNX
QuantizeLinear/DequantizeLinear and the int8 targets take the learned parameters as they are
(`quantization: {mode: int8, method: qat}`: no recalibration). A range narrower than the
type's (7-bit weights in [-64, 63], which x86 int8 kernels without VNNI need) is kept exactly
by clamping before the int8 Q/DQ. A module whose fake quantization is disabled becomes an
identity. A module whose observer is still enabled is frozen at its current parameters, and
its site says so. A type ONNX cannot express (e.g. torch.qint32) is an error naming the
module.
"""

from __future__ import annotations

import copy
from typing import Any

from edgeflow.core.errors import EdgeflowError
from edgeflow.rules.base import AstRule, RewriteContext, RuleOptions, RuleResult, Site

BEFORE = """\
self.act = torch.ao.quantization.FakeQuantize(observer=MovingAverageMinMaxObserver, ...)
# forward: if self.observer_enabled[0] == 1: ...  (a branch on a tensor)
#          if self.fake_quant_enabled[0] == 1: x = fake_quantize_per_tensor_affine(...)
"""
AFTER = """\
self.act = FrozenFakeQuant(scale=0.0314, zero_point=-3, quant_min=-128, quant_max=127)
# forward: return torch.fake_quantize_per_tensor_affine(x, 0.0314, -3, -128, 127)
# ONNX: QuantizeLinear -> DequantizeLinear
"""


class FreezeFakeQuant(AstRule):
    name = "ast.freeze_fake_quant"
    description = (
        "Freeze a QAT model's FakeQuantize modules into fixed Q/DQ modules that export to "
        "QuantizeLinear/DequantizeLinear with the learned scales and zero points."
    )
    example = (BEFORE, AFTER)

    class Options(RuleOptions):
        pass

    def apply(self, model: Any, opts: Options, ctx: RewriteContext) -> RuleResult[Any]:
        import torch
        from torch.ao.quantization import FakeQuantizeBase

        from edgeflow.ops.quant import ONNX_RANGES, FrozenFakeQuant

        copy_ = copy.deepcopy(model)
        sites: list[Site] = []
        for path, found in list(copy_.named_modules()):
            if not isinstance(found, FakeQuantizeBase) or not path:
                continue
            module: Any = found  # its buffers and attributes, untyped in torch's stubs
            scale, zero_point = getattr(module, "scale", None), getattr(module, "zero_point", None)
            if scale is None or zero_point is None:
                sites.append(Site.kept(path, f"{type(module).__name__} has no scale/zero_point"))
                continue
            qmin, qmax = int(module.quant_min), int(module.quant_max)
            lo, hi = ONNX_RANGES.get(str(module.dtype).removeprefix("torch."), (0, -1))
            if not lo <= qmin < qmax <= hi:
                raise EdgeflowError(
                    f"{self.name}: {path} quantizes to {module.dtype} [{qmin}, {qmax}], which "
                    "ONNX QuantizeLinear cannot express",
                    "train with torch.qint8 within [-128, 127] or torch.quint8 within [0, 255]",
                )
            done = "frozen at its learned scale and zero point"
            if module.observer_enabled[0] == 1:
                done = "observer still enabled; frozen at its current scale"
            replacement: torch.nn.Module
            if module.fake_quant_enabled[0] == 0:
                replacement = torch.nn.Identity()
            else:
                per_channel = module.qscheme in (
                    torch.per_channel_affine,
                    torch.per_channel_symmetric,
                )
                axis = int(module.ch_axis) if per_channel else None
                replacement = FrozenFakeQuant(scale, zero_point, (qmin, qmax), (lo, hi), axis)
            parent_path, _, attr = path.rpartition(".")
            setattr(copy_.get_submodule(parent_path) if parent_path else copy_, attr, replacement)
            sites.append(Site.changed(path, done))
        if not sites:
            sites.append(Site.not_applicable("no fake-quantize module in the model"))
        return RuleResult(copy_, sites=sites)

    def tolerance(self, opts: Any) -> float | None:
        return 0.0  # the module's own eval-mode numbers
