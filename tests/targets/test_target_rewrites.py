"""Target default rewrites: a profile's `rewrites:` run on every build for it, shown in the
report, and a recipe can turn them off or replace one."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from edgeflow.cli import main
from edgeflow.core.errors import RecipeError
from edgeflow.engine.cache import Cache
from edgeflow.engine.runner import run_build
from edgeflow.recipe import load_recipe
from edgeflow.rules.onnx.decompose import SUPPORTED
from edgeflow.targets import load_profile
from tests.targets.conftest import needs_tflite
from tests.targets.test_armnn import needs_armnn

MODEL = '''
import torch
from torch import nn


class Net(nn.Module):
    """A conv net with the activations Arm NN's TfLite parser lacks."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        y = nn.functional.hardsigmoid(self.conv(x)) * nn.functional.gelu(self.conv(x))
        return self.head(y.mean(dim=(2, 3)))
'''
RECIPE = """
    source:
      kind: pytorch
      model: net.py:Net
      inputs: [{name: image, shape: [1, 3, 16, 16], dtype: float32}]
    evaluation:
      dataset: edgeflow.datasets:sample_image_crops
      split: test
      options: {size: [16, 16], count: 8, input_name: image}
      metric: agreement
    quantization: {mode: none}
    target: armnn
    verify: {max_relative_diff: 1.0e-3}
"""


@pytest.mark.parametrize("name", ["tflite", "tflite_micro", "armnn"])
def test_default_decompositions_follow_the_measured_operator_list(name: str) -> None:
    """Each profile decomposes exactly the ops onnx.decompose handles that its measured list
    lacks or takes only in some forms (a check: ReduceL2 of a 2-D tensor on the TFLite
    family): rederive the list, and this test says which default to change."""
    profile = load_profile(name)
    assert profile.operators is not None
    ops = profile.operators
    missing = sorted(op for op in SUPPORTED if op not in ops or ops[op].checks)
    [entry] = [e for e in profile.rewrites if e["rule"] == "onnx.decompose"]
    assert sorted(entry["ops"]) == missing


@pytest.mark.parametrize(
    "name", ["tflite", "tflite_micro", "armnn", "onnxruntime_micro", "tensorrt"]
)
def test_no_target_unrolls_recurrent_layers_in_onnx(name: str) -> None:
    """The TFLite family converts LSTM and GRU itself, as the runtime's sequence operator
    or looped or unrolled in TensorFlow with each weight stored once (targets/_onnx2tf_recurrent.py;
    onnx2tf converts onnx.unroll_recurrent's graph of a 160-step LSTM for far more than 15
    minutes); the ONNX runtimes have native kernels."""
    assert "onnx.unroll_recurrent" not in [e["rule"] for e in load_profile(name).rewrites]


@pytest.mark.parametrize(
    "name", ["tflite", "tflite_micro", "armnn", "onnxruntime_micro", "tensorrt"]
)
def test_static_loops_are_unrolled_first_where_the_target_has_no_loop(name: str) -> None:
    """onnx2tf 1.28.8 has no Loop converter: the TFLite family unrolls a static Loop before
    any other rule but onnx.fold_constants (which computes a trip count from constants), so
    the rules after it see the bodies' nodes; the ONNX runtimes run Loop."""
    profile = load_profile(name)
    assert profile.operators is not None
    rules = [e["rule"] for e in profile.rewrites]
    if "Loop" in profile.operators:
        assert name in ("onnxruntime_micro", "tensorrt") and "onnx.unroll_loop" not in rules
    else:
        assert rules[:2] == ["onnx.fold_constants", "onnx.unroll_loop"]


@pytest.mark.parametrize(
    "name", ["tflite", "tflite_micro", "armnn", "onnxruntime_micro", "tensorrt"]
)
def test_tiles_become_concats_where_the_target_has_no_tile(name: str) -> None:
    """TFLite Micro and Arm NN have no TILE (measured lists); LiteRT and the ONNX runtimes do."""
    profile = load_profile(name)
    assert profile.operators is not None
    rules = [e["rule"] for e in profile.rewrites]
    assert ("onnx.tile_to_concat" in rules) == ("Tile" not in profile.operators)


def test_a_profile_takes_only_known_onnx_rules(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "targets").mkdir()
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "targets" / "board.yaml"
    path.write_text("extends: tflite\nrewrites:\n  - {rule: fx.fuse_conv_bn}\n")
    with pytest.raises(
        RecipeError, match=r"board.yaml:\d+:\d+: rewrites: .*'fx.fuse_conv_bn' is an fx"
    ):
        load_profile("board")
    path.write_text("extends: tflite\nrewrites:\n  - {rule: onnx.decompos}\n")
    with pytest.raises(
        RecipeError, match=r"unknown rule 'onnx\.decompos' did you mean 'onnx\.decompose'"
    ):
        load_profile("board")
    path.write_text("extends: tflite\nrewrites: []\n")
    assert load_profile("board").rewrite_specs() == []  # an extending profile can drop them


def target_rules(recipe: Path, cache_dir: Path, build_root: Path) -> dict[str, dict]:
    """The rewrite_target stage's record of each rule, by name, of a build that just ran
    (run again, every stage is cached, and the outcomes name the entries)."""
    cache = Cache(cache_dir)
    result = run_build(load_recipe(recipe), cache, build_root, lambda line: None)
    [key] = [o.key for o in result.outcomes if o.stage == "rewrite_target"]
    info = json.loads((cache.entry("rewrite_target", key) / "rewrite_target.json").read_text())
    return {r["rule"]: r for r in info["rules"]}


@pytest.mark.slow
@needs_tflite
@needs_armnn
def test_armnn_builds_decompose_what_its_parser_lacks(
    tmp_path: Path, shared_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "net.py").write_text(MODEL)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(textwrap.dedent(RECIPE))
    args = ["run", f"recipe={recipe}", f"cache_dir={shared_cache}", f"build_dir={tmp_path}/b"]
    assert main(args) == 0
    out = tmp_path / "b" / "recipe" / "armnn-none"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["verified"] is True and metrics["agreement"]["max_relative_diff"] <= 1e-3
    report = (out / "report.md").read_text()
    assert "target rewrites of `armnn`" in report
    # the exporter writes gelu as Erf (x/2 (1 + erf(x/sqrt2))): HardSigmoid and Erf decomposed
    decompose = target_rules(recipe, shared_cache, tmp_path / "b")["onnx.decompose"]
    assert [s["status"] for s in decompose["sites"]] == ["changed", "changed"]

    capsys.readouterr()
    assert main([*args, "target_rewrites=false"]) == 2  # the recipe turns them off
    err = capsys.readouterr().err
    assert "stage 'precheck' failed: the model does not pass the armnn precheck" in err
    assert "Erf" in err and "HardSigmoid" in err


BLOCKS = '''
import torch
from torch import nn


