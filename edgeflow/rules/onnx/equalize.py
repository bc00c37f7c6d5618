"""onnx.equalize_channels: cross-layer equalization (Nagel et al. 2019, "Data-Free
Quantization Through Weight Equalization and Bias Correction", section 4.1).

Two layers in a row, W1 (output channel i) -> f -> W2 (input channel i), with f positive
homogeneous per channel (f(x / s) = f(x) / s for s > 0: Relu, LeakyRelu, PRelu, pooling,
spatial means, channel-preserving reshapes, nothing), compute the same function after output
channel i of W1 (and its bias) is divided by s_i and input channel i of W2 is multiplied by
s_i. With r1_i, r2_i the channels' ranges (largest |weight|), s_i = sqrt(r1_i / r2_i) makes
both sqrt(r1_i r2_i): the channels of one weight tensor move toward one range, and a
per-tensor int8 scale fits each of them better. A chain (conv -> dw conv -> conv) is swept
pair by pair until every pair's scales lie within `threshold` of 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from edgeflow.core.onnxgraph import copy_model, node_reads
from edgeflow.rules.base import OnnxRule, RewriteContext, RuleOptions, RuleResult, Site
from edgeflow.rules.onnx._build import attr
from edgeflow.rules.onnx._edit import Edit

if TYPE_CHECKING:
    import numpy as np
    import onnx

LAYERS = frozenset({"Conv", "Gemm", "MatMul"})
# per-channel positive-homogeneous, one data input (input 0), channel axis kept
ELEMENTWISE = frozenset({"Relu", "LeakyRelu", "PRelu", "Identity", "Dropout"})
POOLS = frozenset({"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool"})
REDUCES = frozenset({"ReduceMean", "ReduceMax", "ReduceSum"})
RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})


@dataclass
class _Layer:
    """A Conv, Gemm or MatMul (+ a bias Add) with its weight and bias initializers."""

    node: Any
    weight: str
    bias: str  # '' when it has none
    out: str  # the layer's output: the bias Add's for MatMul + Add
    where: str

    @property
    def op(self) -> str:
        return str(self.node.op_type)

    def rows(self, w: np.ndarray) -> np.ndarray:
        """The weight as [output channel, everything it reads]."""
        if self.op == "Conv":
            return w.reshape(w.shape[0], -1)
        transposed = self.op == "Gemm" and attr(self.node, "transB", 0)
        return w if transposed else w.T  # Gemm's B is [K, N] or [N, K]; MatMul's [K, N]

    def in_ranges(self, w: np.ndarray) -> np.ndarray:
        """The largest |weight| reading each input channel (grouped Conv: within its group)."""
        import numpy as np

        if self.op != "Conv":
            return np.abs(self.rows(w)).max(axis=0)
        groups = int(attr(self.node, "group", 1))
        per_group = w.reshape(groups, w.shape[0] // groups, w.shape[1], -1)
        return np.abs(per_group).max(axis=(1, 3)).reshape(-1)

    def scale_out(self, w: np.ndarray, s: np.ndarray) -> np.ndarray:
        if self.op == "Conv":
            return w * s.reshape(-1, *[1] * (w.ndim - 1))
        transposed = self.op == "Gemm" and attr(self.node, "transB", 0)
        return w * (s[:, None] if transposed else s[None, :])

    def scale_in(self, w: np.ndarray, s: np.ndarray) -> np.ndarray:
        if self.op != "Conv":
            transposed = self.op == "Gemm" and attr(self.node, "transB", 0)
            return w * (s[None, :] if transposed else s[:, None])
        groups = int(attr(self.node, "group", 1))
        shaped = w.reshape(groups, w.shape[0] // groups, w.shape[1], -1)
        return (shaped * s.reshape(groups, 1, w.shape[1], 1)).reshape(w.shape)


@dataclass
class _Pair:
    first: _Layer
    second: _Layer
    applied: bool = False


class EqualizeChannels(OnnxRule):
    """Exact in real arithmetic; in float32 each rescaled weight rounds once (outputs move
    by about 1e-7 relative; `power_of_two: true` rounds the scales to powers of two, which
    multiply without rounding, so the outputs stay bit for bit, and leaves each pair's
    ranges within a factor 2 of each other). For per-tensor int8 weights (Arm NN), whose one
    scale per tensor starves the channels of small range. Between the two layers: nothing,
    Relu, LeakyRelu, PRelu, Clip(0, no upper bound), Max/Average/Global pooling, a Reduce
    over other axes than the channels, a channel-preserving Reshape/Flatten/Squeeze. Kept:
    an intermediate tensor with another reader or a graph output (a branch, a residual), a
    Clip with an upper bound (Relu6: its bound would have to differ per channel), HardSwish,
    HardSigmoid, Sigmoid and anything else not positive-homogeneous, weights that are not
    float initializers read by this layer alone. Conv pairs with Conv (grouped and depthwise:
    input channel i is read by its group's rows), Gemm and MatMul (+ bias Add) with each
    other, a Conv with a Gemm through a Flatten of 1x1 maps. A default rewrite of armnn,
    whose int8 is per-tensor; elsewhere a recipe rule (per-channel scales give each channel
    its own range already), and measure: the activations' per-channel ranges change too.
    Measured on Arm NN (per-tensor int8, with the profile's other defaults), output SQNR
    without / with it: digits_cnn (3 pairs) 34.0 / 35.6 dB, digits_mobilenet (4 pairs: both
    squeeze-excite convs, two pointwise -> next-layer pairs) 24.1 / 24.9, keyword_spotter
    27.7 / 28.0; on the coverage benchmark's random-weight models resnet18 30.0 / 30.5,
    shufflenet_v2_x0_5 38.7 / 39.1, regnet_y_400mf 36.8 / 36.9, mobilenet_v3_small 42.9 /
    42.9: never lower. Accuracy moves within a few samples (digits_cnn 0.989 / 0.986 of 360,
    mobilenet 0.975 / 0.975, keyword_spotter 0.927 / 0.922 of 1,200); these weights' channel
    ranges lie within a factor 7 already. Before armnn's onnx.pad_with_concat, the rule
    lifted Arm NN's mobilenet from 0.589 to 0.969, but not by mending weight rounding: it
    moved the zero point of the tensor Arm NN's int8 PAD pads wrongly (with the integer 0),
    and LiteRT ran that very .tflite at 0.975."""

    name = "onnx.equalize_channels"
    description = "Equalize consecutive layers' per-channel weight ranges (cross-layer scaling)."

    class Options(RuleOptions):
        """threshold: a pair whose scales all lie within this of 1 is left as it is, and the
        sweeps stop when every pair's do; sweeps: the most passes over the chains;
        power_of_two: round each scale to a power of two (bit-exact outputs, each pair's
        ranges within a factor 2 of each other)."""

        threshold: float = Field(1e-3, gt=0, lt=1)
        sweeps: int = Field(100, ge=1, le=10000)
        power_of_two: bool = False

    example: ClassVar[tuple[str, str] | None] = (
        "y = Conv(Relu(Conv(x, W1, b1)), W2, b2)",
        "y = Conv(Relu(Conv(x, W1 / s, b1 / s)), W2 * s, b2), s_i = sqrt(r1_i / r2_i) "
        "per channel i (r: largest |weight| of W1's output / W2's input channel i)",
    )

    def tolerance(self, opts: Any) -> float | None:
        return 0.0 if opts.power_of_two else 1e-5

    def apply(
        self, model: onnx.ModelProto, opts: Any, ctx: RewriteContext
    ) -> RuleResult[onnx.ModelProto]:
        from onnx import numpy_helper

        out = copy_model(model)
        found = _Graph(out)
        pairs, sites = found.pairs()
        if not pairs and not sites:
            return RuleResult(out, sites=[Site.not_applicable("no Conv, Gemm or MatMul")])
        weights = {name: numpy_helper.to_array(found.inits[name]) for name in found.used(pairs)}
        before = {id(p): _ratios(p, weights) for p in pairs}
        converged = _equalize(pairs, weights, opts)
        for pair in pairs:
            where, name = pair.first.where, pair.second.where
            if not pair.applied:
                sites.append(Site.kept(where, f"ranges already equal to {name}'s"))
                continue
            (lo, hi), (lo2, hi2) = before[id(pair)], _ratios(pair, weights)
            note = "" if converged else f" (not converged in {opts.sweeps} sweeps)"
            sites.append(
                Site.changed(
                    where,
                    f"equalized with {name}: range ratio r1/r2 from {lo:.3g}..{hi:.3g} "
                    f"to {lo2:.3g}..{hi2:.3g}{note}",
                )
            )
        order = {(n.name or n.output[0]): i for i, n in enumerate(out.graph.node)}
        sites.sort(key=lambda site: order.get(site.where, -1))
        result = RuleResult(out, sites=sites)
        if not result.changed:
            return RuleResult(copy_model(model), sites=sites)
        for name, value in weights.items():
            found.inits[name].CopyFrom(numpy_helper.from_array(value, name))
        return result


def _ratios(pair: _Pair, weights: dict[str, np.ndarray]) -> tuple[float, float]:
    """The least and largest r1_i / r2_i over the channels both have nonzero."""
    import numpy as np

    r1 = np.abs(pair.first.rows(weights[pair.first.weight])).max(axis=1)
    r2 = pair.second.in_ranges(weights[pair.second.weight])
    live = (r1 > 0) & (r2 > 0)
    if not live.any():
        return (1.0, 1.0)
    ratio = r1[live] / r2[live]
    return float(ratio.min()), float(ratio.max())


def _equalize(pairs: list[_Pair], weights: dict[str, np.ndarray], opts: Any) -> bool:
    """Sweep the pairs in graph order until no pair's scales leave [1 - t, 1 + t]; whether
    they got there within opts.sweeps. The sweeps work in float64; each weight rounds back
    to its own type once, at the end."""
    import numpy as np

    dtypes = {name: w.dtype for name, w in weights.items()}
    for name in weights:
        weights[name] = weights[name].astype(np.float64)
    try:
        for _ in range(opts.sweeps):
            moved = False
            for pair in pairs:
                s = _scales(pair, weights, opts.power_of_two)
                if np.all(np.abs(s - 1) <= opts.threshold):
                    continue
                first, second = pair.first, pair.second
                weights[first.weight] = first.scale_out(weights[first.weight], 1 / s)
                if first.bias:  # [N] broadcasts over Gemm's C and the Add's constant
                    weights[first.bias] = weights[first.bias] * (1 / s)
                weights[second.weight] = second.scale_in(weights[second.weight], s)
                pair.applied = moved = True
            if not moved:
                return True
        return False
    finally:
        for name, dtype in dtypes.items():
            weights[name] = weights[name].astype(dtype)


def _scales(pair: _Pair, weights: dict[str, np.ndarray], power_of_two: bool) -> np.ndarray:
    import numpy as np

    r1 = np.abs(pair.first.rows(weights[pair.first.weight])).max(axis=1)
    r2 = pair.second.in_ranges(weights[pair.second.weight])
    s = np.ones_like(r1)
    live = (r1 > 0) & (r2 > 0) & np.isfinite(r1) & np.isfinite(r2)
    s[live] = np.sqrt(r1[live] / r2[live])
    if power_of_two:
        s = np.exp2(np.round(np.log2(s)))
    return s


class _Graph:
    """The model's layers and which of them pair (W1 -> homogeneous ops -> W2)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.edit = Edit(model)
        graph = model.graph
        self.inits = {t.name: t for t in graph.initializer}
        self.overridable = {v.name for v in graph.input}
        self.readers: dict[str, int] = {}
        for node in graph.node:
            for name in set(node_reads(node)):
                self.readers[name] = self.readers.get(name, 0) + 1
        self.nodes = list(graph.node)

    def used(self, pairs: list[_Pair]) -> list[str]:
        names: list[str] = []
        for pair in pairs:
            for name in (pair.first.weight, pair.first.bias, pair.second.weight):
                if name and name not in names:
                    names.append(name)
        return names

    def pairs(self) -> tuple[list[_Pair], list[Site]]:
        pairs, sites = [], []
        for node in self.nodes:
            if node.op_type not in LAYERS or node.domain not in ("", "ai.onnx"):
                continue
            where = node.name or node.output[0]
            layer = self._layer(node, where)
            if isinstance(layer, str):
                if layer:
                    sites.append(Site.kept(where, layer))
                continue
            nxt = self._next(layer)
            if isinstance(nxt, str):
                sites.append(Site.kept(where, nxt))
                continue
            pairs.append(_Pair(layer, nxt))
        return pairs, sites

    def _float_init(self, name: str) -> bool:
        tensor = self.inits.get(name)
        return (
            tensor is not None
            and tensor.data_type in (1, 11)  # float, double
            and name not in self.overridable
            and self.readers.get(name, 0) == 1
        )

    def _layer(self, node: Any, where: str) -> _Layer | str:
        """The node as a layer, or why it cannot be scaled ('' for a MatMul of two
        computed tensors: not a layer)."""
        e = self.edit
        if len(node.input) < 2 or node.input[1] not in e.constants:
            return "" if node.op_type == "MatMul" else "its weight is not a constant"
        weight = node.input[1]
        if not self._float_init(weight):
            return "its weight is not a float initializer that only this node reads"
        value = e.constants[weight]
        bias, out = node.input[2] if len(node.input) > 2 else "", node.output[0]
        if node.op_type == "MatMul":
            if value.ndim != 2:
                return "its weight is not 2-D"
            bias, out = self._bias_add(node, value.shape[1])
        elif node.op_type == "Gemm" and attr(node, "transA", 0):
            return "transA is set"
        if bias and not self._float_init(bias):
            return "its bias is not a float initializer that only this node reads"
        if bias and node.op_type == "Conv" and e.constants[bias].shape != (value.shape[0],):
            return "its bias is not one value per output channel"
        if bias and node.op_type == "Gemm":
            n = value.shape[0] if attr(node, "transB", 0) else value.shape[1]
            c = e.constants[bias]
            if c.ndim > 2 or (c.ndim and c.shape[-1] not in (1, n)):
                return "its bias does not broadcast along the channels"
        return _Layer(node, weight, bias, out, where)

    def _bias_add(self, node: Any, n: int) -> tuple[str, str]:
        """The constant [N] of an Add that alone reads the MatMul's output, and its output."""
        e = self.edit
        reader = e.only_consumer(node.output[0])
        if reader is None or reader.op_type != "Add":
            return "", node.output[0]
        other = reader.input[1] if reader.input[0] == node.output[0] else reader.input[0]
        value = e.constants.get(other)
        if value is None or value.shape[-1:] != (n,) or value.size != n:
            return "", node.output[0]
        rank = e.shape(node.output[0])
        if rank is None or value.ndim > len(rank) or not self._float_init(other):
            return "", node.output[0]
        return other, reader.output[0]

    def _next(self, layer: _Layer) -> _Layer | str:
        """The layer that reads `layer`'s output channels through homogeneous ops, or why
        there is none."""
        e = self.edit
        tensor = layer.out
        axis = _channel_axis(layer.op, e.shape(tensor))
        if axis is None:
            return "its output's shape is not static"
        while True:
            if tensor in e.graph_outputs:
                return f"{tensor} is a graph output"
            readers = e.consumers.get(tensor, [])
            if len(readers) != 1:
                return f"{tensor} has {len(readers)} readers (a branch or a residual)"
            node = readers[0]
            known = node.op_type in LAYERS | ELEMENTWISE | POOLS | REDUCES | RESHAPES | {"Clip"}
            if not known or node.domain not in ("", "ai.onnx"):
                return f"followed by {node.op_type} {node.name}, not positive-homogeneous"
            if node.input[0] != tensor:
                return f"{tensor} is read by {node.op_type} {node.name}, not as its data input"
            if node.op_type in LAYERS:
                return self._second(layer, node, axis, tensor)
            moved = self._through(node, tensor, axis)
            if isinstance(moved, str):
                return moved
            tensor, axis = node.output[0], moved

    def _through(self, node: Any, tensor: str, axis: int) -> int | str:
        """The channel axis of `node`'s output when node is positive-homogeneous per
        channel, else why it is not."""
        import numpy as np

        e, op = self.edit, node.op_type
        if op in ELEMENTWISE or op in POOLS:
            if op in POOLS and axis != 1:
                return f"{op} {node.name} pools over the channel axis"
            if len([o for o in node.output if o]) > 1 and op != "Dropout":
                return f"{op} {node.name} has a second output"
            if op == "Dropout" and len(node.output) > 1 and node.output[1]:
                return f"Dropout {node.name}'s mask is read"
            return axis
        if op == "Clip":
            low = _clip_bound(node, e, 1, "min")
            high = _clip_bound(node, e, 2, "max")
            if low is None or high is None:
                return f"Clip {node.name}'s bounds are not constants"
            if low not in (0.0, -math.inf) or high != math.inf:
                return (
                    f"Clip {node.name} bounds at [{low:g}, {high:g}]: not positive-homogeneous "
                    "(an upper bound would have to differ per channel)"
                )
            return axis
        if op in REDUCES:
            return _reduced_axis(node, e, axis)
        if op in RESHAPES:
            before, after = e.shape(tensor), e.shape(node.output[0])
            if before is None or after is None:
                return f"{op} {node.name}: shapes not static"
            lead, channels = int(np.prod(before[:axis])), before[axis]
            for j in range(len(after)):
                if int(np.prod(after[:j])) == lead and after[j] == channels:
                    return j
            return f"{op} {node.name} mixes the channels with other dims"
        raise AssertionError(f"{op} is none of the ops _next passes on")

    def _second(self, first: _Layer, node: Any, axis: int, tensor: str) -> _Layer | str:
        where = node.name or node.output[0]
        layer = self._layer(node, where)
        if isinstance(layer, str):
            return f"the next layer {where}: {layer or 'not a layer'}"
        if axis != _channel_axis(node.op_type, self.edit.shape(tensor)):
            return f"the next layer {where} reads another axis than {first.where}'s channels"
        w1 = self.edit.constants[first.weight]
        w2 = self.edit.constants[layer.weight]
        n1, n2 = len(first.rows(w1)), len(layer.in_ranges(w2))
        if n1 != n2:
            return f"{n1} output channels, {where} reads {n2}"
        return layer


def _channel_axis(op: str, shape: list[int] | None) -> int | None:
    """The channel axis of a layer's input or output: 1 for Conv and Gemm, the last for
    MatMul (None when its static shape is unknown)."""
    if op in ("Conv", "Gemm"):
        return 1
    return len(shape) - 1 if shape else None


def _clip_bound(node: Any, e: Edit, index: int, name: str) -> float | None:
    """A Clip bound (input `index` from opset 11, attribute `name` before); +-inf absent."""
    default = -math.inf if name == "min" else math.inf
    if e.opset < 11:
        value: Any = attr(node, name, default)
    elif len(node.input) > index and node.input[index]:
        value = e.constants.get(node.input[index])
        if value is None:
            return None
    else:
        value = default
    bound = float(value)
    return default if abs(bound) >= 3.4e38 and (bound < 0) == (default < 0) else bound


def _reduced_axis(node: Any, e: Edit, axis: int) -> int | str:
    """The channel axis after a Reduce over other axes, or why the Reduce mixes channels."""
    rank = e.shape(node.input[0])
    if rank is None:
        return f"{node.op_type} {node.name}: the input shape is not static"
    if e.opset >= 18 or (node.op_type == "ReduceSum" and e.opset >= 13):
        axes_in = node.input[1] if len(node.input) > 1 and node.input[1] else ""
        value = e.constants.get(axes_in) if axes_in else None
        if axes_in and value is None:
            return f"{node.op_type} {node.name}'s axes are not a constant"
        axes = [] if value is None else [int(a) for a in value.reshape(-1)]
    else:
        axes = list(attr(node, "axes", []))
    if not axes:
        if attr(node, "noop_with_empty_axes", 0):
            return axis
        return f"{node.op_type} {node.name} reduces every axis"
    axes = [a % len(rank) for a in axes]
    if axis in axes:
        return f"{node.op_type} {node.name} reduces over the channels"
    return axis if attr(node, "keepdims", 1) else axis - sum(a < axis for a in axes)
