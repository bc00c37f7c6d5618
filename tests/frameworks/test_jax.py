"""edgeflow.frameworks.jax: load a JAX source, run it, export it to ONNX and compare in ORT."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests import needs

needs.require("jax")

from edgeflow.core.errors import EdgeflowError, MissingDependency  # noqa: E402
from edgeflow.frameworks import jax as fj  # noqa: E402
from edgeflow.zoo.digits_flax import _nhwc  # noqa: E402

DEMO = "edgeflow.zoo.digits_flax:digits_cnn"
WEIGHTS = Path(__file__).resolve().parents[2] / "models" / "digits_flax.msgpack"


@pytest.fixture(scope="module")
def demo() -> fj.JaxModel:
    return fj.with_weights(fj.load(DEMO, None), WEIGHTS)


def test_weights_must_fit_the_params(tmp_path: Path) -> None:
    from flax import serialization

    other = tmp_path / "other.msgpack"
    other.write_bytes(serialization.to_bytes({"w": np.zeros(3, np.float32)}))
    with pytest.raises(EdgeflowError, match=r"other\.msgpack do not fit the params"):
        fj.with_weights(fj.load(DEMO, None), other)


@pytest.fixture(scope="module")
def test_split() -> tuple[np.ndarray, np.ndarray]:
    return _nhwc("test")


def test_demo_runs_and_is_accurate(demo: fj.JaxModel, test_split: tuple) -> None:
    images, labels = test_split
    (logits,) = fj.run(demo, {"image": images}, ["image"])
    assert logits.dtype == np.float32 and logits.shape == (len(labels), 10)
    assert np.mean(logits.argmax(1) == labels) >= 0.97  # 0.9861 measured


@pytest.mark.slow
def test_export_matches_jax_in_onnxruntime(
    demo: fj.JaxModel, test_split: tuple, tmp_path: Path
) -> None:
    needs.require("jax2onnx")
    import onnx
    import onnxruntime as ort

    images, _ = test_split
    out = tmp_path / "model.onnx"
    info = fj.export_onnx(demo, [("image", images.shape, "float32")], ["logits"], 18, out)
    assert info["opset"] == 18 and info["converter"].startswith("jax2onnx ")
    assert info["ops"]["Conv"] == 3 and "Gemm" in info["ops"]
    model = onnx.load(out)
    assert [v.name for v in model.graph.input] == ["image"]
    assert [v.name for v in model.graph.output] == ["logits"]
    assert not list(tmp_path.glob("*.data"))  # one file, weights inside
    for value in [*model.graph.input, *model.graph.output]:
        assert value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
        assert all(d.HasField("dim_value") for d in value.type.tensor_type.shape.dim)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"image": images})
    (want,) = fj.run(demo, {"image": images}, ["image"])
    assert np.abs(got - want).max() < 1e-5  # 3.8e-6 measured


def test_export_renames_and_orders_outputs(tmp_path: Path) -> None:
    needs.require("jax2onnx")
    import onnx
    import onnxruntime as ort

    def build():  # a dict output: leaves in sorted key order ("a" then "b")
        return (lambda p, x: {"b": x * p["w"], "a": x + p["w"]}), {"w": np.float32(2.0)}

    model = fj.JaxModel("test:build", *build())
    out = tmp_path / "two.onnx"
    fj.export_onnx(model, [("x", (2, 3), "float32")], ["plus", "times"], 18, out)
    graph = onnx.load(out).graph
    assert [v.name for v in graph.input] == ["x"]
    assert [v.name for v in graph.output] == ["plus", "times"]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    want = fj.run(model, {"x": x}, ["x"])
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(want[0], x + 2)


def test_export_refuses_wrong_output_count(demo: fj.JaxModel, tmp_path: Path) -> None:
    needs.require("jax2onnx")
    with pytest.raises(EdgeflowError, match="returns 1 output"):
        fj.export_onnx(demo, [("image", (1, 8, 8, 1), "float32")], ["a", "b"], 18, tmp_path / "m")


def test_missing_function_is_named_with_a_guess() -> None:
    with pytest.raises(EdgeflowError, match="did you mean 'digits_cnn'") as info:
        fj.load("edgeflow.zoo.digits_flax:digits_cn", None)
    assert info.value.hint and "(apply_fn, params)" in info.value.hint


def test_wrong_return_value_is_explained(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("def build():\n    return 3\n", encoding="utf-8")
    with pytest.raises(EdgeflowError, match=r"returned int, not \(apply_fn, params\)") as info:
        fj.load("bad.py:build", tmp_path)
    assert info.value.hint and "module.apply, variables" in info.value.hint


def test_bad_ref_syntax() -> None:
    with pytest.raises(EdgeflowError, match=r"expected 'package\.module:Name'"):
        fj.load("edgeflow.zoo.digits_flax", None)


def test_user_error_in_builder_is_located(tmp_path: Path) -> None:
    (tmp_path / "boom.py").write_text("def build():\n    raise ValueError('no')\n")
    with pytest.raises(EdgeflowError, match=r"raised ValueError: no \(at boom.py:2\)"):
        fj.load("boom.py:build", tmp_path)


def test_set_names_renames_every_use() -> None:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["in_0"], ["t"]), helper.make_node("Neg", ["t"], ["out_0"])],
        "g",
        [helper.make_tensor_value_info("in_0", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("out_0", TensorProto.FLOAT, [2])],
    )
    fj._set_names(graph, ["x"], ["y"])
    assert [list(n.input) + list(n.output) for n in graph.node] == [["x", "t"], ["t", "y"]]
    assert (graph.input[0].name, graph.output[0].name) == ("x", "y")


def test_opset_below_18_is_refused_with_a_hint(demo: fj.JaxModel, tmp_path: Path) -> None:
    needs.require("jax2onnx")  # jax2onnx 0.17.1 writes ReduceMean's opset-18 form
    with pytest.raises(EdgeflowError, match=r"invalid ONNX model .* at opset 17") as info:
        fj.export_onnx(demo, [("image", (1, 8, 8, 1), "float32")], ["logits"], 17, tmp_path / "m")
    assert info.value.hint == "export at opset 18 or later"


def test_missing_package_names_the_extra() -> None:
    with pytest.raises(MissingDependency, match=r"edgeflow\[jax\]"):
        fj.require("jax2onnx_not_installed")