class Blocks(nn.Module):
    """One of each construct the coverage models brought to Arm NN and TFLite Micro: padded
    MaxPool (resnet), grouped Conv (regnet), LayerNorm and 5-D qkv attention (mobilevit,
    levit), bilinear upsampling (lraspp). image_out=False returns the attention's tokens:
    onnx2tf 1.28.8 gets the tokens-to-image Transpose/Reshape before the upsampling wrong
    (relative error 1.7 on tflite, with or without the rewrites), and Arm NN's parser takes
    the rewritten graph right."""

    def __init__(self, image_out=True):
        super().__init__()
        torch.manual_seed(0)
        self.image_out = image_out
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(3, 2, padding=1)
        self.grouped = nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.norm = nn.LayerNorm(8)
        self.qkv = nn.Linear(8, 24)
        self.proj = nn.Linear(8, 8, bias=False)

    def forward(self, x):
        y = self.grouped(self.pool(torch.relu(self.stem(x))))
        b, c, h, w = y.shape
        t = self.norm(y.flatten(2).transpose(1, 2))
        q, k, v = self.qkv(t).reshape(b, h * w, 3, 2, 4).permute(2, 0, 3, 1, 4).unbind(0)
        a = (q @ k.transpose(-2, -1) * 0.5).softmax(-1)
        t = self.proj((a @ v).transpose(1, 2).reshape(b, h * w, c))
        if not self.image_out:
            return t
        y = t.transpose(1, 2).reshape(b, c, h, w)
        return nn.functional.interpolate(y, scale_factor=2.0, mode="bilinear")
