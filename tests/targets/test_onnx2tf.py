"""onnx2tf conversion in this process on tiny models: offline, layouts, int8 I/O, TFLM errors."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from edgeflow.core.errors import EdgeflowError
from edgeflow.core.specs import Quantization, TensorSpec
from edgeflow.data import Samples
from edgeflow.targets import _onnx2tf, load_profile, tflite, tflite_micro
from edgeflow.targets.base import ConvertJob
from tests.targets.conftest import needs_tflite, tiny_conv_onnx

pytestmark = [
    pytest.mark.slow,
    needs_tflite,
    # TensorFlow's int8 calibrator uses its own deprecated tf.lite.Interpreter
    pytest.mark.filterwarnings("ignore:.*tf.lite.Interpreter is deprecated:UserWarning"),
]


def job(onnx: Path, out: Path, target: str, **quantization: object) -> ConvertJob:
    out.mkdir()
    calibration = None
    if quantization.get("mode") == "int8":
        rng = np.random.default_rng(1)
        calibration = Samples({"x": rng.normal(size=(32, 3, 4, 4)).astype(np.float32)}, None)
    return ConvertJob(
        onnx=onnx,
        out_dir=out,
        profile=load_profile(target),
        quantization=Quantization(**quantization),  # type: ignore[arg-type]
        inputs=[TensorSpec(name="x", shape=[1, 3, 4, 4])],
        calibration=calibration,
    )


def reference(onnx: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    return ort.InferenceSession(str(onnx), providers=["CPUExecutionProvider"]).run(None, {"x": x})[
        0
    ]


def test_three_channel_float_converts_offline_in_nchw(tmp_path: Path, no_network: list) -> None:
    onnx = tiny_conv_onnx(tmp_path / "tiny.onnx")
    before = onnx.read_bytes()
    state = (sys.getrecursionlimit(), list(warnings.filters), dict(os.environ), Path.cwd())
    info = tflite.convert(job(onnx, tmp_path / "out", "tflite", mode="none"))
    assert no_network == []  # onnx2tf never tried to fetch its sample file
    assert onnx.read_bytes() == before  # onnx2tf worked on a copy
    # onnx2tf's process-wide changes (recursion limit 2**31-1, warnings off, env) are undone
    assert (sys.getrecursionlimit(), warnings.filters, dict(os.environ), Path.cwd()) == state
    assert info["io"]["inputs"] == [{"name": "x", "index": 0, "perm": [0, 2, 3, 1]}]
    # 1x4x4x4 fits both layouts: the probe found the NHWC -> NCHW transpose
    assert info["io"]["outputs"] == [{"name": "y", "index": 0, "perm": [0, 3, 1, 2]}]
    assert info["operators"] == ["CONV_2D"]
    x = np.random.default_rng(2).normal(size=(1, 3, 4, 4)).astype(np.float32)
    got = tflite.open_runner(tmp_path / "out", info).run({"x": x})
    np.testing.assert_allclose(got[0], reference(onnx, x), atol=1e-4)


def test_without_the_stand_in_file_onnx2tf_reaches_for_the_network(
    tmp_path: Path, no_network: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The negative control: the trap is real, and the guard above would have seen it."""
    monkeypatch.setattr(_onnx2tf, "_write_sample_file", lambda path: None)
    onnx = tiny_conv_onnx(tmp_path / "tiny.onnx")
    with pytest.raises(EdgeflowError, match="onnx2tf failed"):
        tflite.convert(job(onnx, tmp_path / "out", "tflite", mode="none"))
    assert no_network


def test_int8_per_tensor_quantizes_inputs_and_dequantizes_outputs(
    tmp_path: Path, no_network: list
) -> None:
    onnx = tiny_conv_onnx(tmp_path / "tiny.onnx")
    spec = job(onnx, tmp_path / "out", "tflite", mode="int8", per_channel=False)
    info = tflite.convert(spec)
    assert no_network == []
    assert info["int8"]["per_channel"] is False
    runner = tflite.open_runner(tmp_path / "out", info)
    assert [q.dtype for q in runner.inputs] == [np.int8]
    x = spec.calibration.inputs["x"][:4] if spec.calibration else None
    assert x is not None
    for sample in x:
        want = reference(onnx, sample[None])
        got = runner.run({"x": sample[None]})[0]
        assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()


