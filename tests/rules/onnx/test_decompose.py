"""onnx.decompose: ops a target lacks become basic math, within measured error bounds."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper
from scipy.special import erf

from edgeflow.rules.onnx.decompose import ERF_MAX_ERROR, GELU_TANH_MAX_ERROR, Decompose
from edgeflow.targets.precheck import check
from edgeflow.targets.profile import TargetProfile
from tests.rules.onnx.helpers import apply, model, ops, run
from tests.rules.sites import outcomes

# Inputs: a dense sweep of [-10, 10] plus the points where approximations are worst.
X = np.concatenate([np.linspace(-10, 10, 40_001), [-3.62, 2.7, 0.0, 1e-6, -1e-6]])
X = X.astype(np.float32).reshape(1, -1)
BASIC = {"Add", "Sub", "Mul", "Div", "Clip", "Relu", "Min", "Max", "Neg", "Exp", "Log", "Tanh"}


def unary(op: str, opset: int, dtype: int = T.FLOAT, **attrs: object) -> onnx.ModelProto:
    n = X.shape[1]
    node = helper.make_node(op, ["x"], ["y"], name=op.lower(), **attrs)
    return model([node], [("x", dtype, [1, n])], [("y", dtype, [1, n])], opset=opset)


def exact_gelu(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return 0.5 * x * (1 + erf(x / np.sqrt(2)))


CASES = [
    ("Gelu", 20, {}),
    ("Gelu", 20, {"approximate": "tanh"}),
    ("Erf", 13, {}),
    ("HardSwish", 14, {}),
    ("HardSigmoid", 18, {}),
    ("HardSigmoid", 10, {"alpha": 0.3, "beta": 0.4}),  # opset 10: Clip takes attributes
    ("Softplus", 18, {}),
    ("Mish", 18, {}),
    ("Softsign", 18, {}),
    ("Elu", 18, {"alpha": 0.7}),
    ("Selu", 18, {}),
]


@pytest.mark.parametrize(("op", "opset", "attrs"), CASES)
def test_each_op_becomes_basic_math_with_the_same_outputs(op: str, opset: int, attrs: dict) -> None:
    m = unary(op, opset, **attrs)
    result = apply(Decompose, m)
    after = ops(result.model)
    assert result.changed and result.matches == 1
    assert op not in after and "Erf" not in after
    assert set(after) <= BASIC, after
    want, got = run(m, {"x": X})[0], run(result.model, {"x": X})[0]
    # Against onnxruntime's own kernel: within the rule's declared tolerance (1e-5).
    np.testing.assert_allclose(
        got, want, rtol=1e-5, atol=Decompose().tolerance(Decompose.Options())
    )


def test_erf_approximation_max_error_is_measured() -> None:
    result = apply(Decompose, unary("Erf", 13))
    error = np.abs(run(result.model, {"x": X})[0].astype(np.float64) - erf(X.astype(np.float64)))
    assert error.max() <= ERF_MAX_ERROR  # measured 4.2e-7 in float32 (x = -3.62)
    assert error.max() > 1e-7  # the bound is tight, not a guess


def test_gelu_formulations_against_exact_gelu() -> None:
    m = unary("Gelu", 20)
    via_erf = run(apply(Decompose, m).model, {"x": X})[0]
    via_tanh = run(apply(Decompose, m, gelu="tanh").model, {"x": X})[0]
    exact = exact_gelu(X)
    assert np.abs(via_erf - exact).max() <= 2e-6  # Erf's 4.3e-7 error times |x| / 2, x <= 10
    tanh_error = np.abs(via_tanh - exact).max()
    assert 4.5e-4 < tanh_error <= GELU_TANH_MAX_ERROR  # the tanh formula's own error: 4.73e-4
    assert Decompose().tolerance(Decompose.Options(gelu="tanh")) >= tanh_error


def test_gelu_only_keeps_erf_when_asked() -> None:
    result = apply(Decompose, unary("Gelu", 20), ops=["Gelu"])
    assert ops(result.model)["Erf"] == 1 and "Gelu" not in ops(result.model)
    assert outcomes(result) == [("changed", "gelu")]


@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize("axis", [-1, 1, -2])
def test_layer_normalization_with_all_outputs(opset: int, axis: int) -> None:
    rng = np.random.default_rng(0)
    shape = [2, 3, 8]
    norm = shape[axis:]
    node = helper.make_node(
        "LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv"], axis=axis, epsilon=1e-3
    )
    stat = [2, 1, 1] if len(norm) == 2 else [2, 3, 1]
    m = model(
        [node],
        [("x", T.FLOAT, shape)],
        [("y", T.FLOAT, shape), ("mean", T.FLOAT, stat), ("inv", T.FLOAT, stat)],
        {
            "s": rng.standard_normal(norm).astype(np.float32),
            "b": rng.standard_normal(norm).astype(np.float32),
        },
        opset=opset,
    )
    result = apply(Decompose, m)
    after = ops(result.model)
    assert "LayerNormalization" not in after
    assert {"ReduceMean", "Sub", "Mul", "Sqrt", "Div"} <= after.keys()
    assert "Pow" not in after
    x = {"x": (rng.standard_normal(shape) * 3 + 1).astype(np.float32)}
    for got, want in zip(run(result.model, x), run(m, x), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_float64_ops_onnxruntime_lacks_run_after_decomposition() -> None:
    """onnxruntime 1.32 has no float64 Erf, HardSigmoid or Softplus kernels (seen at opset 20;
    at opset 18 it runs the latter two through their ONNX function bodies)."""
    x64 = X.astype(np.float64)
    for op, reference in [
        ("Erf", erf(x64)),
        ("HardSigmoid", np.clip(0.2 * x64 + 0.5, 0, 1)),
        ("Softplus", np.logaddexp(0, x64)),
    ]:
        m = unary(op, 20, T.DOUBLE)
        with pytest.raises(Exception, match=f"NOT_IMPLEMENTED.*{op}"):
            run(m, {"x": x64})
        got = run(apply(Decompose, m).model, {"x": x64})[0]
        np.testing.assert_allclose(got, reference, rtol=1e-7, atol=1e-6)


def test_a_target_without_gelu_passes_precheck_after_decomposition() -> None:
    profile = TargetProfile(
        name="mcu", backend="onnxruntime_micro", operators=sorted(BASIC | {"MatMul"})
    )
    m = unary("Gelu", 20)
    assert [f.operator for f in check(m, profile)] == ["Gelu"]
    assert check(apply(Decompose, m).model, profile) == []


def test_subgraph_nodes_are_decomposed_and_unsupported_types_kept() -> None:
    then = helper.make_graph(
        [helper.make_node("HardSwish", ["x"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", T.FLOAT, [2])],
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", T.FLOAT, [2])],
    )
    nodes = [
        helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
        helper.make_node("Erf", ["h"], ["z"], name="half_erf"),
    ]
    m = model(
        nodes,
        [("c", T.BOOL, []), ("x", T.FLOAT, [2]), ("h", T.FLOAT16, [2])],
        [("y", T.FLOAT, [2]), ("z", T.FLOAT16, [2])],
    )
    result = apply(Decompose, m, [])
    assert ops(result.model).get("HardSwish", 0) == 0 and ops(result.model)["Erf"] == 1
    assert ("kept", "half_erf") in outcomes(result)  # float16: the decomposition would lose
    feeds = {"c": np.array(True), "x": np.array([-4, 1], np.float32), "h": np.zeros(2, np.float16)}
    np.testing.assert_allclose(run(result.model, feeds)[0], run(m, feeds)[0], atol=1e-6)


def test_nothing_to_decompose() -> None:
    m = unary("Relu", 18)
    result = apply(Decompose, m)
    assert not result.changed and outcomes(result) == [("not_applicable", "")]


def norms_model(opset: int) -> onnx.ModelProto:
    """PRelu with a per-channel and a scalar slope, LpNormalization (p=2) over the channels,
    ReduceL2 over two axes without keepdims and over all axes."""
    rng = np.random.default_rng(1)
    nodes = [
        helper.make_node("PRelu", ["x", "slope"], ["a"], name="prelu"),
        helper.make_node("PRelu", ["x", "one"], ["b"], name="prelu_scalar"),
        helper.make_node("LpNormalization", ["x"], ["c"], name="lpnorm", axis=1),
        helper.make_node("ReduceL2", ["x"], ["e"], name="l2_all"),
    ]
    inits = {
        "slope": rng.uniform(-0.5, 0.5, (6, 1, 1)).astype(np.float32),
        "one": np.array([0.25], np.float32),
    }
    if opset >= 18:
        nodes.append(helper.make_node("ReduceL2", ["x", "axes"], ["d"], name="l2", keepdims=0))
        inits["axes"] = np.array([2, -1])
    else:
        nodes.append(
            helper.make_node("ReduceL2", ["x"], ["d"], name="l2", axes=[2, -1], keepdims=0)
        )
    outputs = [(n, T.FLOAT, None) for n in "abced"]
    return model(nodes, [("x", T.FLOAT, [2, 6, 5, 4])], outputs, inits, opset=opset)


@pytest.mark.parametrize("opset", [11, 13, 18])
@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_prelu_and_l2_norms_become_basic_math(opset: int, reduce: str) -> None:
    m = norms_model(opset)
    result = apply(Decompose, m, reduce=reduce)
    after = ops(result.model)
    assert result.matches == 5 and not {"PRelu", "LpNormalization", "ReduceL2"} & after.keys()
    sums = {"sum": "ReduceSum", "mean": "ReduceMean"}
    assert after[sums[reduce]] == 3 and sums["mean" if reduce == "sum" else "sum"] not in after
    assert after["Sqrt"] == 3 and set(after) <= BASIC | {"Sqrt", sums[reduce]}
    x = (np.random.default_rng(2).standard_normal((2, 6, 5, 4)) * 3).astype(np.float32)
    for feed in (x, np.zeros_like(x)):  # all zeros: LpNormalization gives 0, as onnxruntime
        for want, got in zip(run(m, {"x": feed}), run(result.model, {"x": feed}), strict=True):
            assert got.shape == want.shape and np.isfinite(got).all()
            scale = max(1.0, float(np.abs(want).max()))
            assert np.abs(got - want).max() <= 1e-6 * scale  # float rounding: 1.9e-7 seen
    prelus = run(result.model, {"x": x})[:2]
    np.testing.assert_array_equal(prelus, run(m, {"x": x})[:2])  # PRelu: exact


def test_l2_norms_kept_where_they_cannot_be_written_exactly() -> None:
    nodes = [
        helper.make_node("LpNormalization", ["x"], ["a"], name="l1", axis=1, p=1),
        helper.make_node("ReduceL2", ["x", "axes"], ["b"], name="computed_axes"),
        helper.make_node("ReduceL2", ["h"], ["c"], name="half"),
    ]
    m = model(
        nodes,
        [("x", T.FLOAT, ["n", 6]), ("axes", T.INT64, [1]), ("h", T.FLOAT16, [4])],
        [("a", T.FLOAT, ["n", 6]), ("b", T.FLOAT, ["p", "q"]), ("c", T.FLOAT16, [1])],
    )
    result = apply(Decompose, m, [])
    assert not result.changed
    assert outcomes(result) == [("kept", "l1"), ("kept", "computed_axes"), ("kept", "half")]
    dynamic = model(
        [helper.make_node("ReduceL2", ["x"], ["y"], name="l2", axes=[0], keepdims=1)],
        [("x", T.FLOAT, ["n", 6])],
        [("y", T.FLOAT, None)],
        opset=17,
    )
    assert outcomes(apply(Decompose, dynamic, [], reduce="mean")) == [("kept", "l2")]  # n?
    assert apply(Decompose, dynamic, [], reduce="sum").changed  # ReduceSum needs no count
