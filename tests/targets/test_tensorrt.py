"""The tensorrt target: the published support matrix as a profile, symmetric QDQ artifacts, and
an honest "not verified" where there is no GPU (here and in CI); engines where there is one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import numpy_helper

from edgeflow.cli import main
from edgeflow.targets import load_profile
from edgeflow.targets.precheck import check
from edgeflow.targets.tensorrt.backend import gpu_unavailable
from edgeflow.targets.tensorrt.derive import render_tensorrt, tensorrt_operators
from tests.report import plots_in
from tests.targets.opzoo import X, _const, single

MATRIX = """
TensorRT 10.0 supports operators in the inclusive range of opset 9 to opset 20. More text.

| Operator   | Supported  | Supported Types | Restrictions |
|------------|------------|-----------------|--------------|
| Abs        | Y          | FP32, FP16, INT32 |
| Bernoulli  | N          |
| ReduceMean | Y          | FP32, FP16 | `axes` must be an initializer |
| TopK       | Y          | FP32 | `sorted` must be 1. `K` input must be less than 3840. |
"""


def test_the_support_matrix_parser() -> None:
    header, ops = tensorrt_operators(MATRIX)
    assert (
        header == "TensorRT 10.0 supports operators in the inclusive range of opset 9 to opset 20"
    )
    assert set(ops) == {"Abs", "ReduceMean", "TopK"}  # Bernoulli: N
    assert ops["Abs"] == {"dtypes": ["float", "float16", "int32"], "checks": [], "note": ""}
    assert ops["ReduceMean"]["checks"] == ["constant_axes"] and ops["ReduceMean"]["note"] == ""
    assert ops["TopK"]["note"] == "`sorted` must be 1. `K` input must be less than 3840"
    assert "  ReduceMean: {dtypes: [float, float16], checks: [constant_axes]}" in render_tensorrt(
        header, ops, "test"
    )


def test_tensorrt_profile_checks_what_the_matrix_says() -> None:
    profile = load_profile("tensorrt")
    assert profile.operators is not None and len(profile.operators) >= 140
    assert profile.int8 == {"symmetric": True}
    axes = [("x", T.FLOAT, [1, 4, 8, 8]), ("axes", T.INT64, [1])]
    # (the computed axes also leave the output shape unknown: the checker's own finding)
    [computed] = [f for f in check(single("m", "ReduceMean", axes, opset=18).model, profile)
                  if f.operator == "ReduceMean"]  # fmt: skip
    assert computed.reason == "constant_axes: axes (axes) is computed"
    constant = {"axes": _const("axes", [1], np.int64)}
    assert check(single("m", "ReduceMean", X, constant, opset=18).model, profile) == []
    zero3 = {"s": 0.1, "z": _const("z", 3, np.int8)}
    [zp] = check(single("q", "QuantizeLinear", X, zero3, out_type=T.INT8).model, profile)
    assert zp.operator == "QuantizeLinear" and "zero point is not 0" in zp.reason
    [bern] = check(single("b", "Bernoulli", X, opset=17).model, profile)
    assert bern.reason == "not supported by tensorrt"


@pytest.mark.slow
@pytest.mark.skipif(gpu_unavailable() is None, reason="a GPU is present: the engine is verified")
def test_without_a_gpu_the_build_says_not_verified(
    tmp_path: Path, shared_cache: Path, capsys
) -> None:  # type: ignore[no-untyped-def]
    args = ["run", "recipe=digits_cnn", "target=tensorrt", "quantization=int8"]
    args += [f"cache_dir={shared_cache}", f"build_dir={tmp_path}"]
    assert main(args) == 3  # built, but nothing ran it: not a pass
    assert "NOT VERIFIED: no GPU" in capsys.readouterr().err
    assert main([*args, "verify.allow_unverified=true"]) == 0  # accepted, and still marked
    assert "not verified: no GPU" in capsys.readouterr().out
    out = tmp_path / "digits_cnn" / "tensorrt-int8"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["verified"] is False and metrics["not_verified"].startswith("no GPU")
    assert metrics["accuracy"] is None and metrics["agreement"] is None
    assert "**NOT VERIFIED**: no GPU" in (out / "report.md").read_text()
    assert "(set by the target: symmetric=True)" in (out / "report.md").read_text()
    page = (out / "report.html").read_text()  # nothing ran: no latency, no output plotted
    assert '<div class="verdict unverified" id="verdict">NOT VERIFIED: not run here</div>' in page
    assert plots_in(page) == ["memory"]
    model = onnx.load(str(out / "model.onnx"))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    qdq = [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert len(qdq) > 10
    assert all(not inits[n.input[2]].any() for n in qdq)  # zero point 0 everywhere


@pytest.mark.slow
@pytest.mark.skipif(gpu_unavailable() is not None, reason=f"{gpu_unavailable()}")
@pytest.mark.parametrize("mode", ["none", "fp16", "int8"])
def test_engines_are_verified_on_a_gpu(mode: str, tmp_path: Path, shared_cache: Path) -> None:
    args = ["run", "recipe=digits_cnn", "target=tensorrt", f"quantization={mode}"]
    assert main([*args, f"cache_dir={shared_cache}", f"build_dir={tmp_path}"]) == 0
    out = tmp_path / "digits_cnn" / f"tensorrt-{mode}"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["verified"] is True
    assert metrics["agreement"]["top1"] >= 0.98
    assert (out / "model.engine").stat().st_size > 1000
