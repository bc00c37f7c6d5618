"""Fast checks of the tflite backends: no TensorFlow import, no conversion."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeflow.core.errors import EdgeflowError, MissingDependency, RecipeError
from edgeflow.recipe import load_recipe
from edgeflow.schema.sections import Quantization, TensorSpec
from edgeflow.targets import (
    _onnx2tf,
    _onnx2tf_copy,
    _tflite_layout,
    backend,
    load_profile,
)
from edgeflow.targets._tflite_deps import require
from edgeflow.targets._tflite_io import Quant
from edgeflow.targets.base import ConvertJob, channel_last
from edgeflow.targets.tflite import backend as tflite
from edgeflow.targets.tflite_micro import backend as tflite_micro
from tests.conftest import DEMO_RECIPE, REPO
from tests.targets.conftest import needs_tflite


def job(tmp_path: Path, target: str, **quantization: object) -> ConvertJob:
    return ConvertJob(
        onnx=tmp_path / "model.onnx",
        out_dir=tmp_path,
        profile=load_profile(target),
        quantization=Quantization(**quantization),  # type: ignore[arg-type]
        inputs=[TensorSpec(name="x", shape=[1, 3, 4, 4])],
        calibration=None,
    )


def test_profiles_select_their_backends() -> None:
    assert backend(load_profile("tflite")) is tflite
    assert backend(load_profile("tflite_micro")) is tflite_micro
    assert load_profile("tflite").family.quantizes_itself
    assert load_profile("tflite_micro").family.quantizes_itself
    assert "fp16" not in load_profile("tflite_micro").quantization


def test_tflite_micro_fp16_is_a_recipe_error() -> None:
    with pytest.raises(RecipeError) as err:
        load_recipe(DEMO_RECIPE, {"target": "tflite_micro", "quantization.mode": "fp16"})
    assert "target 'tflite_micro' does not support mode 'fp16'" in err.value.render()


def test_importing_the_backends_does_not_import_tensorflow() -> None:
    code = (
        "import sys, edgeflow.targets.tflite, edgeflow.targets.tflite_micro\n"
        "heavy = {'tensorflow', 'onnx2tf', 'ai_edge_litert', 'tflite_micro'} & set(sys.modules)\n"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


@pytest.mark.parametrize(
    ("module", "package"),
    [("onnx2tf", "onnx2tf"), ("tf_keras", "tf-keras"), ("tensorflow", "tensorflow")],
)
def test_missing_converter_says_what_to_install(
    module: str, package: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail
    with pytest.raises(MissingDependency) as err:
        require(module, "tflite_micro")
    assert err.value.message == (
        f"target tflite_micro needs {package}: install it with pip install 'edgeflow[tflite]'"
    )


def test_convert_without_onnx2tf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnx2tf", None)
    with pytest.raises(MissingDependency, match="target tflite needs onnx2tf"):
        tflite.convert(job(tmp_path, "tflite", mode="none"))


def test_runners_without_their_runtimes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "model.tflite").write_bytes(b"")
    info = {"artifact": "model.tflite", "io": {"inputs": [], "outputs": []}, "arena_bytes": 64}
    monkeypatch.setitem(sys.modules, "ai_edge_litert", None)
    monkeypatch.setitem(sys.modules, "ai_edge_litert.interpreter", None)
    with pytest.raises(MissingDependency, match="target tflite needs ai-edge-litert"):
        tflite.open_runner(tmp_path, info)
    monkeypatch.setitem(sys.modules, "tflite_micro", None)
    with pytest.raises(MissingDependency, match="target tflite_micro needs tflite-micro"):
        tflite_micro.open_runner(tmp_path, info)


def test_calibration_methods_the_tflite_family_lacks_are_refused(tmp_path: Path) -> None:
    for method, activations in (("entropy", "int8"), ("percentile", "int16")):
        with pytest.raises(EdgeflowError, match="calibrates with minmax, or for int8") as err:
            q = {"mode": "int8", "method": method, "activations": activations}
            tflite.convert(job(tmp_path, "tflite", **q))
        assert err.value.hint == "set quantization.method: minmax"


def test_tflite_micro_refuses_fp16_even_from_an_inline_profile(tmp_path: Path) -> None:
    with pytest.raises(EdgeflowError, match="no fp16 kernels"):
        tflite_micro.convert(job(tmp_path, "tflite_micro", mode="fp16"))


def test_int8_quantization_round_trip() -> None:
    q = Quant(np.int8, scale=0.5, zero_point=-3)
    x = np.array([-100.0, -1.0, 0.0, 0.26, 1.0, 100.0], dtype=np.float32)
    codes = q.quantize(x)
    assert codes.dtype == np.int8
    assert codes.tolist() == [-128, -5, -3, -2, -1, 127]  # clipped at both ends
    assert q.dequantize(codes).tolist() == [-62.5, -1.0, 0.0, 0.5, 1.0, 65.0]
    plain = Quant(np.float32)
    assert plain.quantize(x) is x and not plain.quantized


def test_layouts() -> None:
    assert channel_last(4) == (0, 2, 3, 1)
    assert channel_last(3) == (0, 2, 1)
    assert channel_last(2) == (0, 1)
    assert _tflite_layout.inverse((0, 2, 3, 1)) == (0, 3, 1, 2)
    details = [{"name": "serving_default_b:0"}, {"name": "serving_default_a:0"}]
    assert _tflite_layout.input_order(["a", "b"], details) == ["b", "a"]
    assert _tflite_layout.input_order(["a", "b"], [{"name": "x"}, {"name": "y"}]) == ["a", "b"]


def test_onnx2tf_gets_constants_as_initializers_and_usable_output_names(tmp_path: Path) -> None:
    """Two onnx2tf failures avoided on its copy of the model: a Constant node's value is not
    moved to channel-last ("Dimensions must be equal, but are 320 and 3"), and an output named
    like an internal tensor cannot name a TensorFlow op. The copy computes the same outputs."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    mean = numpy_helper.from_array(np.full((1, 3, 1, 1), 0.5, np.float32))
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["mean"], value=mean),
            helper.make_node("Sub", ["x", "mean"], ["/head/Sub_output_0"]),
            helper.make_node("Relu", ["/head/Sub_output_0"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 4, 4])],
        [
            helper.make_tensor_value_info("/head/Sub_output_0", T.FLOAT, [1, 3, 4, 4]),
            helper.make_tensor_value_info("y", T.FLOAT, [1, 3, 4, 4]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(tmp_path / "in.onnx"))
    _onnx2tf_copy.prepare(tmp_path / "in.onnx", tmp_path / "out.onnx")
    copy = onnx.load(str(tmp_path / "out.onnx"))
    assert [n.op_type for n in copy.graph.node] == ["Sub", "Relu", "Identity"]
    assert [t.name for t in copy.graph.initializer] == ["mean"]
    assert [o.name for o in copy.graph.output] == ["edgeflow_output_0", "y"]
    x = {"x": np.random.default_rng(0).standard_normal((1, 3, 4, 4)).astype(np.float32)}
    runs = [
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, x)
        for m in (model, copy)
    ]
    for a, b in zip(*runs, strict=True):
        np.testing.assert_array_equal(a, b)
    # nothing to change: the file is copied as it is
    onnx.save(copy, str(tmp_path / "clean.onnx"))
    _onnx2tf_copy.prepare(tmp_path / "clean.onnx", tmp_path / "again.onnx")
    assert (tmp_path / "again.onnx").read_bytes() == (tmp_path / "clean.onnx").read_bytes()


