"""`edgeflow init`: a recipe read from the model, that validates and builds on
onnxruntime_micro as written, for every source kind; proposals (batch axes, 0-D inputs,
state links) with their comments; random data to replace, or --data; no file overwritten."""

from __future__ import annotations

import re
import runpy
import shlex
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgeflow.cli import main
from edgeflow.engine.cache import Cache
from edgeflow.engine.runner import BuildResult, run_build
from edgeflow.recipe import load_recipe
from edgeflow.scaffold.model import Model, Output, Tensor, parse_input
from edgeflow.scaffold.render import ANCHORS, scalar, state_links
from tests import needs
from tests.conftest import REPO

RECIPE_DOCS = REPO / "docs" / "recipe.md"

CELL = '''
import torch
from torch import nn


class Cell(nn.Module):
    """A GRU cell over feature frames, its state passed in and out."""

    def __init__(self, features: int, hidden: int = 16) -> None:
        super().__init__()
        self.cell = nn.GRUCell(features, hidden)
        self.head = nn.Linear(hidden, 3)

    def forward(self, x: torch.Tensor, state: torch.Tensor):
        new_state = self.cell(x, state)
        return self.head(new_state), new_state
'''


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a Markdown file's headings."""
    found = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            text = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^a-z0-9 _-]", "", text).replace(" ", "-"))
    return found


def _two_outputs(path: Path) -> Path:
    """An ONNX file with an open batch and open spatial dims, and two outputs."""
    x = helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, "H", "W"])
    nodes = [
        helper.make_node("Relu", ["image"], ["features"]),
        helper.make_node("ReduceMean", ["features"], ["pooled"], axes=[2, 3], keepdims=0),
    ]
    outputs = [
        helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["N", 3]),
        helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 3, "H", "W"]),
    ]
    graph = helper.make_graph(nodes, "two", [x], outputs)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _mixed(path: Path) -> Path:
    """An ONNX file with a 0-D input, an int64 and a bool input sharing an open length."""
    T = TensorProto
    nodes = [
        helper.make_node("Mul", ["x", "gain"], ["scaled"]),
        helper.make_node("Cast", ["ids"], ["idsf"], to=T.FLOAT),
        helper.make_node("Cast", ["mask"], ["maskf"], to=T.FLOAT),
        helper.make_node("Mul", ["idsf", "maskf"], ["masked"]),
        helper.make_node("ReduceSum", ["masked"], ["total"], keepdims=1),
        helper.make_node("Add", ["scaled", "total"], ["out"]),
    ]
    inputs = [
        helper.make_tensor_value_info("x", T.FLOAT, ["N", 4]),
        helper.make_tensor_value_info("gain", T.FLOAT, []),
        helper.make_tensor_value_info("ids", T.INT64, ["N", "T"]),
        helper.make_tensor_value_info("mask", T.BOOL, ["N", "T"]),
    ]
    out = [helper.make_tensor_value_info("out", T.FLOAT, ["N", 4])]
    graph = helper.make_graph(nodes, "mixed", inputs, out)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _init(capsys, *args: str) -> tuple[int, str, str]:
    status = main(["init", *args])
    out, err = capsys.readouterr()
    return status, out, err


def _build(path: Path, cache: Path) -> BuildResult:
    return run_build(load_recipe(path), Cache(cache), path.parent / "build", lambda line: None)


def _verified(result: BuildResult) -> None:
    assert result.failed_checks == [], result.failed_checks
    assert result.metrics["verified"] is True
    assert result.metrics["agreement"]["max_relative_diff"] <= 1e-3


# --------------------------------------------------------------------------- the recipe text


def test_every_anchor_is_a_heading_of_the_recipe_reference() -> None:
    assert set(ANCHORS.values()) <= _anchors(RECIPE_DOCS.read_text(encoding="utf-8"))
    workflows = (REPO / "docs" / "workflows.md").read_text(encoding="utf-8")
    assert "start-from-a-model-file-edgeflow-init" in _anchors(workflows)  # README links it