'''


@pytest.mark.slow
@needs_tflite
@needs_armnn
@pytest.mark.parametrize("target", ["armnn", "tflite_micro"])
def test_default_rewrites_carry_the_coverage_constructs(
    target: str, tmp_path: Path, shared_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Verified within 1e-3 of PyTorch with the target's defaults; without them, the precheck
    names the constructs and the rule for each."""
    (tmp_path / "net.py").write_text(BLOCKS)
    recipe = tmp_path / "recipe.yaml"
    text = textwrap.dedent(RECIPE).replace("net.py:Net", "net.py:Blocks")
    if target == "tflite_micro":
        text = text.replace(
            "model: net.py:Blocks", "model: net.py:Blocks\n  init: {image_out: false}"
        )
    recipe.write_text(text.replace("target: armnn", f"target: {target}"))
    args = ["run", f"recipe={recipe}", f"cache_dir={shared_cache}", f"build_dir={tmp_path}/b"]
    assert main(args) == 0, capsys.readouterr().err
    out = tmp_path / "b" / "recipe" / f"{target}-none"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["verified"] is True and metrics["agreement"]["max_relative_diff"] <= 1e-3
    rules = target_rules(recipe, shared_cache, tmp_path / "b")
    expected = {
        "armnn": {"onnx.sqrt_newton": 1, "onnx.maxpool_edge_pad": 1, "onnx.split_groups": 1,
                  "onnx.lower_matmul": 4, "onnx.resize_to_matmul": 1, "onnx.slice_rank": 3},
        "tflite_micro": {"onnx.slice_rank": 3},
    }  # fmt: skip
    for rule, matches in expected[target].items():
        changed = [s for s in rules[rule]["sites"] if s["status"] == "changed"]
        assert rules[rule]["matches"] == len(changed) == matches, rule

    capsys.readouterr()
    assert main([*args, "target_rewrites=false"]) == 2
    err = capsys.readouterr().err
    suggestions = {
        "armnn": ["onnx.split_groups", "onnx.lower_matmul", "onnx.resize_to_matmul",
                  "onnx.slice_rank"],
        "tflite_micro": ["onnx.slice_rank"],
    }  # fmt: skip
    for rule in suggestions[target]:
        assert rule in err, rule


def ops_graph(path: Path, norms: bool = True) -> Path:
    """Conv -> PRelu (per-channel slope) -> edge Pad -> reflect Pad -> a Slice of the channels
    and the width -> LpNormalization + ReduceL2 over the channels: each of these is an op or
    form Arm NN's parser lacks (PRELU, MIRROR_PAD, SUM, SQUARE) or onnx2tf converts wrong
    (a Slice of the channel axis and another). norms=False ends at the Slice (+ a Relu): the
    int8 form of the norms' Newton square root aborts every runtime."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    consts = {
        "w": rng.standard_normal((6, 3, 3, 3)).astype(np.float32),
        "b": rng.standard_normal(6).astype(np.float32),
        "slope": rng.uniform(0.05, 0.5, (6, 1, 1)).astype(np.float32),
        "edge": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64),
        "mirror": np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64),
        "starts": np.array([1, 2], np.int64),
        "ends": np.array([5, 20], np.int64),
        "axes": np.array([1, 3], np.int64),
    }
    node = helper.make_node
    nodes = [
        node("Conv", ["image", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        node("PRelu", ["c", "slope"], ["p"]),
        node("Pad", ["p", "edge"], ["e"], mode="edge"),
        node("Pad", ["e", "mirror"], ["r"], mode="reflect"),
        node("Slice", ["r", "starts", "ends", "axes"], ["s"]),
        node("LpNormalization", ["s"], ["q"], axis=1),
        node("ReduceL2", ["s"], ["n"], axes=[1]),
        node("Add", ["q", "n"], ["y"]),
    ]
    if not norms:
        nodes[-3:] = [node("Relu", ["s"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "ops",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 21, 18])],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


@pytest.mark.slow
@needs_tflite
@needs_armnn
@pytest.mark.parametrize("target", ["armnn", "tflite_micro", "tflite"])
def test_default_rewrites_carry_prelu_l2_norms_mirror_pads_and_two_axis_slices(
    target: str, tmp_path: Path, shared_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Verified within 1e-3 of onnxruntime on the source graph with the target's defaults;
    without them, the precheck names the rule for each construct."""
    ops_graph(tmp_path / "ops.onnx")
    recipe = tmp_path / "recipe.yaml"
    text = textwrap.dedent(RECIPE).replace(
        "kind: pytorch\n  model: net.py:Net", "kind: onnx\n  model: ops.onnx"
    )
    recipe.write_text(text.replace("target: armnn", f"target: {target}"))
    args = ["run", f"recipe={recipe}", f"cache_dir={shared_cache}", f"build_dir={tmp_path}/b"]
    assert main(args) == 0, capsys.readouterr().err
    out = tmp_path / "b" / "recipe" / f"{target}-none"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["verified"] is True and metrics["agreement"]["max_relative_diff"] <= 1e-3
    assert metrics["agreement"]["max_relative_diff"] <= 1e-6  # exact rewrites: float rounding
    rules = target_rules(recipe, shared_cache, tmp_path / "b")
    expected = {
        "armnn": {"onnx.decompose": 3, "onnx.pad_with_concat": 2, "onnx.split_slice": 1,
                  "onnx.sqrt_newton": 2},
        "tflite_micro": {"onnx.split_slice": 1},
        "tflite": {"onnx.split_slice": 1},
    }  # fmt: skip
    for rule, matches in expected[target].items():
        changed = [s for s in rules[rule]["sites"] if s["status"] == "changed"]
        assert rules[rule]["matches"] == len(changed) == matches, rule

    capsys.readouterr()
    assert main([*args, "target_rewrites=false"]) == 2
    err = capsys.readouterr().err
    suggestions = {
        "armnn": ["onnx.decompose", "onnx.pad_with_concat", "onnx.split_slice"],
        "tflite_micro": ["onnx.split_slice"],
        "tflite": ["onnx.split_slice"],
    }
    for rule in suggestions[target]:
        assert rule in err, rule


@pytest.mark.slow
@needs_tflite
@needs_armnn
def test_armnn_int8_runs_prelu_mirror_pads_and_two_axis_slices(
    tmp_path: Path, shared_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Per-tensor int8 on Arm NN with its defaults: verified, SQNR against onnxruntime."""
    ops_graph(tmp_path / "ops.onnx", norms=False)
    recipe = tmp_path / "recipe.yaml"
    text = textwrap.dedent(RECIPE).replace(
        "kind: pytorch\n  model: net.py:Net", "kind: onnx\n  model: ops.onnx"
    )
    calibration = (
        "calibration:\n  dataset: edgeflow.datasets:sample_image_crops\n  split: calibration\n"
        "  options: {size: [16, 16], count: 8, input_name: image}\n"
    )
    text = text.replace("quantization: {mode: none}", calibration + "quantization: {mode: int8}")
    recipe.write_text(text.replace("max_relative_diff: 1.0e-3", "min_sqnr_db: 25"))
    args = ["run", f"recipe={recipe}", f"cache_dir={shared_cache}", f"build_dir={tmp_path}/b"]
    assert main(args) == 0, capsys.readouterr().err
    metrics = json.loads((tmp_path / "b" / "recipe" / "armnn-int8" / "metrics.json").read_text())
    assert metrics["verified"] is True
    # measured: 41.4 dB, max relative error 0.011 (the probes' per-op int8 errors: 0.004-0.009)
    assert metrics["agreement"]["min_sqnr_db"] >= 35
    assert metrics["agreement"]["max_relative_diff"] <= 0.02
