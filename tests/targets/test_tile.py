"""Tile end to end: torch's `x.repeat(...)` as ONNX Tile, built for TFLite Micro and Arm NN
(no TILE kernel: onnx.tile_to_concat is their default) and verified against onnxruntime."""

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
    source: {kind: onnx, model: tile.onnx, inputs: [{name: x, shape: [1, 3, 4, 4]}]}
    evaluation: {dataset: data.npz, metric: agreement}
    quantization: {mode: none}
    target: TARGET
    verify: {max_relative_diff: 1.0e-5, latency_runs: 2, warmup_runs: 0}
"""


def repeats(path: Path) -> Path:
    """Two Tiles of runtime tensors: a = Conv(x) repeated twice over the channels
    [1, 6, 4, 4], b = Relu(x) repeated 2 x 2 over the image [1, 3, 8, 8]."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    consts = {
        "w": rng.standard_normal((3, 3, 3, 3)).astype(np.float32),
        "channels": np.array([1, 2, 1, 1], np.int64),
        "image": np.array([1, 1, 2, 2], np.int64),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Tile", ["c", "channels"], ["a"], name="tile_channels"),
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Tile", ["r", "image"], ["b"], name="tile_image"),
    ]
    v = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes,
        "tile",
        [v("x", T.FLOAT, [1, 3, 4, 4])],
        [v("a", T.FLOAT, [1, 6, 4, 4]), v("b", T.FLOAT, [1, 3, 8, 8])],
        [numpy_helper.from_array(value, name) for name, value in consts.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


@pytest.mark.slow
@needs_tflite
@needs_armnn
@pytest.mark.parametrize("target", ["tflite_micro", "armnn"])
def test_tiles_build_and_verify_on_targets_without_tile(
    target: str, tmp_path: Path, shared_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Verified within 1e-5 relative (measured: 2.2e-7 tflite_micro, 1.5e-7 armnn, the Conv's
    rounding: the Concats copy values); without the target's rewrites the precheck names
    onnx.tile_to_concat for the Tiles."""
    repeats(tmp_path / "tile.onnx")
    data = np.random.default_rng(1).standard_normal((8, 3, 4, 4)).astype(np.float32)
    np.savez(tmp_path / "data.npz", x=data)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(textwrap.dedent(RECIPE).replace("TARGET", target))
    args = ["run", f"recipe={recipe}", f"cache_dir={shared_cache}", f"build_dir={tmp_path}/b"]
    assert main(args) == 0, capsys.readouterr().err
    out = tmp_path / "b" / "recipe" / f"{target}-none"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["verified"] is True and metrics["agreement"]["max_relative_diff"] <= 1e-5
    rules = target_rules(recipe, shared_cache, tmp_path / "b")
    assert rules["onnx.tile_to_concat"]["matches"] == 2

    capsys.readouterr()
    assert main([*args, "target_rewrites=false"]) == 2
    err = capsys.readouterr().err
    assert "Tile" in err and "onnx.tile_to_concat" in err