def test_an_onnx_file_every_key_commented_and_valid(tmp_path: Path, monkeypatch, capsys) -> None:
    """Open dims defaulted and said so, the outputs named, every key line with a comment
    pointing to an existing section; the recipe and the data validate as written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipes").mkdir()
    _two_outputs(tmp_path / "two.onnx")
    status, out, err = _init(capsys, "two.onnx")
    assert status == 0, err
    recipe = tmp_path / "recipes" / "two.yaml"
    assert f"wrote {Path('recipes/two.yaml')}" in out
    text = recipe.read_text(encoding="utf-8")
    anchors = _anchors(RECIPE_DOCS.read_text(encoding="utf-8"))
    keys = [line for line in text.splitlines() if re.match(r"\s*(- )?[a-z_]+:", line)]
    assert len(keys) >= 20
    for line in keys:
        pointer = re.search(r"# .*\(docs/recipe\.md#([a-z0-9_-]+)\)$", line)
        assert pointer and pointer[1] in anchors, line
    assert text.startswith("# Written by `edgeflow init two.onnx`.")
    assert "RANDOM" in text and "REPLACE WITH YOUR DATA" in text
    assert "SET THE REAL SIZE" in text.split("shape: [1, 3, 32, 32]")[1].splitlines()[0]
    source = load_recipe(recipe).recipe.source
    assert source.model == tmp_path / "two.onnx"
    assert source.outputs == ["pooled", "features"]
    [image] = source.inputs
    assert (image.shape, image.dtype, image.batch_axis) == ([1, 3, 32, 32], "float32", 0)
    data = (tmp_path / "recipes" / "data.py").read_text(encoding="utf-8")
    assert "REPLACE WITH YOUR REAL DATA" in data and "def samples(split" in data
    loaded = load_recipe(recipe)
    from edgeflow.data import load_samples

    samples = load_samples(loaded.recipe.evaluation, source.inputs, "evaluation")
    assert samples.inputs["image"].shape == (32, 3, 32, 32)
    assert samples.inputs["image"].dtype == np.float32


def test_a_0d_input_int_and_bool_inputs_and_a_shared_open_dim(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _mixed(tmp_path / "mixed.onnx")
    status, _, err = _init(capsys, "mixed.onnx", "--input", "mask:1x6")
    assert status == 0, err
    loaded = load_recipe(tmp_path / "mixed.yaml")
    found = {s.name: (s.shape, s.dtype, s.batch_axis) for s in loaded.recipe.source.inputs}
    assert found == {
        "x": ([1, 4], "float32", 0),
        "gain": ([], "float32", None),
        "ids": ([1, 6], "int64", 0),  # the length --input gave mask: both are T
        "mask": ([1, 6], "bool", 0),
    }
    text = (tmp_path / "mixed.yaml").read_text(encoding="utf-8")
    assert "batch_axis: null          # 0-D" in text
    samples = runpy.run_path(str(tmp_path / "data.py"))["samples"]("test")
    assert {k: (v.shape, v.dtype) for k, v in samples.items()} == {
        "x": ((32, 4), np.float32),
        "gain": ((), np.float32),
        "ids": ((32, 6), np.int64),
        "mask": ((32, 6), np.bool_),
    }
    assert samples["ids"].max() < 4


def test_scalars_read_back_as_written() -> None:
    from ruamel.yaml import YAML

    values = [1e-05, 0.001, 16, True, None, "yes", "a:b", "x", [1, 2.5], {"k": "v w"}, "out.1"]
    values += ["../m/x.onnx", ".inf", "./a", "-1", "1e3", "~", "null", "y"]
    for value in values:
        assert YAML(typ="safe", pure=True).load(f"v: {scalar(value)}")["v"] == value


@pytest.mark.parametrize(
    ("text", "name", "shape", "dtype"),
    [
        ("x:1x3x32x32", "x", (1, 3, 32, 32), None),
        ("ids:1x16:int64", "ids", (1, 16), "int64"),
        ("gain:scalar", "gain", (), None),
        ("serving_default_x:0:1x4:float32", "serving_default_x:0", (1, 4), "float32"),
    ],
)
def test_input_syntax(text: str, name: str, shape: tuple, dtype: str | None) -> None:
    given = parse_input(text)
    assert (given.name, given.shape, given.dtype) == (name, shape, dtype)


@pytest.mark.parametrize("text", ["x", "x:1x0", "x:[1,3]", ":1x3", "x:1xfloat32"])
def test_bad_input_syntax(text: str, capsys) -> None:
    assert main(["init", "whatever.onnx", "--input", text]) == 2
    assert "hint: " in capsys.readouterr().err


def _model(inputs: dict[str, tuple], outputs: dict[str, tuple], of_input=None) -> Model:
    tensors = tuple(Tensor(n, s, "float32") for n, s in inputs.items())
    outs = tuple(Output(n, s, (of_input or {}).get(n)) for n, s in outputs.items())
    return Model("onnx", "", None, tensors, outs)


@pytest.mark.parametrize(
    ("state", "output"),
    [
        ("state", "new_state"),
        ("h", "h_out"),
        ("state_in", "state_out"),
        ("h0", "hn"),
        ("prev_hidden", "next_hidden"),
    ],
)
def test_a_state_pair_is_proposed_by_name_and_shape(state: str, output: str) -> None:
    model = _model({"x": (1, 8), state: (1, 16)}, {"y": (1, 3), output: (1, 16)})
    [link] = state_links(model)
    assert (link.input, link.output) == (state, output)


def test_no_state_without_a_data_input_or_a_fitting_shape() -> None:
    # the output holds the input's name but not its shape
    assert state_links(_model({"x": (1, 8), "h": (1, 16)}, {"h_out": (1, 8)})) == ()
    # an input's shape, but no name in common: a residual block, not a state
    assert state_links(_model({"x": (1, 8), "h": (1, 8)}, {"y": (1, 8)})) == ()
    # every input would be a state: nothing left for the data
    assert state_links(_model({"h": (1, 8)}, {"h_out": (1, 8)})) == ()
    # forward returned its own input variable
    model = _model({"x": (1, 8), "h": (1, 16)}, {"y": (1, 3), "h_out": (1, 16)}, {"h_out": "h"})
    assert [link.why for link in state_links(model)] == [
        "forward returns its variable h, of its shape"
    ]


# ----------------------------------------------------------------------- refusals and hints


def test_refuses_to_overwrite_either_file(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    _two_outputs(tmp_path / "two.onnx")
    (tmp_path / "data.py").write_text("mine\n", encoding="utf-8")  # another recipe's
    status, _, _ = _init(capsys, "two.onnx")
    assert status == 0 and (tmp_path / "data.py").read_text(encoding="utf-8") == "mine\n"
    assert '"two_data.py:samples"' in (tmp_path / "two.yaml").read_text(encoding="utf-8")
    before = (tmp_path / "two.yaml").read_bytes()
    status, _, err = _init(capsys, "two.onnx")
    assert status == 2
    assert "two.yaml and two_data.py exist: edgeflow init does not overwrite files" in err
    assert (tmp_path / "two.yaml").read_bytes() == before
    hint = err.split("hint: ")[1].strip()
    assert hint.endswith("edgeflow init two.onnx --output two_2.yaml")
    assert main(shlex.split(hint.split(": ", 1)[1])[1:]) == 0  # works as printed
    before = (tmp_path / "two_2.yaml").read_bytes()
    status, _, err = _init(capsys, "two.onnx", "--output", "two_2.yaml")
    assert status == 2 and "two_2.yaml and two_2_data.py exist" in err
    assert (tmp_path / "two_2.yaml").read_bytes() == before


def test_data_file_instead_of_random_samples(tmp_path: Path, monkeypatch, capsys) -> None:
    """--data: the datasets read the file (its sizes fill the open dims), no data.py."""
    monkeypatch.chdir(tmp_path)
    _two_outputs(tmp_path / "two.onnx")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "imgs.npz", image=rng.standard_normal((5, 3, 16, 12)).astype(np.float32))
    np.savez(tmp_path / "bad.npz", img=np.zeros((5, 3, 16, 12), np.float32))
    status, _, err = _init(capsys, "two.onnx", "--data", "bad.npz")
    assert status == 2 and "no array 'image' (it has: img)" in err
    assert not list(tmp_path.glob("two*.py")) and not (tmp_path / "two.yaml").exists()
    status, _, err = _init(capsys, "two.onnx", "--data", "imgs.npz")
    assert status == 0, err
    assert not (tmp_path / "two_data.py").exists()
    recipe = load_recipe(tmp_path / "two.yaml").recipe
    assert recipe.source.inputs[0].shape == [1, 3, 16, 12]
    assert recipe.calibration is not None
    assert recipe.evaluation.dataset == recipe.calibration.dataset == tmp_path / "imgs.npz"
    assert "open dims 2, 3 from imgs.npz" in (tmp_path / "two.yaml").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("nothing.onnx", "nothing.onnx: no such file or folder"),
        ("folder", "folder is a folder without saved_model.pb: not a SavedModel"),
        ("net.py", "net.py is a Python file: name the class or function in it"),
        ("net.py:Missing", "'Missing' is not defined in net.py"),
        ("net.py:Cell --output x.txt", "--output x.txt: a recipe is a .yaml file"),
        ("two.onnx --input image:1x3x8", "two.onnx takes 'image' as ['?', 3, '?', '?']"),
        ("two.onnx --input img:1x3x8x8", "two.onnx has no input 'img'"),
        ("two.onnx --init a=1", "--init passes arguments to a class or a function"),
        ("two.onnx --target onnxruntime_mcu", "unknown target 'onnxruntime_mcu'"),
        ("net.py:Cell", "cannot call net.py:Cell(): "),
    ],
)
def test_user_errors(model: str, message: str, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    (tmp_path / "net.py").write_text(CELL, encoding="utf-8")
    _two_outputs(tmp_path / "two.onnx")
    status, _, err = _init(capsys, *model.split())
    assert status == 2 and message in err, err
    assert "hint: " in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "net.py", "two.onnx"]


def test_a_missing_input_shape_has_a_hint_that_works_as_printed(tmp_path, monkeypatch, capsys):
    """pkg.module:Class without --input: located at forward, the hint a command whose
    shapes (from the first layer) ran the model."""
    monkeypatch.chdir(tmp_path)
    status, _, err = _init(capsys, "edgeflow.zoo.digits:DigitsCNN")
    assert status == 2
    assert re.search(r"^error: digits\.py:\d+: DigitsCNN\.forward: no shape for image", err, re.M)
    command = err.split("hint: shapes that ran it: ")[1].strip()
    assert command == "edgeflow init edgeflow.zoo.digits:DigitsCNN --input image:1x1x32x32"
    assert main(shlex.split(command)[1:]) == 0
    recipe = load_recipe(tmp_path / "digits_cnn.yaml").recipe
    assert recipe.source.kind == "pytorch" and recipe.source.outputs == ["classifier"]
    assert recipe.source.inputs[0].shape == [1, 1, 32, 32]


# ----------------------------------------------------------------------- builds, every kind


@pytest.mark.slow
def test_onnx_files_build_and_verify(tmp_path: Path, monkeypatch, capsys, shared_cache) -> None:
    monkeypatch.chdir(tmp_path)
    _two_outputs(tmp_path / "two.onnx")
    _mixed(tmp_path / "mixed.onnx")
    assert _init(capsys, "two.onnx")[0] == 0
    assert _init(capsys, "mixed.onnx")[0] == 0
    for name in ("two", "mixed"):
        result = _build(tmp_path / f"{name}.yaml", shared_cache)
        _verified(result)
        assert (result.build_dir / "model.ort").is_file()
    assert set(result.metrics["agreement"]["outputs"]) == {"out"}


@pytest.mark.slow
def test_a_pytorch_file_with_a_state_builds_and_streams(
    tmp_path, monkeypatch, capsys, shared_cache
):
    """file.py:Class with a constructor argument and a state pair: the hint's shapes (the
    GRU cell's sizes), the state proposed on, the data sequences, verified step by step."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "cell.py").write_text(CELL, encoding="utf-8")
    (tmp_path / "recipes").mkdir()
    status, _, err = _init(capsys, "models/cell.py:Cell", "--init", "features=8")
    assert status == 2 and "cell.py:14: Cell.forward: no shape for x, state" in err
    command = err.split("hint: shapes that ran it: ")[1].strip()
    assert command.endswith("--init features=8 --input x:1x8 --input state:1x16")
    status, out, err = _init(capsys, *shlex.split(command)[2:])
    assert status == 0, err
    assert "state: state <- new_state proposed" in out
    path = tmp_path / "recipes" / "cell.yaml"
    source = load_recipe(path).recipe.source
    assert source.model.module == str(tmp_path / "models" / "cell.py")  # type: ignore[union-attr]
    assert source.init == {"features": 8}
    assert source.outputs == ["head", "new_state"]
    assert [(s.input, s.output) for s in source.state] == [("state", "new_state")]
    assert 'model: "../models/cell.py:Cell"' in path.read_text(encoding="utf-8")
    result = _build(path, shared_cache)
    _verified(result)
    assert result.metrics["stream"]["steps"] == 10