def test_names_tensorflow_refuses_as_scopes_are_replaced_on_the_copy(tmp_path: Path) -> None:
    """Paddle's '@' (and ':', spaces) in node and tensor names: the copy onnx2tf converts
    names them with letters, digits and _ . / - only, the input as `scope_safe` writes it
    (which the calibration files and io_layout use), and computes the same outputs."""
    import onnx
    import onnxruntime as ort

    from tests.targets.conftest import paddle_named_onnx

    source = paddle_named_onnx(tmp_path / "in.onnx")
    _onnx2tf_copy.prepare(source, tmp_path / "out.onnx")
    copy = onnx.load(str(tmp_path / "out.onnx"))
    names = [n.name for n in copy.graph.node]
    names += [t for n in copy.graph.node for t in (*n.input, *n.output)]
    assert all(re.fullmatch(r"[A-Za-z0-9_./-]+", n) for n in names), names
    assert [i.name for i in copy.graph.input] == [_onnx2tf_copy.scope_safe("@x:0")] == ["n_x__0"]
    assert [o.name for o in copy.graph.output] == ["y"]
    assert _onnx2tf_copy.scope_safe("/stem/Conv_output_0") == "/stem/Conv_output_0"  # torch's
    x = np.random.default_rng(0).standard_normal((1, 3, 4, 4)).astype(np.float32)
    session = {m: ort.InferenceSession(str(tmp_path / m)) for m in ("in.onnx", "out.onnx")}
    want = session["in.onnx"].run(None, {"@x:0": x})[0]
    np.testing.assert_array_equal(session["out.onnx"].run(None, {"n_x__0": x})[0], want)
    details = [{"name": "serving_default_n_x__0:0"}, {"name": "serving_default_b:0"}]
    assert _tflite_layout.input_order(["b", "@x:0"], details) == ["@x:0", "b"]


