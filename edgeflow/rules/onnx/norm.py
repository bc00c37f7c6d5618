"""onnx.channel_layernorm: a LayerNorm over the channels of an NCHW tensor, written as the
exporter writes timm's LayerNorm2d (Transpose to NHWC, LayerNormalization over the last axis,
Transpose back), becomes its formula on the NCHW tensor itself: ReduceMean over axis 1, Sub,
Mul, ReduceMean, Add epsilon, Sqrt, Div, Mul by the scale and Add the bias as [1, C, 1, 1]
constants (4-D: onnx2tf moves a 4-D constant to NHWC with the tensor, while it broadcast a
[C, 1, 1] one against a [1, 1, 1, C] map into [1, C, 1, C] in convnext's head). No Transposes
are left: onnx2tf keeps NCHW axis 1 as the NHWC channel axis, while
the decomposed LayerNorm between the two Transposes sends onnx2tf 1.28.8 into its
parameter-search fallback, which ends in a RecursionError (measured on timm's convnext_atto).
"""

from __future__ import annotations

from typing import Any, ClassVar

from edgeflow.rules.base import RuleOptions
from edgeflow.rules.onnx._build import attr
from edgeflow.rules.onnx._edit import Edit, NodeRule


class ChannelLayerNorm(NodeRule):
    """Within float rounding (the same formula as `onnx.decompose`'s LayerNorm, on the other
    layout). Needs constant scale and bias, and a LayerNormalization whose only reader is the
    Transpose back to NCHW (its mean and inverse-std outputs unused). Runs before
    `onnx.decompose` in armnn's default rewrites; its Sqrt is then `onnx.sqrt_newton`'s."""

    name = "onnx.channel_layernorm"
    description = "Turn Transpose -> LayerNorm(last axis) -> Transpose into a channel-axis norm."
    runs_before: ClassVar[dict[str, str]] = {
        "onnx.decompose": "decomposed between its Transposes, a LayerNorm2d makes onnx2tf fail",
        "onnx.sqrt_newton": "its formula takes a square root",
    }

    class Options(RuleOptions):
        pass

    example: ClassVar[tuple[str, str] | None] = (
        "y = Transpose(LayerNormalization(Transpose(x, [0, 2, 3, 1]), g, b), [0, 3, 1, 2])",
        "d = x - ReduceMean(x, [1]); y = d / Sqrt(ReduceMean(d * d, [1]) + eps) * g[1,C,1,1] "
        "+ b[1,C,1,1]",
    )

    def tolerance(self, opts: Any) -> float | None:
        return 1e-5

    op_types = frozenset({"Transpose"})
    what = "channel LayerNorm"

    def replace(self, e: Edit, node: Any, opts: Options) -> str | None:
        return _channel_layernorm(node, e)


def _channel_layernorm(node: Any, e: Edit) -> str | None:
    if list(attr(node, "perm", [])) != [0, 2, 3, 1]:
        return ""
    norm = e.only_consumer(node.output[0])
    if norm is None or norm.op_type != "LayerNormalization":
        return ""
    back = e.only_consumer(norm.output[0])
    if back is None or back.op_type != "Transpose" or list(attr(back, "perm", [])) != [0, 3, 1, 2]:
        return ""
    if any(name for name in norm.output[1:]):
        return "the LayerNorm's mean or inverse-std output is used"
    if int(attr(norm, "axis", -1)) not in (-1, 3):
        return "the LayerNorm is not over the last axis only"
    scale = e.constants.get(norm.input[1])
    bias = e.constants.get(norm.input[2]) if len(norm.input) > 2 and norm.input[2] else None
    if scale is None or (len(norm.input) > 2 and norm.input[2] and bias is None):
        return "scale or bias is not a constant"
    x = node.input[0]
    mean = e.reduce_mean(x, [1], keepdims=1)
    d = e.op("Sub", x, mean)
    var = e.reduce_mean(e.op("Mul", d, d), [1], keepdims=1)
    std = e.op("Sqrt", e.op("Add", var, e.scalar(float(attr(norm, "epsilon", 1e-5)), x)))
    scaled = e.op("Mul", e.op("Div", d, std), e.array(scale.reshape(1, -1, 1, 1), "scale"))
    if bias is None:
        e.op("Identity", scaled, out=back.output[0])
    else:
        e.op("Add", scaled, e.array(bias.reshape(1, -1, 1, 1), "bias"), out=back.output[0])
    e.removed.update((norm.output[0], back.output[0]))
    return None