def test_tflm_rejection_quotes_the_interpreter(tmp_path: Path) -> None:
    """onnx2tf turns HardSigmoid into RELU_0_TO_1, which LiteRT runs and TFLM lacks."""
    onnx = tiny_conv_onnx(tmp_path / "tiny.onnx", activation="HardSigmoid")
    with pytest.raises(EdgeflowError) as failure:
        tflite_micro.convert(job(onnx, tmp_path / "out", "tflite_micro", mode="none"))
    assert "TFLite Micro rejects the model" in failure.value.message
    assert "Didn't find op for builtin opcode 'RELU_0_TO_1'" in failure.value.message


def test_flex_ops_are_reported_by_litert(tmp_path: Path) -> None:
    """Erf has no TFLite builtin: onnx2tf emits the Select-TF op FlexErf, LiteRT refuses it."""
    onnx = tiny_conv_onnx(tmp_path / "tiny.onnx", activation="Erf")
    info = tflite.convert(job(onnx, tmp_path / "out", "tflite", mode="none"))
    assert info["operators"] == ["CONV_2D", "CUSTOM:FlexErf"]
    assert info["io"]["ambiguous_outputs"].startswith("assumed NHWC outputs")
    with pytest.raises(EdgeflowError, match=r"LiteRT cannot load model.tflite: Select TensorFlow"):
        tflite.open_runner(tmp_path / "out", info)


@pytest.mark.parametrize("mode", ["none", "int8"])
def test_paddle_names_build_and_verify_on_tflite(mode: str, tmp_path: Path) -> None:
    """Node, tensor and input names with '@', ':' and spaces (as Paddle2ONNX writes them):
    onnx2tf failed on them ("... is not a valid scope name"); the recipe declares the input
    by its own name '@x:0', and the build verifies against onnxruntime. Measured: float32
    max relative diff 2.0e-7; int8 0.018 (SQNR 36.4 dB), top-1 agreement 1.0 in both."""
    import json

    from edgeflow.cli import main
    from tests.targets.conftest import paddle_named_onnx

    paddle_named_onnx(tmp_path / "m.onnx")
    data = np.random.default_rng(1).standard_normal((16, 3, 4, 4)).astype(np.float32)
    np.savez(tmp_path / "data.npz", **{"@x:0": data})
    verify = "max_relative_diff: 1.0e-5" if mode == "none" else "max_relative_diff: 0.05"
    (tmp_path / "r.yaml").write_text(
        "source: {kind: onnx, model: m.onnx, inputs: [{name: '@x:0', shape: [1, 3, 4, 4]}]}\n"
        "calibration: {dataset: data.npz}\n"
        "evaluation: {dataset: data.npz, metric: agreement}\n"
        f"quantization: {{mode: {mode}}}\n"
        "target: tflite\n"
        f"verify: {{latency_runs: 2, warmup_runs: 0, {verify}}}\n"
    )
    args = [f"cache_dir={tmp_path / 'c'}", f"build_dir={tmp_path / 'b'}"]
    assert main(["run", f"recipe={tmp_path / 'r.yaml'}", *args]) == 0
    metrics = json.loads((tmp_path / "b" / "r" / f"tflite-{mode}" / "metrics.json").read_text())
    assert metrics["verified"] is True and metrics["agreement"]["top1"] == 1.0
    if mode == "none":
        assert metrics["agreement"]["max_relative_diff"] <= 1e-6


def test_without_renaming_onnx2tf_refuses_paddle_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The negative control: the names themselves make onnx2tf fail."""
    from tests.targets.conftest import paddle_named_onnx

    monkeypatch.setattr(_onnx2tf, "_scope_safe_names", lambda model: 0)
    onnx = paddle_named_onnx(tmp_path / "m.onnx")
    (tmp_path / "out").mkdir()
    convert = ConvertJob(
        onnx=onnx,
        out_dir=tmp_path / "out",
        profile=load_profile("tflite"),
        quantization=Quantization(mode="none"),
        inputs=[TensorSpec(name="@x:0", shape=[1, 3, 4, 4])],
        calibration=None,
    )
    with pytest.raises(EdgeflowError, match="is not a valid scope name"):
        tflite.convert(convert)