def test_conv_transpose_gets_its_kernel_shape_for_onnx2tf(tmp_path: Path) -> None:
    """onnx2tf 1.28.8 reads a ConvTranspose's kernel rank from `kernel_shape` alone ("axes
    don't match array" without it): the copy it converts gets it from the weight."""
    import onnx
    from onnx import TensorProto

    from edgeflow.targets.probes import single

    w = np.ones((6, 4, 3, 2), np.float32)
    x = [("x", TensorProto.FLOAT, [1, 6, 10, 10])]
    model = single("t", "ConvTranspose", x, {"w": w}, {"strides": [2, 2]}).model
    onnx.save(model, str(tmp_path / "m.onnx"))
    _onnx2tf_copy.prepare(tmp_path / "m.onnx", tmp_path / "copy.onnx")
    [node] = onnx.load(str(tmp_path / "copy.onnx")).graph.node
    assert onnx.helper.get_node_attr_value(node, "kernel_shape") == [3, 2]
    assert not [
        a
        for a in onnx.load(str(tmp_path / "m.onnx")).graph.node[0].attribute
        if a.name == "kernel_shape"
    ]


def test_the_replacement_json_is_found_by_onnx2tf_s_message_or_name(tmp_path: Path) -> None:
    """onnx2tf 1.28.8 writes <output folder>/<model stem>_auto.json and names it in its
    warning; a failure without one is not retried."""
    out = tmp_path / "out"
    out.mkdir()
    assert _onnx2tf._generated_json("ERROR: The trace log is below.", out) is None
    elsewhere = tmp_path / "named.json"
    elsewhere.write_text("{}")
    log = (
        "\x1b[33mWARNING:\x1b[0m Conversion failed. An automatic replacement JSON has been "
        f"generated: {elsewhere}\nPlease try running the conversion again with: -prf {elsewhere}"
    )
    assert _onnx2tf._generated_json(log, out) == elsewhere
    (out / "model_auto.json").write_text("{}")
    assert _onnx2tf._generated_json("no message", out) == out / "model_auto.json"


def test_what_decides_the_retry_is_in_the_convert_key() -> None:
    """The replacement JSON is onnx2tf's function of the model: a cached artifact made with
    a retry is reused only for the same ONNX model, onnx2tf and TensorFlow versions and
    edgeflow code (the retry's own), all in the convert stage's key."""
    from edgeflow.stages.convert import STAGE
    from edgeflow.targets import load_profile

    assert STAGE.consumes == ("onnx",)
    for target in ("tflite", "tflite_micro", "armnn"):
        assert {"onnx2tf", "tensorflow"} <= set(STAGE.tools_for(load_profile(target)))
    assert STAGE.reads[:2] == ("target", "quantization")


@needs_tflite
def test_too_few_calibration_samples_is_said_as_such_not_as_tensorflows_failure(
    tmp_path: Path,
) -> None:
    """edgeflow's own calibration reads onnx2tf's float32 file; a model of batch 2 given one
    sample gets edgeflow's error, not "TensorFlow's calibrator could not run it"."""
    import tensorflow as tf

    from edgeflow.data import Samples
    from edgeflow.targets import _tflite_quant

    run = tf.function(lambda x: x * 2.0, input_signature=[tf.TensorSpec([2, 3], tf.float32)])
    converter = tf.lite.TFLiteConverter.from_concrete_functions([run.get_concrete_function()])
    (tmp_path / "model_float32.tflite").write_bytes(converter.convert())
    spec = TensorSpec.model_validate({"name": "x", "shape": [2, 3]})
    samples = Samples({"x": np.ones((1, 3), np.float32)}, None)
    int8 = Quantization.model_validate({"mode": "int8"})
    job = ConvertJob(tmp_path / "m.onnx", tmp_path, None, int8, [spec], samples)  # type: ignore[arg-type]
    with pytest.raises(EdgeflowError, match=r"^int8 calibration needs at least 2 samples"):
        _tflite_quant.own_int8(job, tmp_path, "tflite", "a recurrent layer")
