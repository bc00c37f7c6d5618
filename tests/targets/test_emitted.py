"""What the converter really wrote: TFLite-family builds judge the .tflite's operators, with
the options that matter (a fused activation, a mirror-pad mode), against the profile's
measured builtins after conversion and before the target's runtime loads the file; and the
padding onnx2tf writes as PADV2, or computes wrong, converts right on all three targets."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from edgeflow.cli import main
from edgeflow.engine.cache import Cache
from edgeflow.engine.runner import run_build
from edgeflow.recipe import load_recipe
from edgeflow.targets import load_profile
from edgeflow.targets.precheck import check_builtins
from tests.rules.onnx.helpers import model
from tests.targets.conftest import needs_tflite
from tests.targets.test_armnn import needs_armnn
from tests.targets.test_target_rewrites import target_rules

RECIPE = """
    source: {kind: onnx, model: m.onnx, inputs: [{name: x, shape: SHAPE}]}
    evaluation: {dataset: data.npz, metric: agreement}
    quantization: {mode: none}
    target: TARGET
    verify: {max_relative_diff: 1.0e-5, latency_runs: 2, warmup_runs: 0}
"""


def padding_graph(path: Path, opset: int) -> Path:
    """MaxPool 3x3 stride 2 with ceil_mode on 10x10 (a partial last window), then a Pad with
    the value 1.5: before opset 11 as the Pad's `value` attribute, from 11 on as its input."""
    pads = [0, 0, 1, 2, 0, 0, 2, 1]
    nodes = [
        helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    ]
    inits = {}
    if opset < 11:
        nodes.append(helper.make_node("Pad", ["p"], ["y"], pads=pads, value=1.5))
    else:
        nodes.append(helper.make_node("Pad", ["p", "pads", "v"], ["y"]))
        inits = {"pads": np.array(pads, np.int64), "v": np.array(1.5, np.float32)}
    io = ([("x", T.FLOAT, [1, 3, 10, 10])], [("y", T.FLOAT, [1, 3, 8, 8])])
    onnx.save(model(nodes, *io, inits, opset=opset), str(path))
    return path


def fused_clip_graph(path: Path) -> Path:
    """Gemm (with a bias) then Clip(-1, 1): onnx2tf fuses the Clip into the FULLY_CONNECTED
    as its RELU_N1_TO_1 activation, which Arm NN 22's parser refuses."""
    rng = np.random.default_rng(0)
    consts = {
        "w": (rng.standard_normal((12, 7)) * 0.3).astype(np.float32),
        "b": np.full(7, 0.1, np.float32),
        "lo": np.array(-1.0, np.float32),
        "hi": np.array(1.0, np.float32),
    }
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["g"]),
        helper.make_node("Clip", ["g", "lo", "hi"], ["y"]),
    ]
    io = ([("x", T.FLOAT, [1, 12])], [("y", T.FLOAT, [1, 7])])
    onnx.save(model(nodes, *io, consts, opset=17), str(path))
    return path


def stage_record(recipe: Path, cache_dir: Path, build_root: Path, stage: str) -> dict:
    """`<stage>.json` from the cache entry of a build that just ran (run again: all cached)."""
    cache = Cache(cache_dir)
    result = run_build(load_recipe(recipe), cache, build_root, lambda line: None)
    [key] = [o.key for o in result.outcomes if o.stage == stage]
    return json.loads((cache.entry(stage, key) / f"{stage}.json").read_text())


def write_recipe(tmp_path: Path, target: str, shape: list[int]) -> Path:
    data = np.random.default_rng(1).standard_normal((4, *shape[1:])).astype(np.float32) * 2
    np.savez(tmp_path / "data.npz", x=data)
    recipe = tmp_path / "recipe.yaml"
    text = textwrap.dedent(RECIPE).replace("TARGET", target).replace("SHAPE", str(shape))
    recipe.write_text(text)
    return recipe


def test_an_option_no_probe_measured_is_judged_by_its_builtin() -> None:
    """FULLY_CONNECTED with a fused RELU_N1_TO_1 was measured to fail on Arm NN (the
    "Gemm fused Clip" probe); with RELU, which no probe fused, it is judged as the
    FULLY_CONNECTED the probes ran."""
    armnn = load_profile("armnn")
    [finding] = check_builtins({"FULLY_CONNECTED(RELU_N1_TO_1)": 1}, armnn, "none")
    assert finding.severity == "error" and "fused activation" in finding.reason
    assert check_builtins({"FULLY_CONNECTED(RELU)": 2, "FULLY_CONNECTED": 1}, armnn, "none") == []
    assert (
        check_builtins({"FULLY_CONNECTED(RELU_N1_TO_1)": 1}, load_profile("tflite"), "none") == []
    )
    [padv2] = check_builtins({"PADV2": 1}, armnn, "none")
    assert padv2.severity == "error" and "PADV2" in padv2.reason
    # after an ONNX conversion nothing is suggested (the precheck of the ONNX graph suggested
    # the rules); the native path names the ONNX path
    assert padv2.rule == ""
    [native] = check_builtins({"PADV2": 1}, armnn, "none", remedy="(convert.via: onnx)")
    assert native.rule == "(convert.via: onnx)"