@pytest.mark.slow
@needs.mark("jax", "jax2onnx")
def test_a_jax_function_builds(tmp_path: Path, monkeypatch, capsys, shared_cache) -> None:
    monkeypatch.chdir(tmp_path)
    status, _, err = _init(capsys, "edgeflow.zoo.digits_flax:digits_cnn")
    assert status == 2
    command = err.split("hint: shapes that ran it: ")[1].strip()
    assert command.endswith("--input image:1x32x32x1")  # channel-last, from the first kernel
    status, _, err = _init(
        capsys, "edgeflow.zoo.digits_flax:digits_cnn", "--input", "image:1x8x8x1"
    )
    assert status == 0, err
    recipe = load_recipe(tmp_path / "digits_cnn.yaml").recipe
    assert recipe.source.kind == "jax" and recipe.source.outputs == ["output"]
    _verified(_build(tmp_path / "digits_cnn.yaml", shared_cache))


@pytest.mark.slow
@needs.mark("tensorflow", "tf2onnx")
def test_a_keras_file_and_a_saved_model_build(tmp_path, monkeypatch, capsys, shared_cache) -> None:
    import keras
    import tensorflow as tf

    monkeypatch.chdir(tmp_path)
    keras.utils.set_random_seed(0)
    image = keras.Input((None, None, 1), name="image")
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(image)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(image, keras.layers.Dense(10, name="logits")(x))
    model.save(tmp_path / "net.keras")

    class Served(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model  # its variables, tracked

        @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 1], tf.float32, name="pixels")])
        def serve(self, pixels):
            return {"scores": self.model(pixels, training=False)}

    served = Served()
    tf.saved_model.save(
        served, str(tmp_path / "saved"), signatures={"serving_default": served.serve}
    )
    assert _init(capsys, "net.keras", "--input", "image:1x8x8x1")[0] == 0
    assert _init(capsys, "saved")[0] == 0
    for name, input_name, output in (("net", "image", "logits"), ("saved", "pixels", "scores")):
        source = load_recipe(tmp_path / f"{name}.yaml").recipe.source
        assert [(s.name, s.shape) for s in source.inputs] == [(input_name, [1, 8, 8, 1])]
        assert source.outputs == [output]
        _verified(_build(tmp_path / f"{name}.yaml", shared_cache))


