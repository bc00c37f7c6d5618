"""Fixtures for target backends: tiny ONNX models, a network guard, the [tflite] stack check."""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pytest

from tests import needs

needs_tflite = needs.mark("tflite")


def tiny_conv_onnx(path: Path, activation: str = "Relu", opset: int = 17) -> Path:
    """x[1,3,4,4] -> Conv(3->4, 3x3, pad 1) -> activation -> y[1,4,4,4], fixed random weights.

    Three input channels trigger onnx2tf's sample-download trap; the 1x4x4x4 output fits
    NCHW and NHWC alike, so only a numerical probe can tell its layout.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.normal(size=(4,)).astype(np.float32), "b"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node(activation, ["c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4, 4])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Any name lookup or connection in this process fails and is recorded."""
    attempts: list[object] = []

    def lookup(host: object, *args: object, **kwargs: object) -> object:
        attempts.append(host)
        raise OSError(f"network blocked by the test (lookup of {host})")

    def connect(self: socket.socket, address: object) -> None:
        attempts.append(address)
        raise OSError(f"network blocked by the test (connect to {address})")

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    monkeypatch.setattr(socket.socket, "connect", connect)
    return attempts


@pytest.fixture
def offline_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker processes inherit proxies that refuse every HTTP(S) request."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)


def paddle_named_onnx(path: Path) -> Path:
    """A Conv, BatchNormalization, Softmax, MatMul, Split and Concat graph whose input, nodes
    and tensors carry the names Paddle2ONNX writes ('@', ':', a space): TensorFlow refuses
    them as scope names ("'softmax_0.tmp_0@SOFTMAX__0' is not a valid scope name"), and an
    input '@x:0' as an op name in int8 mode. x [1, 3, 4, 4] -> y [1, 8]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    consts = {
        "conv2d_0.w_0@W": rng.normal(size=(8, 3, 3, 3)),
        "conv2d_0.b_0": rng.normal(size=8),
        "bn@scale": rng.uniform(0.5, 1.5, 8),
        "bn@bias": rng.normal(size=8),
        "bn@mean": rng.normal(size=8) * 0.1,
        "bn@var": rng.uniform(0.5, 1.5, 8),
        "reshape@shape": np.array([1, 8, 16], np.int64),
        "fc_0.w_0": rng.normal(size=(16, 4)),
        "reduce@axes": np.array([2], np.int64),
    }
    inits = [
        numpy_helper.from_array(v.astype(np.float32) if v.dtype == np.float64 else v, k)
        for k, v in consts.items()
    ]
    node = helper.make_node
    nodes = [
        node("Conv", ["@x:0", "conv2d_0.w_0@W", "conv2d_0.b_0"], ["conv2d_0.tmp_0@CONV:0"],
             "p2o.Conv@0", pads=[1, 1, 1, 1]),
        node("BatchNormalization", ["conv2d_0.tmp_0@CONV:0", "bn@scale", "bn@bias", "bn@mean",
             "bn@var"], ["batch_norm_0.tmp_2@BN"], "p2o.BatchNormalization@0"),
        node("Relu", ["batch_norm_0.tmp_2@BN"], ["relu_0.tmp_0 @out"], "p2o.Relu@0"),
        node("Reshape", ["relu_0.tmp_0 @out", "reshape@shape"], ["reshape2_0.tmp_0@R"],
             "p2o.Reshape@0"),
        node("Softmax", ["reshape2_0.tmp_0@R"], ["softmax_0.tmp_0@SOFTMAX:0"], "p2o.Softmax@0",
             axis=-1),
        node("MatMul", ["softmax_0.tmp_0@SOFTMAX:0", "fc_0.w_0"], ["fc_0.tmp_0@MM"],
             "p2o.MatMul@0"),
        node("Split", ["fc_0.tmp_0@MM"], ["split@0", "split@1"], "p2o.Split@0", axis=1,
             num_outputs=2),
        node("Concat", ["split@1", "split@0"], ["concat_0.tmp_0@C"], "p2o.Concat@0", axis=1),
        node("ReduceMean", ["concat_0.tmp_0@C", "reduce@axes"], ["y"], "p2o.ReduceMean@0",
             keepdims=0),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "paddle",
        [helper.make_tensor_value_info("@x:0", TensorProto.FLOAT, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


ARMNN_RECIPE = """
    source: {{kind: onnx, model: model.onnx, inputs: [{{name: x, shape: {shape}}}]}}
    evaluation: {{dataset: data.npz, metric: agreement, outputs: {{y: {{kind: values}}}}}}
    calibration: {{dataset: data.npz}}
    quantization: {{mode: {mode}}}
    target: armnn
    verify: {{max_relative_diff: {tolerance}, latency_runs: 1, warmup_runs: 0}}
"""


def build_on_armnn(
    model: object, data: np.ndarray, mode: str, tmp_path: Path, cache: Path, err: object
) -> Path:
    """Build an ONNX model with input `x` and output `y` for armnn through the CLI, its data
    `x` (samples on axis 0), within 1e-5 relative in float32 (0.05 in int8); returns the
    build folder. `err()`: the captured stderr, for the message when the build fails."""
    import textwrap

    import onnx

    from edgeflow.cli import main

    onnx.save(model, tmp_path / "model.onnx")
    np.savez(tmp_path / "data.npz", x=data)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    tolerance = 1.0e-5 if mode == "none" else 0.05
    recipe = tmp_path / "recipe.yaml"
    text = ARMNN_RECIPE.format(shape=shape, mode=mode, tolerance=tolerance)
    recipe.write_text(textwrap.dedent(text))
    args = ["run", f"recipe={recipe}", f"cache_dir={cache}", f"build_dir={tmp_path}/b"]
    assert main(args) == 0, err()
    return tmp_path / "b" / "recipe" / f"armnn-{mode}"
