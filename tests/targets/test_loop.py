"""ONNX Loop end to end: a static-count recurrence with a scan output, built for the TFLite
family (which has no Loop: onnx.unroll_loop is their default) and verified against
onnxruntime on the source graph."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from edgeflow.cli import main
from tests.targets.conftest import needs_tflite
from tests.targets.test_armnn import needs_armnn
from tests.targets.test_target_rewrites import target_rules

RECIPE = """
    source: {kind: onnx, model: loop.onnx, inputs: [{name: x, shape: [1, 8]}]}
    evaluation: {dataset: data.npz, metric: agreement}
    quantization: {mode: none}
    target: TARGET
    verify: {max_relative_diff: 1.0e-5, latency_runs: 2, warmup_runs: 0}
"""


def recurrence(path: Path, trips: int = 5) -> Path:
    """h = x; for i in range(trips): h = tanh(h W + x) (W a body initializer); the Loop's
    outputs: the last h, and every h times i + 1 stacked [trips, 1, 8]; Relu before it."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    v = helper.make_tensor_value_info
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array((rng.standard_normal((8, 8)) * 0.4).astype(np.float32), "W")
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("MatMul", ["h_in", "W"], ["hw"]),
            helper.make_node("Add", ["hw", "r"], ["pre"]),
            helper.make_node("Tanh", ["pre"], ["h_out"]),
            helper.make_node("Add", ["i", "one"], ["k"]),
            helper.make_node("Cast", ["k"], ["kf"], to=T.FLOAT),
            helper.make_node("Mul", ["h_out", "kf"], ["scan"]),
        ],
        "body",
        [v("i", T.INT64, []), v("cond_in", T.BOOL, []), v("h_in", T.FLOAT, [1, 8])],
        [v("cond_out", T.BOOL, []), v("h_out", T.FLOAT, [1, 8]), v("scan", T.FLOAT, [1, 8])],
        [weight, numpy_helper.from_array(np.array(1, np.int64), "one")],
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Loop", ["M", "c", "r"], ["h", "hs"], name="loop", body=body),
    ]
    graph = helper.make_graph(
        nodes,
        "loop",
        [v("x", T.FLOAT, [1, 8])],
        [v("h", T.FLOAT, [1, 8]), v("hs", T.FLOAT, [trips, 1, 8])],
        [
            numpy_helper.from_array(np.array(trips, np.int64), "M"),
            numpy_helper.from_array(np.array(True), "c"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


@pytest.mark.slow
@needs_tflite
@needs_armnn
@pytest.mark.parametrize("target", ["tflite", "tflite_micro", "armnn"])
def test_a_static_loop_builds_and_verifies_on_targets_without_loop(
    target: str, tmp_path: Path, shared_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Measured: max relative diff <= 1e-5 (float rounding of the MatMuls); without the
    target's rewrites the precheck names onnx.unroll_loop for the Loop."""
    recurrence(tmp_path / "loop.onnx")
    data = np.random.default_rng(1).standard_normal((8, 8)).astype(np.float32)
    np.savez(tmp_path / "data.npz", x=data)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(textwrap.dedent(RECIPE).replace("TARGET", target))
    args = ["run", f"recipe={recipe}", f"cache_dir={shared_cache}", f"build_dir={tmp_path}/b"]
    assert main(args) == 0, capsys.readouterr().err
    out = tmp_path / "b" / "recipe" / f"{target}-none"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["verified"] is True and metrics["agreement"]["max_relative_diff"] <= 1e-5
    rules = target_rules(recipe, shared_cache, tmp_path / "b")
    assert rules["onnx.unroll_loop"]["matches"] == 1

    capsys.readouterr()
    assert main([*args, "target_rewrites=false"]) == 2
    err = capsys.readouterr().err
    assert "Loop" in err and "onnx.unroll_loop" in err


@pytest.mark.slow
@needs_tflite
def test_a_torchscript_loop_over_a_list_builds_and_verifies_on_tflite_micro(
    tmp_path: Path, shared_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """TorchScript's export of a loop appending to a list that is stacked (Loop,
    SequenceEmpty, SequenceInsert, ConcatFromSequence): after onnx.unroll_loop, Gemm, Tanh and
    one Concat + Reshape. Measured: max relative diff 1.8e-7."""
    import onnx

    from tests.rules.onnx.test_unroll_loop import scripted_loop

    onnx.save(scripted_loop(), str(tmp_path / "loop.onnx"))
    data = np.random.default_rng(1).standard_normal((8, 8)).astype(np.float32)
    np.savez(tmp_path / "data.npz", x=data)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(textwrap.dedent(RECIPE).replace("TARGET", "tflite_micro"))
    args = ["run", f"recipe={recipe}", f"cache_dir={shared_cache}", f"build_dir={tmp_path}/b"]
    assert main(args) == 0, capsys.readouterr().err
    out = tmp_path / "b" / "recipe" / "tflite_micro-none"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["verified"] is True and metrics["agreement"]["max_relative_diff"] <= 1e-5