@needs_tflite
def test_counts_name_fused_activations_and_mirror_pad_modes(tmp_path: Path) -> None:
    """TensorFlow's own converter on a Dense with relu6 and a reflect pad."""
    import tensorflow as tf

    from edgeflow.targets import emitted

    @tf.function(input_signature=[tf.TensorSpec([1, 6, 4], tf.float32)])
    def model(x: tf.Tensor) -> tf.Tensor:
        padded = tf.pad(x, [[0, 0], [1, 1], [0, 0]], mode="REFLECT")
        return tf.nn.relu6(tf.matmul(tf.reshape(padded, [8, 4]), tf.ones([4, 3])) + 1.0)

    converter = tf.lite.TFLiteConverter.from_concrete_functions([model.get_concrete_function()])
    path = tmp_path / "m.tflite"
    path.write_bytes(converter.convert())
    found = emitted.counts(path, "tflite")
    assert found["MIRROR_PAD(REFLECT)"] == 1
    assert found["FULLY_CONNECTED(RELU6)"] == 1
    assert emitted.base("FULLY_CONNECTED(RELU6)") == "FULLY_CONNECTED"


@pytest.mark.slow
@needs_tflite
@needs_armnn
def test_an_operator_the_runtime_refuses_stops_the_build_before_it_loads(
    tmp_path: Path, shared_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The ONNX precheck passes Gemm + Clip on armnn (both ops run there); the .tflite holds
    FULLY_CONNECTED(RELU_N1_TO_1), measured to fail, so convert stops with the table (exit
    2) before Arm NN loads it. precheck.continue_on_failure lets the runtime try, and Arm NN's
    parser then refuses it at load, as measured."""
    fused_clip_graph(tmp_path / "m.onnx")
    recipe = write_recipe(tmp_path, "armnn", [1, 12])
    args = ["run", f"recipe={recipe}", f"cache_dir={shared_cache}", f"build_dir={tmp_path}/b"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "convert" in err and "FULLY_CONNECTED(RELU_N1_TO_1)" in err
    assert "measured to fail on armnn none" in err and "fused activation" in err
    assert "Arm NN failed while loading" not in err  # stopped before the runtime

    assert main([*args, "precheck.continue_on_failure=true"]) != 0
    out, err = capsys.readouterr()
    assert "continuing because the recipe sets precheck.continue_on_failure" in out + err
    assert "stage 'verify' failed: Arm NN failed while loading" in err
    assert "fused activation" in err  # now in Arm NN's own words, at load


@pytest.mark.slow
@needs_tflite
@needs_armnn
@pytest.mark.parametrize("opset", [10, 17])
@pytest.mark.parametrize("target", ["tflite", "tflite_micro", "armnn"])
def test_ceil_mode_pools_and_pads_with_a_value_verify_on_every_tflite_target(
    target: str, opset: int, tmp_path: Path, shared_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Measured without the rules: onnx2tf computes the ceil-mode pool wrong on all three
    (relative error 0.44), writes the Pad's 1.5 as PADV2 (which Arm NN's parser refuses)
    and, before opset 11, drops it. With the targets' defaults (onnx.maxpool_edge_pad; on
    armnn onnx.pad_with_concat; an opset-10 file moved to opset 11 on ingest) every build
    verifies exactly; without them, the precheck names the rules."""
    padding_graph(tmp_path / "m.onnx", opset)
    recipe = write_recipe(tmp_path, target, [1, 3, 10, 10])
    args = ["run", f"recipe={recipe}", f"cache_dir={shared_cache}", f"build_dir={tmp_path}/b"]
    assert main(args) == 0, capsys.readouterr().err
    out = tmp_path / "b" / "recipe" / f"{target}-none"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["verified"] is True and metrics["agreement"]["max_relative_diff"] <= 1e-6
    convert = stage_record(recipe, shared_cache, tmp_path / "b", "convert")
    assert not [f for f in convert["emitted"] if f["severity"] == "error"]
    if target == "armnn":
        assert "PADV2" not in convert["operators"]
    rules = target_rules(recipe, shared_cache, tmp_path / "b")
    assert rules["onnx.maxpool_edge_pad"]["matches"] == 1
    if target == "armnn":
        assert rules["onnx.pad_with_concat"]["matches"] == 1

    capsys.readouterr()
    assert main([*args, "target_rewrites=false"]) == 2
    err = capsys.readouterr().err
    assert "no_partial_window" in err or "partial last window" in err
    assert "onnx.maxpool_edge_pad" in err
    if target == "armnn":
        assert "onnx.pad_with_concat" in err
