"""The armnn target: the digits demo through Arm NN (CpuRef) in a worker process; Arm NN's
aborts become reported failures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeflow.cli import main
from edgeflow.core.errors import EdgeflowError
from edgeflow.targets.armnn.backend import ArmnnRunner
from tests import needs
from tests.conftest import DEMO_RECIPE, DEMO_WEIGHTS
from tests.targets.conftest import needs_tflite

needs_armnn = needs.mark("armnn")


def test_without_the_system_python_the_error_says_how_to_install(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("EDGEFLOW_ARMNN_PYTHON", str(tmp_path / "no-python"))
    with pytest.raises(EdgeflowError, match=r"target armnn needs .*no Python at .*no-py") as info:
        ArmnnRunner(tmp_path / "model.tflite", {"inputs": [], "outputs": []})
    assert "apt-get install -y python3-pyarmnn" in (info.value.hint or "")


@pytest.mark.slow
@needs_tflite
@needs_armnn
@pytest.mark.usefixtures("offline_env")
@pytest.mark.parametrize("mode", ["none", "int8"])
def test_digits_demo_is_verified_in_armnn(mode: str, tmp_path: Path, shared_cache: Path) -> None:
    args = ["run", "recipe=digits_cnn", "target=armnn", f"quantization={mode}"]
    assert main([*args, f"cache_dir={shared_cache}", f"build_dir={tmp_path}"]) == 0
    out = tmp_path / "digits_cnn" / f"armnn-{mode}"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["verified"] is True and metrics["armnn_version"] == "22.0.0"
    assert metrics["agreement"]["top1"] >= 0.98 and metrics["accuracy"]["drop"] <= 0.01
    if mode == "none":
        assert metrics["agreement"]["max_abs_diff"] <= 1e-4
    else:
        report = (out / "report.md").read_text()
        # per-channel convolutions, per-tensor fully-connected layers (Arm NN aborts on others)
        assert "fully-connected weights per-tensor (armnn's int8 fully-connected" in report
        assert "`onnx.equalize_channels`: changed" in report
        assert metrics["agreement"]["min_sqnr_db"] >= 34  # measured 35.1 dB (35.6 per-tensor)


@pytest.mark.slow
@needs_tflite
@needs_armnn
@pytest.mark.usefixtures("offline_env")
def test_an_arm_nn_abort_is_a_reported_stage_failure(
    tmp_path: Path, shared_cache: Path, write_recipe, capsys
) -> None:  # type: ignore[no-untyped-def]
    """Per-channel int8 fully-connected layers make Arm NN 22.0 abort the process."""
    text = DEMO_RECIPE.read_text().replace("../models/digits_cnn.pt", str(DEMO_WEIGHTS))
    inline = (
        "target:\n  name: armnn_per_channel\n  backend: armnn\n"
        "  quantization: [none, int8]\n  dynamic_shapes: false\n"
    )
    path = write_recipe(text.replace("target: onnxruntime_micro\n", inline))
    args = ["run", f"recipe={path}", f"cache_dir={shared_cache}", f"build_dir={tmp_path}"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "stage 'verify' failed: Arm NN failed while loading the model (killed by SIGABRT)" in err
    assert "GetBiasTypeFromWeightsType" in err  # Arm NN's own assertion text


def test_a_python_without_pyarmnn_gets_the_install_command(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import sys

    monkeypatch.setenv("EDGEFLOW_ARMNN_PYTHON", sys.executable)  # edgeflow's: no pyarmnn
    with pytest.raises(EdgeflowError, match="target armnn needs pyarmnn") as info:
        ArmnnRunner(tmp_path / "model.tflite", {"inputs": [], "outputs": []})
    assert info.value.exit_code == 2
    assert "apt-get install -y python3-pyarmnn" in info.value.message


@needs_tflite
@needs_armnn
@pytest.mark.parametrize("mode", ["none", "int8"])
def test_a_zero_dimensional_output_is_read_as_one_value(
    mode: str, tmp_path: Path, shared_cache: Path
) -> None:
    """Arm NN has no 0-D tensor (its parser refused PLCMOS's squeezed score at load: "Tensor
    numDimensions must be greater than 0"): the output is written as [1], and verify reads
    it as the sample's value."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((1, 8)).astype(np.float32), "w")
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["x", "w", "b"], ["g"], transB=1),  # armnn: a bias
            helper.make_node("Tanh", ["g"], ["t"]),
            helper.make_node("Reshape", ["t", "empty"], ["score"]),  # [1, 1] -> 0-D
        ],
        "score",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, [])],
        [
            weight,
            numpy_helper.from_array(np.array([0.1], np.float32), "b"),
            numpy_helper.from_array(np.zeros(0, np.int64), "empty"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "score.onnx")
    np.savez(tmp_path / "data.npz", x=rng.standard_normal((8, 8)).astype(np.float32))
    (tmp_path / "recipe.yaml").write_text(
        "source: {kind: onnx, model: score.onnx, inputs: [{name: x, shape: [1, 8]}]}\n"
        "calibration: {dataset: data.npz}\n"
        "evaluation: {dataset: data.npz, metric: agreement}\n"
        f"quantization: {{mode: {mode}}}\ntarget: armnn\n"
    )
    args = [f"recipe={tmp_path / 'recipe.yaml'}", f"cache_dir={shared_cache}"]
    assert main(["run", *args, f"build_dir={tmp_path}/b"]) == 0
    metrics = json.loads((tmp_path / "b" / "recipe" / f"armnn-{mode}" / "metrics.json").read_text())
    assert metrics["verified"] is True
    figures = metrics["agreement"]["outputs"]["score"]
    assert figures["sqnr_db"] >= (25 if mode == "int8" else 100), figures
