"""source.kind tensorflow in the recipe: what validates, what is refused (every problem in one
run, located), which pipeline each build takes, and what its cache keys and DVC deps hold.
Nothing here imports TensorFlow: a recipe is checked without it."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeflow.core.errors import RecipeError
from edgeflow.engine.keys import recipe_slice
from edgeflow.engine.pipeline import load_pipeline, pipeline_name
from edgeflow.recipe import load_recipe
from edgeflow.stages import STAGES

BUILDER = """
import keras

def build(width: int = 8):
    image = keras.Input((8, 8, 1), name="image")
    x = keras.layers.Conv2D(width, 3, padding="same", activation="relu")(image)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(image, keras.layers.Dense(10, name="logits")(x))
"""

RECIPE = """
source:
  kind: tensorflow
  model: model.py:build
  inputs: [{{name: image, shape: [1, 8, 8, 1]}}]
  outputs: [logits]
{extra}
evaluation: {{dataset: "edgeflow.zoo.digits_keras:digits_nhwc", split: test, metric: agreement}}
target: {target}
"""


@pytest.fixture
def recipe(tmp_path: Path, write_recipe):
    (tmp_path / "model.py").write_text(BUILDER, encoding="utf-8")

    def make(extra: str = "", target: str = "tflite") -> Path:
        return write_recipe(RECIPE.format(extra=extra, target=target))

    return make


def problems(path: Path, overrides: dict | None = None) -> list[str]:
    with pytest.raises(RecipeError) as info:
        load_recipe(path, overrides)
    return [p.render() for p in info.value.problems]


def test_each_build_takes_its_path(recipe) -> None:
    """native for the TFLite family, ONNX for the others; convert.via picks one."""
    path = recipe()
    assert pipeline_name(load_recipe(path)) == "tensorflow_native"
    for target in ("tflite_micro", "armnn"):
        assert pipeline_name(load_recipe(path, {"target": target})) == "tensorflow_native"
    for target in ("onnxruntime_micro", "tensorrt"):
        assert pipeline_name(load_recipe(path, {"target": target})) == "tensorflow"
    assert pipeline_name(load_recipe(path, {"convert.via": "onnx"})) == "tensorflow"
    native = [s.name for s in load_pipeline("tensorflow_native").stages]
    assert native == ["tf_load", "tf_convert", "verify", "report", "html"]
    onnx = [s.name for s in load_pipeline("tensorflow").stages]
    assert onnx[:3] == ["tf_load", "tf_export", "rewrite_onnx"] and "convert" in onnx


def test_every_problem_of_the_paths_in_one_run(recipe) -> None:
    path = recipe(
        "rewrites: [fx.fuse_conv_bn, onnx.fold_constants]\n"
        "export: {exporter: torchscript, opset: 17}\n"
        "convert: {via: native}",
        target="onnxruntime_micro",
    )
    found = problems(path)
    text = "\n".join(found)
    assert len(found) == 5, text  # via native: the onnx rule and the opset have no ONNX either
    assert "recipe.yaml:6:12: rewrites[0]: 'fx.fuse_conv_bn' is an fx rule" in text
    assert "recipe.yaml:6:29: rewrites[1]: 'onnx.fold_constants' rewrites the ONNX" in text
    assert "export.exporter: export.exporter picks PyTorch's ONNX exporter" in text
    assert (
        "convert.via: TensorFlow's TFLite converter builds for armnn, ethos_u, tflite, "
        "tflite_micro" in text
    )
    assert "target 'onnxruntime_micro' is onnxruntime_micro" in text


def test_onnx_rules_and_opset_need_the_onnx_path(recipe) -> None:
    path = recipe("rewrites: [onnx.fold_constants]\nexport: {opset: 17}")
    text = "\n".join(problems(path))
    assert "rewrites[0]: 'onnx.fold_constants' rewrites the ONNX graph" in text
    assert "set convert.via: onnx" in text
    assert "export.opset: export.opset is the opset of the exported ONNX graph" in text
    loaded = load_recipe(path, {"convert.via": "onnx"})  # through tf2onnx they apply
    assert [r.rule.name for r in loaded.recipe.rewrites] == ["onnx.fold_constants"]
    assert loaded.recipe.export.opset == 17


def test_convert_via_is_for_tensorflow_sources(write_recipe) -> None:
    path = write_recipe(
        """
        source:
          kind: pytorch
          model: edgeflow.zoo.digits:DigitsCNN
          inputs: [{name: image, shape: [1, 1, 8, 8]}]
        convert: {via: onnx}
        evaluation: {dataset: "edgeflow.datasets:sklearn_digits", split: test}
        target: tflite
        """
    )
    assert problems(path) == [
        f"{path}:5:16: convert.via: convert.via picks the path of a tensorflow source; this "
        "is a pytorch source\n  hint: remove convert.via"
    ]


def test_model_files_and_their_keys(tmp_path: Path, recipe) -> None:
    folder = tmp_path / "sm"
    folder.mkdir()
    (folder / "variables").mkdir()
    (tmp_path / "net.pt").write_bytes(b"x")
    for model, message in (
        ("sm", "sm is a folder without saved_model.pb: not a SavedModel"),
        (
            "net.pt",
            "a tensorflow source is a SavedModel folder, a .keras (or legacy .h5, .hdf5) file",
        ),
        ("gone.keras", "file not found: gone.keras"),
        ("model.py:nothing", "'nothing' is not defined in model.py"),
    ):
        text = "\n".join(problems(recipe(), {"source.model": model}))
        assert message in text, text
    (folder / "saved_model.pb").write_bytes(b"")  # a SavedModel without graphs
    (folder / "variables" / "variables.index").write_bytes(b"one")
    saved = recipe()
    text = "\n".join(problems(saved, {"source.model": "sm", "source.init": {"width": 4}}))
    assert "init: passes arguments to a builder function" in text
    (tmp_path / "w.weights.h5").write_bytes(b"w")
    text = "\n".join(problems(saved, {"source.model": "sm", "source.weights": "w.weights.h5"}))
    assert "a SavedModel holds its own weights" in text
    # the folder's content is in the key of the stage that loads it
    stage = STAGES["tf_load"]
    key = recipe_slice(load_recipe(saved, {"source.model": "sm"}), stage.reads)
    (folder / "variables" / "variables.index").write_bytes(b"two")
    again = recipe_slice(load_recipe(saved, {"source.model": "sm"}), stage.reads)
    assert key["source"]["model"]["folder"] == "sm"
    assert key != again


def test_the_builders_source_is_in_the_key(tmp_path: Path, recipe) -> None:
    path = recipe()
    stage = STAGES["tf_load"]
    before = recipe_slice(load_recipe(path), stage.reads)
    (tmp_path / "model.py").write_text(BUILDER.replace("width: int = 8", "width: int = 4"))
    assert recipe_slice(load_recipe(path), stage.reads) != before


def test_dvc_init_makes_the_saved_model_folder_a_dependency(tmp_path: Path) -> None:
    from edgeflow.engine.dvcfile import init

    (tmp_path / "recipes").mkdir()
    folder = tmp_path / "models" / "sm"
    (folder / "variables").mkdir(parents=True)
    (folder / "saved_model.pb").write_bytes(b"")  # a SavedModel without graphs
    (tmp_path / "recipes" / "net.yaml").write_text(
        RECIPE.format(extra="", target="tflite").replace("model.py:build", "../models/sm")
    )
    init(tmp_path, echo=lambda _: None)
    dvc = (tmp_path / "dvc.yaml").read_text()
    assert "net.tf_load:" in dvc and "- models/sm\n" in dvc
    assert "net.default.tf_convert:" in dvc  # the build's own native stage
    assert "export" not in dvc.split("net.tf_load:")[1].split("outs:")[0]


def test_without_tensorflow_the_build_says_what_to_install(monkeypatch) -> None:
    import importlib

    from edgeflow.core.errors import EXIT_USER, MissingDependency
    from edgeflow.frameworks import tensorflow as tfw

    real = importlib.import_module

    def missing(name: str, *args, **kwargs):
        if name.split(".")[0] in ("tensorflow", "keras"):
            raise ImportError(f"No module named '{name}'", name=name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", missing)
    with pytest.raises(MissingDependency) as info:
        tfw.require()
    assert info.value.exit_code == EXIT_USER
    assert info.value.message == (
        "source kind tensorflow needs tensorflow: install it with pip install 'edgeflow[tflite]'"
    )
