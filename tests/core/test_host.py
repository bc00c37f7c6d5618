"""Which CPUs saturate onnxruntime's int8 kernels, `quantization.reduce_range: auto`, and the
host fact in the stage keys of the stages whose results it changes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from edgeflow.core import host
from edgeflow.core.errors import EdgeflowError
from edgeflow.engine import keys
from edgeflow.engine.cache import Cache
from edgeflow.engine.runner import run_build
from edgeflow.recipe import find_recipe, load_recipe
from edgeflow.stages import convert, quantize
from edgeflow.targets.registry import backends


@pytest.mark.parametrize(
    ("machine", "flags", "saturates"),
    [
        ("x86_64", {"sse4_1", "avx2", "fma"}, True),  # AVX2 without VNNI: VPMADDUBSW
        ("x86_64", {"avx2", "avx512f", "avx512bw"}, True),  # AVX-512 without VNNI
        ("x86_64", {"avx2", "avx512f", "avx512_vnni"}, False),
        ("x86_64", {"avx2", "avx_vnni"}, False),  # Alder Lake's VEX-coded VNNI
        ("AMD64", {"avx2"}, True),  # Windows spells the machine so
        ("aarch64", set(), False),
        ("arm64", set(), False),
    ],
)
def test_int8_saturation_by_cpu(machine: str, flags: set[str], saturates: bool) -> None:
    why = host.int8_saturation(machine, flags)
    assert (why is not None) is saturates
    if saturates:
        assert machine.lower() in why


def test_an_x86_cpu_whose_flags_cannot_be_read_counts_as_saturating(monkeypatch) -> None:
    monkeypatch.setattr(host, "cpu_flags", lambda: None)
    assert "cannot be read" in (host.int8_saturation("x86_64") or "")


def test_this_machines_flags_are_read() -> None:
    flags = host.cpu_flags()
    if Path("/proc/cpuinfo").is_file():
        assert flags  # a Linux machine lists its flags
    assert host.fact("int8").split(":")[1].strip().startswith(("exact", "saturating"))
    with pytest.raises(ValueError, match="unknown host fact"):
        host.fact("gpu")


@pytest.mark.parametrize(
    ("setting", "backend", "saturates", "expected"),
    [
        (True, "onnxruntime_micro", False, True),  # the recipe's word stands
        (False, "onnxruntime_micro", True, False),
        ("auto", "onnxruntime_micro", True, True),
        ("auto", "onnxruntime_micro", False, False),
        ("auto", "tensorrt", True, False),  # TensorRT's kernels do not saturate
    ],
)
def test_reduce_range_auto(monkeypatch, setting, backend, saturates, expected) -> None:
    monkeypatch.setattr(host, "int8_saturation", lambda: "x86_64 CPU" if saturates else None)
    chosen, why = quantize._reduce_range(setting, backends()[backend])
    assert chosen is expected
    assert (why is None) is (setting != "auto")


def test_reduce_range_takes_true_false_or_auto() -> None:
    loaded = load_recipe(find_recipe("digits_cnn"), {"quantization.reduce_range": "auto"})
    assert loaded.recipe.quantization.reduce_range == "auto"
    with pytest.raises(EdgeflowError, match="reduce_range"):
        load_recipe(find_recipe("digits_cnn"), {"quantization.reduce_range": "sometimes"})


def test_the_host_fact_is_in_the_keys_of_quantize_and_convert(monkeypatch) -> None:
    """An int8 model quantized (reduce_range auto) or verified on a CPU whose kernels saturate
    is not the result of one whose kernels do not: the fact is part of the key."""
    assert "host:int8" in quantize.STAGE.tools and "host:int8" in convert.RUNTIMES
    assert "host:int8" in backends()["onnxruntime_micro"].tools
    before = keys.tool_versions(("onnxruntime", "host:int8"))
    monkeypatch.setattr(host, "fact", lambda name: "x86_64: saturating (a test)")
    after = keys.tool_versions(("onnxruntime", "host:int8"))
    assert before["onnxruntime"] == after["onnxruntime"]
    assert after["host:int8"] == "x86_64: saturating (a test)" != before["host:int8"]


@pytest.mark.slow
def test_auto_quantizes_with_the_weights_this_cpu_needs(tmp_path: Path, shared_cache) -> None:
    """The demo's int8 build with reduce_range auto: 7-bit weights (|q| <= 64) exactly where
    this CPU's kernels saturate, full 8-bit ones elsewhere, and quantize.json says which."""
    overrides = {"quantization.mode": "int8", "quantization.reduce_range": "auto"}
    result = run_build(
        load_recipe(find_recipe("digits_cnn"), overrides), Cache(shared_cache), tmp_path, print
    )
    assert result.metrics["verified"] is True
    outcome = next(o for o in result.outcomes if o.stage == "quantize")
    entry = Cache(shared_cache).entry("quantize", outcome.key)
    info = json.loads((entry / "quantize.json").read_text())
    saturates = host.int8_saturation() is not None
    assert info["reduce_range"] is saturates
    assert ("7-bit" if saturates else "8-bit") in info["reduce_range_auto"]
    model = onnx.load(str(entry / "model.onnx"))
    weights = [
        numpy_helper.to_array(t)
        for t in model.graph.initializer
        if t.data_type == onnx.TensorProto.INT8 and t.name.endswith("weight_quantized")
    ]
    largest = max(int(np.abs(w.astype(np.int32)).max()) for w in weights)
    assert (largest <= 64) is saturates
    assert "reduce_range auto" in (result.build_dir / "report.md").read_text()
