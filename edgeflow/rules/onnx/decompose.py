"""onnx.decompose: rewrite ops a target lacks (Gelu, Erf, HardSigmoid, ...) into basic math.

Each decomposition uses only Add/Sub/Mul/Div/Clip/Relu/Min/Max/Neg/Exp/Log/Tanh/Sqrt/
ReduceMean/ReduceSum, ops every edge runtime has (ReduceSum only where `reduce` asks for it:
Arm NN 22's parser has MEAN but no SUM). Measured against float64 references (onnxruntime,
float32, inputs in [-10, 10]): Erf's rational approximation is within 4.3e-7 of erf; Gelu via
that Erf within 2e-6; Gelu's tanh formula within 4.8e-4 of the exact (erf) Gelu; the others are
exact formulas, off by float rounding only.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, ClassVar, Literal, get_args

from pydantic import Field

from edgeflow.core.onnxgraph import (
    Namer,
    all_graphs,
    constant_value,
    copy_model,
    elem_type,
    tensor_types,
)
from edgeflow.rules.base import OnnxRule, RewriteContext, RuleOptions, RuleResult, Site
from edgeflow.rules.fixes import Fix
from edgeflow.rules.onnx._build import Builder, attr

if TYPE_CHECKING:
    import onnx

DecomposableOp = Literal[
    "Gelu",
    "Erf",
    "HardSwish",
    "HardSigmoid",
    "LayerNormalization",
    "Softplus",
    "Mish",
    "Softsign",
    "Elu",
    "Selu",
    "PRelu",
    "ReduceL2",
    "LpNormalization",
]
SUPPORTED: tuple[DecomposableOp, ...] = get_args(DecomposableOp)
FLOAT, DOUBLE, FLOAT16 = 1, 11, 10
# Polynomial approximations lose their accuracy in float16; these ops decompose only in fp32/64.
# Squares overflow float16 (256^2 > 65504): the L2 norms decompose only in fp32/64 too.
WIDE_ONLY = {"Erf", "LayerNormalization", "ReduceL2", "LpNormalization"}
# float32's smallest normal number: LpNormalization divides by Max(norm, TINY), so an all-zero
# vector gives 0 (as onnxruntime's kernel does), not 0/0.
TINY = {FLOAT: 2.0**-126, DOUBLE: 2.0**-1022}

# erf(x) ~ x * P(x^2) / Q(x^2) on x clamped to [-4, 4] (Eigen's / XLA's float32 erf).
ERF_P = (
    -1.60960333262415e-02,
    -2.95459980854025e-03,
    -7.34990630326855e-04,
    -5.69250639462346e-05,
    -2.10102402082508e-06,
    2.77068142495902e-08,
    -2.72614225801306e-10,
)
ERF_Q = (
    -1.42647390514189e-02,
    -7.37332916720468e-03,
    -1.68282697438203e-03,
    -2.13374055278905e-04,
    -1.45660718464996e-05,
)
ERF_MAX_ERROR = 4.3e-7
GELU_TANH_MAX_ERROR = 4.8e-4


class Decompose(OnnxRule):
    """Exact formulas, but for Erf (within 4.3e-7) and the tanh Gelu (4.8e-4). PRelu becomes
    Relu(x) + slope (x - Relu(x)) (RELU SUB MUL ADD): TensorFlow's int8 converter gets
    Relu(x) + Min(x, 0) wrong (relative error 0.79 in LiteRT, TFLite Micro and Arm NN alike;
    this form 0.008-0.009, PRELU itself 0.007). ReduceL2 and LpNormalization (p=2) become
    Sqrt(ReduceSum(x * x)), or with `reduce: mean` Sqrt(ReduceMean(x * x) * n) for Arm NN,
    whose parser has MEAN but neither SUM nor SQUARE; LpNormalization divides by
    Max(norm, 2^-126), so an all-zero vector stays 0 as in onnxruntime. Decomposed ops are
    defaults of tflite, tflite_micro and armnn where their measured operator lists lack them."""

    name = "onnx.decompose"
    description = "Rewrite ops a target lacks (Gelu, Erf, HardSigmoid, LayerNorm...) as basic math."
    fixes = tuple(Fix.op(op) for op in SUPPORTED)
    runs_before: ClassVar[dict[str, str]] = {
        "onnx.sqrt_newton": "LayerNormalization and ReduceL2 decompose into a square root",
    }

    class Options(RuleOptions):
        """ops: which op types to decompose (default: all supported); gelu: how an exact Gelu
        becomes math: 'erf' (0.5x(1+erf(x/sqrt2)), exact up to Erf, itself decomposed when
        listed) or 'tanh' (the tanh formula: fewer ops, within 4.8e-4 of exact Gelu); reduce:
        how ReduceL2 and LpNormalization sum squares: 'sum' (ReduceSum) or 'mean' (ReduceMean
        times the element count, for runtimes without SUM; needs the reduced dims static)."""

        ops: list[DecomposableOp] = Field(default_factory=lambda: list(SUPPORTED))
        gelu: Literal["erf", "tanh"] = "erf"
        reduce: Literal["sum", "mean"] = "sum"

    example: ClassVar[tuple[str, str] | None] = (
        "y = HardSigmoid(x, alpha=0.2, beta=0.5); z = Gelu(x)",
        "y = Div(Clip(Add(Mul(x, 1.2), 3), 0, 6), 6); z = Mul(Mul(x, Add(erf~(x/sqrt2), 1)), 0.5)",
    )

    def tolerance(self, opts: Any) -> float | None:
        if "Gelu" in opts.ops and opts.gelu == "tanh":
            return 1e-3  # measured 4.8e-4: the tanh formula is an approximation of Gelu
        return 1e-5  # Erf's approximation (4.3e-7, times |x|/2 in Gelu) and float rounding

    def apply(
        self, model: onnx.ModelProto, opts: Options, ctx: RewriteContext
    ) -> RuleResult[onnx.ModelProto]:
        out = copy_model(model)
        wanted: set[str] = set(opts.ops)
        types = tensor_types(out)
        emit = Emitter(out, Namer(out))
        emit.reduce = opts.reduce
        emit.constants = _constants(out)
        done: Counter[str] = Counter()
        sites: list[Site] = []
        # Innermost graphs first: rebuilding a graph's node list copies its subgraphs.
        for graph in reversed(list(all_graphs(out.graph))):
            nodes: list[Any] = []
            for node in graph.node:
                if node.op_type not in wanted or node.domain not in ("", "ai.onnx"):
                    nodes.append(node)
                    continue
                dtype = elem_type(types, node.input[0])
                where = node.name or node.output[0]
                why = self._cannot(node, dtype, types, emit)
                if why:
                    sites.append(Site.kept(where, f"{node.op_type}: {why}"))
                    nodes.append(node)
                    continue
                nodes.extend(emit.expand(node, dtype, wanted, opts.gelu, types, done))
                sites.append(Site.changed(where, f"{node.op_type} -> {NOTES[node.op_type](opts)}"))
            del graph.node[:]
            graph.node.extend(nodes)
        if not done:
            nothing = Site.not_applicable(f"no {', '.join(sorted(wanted))} nodes")
            return RuleResult(copy_model(model), sites=sites or [nothing])
        out.graph.initializer.extend(emit.initializers)
        return RuleResult(out, sites=sites)

    @staticmethod
    def _cannot(node: Any, dtype: int, types: dict[str, Any], emit: Emitter) -> str:
        """Why a node cannot be decomposed, or ''."""
        if dtype not in (FLOAT, DOUBLE, FLOAT16):
            return "input element type unknown or not float16/32/64"
        if dtype == FLOAT16 and node.op_type in WIDE_ONLY:
            return "float16: the decomposition would lose accuracy"
        if node.op_type == "LayerNormalization" and _ln_axes(node, types) is None:
            return "non-negative axis on an input of unknown rank"
        if node.op_type == "LpNormalization" and int(attr(node, "p", 2)) != 2:
            return f"p={attr(node, 'p', 2)} (only p=2 decomposes)"
        if node.op_type in ("ReduceL2", "LpNormalization"):
            axes = _norm_axes(node, emit)
            if isinstance(axes, str):
                return axes
            if emit.reduce == "mean" and _count(types, node.input[0], axes) is None:
                return "reduce 'mean' needs the reduced dims static"
        return ""


SQUARES = {"sum": "ReduceSum(x * x)", "mean": "ReduceMean(x * x) * n"}  # by Options.reduce
NOTES: dict[str, Any] = {
    "Gelu": lambda o: (
        f"{o.gelu} formula"
        + (f" (max error {GELU_TANH_MAX_ERROR:g} vs exact)" if o.gelu == "tanh" else "")
    ),
    "Erf": lambda o: f"rational approximation on [-4, 4] (max error {ERF_MAX_ERROR:g})",
    "HardSwish": lambda o: "x * Clip(x + 3, 0, 6) / 6",
    "HardSigmoid": lambda o: "Clip(6 alpha x + 6 beta, 0, 6) / 6",
    "LayerNormalization": lambda o: "ReduceMean/Sub/Mul/Sqrt/Div (on a [rows, C] view)",
    "Softplus": lambda o: "Relu(x) + Log(1 + Exp(-|x|))",
    "Mish": lambda o: "x * Tanh(Softplus(x))",
    "Softsign": lambda o: "x / (1 + |x|)",
    "Elu": lambda o: "Relu(x) + alpha (Exp(Min(x, 0)) - 1)",
    "Selu": lambda o: "gamma (Relu(x) + alpha (Exp(Min(x, 0)) - 1))",
    "PRelu": lambda o: "Relu(x) + slope (x - Relu(x))",
    "ReduceL2": lambda o: f"Sqrt({SQUARES[o.reduce]})",
    "LpNormalization": lambda o: f"x / Max(Sqrt({SQUARES[o.reduce]}), tiny)",
}


def _constants(model: onnx.ModelProto) -> dict[str, Any]:
    """Initializers and Constant outputs of every graph, as numpy arrays."""
    from onnx import numpy_helper

    found: dict[str, Any] = {}
    for graph in all_graphs(model.graph):
        found |= {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        for node in graph.node:
            if node.op_type == "Constant" and constant_value(node) is not None:
                found[node.output[0]] = constant_value(node)
    return found


def _norm_axes(node: Any, e: Emitter) -> list[int] | str:
    """The axes a ReduceL2 or LpNormalization sums over ([] for all), or why they are unknown."""
    if node.op_type == "LpNormalization":
        return [int(attr(node, "axis", -1))]
    if e.opset >= 18:
        given = node.input[1] if len(node.input) > 1 else ""
        if given and given not in e.constants:
            return "the axes are computed, not a constant"
        axes = [int(a) for a in e.constants[given].reshape(-1)] if given else []
    else:
        axes = [int(a) for a in attr(node, "axes", [])]
    if not axes and attr(node, "noop_with_empty_axes", 0):
        return "no axes with noop_with_empty_axes (the node reduces nothing)"
    return axes


def _count(types: dict[str, Any], x: str, axes: list[int]) -> int | None:
    """How many elements the axes ([] for all) hold, None when their dims are not static."""
    import math

    shape = _static_shape(types, x)
    if shape is None:
        return None
    return math.prod(shape[a] for a in axes) if axes else math.prod(shape)


def _ln_axes(node: Any, types: dict[str, Any]) -> list[int] | None:
    """The axes LayerNormalization normalises over, or None when the rank is needed and unknown."""
    axis = int(attr(node, "axis", -1))
    if axis < 0:
        return list(range(axis, 0))
    t = types.get(node.input[0])
    if t is None or not t.tensor_type.HasField("shape"):
        return None
    return list(range(axis, len(t.tensor_type.shape.dim)))


class Emitter(Builder):
    """A Builder whose scalar constants are shared between decompositions, of the element
    type of the one being built (`dtype`)."""

    def __init__(self, model: onnx.ModelProto, namer: Namer) -> None:
        super().__init__(model, namer)
        self.consts: dict[tuple[int, float], str] = {}
        self.dtype = FLOAT
        self.reduce = "sum"  # the Options' reduce: how ReduceL2 and LpNormalization sum
        self.constants: dict[str, Any] = {}  # the model's constant tensors, by name

    def const(self, value: float) -> str:
        """A scalar initializer of the current element type (shared between decompositions)."""
        import numpy as np

        key = (self.dtype, float(value))
        if key not in self.consts:
            np_type = {FLOAT: np.float32, DOUBLE: np.float64, FLOAT16: np.float16}[self.dtype]
            name = f"decompose_const_{len(self.consts)}"
            self.consts[key] = self.initializer(np.array(value, np_type), name)
        return self.consts[key]

    def ints(self, values: list[int]) -> str:
        import numpy as np

        return self.initializer(np.array(values, np.int64), "decompose_axes")

    def norm(self, x: str, axes: list[int], keepdims: int, types: Any, out: str = "") -> str:
        """Sqrt of the sum of squares over `axes` ([] for all): ReduceSum, or ReduceMean times
        the count (self.reduce)."""
        squares = self.op("Mul", x, x)
        if self.reduce == "mean":
            count = _count(types, x, axes)
            assert count is not None  # checked by Decompose._cannot
            rank = len(_static_shape(types, x) or [])
            mean = self.reduce_mean(squares, axes or list(range(rank)), keepdims)
            return self.op("Sqrt", self.op("Mul", mean, self.const(float(count))), out=out)
        if not axes:
            total = self.op("ReduceSum", squares, keepdims=keepdims)
        elif self.opset >= 13:
            total = self.op("ReduceSum", squares, self.ints(axes), keepdims=keepdims)
        else:
            total = self.op("ReduceSum", squares, axes=axes, keepdims=keepdims)
        return self.op("Sqrt", total, out=out)

    def clip(self, x: str, lo: float, hi: float, out: str = "") -> str:
        if self.opset >= 11:
            return self.op("Clip", x, self.const(lo), self.const(hi), out=out)
        return self.op("Clip", x, out=out, min=lo, max=hi)

    def expand(
        self,
        node: Any,
        dtype: int,
        wanted: set[str],
        gelu: str,
        types: dict[str, Any],
        done: Counter[str] | None,
    ) -> list[Any]:
        """Replacement nodes for `node`; new nodes of wanted op types are expanded in turn
        (`done` counts the model's own nodes, so it is None for those)."""
        self.nodes, self.dtype = [], dtype
        self.prefix = node.name or node.output[0]
        BUILDERS[node.op_type](self, node, gelu, types)
        if done is not None:
            done[node.op_type] += 1
        result: list[Any] = []
        for new in self.nodes:
            if new.op_type in wanted and new.op_type != node.op_type:
                result.extend(self.expand(new, dtype, wanted, gelu, types, None))
            else:
                result.append(new)
        return result


def _gelu(e: Emitter, node: Any, gelu: str, types: Any) -> None:
    x, y = node.input[0], node.output[0]
    if attr(node, "approximate", "none") == "tanh" or gelu == "tanh":
        # 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2)))
        poly = e.op("Add", e.op("Mul", e.op("Mul", x, x), e.const(0.044715)), e.const(1.0))
        inner = e.op("Mul", e.op("Mul", x, poly), e.const(0.7978845608028654))
        t = e.op("Tanh", inner)
    else:  # 0.5 x (1 + erf(x / sqrt 2))
        t = e.op("Erf", e.op("Mul", x, e.const(0.7071067811865476)))
    e.op("Mul", e.op("Mul", x, e.op("Add", t, e.const(1.0))), e.const(0.5), out=y)


def _erf(e: Emitter, node: Any, gelu: str, types: Any) -> None:
    x = e.clip(node.input[0], -4.0, 4.0)
    x2 = e.op("Mul", x, x)

    def horner(coefficients: tuple[float, ...]) -> str:
        acc = e.const(coefficients[-1])
        for c in reversed(coefficients[:-1]):
            acc = e.op("Add", e.op("Mul", x2, acc), e.const(c))
        return acc

    p = e.op("Mul", x, horner(ERF_P))
    e.op("Div", p, horner(ERF_Q), out=node.output[0])


def _hard_sigmoid(e: Emitter, x: str, alpha: float, beta: float, out: str = "") -> str:
    """Clip(6 alpha x + 6 beta, 0, 6) / 6: the ReLU6 form, which edge runtimes all have."""
    scaled = x if abs(6 * alpha - 1) < 1e-6 else e.op("Mul", x, e.const(6 * alpha))
    shifted = e.op("Add", scaled, e.const(6 * beta))
    return e.op("Div", e.clip(shifted, 0.0, 6.0), e.const(6.0), out=out)


def _hardsigmoid(e: Emitter, node: Any, gelu: str, types: Any) -> None:
    alpha, beta = float(attr(node, "alpha", 0.2)), float(attr(node, "beta", 0.5))
    _hard_sigmoid(e, node.input[0], alpha, beta, out=node.output[0])


def _hardswish(e: Emitter, node: Any, gelu: str, types: Any) -> None:
    x = node.input[0]
    e.op("Mul", x, _hard_sigmoid(e, x, 1 / 6, 0.5), out=node.output[0])


def _layernorm(e: Emitter, node: Any, gelu: str, types: Any) -> None:
    axes = _ln_axes(node, types)
    assert axes is not None  # checked by Decompose._cannot
    x = node.input[0]
    outputs = [*node.output, "", ""]
    shape = _static_shape(types, x)
    # Over the last axis of a tensor above 2-D, the formula runs on a [rows, C] view:
    # onnx2tf guesses a layout for 3-D and 4-D tensors, and within mobilevit_xxs its guess
    # for these ReduceMeans fails (its parameter search then ends in a RecursionError).
    flat = axes == [-1] and shape is not None and len(shape) > 2 and not any(outputs[1:3])
    if flat:
        assert shape is not None
        x, axes = e.op("Reshape", x, e.ints([-1, shape[-1]])), [-1]
    mean = e.reduce_mean(x, axes, out=outputs[1])
    d = e.op("Sub", x, mean)
    var = e.reduce_mean(e.op("Mul", d, d), axes)  # Mul(d, d): no Pow / squared-difference
    std = e.op("Sqrt", e.op("Add", var, e.const(float(attr(node, "epsilon", 1e-5)))))
    if outputs[2]:
        e.op("Div", e.const(1.0), std, out=outputs[2])
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else ""
    last = "" if bias or flat else outputs[0]
    y = e.op("Mul", e.op("Div", d, std), node.input[1], out=last)
    if bias:
        y = e.op("Add", y, bias, out="" if flat else outputs[0])
    if flat:
        assert shape is not None
        e.op("Reshape", y, e.ints(shape), out=outputs[0])


def _static_shape(types: dict[str, Any], name: str) -> list[int] | None:
    t = types.get(name)
    if t is None or not t.tensor_type.HasField("shape"):
        return None
    dims = [d.dim_value if d.HasField("dim_value") else 0 for d in t.tensor_type.shape.dim]
    return dims if all(dims) else None


def _softplus_of(e: Emitter, x: str, out: str = "") -> str:
    """Relu(x) + Log(1 + Exp(-|x|)), with -|x| = Min(x, -x): stable for large |x|, no Abs."""
    tail = e.op("Exp", e.op("Min", x, e.op("Neg", x)))
    return e.op("Add", e.op("Relu", x), e.op("Log", e.op("Add", tail, e.const(1.0))), out=out)


def _softplus(e: Emitter, node: Any, gelu: str, types: Any) -> None:
    _softplus_of(e, node.input[0], out=node.output[0])


def _mish(e: Emitter, node: Any, gelu: str, types: Any) -> None:
    x = node.input[0]
    e.op("Mul", x, e.op("Tanh", _softplus_of(e, x)), out=node.output[0])


def _softsign(e: Emitter, node: Any, gelu: str, types: Any) -> None:
    x = node.input[0]
    magnitude = e.op("Max", x, e.op("Neg", x))
    e.op("Div", x, e.op("Add", magnitude, e.const(1.0)), out=node.output[0])


def _elu_of(e: Emitter, x: str, alpha: float, out: str = "") -> str:
    negative = e.op("Sub", e.op("Exp", e.op("Min", x, e.const(0.0))), e.const(1.0))
    return e.op("Add", e.op("Relu", x), e.op("Mul", negative, e.const(alpha)), out=out)


def _elu(e: Emitter, node: Any, gelu: str, types: Any) -> None:
    _elu_of(e, node.input[0], float(attr(node, "alpha", 1.0)), out=node.output[0])


def _selu(e: Emitter, node: Any, gelu: str, types: Any) -> None:
    alpha = float(attr(node, "alpha", 1.67326319217681884765625))
    gamma = float(attr(node, "gamma", 1.05070102214813232421875))
    e.op("Mul", _elu_of(e, node.input[0], alpha), e.const(gamma), out=node.output[0])


def _prelu(e: Emitter, node: Any, gelu: str, types: Any) -> None:
    """Relu(x) + slope * (x - Relu(x)): x - Relu(x) is Min(x, 0) exactly (x - x, or x - 0),
    and slope broadcasts to x as PRelu's does. Not Relu(x) + slope * Min(x, 0): TensorFlow's
    int8 converter gets RELU and MINIMUM of one tensor added together wrong (relative error
    0.79 in LiteRT, TFLite Micro and Arm NN alike; this form: 0.009)."""
    x, slope = node.input[0], node.input[1]
    positive = e.op("Relu", x)
    negative = e.op("Mul", e.op("Sub", x, positive), slope)
    e.op("Add", positive, negative, out=node.output[0])


def _reduce_l2(e: Emitter, node: Any, gelu: str, types: Any) -> None:
    axes = _norm_axes(node, e)
    assert isinstance(axes, list)  # checked by Decompose._cannot
    keepdims = int(attr(node, "keepdims", 1))
    e.norm(node.input[0], axes, keepdims, types, out=node.output[0])


def _lp_normalization(e: Emitter, node: Any, gelu: str, types: Any) -> None:
    x = node.input[0]
    norm = e.norm(x, [int(attr(node, "axis", -1))], 1, types)
    e.op("Div", x, e.op("Max", norm, e.const(TINY[e.dtype])), out=node.output[0])


BUILDERS: dict[str, Any] = {
    "Gelu": _gelu,
    "Erf": _erf,
    "HardSwish": _hardswish,
    "HardSigmoid": _hardsigmoid,
    "LayerNormalization": _layernorm,
    "Softplus": _softplus,
    "Mish": _mish,
    "Softsign": _softsign,
    "Elu": _elu,
    "Selu": _selu,
    "PRelu": _prelu,
    "ReduceL2": _reduce_l2,
    "LpNormalization": _lp_normalization,
}