def test_the_input_of_an_onnx_recurrent_layer_is_batched_on_axis_1(tmp_path: Path, capsys) -> None:
    """ONNX's LSTM/GRU/RNN take X as [sequence, batch, features] (layout 0, the default)."""
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    weights = [
        helper.make_tensor(n, TensorProto.FLOAT, s, rng.standard_normal(s).ravel().tolist())
        for n, s in (("W", [1, 12, 3]), ("R", [1, 12, 3]))
    ]
    node = helper.make_node("LSTM", ["seq", "W", "R"], ["y"], hidden_size=3)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("seq", TensorProto.FLOAT, [5, 1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 1, 1, 3])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    onnx.save(model, str(tmp_path / "lstm.onnx"))
    status, _, _ = _init(capsys, str(tmp_path / "lstm.onnx"), "--output", str(tmp_path / "r.yaml"))
    assert status == 0
    [seq] = load_recipe(tmp_path / "r.yaml").recipe.source.inputs
    assert (seq.shape, seq.batch_axis) == ([5, 1, 3], 1)


def test_a_link_in_the_way_of_a_temporary_file_is_neither_followed_nor_removed(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    import os

    monkeypatch.chdir(tmp_path)
    _two_outputs(tmp_path / "two.onnx")
    (tmp_path / "outside.txt").write_text("keep\n", encoding="utf-8")
    link = tmp_path / f"two-edgeflow-init-{os.getpid()}.yaml"
    link.symlink_to(tmp_path / "outside.txt")
    status, _, err = _init(capsys, "two.onnx")
    assert status == 2 and "is in the way of edgeflow init's temporary file" in err
    assert link.is_symlink() and (tmp_path / "outside.txt").read_text() == "keep\n"
    assert not (tmp_path / "two.yaml").exists() and not (tmp_path / "data.py").exists()
