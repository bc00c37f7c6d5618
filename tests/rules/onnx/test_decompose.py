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
