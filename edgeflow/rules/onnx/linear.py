"""onnx.lower_matmul, onnx.resize_to_matmul, onnx.sqrt_newton: linear algebra and Sqrt in the
few ops a small TFLite runtime parses (measured on Arm NN 22's TfLite parser, which has no
BATCH_MATMUL, no SQRT/RSQRT, rejects FULLY_CONNECTED without a bias, and computes bilinear
RESIZE wrong).

- MatMul by a constant 2-D weight becomes Gemm with a bias (the following Add's, or a
  negligible one) for a 2-D input, a 1x1 Conv for a higher rank: FULLY_CONNECTED with its
  bias, or CONV_2D. Exact.
- MatMul of two computed tensors (attention's Q K^T and A V) becomes a broadcast Mul and a
  ReduceMean over K, times K: MUL and MEAN. The same sums in another order (1e-6 relative);
  it holds an [M, K, N] product per batch, so it is for small attention maps.
- A linear Resize is linear in its input: Y = A_h X A_w^T with constant interpolation
  matrices, computed here from the ONNX formula of each coordinate mode. Two 1x1 Convs.
- Sqrt starts from the least of its tangents and takes 4 rounds of Heron's iteration
  s <- (s + x / s) / 2, then x / s: Add, Mul, Min, Div. Float32 precision on all of float32
  (relative error 1.5e-7 measured from 1e-45 to 3.4e38), and exactly 0 at 0.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from edgeflow.rules.base import RuleOptions
from edgeflow.rules.fixes import Fix
from edgeflow.rules.onnx._build import attr
from edgeflow.rules.onnx._edit import Edit, NodeRule

if TYPE_CHECKING:
    import numpy as np


class LowerMatMul(NodeRule):
    """Arm NN 22's TfLite parser rejects a FULLY_CONNECTED without a bias, which onnx2tf
    writes for a MatMul by a weight, and has no BATCH_MATMUL. A MatMul by a constant 2-D
    weight takes the bias of the Add that follows it (or 2^-126, which changes no sum above
    2e-31) and becomes Gemm for a 2-D input (static or not: a Paddle-style Reshape to
    [batch, -1] before the classifier), else a 1x1 Conv over the input viewed as
    [B, K, rest, 1] (TensorFlow's converter would fuse Reshape/Gemm/Reshape into a
    FULLY_CONNECTED with keep_num_dims, which Arm NN 22 refuses): exact. A MatMul of
    two computed tensors (attention's Q K^T and A V), with static shapes and equal batch dims,
    becomes Mul of [P, M, K, 1] and [P, 1, K, N] views, ReduceMean over K (kept as an axis:
    onnx2tf swaps M and N of a [P, M, N] mean), times K: the same sums in another order
    (within 1e-5), holding a P x M x K x N tensor, so `max_elements` bounds it. A default
    rewrite of armnn."""

    name = "onnx.lower_matmul"
    description = "Turn MatMul into Gemm/1x1 Conv with bias (constant weight) or Mul + ReduceMean."
    fixes = (Fix.op("MatMul"),)

    class Options(RuleOptions):
        """constant: MatMul by a constant 2-D weight -> Gemm or 1x1 Conv, with a bias;
        activations: MatMul of two computed tensors -> broadcast Mul + ReduceMean; max_elements:
        the largest product tensor (batch x M x K x N) the activations form may create."""

        constant: bool = True
        activations: bool = True
        max_elements: int = Field(1 << 22, ge=1)

    example: ClassVar[tuple[str, str] | None] = (
        "y = Add(MatMul(x[1, 64, 128], W[128, 384]), b); a = MatMul(q[4, 64, 16], k[4, 16, 64])",
        "y = Transpose(Reshape(Conv(Reshape(Transpose(x), [1, 128, 64, 1]), W^T, b))); "
        "a = Reshape(ReduceMean(Mul(q[4, 64, 16, 1], k[4, 1, 16, 64]), axis 2) * 16, "
        "[4, 64, 64])",
    )

    def tolerance(self, opts: Any) -> float | None:
        return 1e-5 if opts.activations else 0.0

    op_types = frozenset({"MatMul"})
    what = "MatMul"

    def replace(self, e: Edit, node: Any, opts: Options) -> str | None:
        weight = e.constants.get(node.input[1])
        if weight is not None and weight.ndim == 2:
            return _matmul_gemm(node, e, weight) if opts.constant else "constant: false"
        if not opts.activations:
            return "activations: false"
        return _matmul_broadcast(node, e, opts.max_elements)


def _matmul_gemm(node: Any, e: Edit, weight: np.ndarray) -> str | None:
    shape = e.shape(node.input[0])
    rank = len(shape) if shape is not None else e.rank(node.input[0])
    if rank is None or rank < 2:
        return "the input's rank is not known (or it is 1-D)"
    if shape is None and rank > 2:  # a 2-D input becomes a Gemm whatever its dims
        return "the input shape is not static (and it is above 2-D)"
    n = weight.shape[1]
    out, bias = node.output[0], None
    reader = e.only_consumer(out)
    if reader is not None and reader.op_type == "Add":
        other = reader.input[1] if reader.input[0] == out else reader.input[0]
        value = e.constants.get(other)
        # a bias of shape [N] (or [1, .., N] adding no dims), not one that broadcasts wider
        fits = value is not None and value.shape[-1:] == (n,) and value.size == n
        if fits and value is not None and value.ndim <= rank:
            bias, out = value.reshape(n).astype(weight.dtype), reader.output[0]
            e.removed.add(out)
    if rank == 2:
        e.gemm(node.input[0], weight, bias, out=out)
    else:
        assert shape is not None
        e.linear(node.input[0], shape, len(shape) - 1, weight, bias, out=out)
    return None


def _matmul_broadcast(node: Any, e: Edit, max_elements: int) -> str | None:
    a, b = e.shape(node.input[0]), e.shape(node.input[1])
    if a is None or b is None:
        return "the input shapes are not static"
    if len(a) < 2 or len(b) < 2:
        return "a 1-D operand"
    batch_a, batch_b = a[:-2], b[:-2]
    width = max(len(batch_a), len(batch_b))
    batch_a = [1] * (width - len(batch_a)) + batch_a
    batch_b = [1] * (width - len(batch_b)) + batch_b
    if batch_a != batch_b:
        return f"batch dims {a[:-2]} and {b[:-2]} differ (broadcast MatMul)"
    (m, k), n = a[-2:], b[-1]
    p = math.prod(batch_a)
    if p * m * k * n > max_elements:
        return f"the product would hold {p * m * k * n} elements (max_elements {max_elements})"
    left = e.reshape(node.input[0], [p, m, k, 1])
    right = e.reshape(node.input[1], [p, 1, k, n])
    # keepdims: onnx2tf 1.28.8 converts the [P, M, N] a keepdims=0 mean writes with M and N
    # swapped in its channel-last layout (measured: softmax of the scores off by 0.6 to 1.0
    # for every T, head width and head count tried, LiteRT and Arm NN alike); [P, M, 1, N]
    # then the Reshape below converts right (within 1.4e-6)
    mean = e.reduce_mean(e.op("Mul", left, right), [2], keepdims=1)
    total = e.op("Mul", mean, e.scalar(float(k), node.input[0]))
    e.reshape(total, [*batch_a, m, n], out=node.output[0])
    return None


class ResizeToMatMul(NodeRule):
    """Within float rounding (1e-5). Arm NN's CpuRef computes bilinear RESIZE wrong (relative
    error 0.58 in the target's probe, half-pixel centres). A linear Resize of an [N, C, H, W]
    tensor with constant sizes or scales is Y = A_h X A_w^T, with interpolation matrices
    computed from the ONNX formula of its coordinate_transformation_mode (half_pixel,
    pytorch_half_pixel, align_corners, asymmetric, half_pixel_symmetric): a 1x1 Conv (with
    Transposes) per axis that changes size. Kept: nearest and cubic modes, antialias,
    axes. A default rewrite of armnn."""

    name = "onnx.resize_to_matmul"
    description = "Turn a linear (bilinear) 4-D Resize into 1x1 Convs by interpolation matrices."
    fixes = (Fix.check("Resize", "resize_nearest"),)

    class Options(RuleOptions):
        pass

    example: ClassVar[tuple[str, str] | None] = (
        "y = Resize(x[1, 21, 16, 16], sizes=[1, 21, 128, 128], mode=linear)",
        "y = the 1x1 Conv by A_w [128, 16] along W, then by A_h [128, 16] along H",
    )

    def tolerance(self, opts: Any) -> float | None:
        return 1e-5

    op_types = frozenset({"Resize"})
    what = "linear Resize"

    def replace(self, e: Edit, node: Any, opts: Options) -> str | None:
        return _resize(node, e)


COORDINATE_MODES = (
    "half_pixel",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "half_pixel_symmetric",
)


def _resize(node: Any, e: Edit) -> str | None:
    import numpy as np

    if attr(node, "mode", "nearest") != "linear":
        return f"mode {attr(node, 'mode', 'nearest')} (only linear)"
    default_mode = "half_pixel" if e.opset >= 11 else "asymmetric"
    mode = attr(node, "coordinate_transformation_mode", default_mode)
    if mode not in COORDINATE_MODES:
        return f"coordinate_transformation_mode {mode}"
    if attr(node, "antialias", 0) or attr(node, "axes", None) is not None:
        return "antialias or axes set"
    if attr(node, "keep_aspect_ratio_policy", "stretch") != "stretch":
        return "keep_aspect_ratio_policy is not stretch"
    shape = e.shape(node.input[0])
    if shape is None or len(shape) != 4:
        return "the input is not a static 4-D tensor"
    scales_name = node.input[2] if e.opset >= 11 and len(node.input) > 2 else node.input[-1]
    sizes_name = node.input[3] if len(node.input) > 3 else ""
    sizes, scales = e.constants.get(sizes_name), e.constants.get(scales_name)
    if sizes is not None and sizes.size == 4:
        out = [int(v) for v in sizes]
        factors = [o / i for o, i in zip(out, shape, strict=True)]
    elif scales is not None and scales.size == 4:
        factors = [float(v) for v in scales]
        out = [math.floor(i * f) for i, f in zip(shape, factors, strict=True)]
    else:
        return "neither constant sizes nor constant scales"
    if out[:2] != shape[:2]:
        return "resizes the batch or channel dim"
    x = node.input[0]
    now = list(shape)
    for axis in (3, 2):
        matrix = _interpolation(shape[axis], out[axis], factors[axis], mode)
        if matrix.shape[0] == matrix.shape[1] and np.allclose(matrix, np.eye(len(matrix))):
            continue  # this axis keeps its size and values
        last = axis == 2 or out[2] == shape[2]
        weight = np.ascontiguousarray(matrix.T.astype(np.float32))
        x = e.linear(x, now, axis, weight, None, out=node.output[0] if last else "")
        now[axis] = out[axis]
    if x == node.input[0]:
        e.op("Identity", x, out=node.output[0])
    return None


def _interpolation(size_in: int, size_out: int, scale: float, mode: str) -> np.ndarray:
    """[size_out, size_in]: row i holds the weights of output i, per the ONNX Resize spec's
    coordinate transformation and linear interpolation (edge values beyond the border)."""
    import numpy as np

    i = np.arange(size_out, dtype=np.float64)
    if mode == "align_corners":
        x = i * (size_in - 1) / (size_out - 1) if size_out > 1 else np.zeros_like(i)
    elif mode == "asymmetric":
        x = i / scale
    elif mode == "pytorch_half_pixel":
        x = (i + 0.5) / scale - 0.5 if size_out > 1 else np.zeros_like(i)
    elif mode == "half_pixel_symmetric":
        adjustment = size_out / (scale * size_in)
        offset = size_in / 2 * (1 - adjustment)
        x = offset + (i + 0.5) / scale - 0.5
    else:  # half_pixel
        x = (i + 0.5) / scale - 0.5
    x = np.clip(x, 0, size_in - 1)
    low = np.floor(x).astype(np.int64)
    high = np.minimum(low + 1, size_in - 1)
    frac = x - low
    matrix = np.zeros((size_out, size_in))
    np.add.at(matrix, (np.arange(size_out), low), 1 - frac)
    np.add.at(matrix, (np.arange(size_out), high), frac)
    return matrix


FLOAT32_DECADES = (-46, 39)  # 1e-45 (the least denormal) .. 3.4e38 (the largest float32)


def heron_error(step: int, iterations: int) -> float:
    """The worst relative error, before rounding, of Heron's iteration from the least of
    sqrt's tangents at points 10^step apart (the start's worst is midway, in log scale)."""
    r = 10.0 ** (step / 4)
    error = (1 / r + r) / 2 - 1
    for _ in range(iterations):
        error = error * error / (2 * (1 + error))
    return error


class SqrtNewton(NodeRule):
    """Arm NN 22's TfLite parser has no SQRT or RSQRT, and `onnx.decompose`'s LayerNorm
    takes one square root per normalisation. The start is the least of sqrt's tangents at
    10^k, k = low, low + step, ..., high (a concave function is the minimum of its tangents):
    within 74% on [10^low, 10^high] at the default step of two decades. Then 4 rounds of
    Heron's iteration s <- (s + x / s) / 2 and y = x / s (exactly 0 at 0, where Heron's s
    only halves). Measured in onnxruntime on 200,001 float32 values log-spaced from 1e-45 to
    3.4e38 and 0: relative error at most 1.47e-7 (float32 rounding; 3 rounds: 5.6e-5), so the
    contract's 1e-6 holds on any input. The default range is all of float32: 3 rounds from
    [1e-12, 1e12] were off by 6e-8 at 0 and by orders of magnitude outside (an audio model's
    silence or its power spectrum's 1e14 broke the contract). The graph stays shallow (about
    20 ops deep per Sqrt; onnx2tf's conversion recurses once per op of depth). float32/float64
    only. A default rewrite of armnn, after `onnx.decompose`."""

    name = "onnx.sqrt_newton"
    description = "Compute Sqrt from its tangents and Heron's iteration: Add, Mul, Div, Min only."
    fixes = (Fix.op("Sqrt"),)
    breaks: ClassVar[dict[str, str]] = {
        "int8": "the TFLite converter aborts the process quantizing the Heron chain (a "
        "[1, 3, 4, 4] Sqrt), or, where it converts ([1, 6, 10, 10]), LiteRT's int8 DIV stops "
        "on a divisor at its zero point ('div.cc:262 data[i] != zero_point was not true'), "
        "as the tangent start (about 5e-7 near 0) is for small inputs (measured 2026-12)"
    }

    class Options(RuleOptions):
        """iterations: rounds of s <- (s + x/s)/2 after the tangent start; low, high: the
        powers of ten of the first and last tangent point; step: decades between points."""

        iterations: int = Field(4, ge=1, le=16)
        low: int = Field(-46, ge=-46, le=0)
        high: int = Field(38, ge=0, le=38)
        step: int = Field(2, ge=1, le=8)

    example: ClassVar[tuple[str, str] | None] = (
        "y = Sqrt(v)",
        "s = Min(v * 0.5e23 + 0.5e-23, ..., v * 0.5e-19 + 0.5e19); "
        "s = (s + v / s) * 0.5  (x4); y = v / s",
    )

    def tolerance(self, opts: Any) -> float | None:
        """1e-6 where the options reach float32 precision on all of float32 (the defaults:
        measured 1.5e-7, 0 exact); None (verify judges) for a narrower or coarser start."""
        covers = opts.low <= FLOAT32_DECADES[0] and opts.high >= FLOAT32_DECADES[1] - opts.step
        return 1e-6 if covers and heron_error(opts.step, opts.iterations) < 1e-7 else None

    op_types = frozenset({"Sqrt"})
    what = "Sqrt"

    def replace(self, e: Edit, node: Any, opts: Options) -> str | None:
        if e.dtypes.get(node.input[0]) not in (1, 11):  # float, double
            return "not float32/float64"
        x = node.input[0]
        tangents = []
        for k in range(opts.low, opts.high + 1, opts.step):
            root = 10.0 ** (k / 2)  # tangent at a = 10^k: sqrt(a)/2 + x / (2 sqrt(a))
            slope = e.op("Mul", x, e.scalar(0.5 / root, x))
            tangents.append(e.op("Add", slope, e.scalar(root / 2, x)))
        while len(tangents) > 1:  # a balanced tree of Min: shallow
            pairs = zip(tangents[::2], tangents[1::2], strict=False)
            merged = [e.op("Min", a, b) for a, b in pairs]
            tangents = merged + (tangents[-1:] if len(tangents) % 2 else [])
        s, half = tangents[0], e.scalar(0.5, x)
        for _ in range(opts.iterations):
            s = e.op("Mul", e.op("Add", s, e.op("Div", x, s)), half)
        e.op("Div", x, s, out=node.output[0])  # x / sqrt(x): as close, and exactly 0 at 0
        return None
