"""Fixtures for target backends: tiny ONNX models, a network guard, the [tflite] stack check."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

import numpy as np
import pytest

TFLITE_STACK = ("onnx2tf", "tensorflow", "tf_keras", "ai_edge_litert", "tflite_micro")
needs_tflite = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in TFLITE_STACK),
    reason="the [tflite] extra is not installed: pip install -e '.[tflite]'",
)


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
