"""Bisection: cut points, prefixes whose outputs are every tensor crossing the cut, and the
binary search for the first failing one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from edgeflow.stages.bisect import Attempt, cut_points, prefix, search
from tests.targets.conftest import needs_tflite
from tests.targets.test_armnn import needs_armnn


def _branchy() -> onnx.ModelProto:
    """x -> Relu a -> (Sigmoid b, Neg c) -> Mul d: the gate b branches off a."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Sigmoid", ["a"], ["b"], name="gate"),
        helper.make_node("Mul", ["a", "w"], ["c"], name="scale"),
        helper.make_node("Mul", ["b", "c"], ["d"], name="apply"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("d", T.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.full((1, 4), 2.0, np.float32), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return onnx.shape_inference.infer_shapes(model)


def test_a_prefix_outputs_every_tensor_that_crosses_the_cut() -> None:
    model = _branchy()
    points = cut_points(model)
    assert [p[0] for p in points] == ["a", "b", "c", "d"]
    outputs = [[o.name for o in prefix(model, points, k).graph.output] for k in range(4)]
    # after the gate, `a` is still read by `scale`: a wrong `a` cannot hide behind the gate
    assert outputs == [["a"], ["a", "b"], ["b", "c"], ["d"]]
    assert [n.name for n in prefix(model, points, 1).graph.node] == ["relu", "gate"]


def test_the_search_finds_the_first_failing_prefix_in_log2_attempts() -> None:
    for first_bad in (0, 1, 17, 40, 63):
        tried: list[int] = []

        def attempt(k: int, first_bad: int = first_bad, tried: list[int] = tried) -> Attempt:
            tried.append(k)
            return Attempt(k, f"t{k}", "Conv", f"n{k}", "diverges" if k >= first_bad else "ok")

        attempts = search(64, attempt)
        failing = min(a.index for a in attempts if a.failed)
        assert failing == first_bad
        assert tried[0] == 63 and len(tried) <= 1 + 6  # the whole model, then log2(64)
    passing = search(8, lambda k: Attempt(k, "t", "Conv", "n", "ok"))
    assert len(passing) == 1 and not passing[0].failed  # the whole model passes: done


PER_CHANNEL_ARMNN = """\
extends: armnn
name: armnn_pc
description: armnn with per-channel int8 fully-connected layers, which abort Arm NN
per_channel_dense: true
"""


@pytest.mark.slow
@needs_tflite
@needs_armnn
def test_bisection_pins_a_runtime_abort_on_the_layer_that_causes_it(
    tmp_path: Path, shared_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Per-channel int8 makes Arm NN abort (SIGABRT) while loading the digits CNN: the build
    fails in verify, with nothing to compare. `--bisect` still runs and names the layer: the
    classifier's Gemm (FULLY_CONNECTED); every shorter prefix loads and matches."""
    from edgeflow.cli import main

    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "armnn_pc.yaml").write_text(PER_CHANNEL_ARMNN)
    monkeypatch.chdir(tmp_path)
    args = ["diff", "digits_cnn", "--bisect", "target=armnn_pc", "quantization=int8"]
    assert main([*args, f"cache_dir={shared_cache}", f"build_dir={tmp_path}/b"]) == 1
    out = capsys.readouterr()
    assert "stage 'verify' failed: Arm NN failed while loading the model (killed by SIGABRT)" in (
        out.err
    )
    line = next(x for x in out.out.splitlines() if "bisect: the shortest failing prefix" in x)
    figures = next(x for x in out.out.splitlines() if "figures: " in x)
    assert "(the build folder is not written)" in figures  # verify failed: nothing published
    found = json.loads(Path(figures.split("figures: ")[1].split(" (")[0]).read_text())
    first = found["first_failing"]
    assert first["op"] == "Gemm" and first["verdict"] == "crash", line
    assert "SIGABRT" in first["detail"]
    assert found["last_passing"]["index"] == first["index"] - 1
