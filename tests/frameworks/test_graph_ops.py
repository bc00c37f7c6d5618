"""A SavedModel is a program: saved_model.pb is read before TensorFlow runs anything, and a
graph with file, Python or network ops is refused (located, exit 2) unless the recipe names
them in source.allow_graph_ops. The graph walk is tested on graphs written by hand (no
TensorFlow needed); the whole path on SavedModels TensorFlow saved."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edgeflow.core import savedmodel
from edgeflow.core.errors import EXIT_USER, EdgeflowError, RecipeError
from edgeflow.engine.keys import recipe_slice
from edgeflow.recipe import load_recipe
from edgeflow.stages import STAGES
from tests import needs

RECIPE = """
source:
  kind: tensorflow
  model: {model}
  inputs: [{{name: x, shape: [1, 4]}}]
  outputs: [y]
{extra}
evaluation: {{dataset: "data.py:rows", split: test, samples: 4, metric: agreement}}
quantization: {{mode: none}}
target: tflite
"""

DATA = """
import numpy as np

def rows(split="test"):
    return {"x": np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)}
"""


def recipe_text(model: str, allow: list[str] | None = None) -> str:
    extra = f"  allow_graph_ops: [{', '.join(allow)}]" if allow else ""
    text = RECIPE.format(model=model, extra=extra).replace("  outputs: [y]\n\n", "  outputs: [y]\n")
    return text.lstrip("\n")


@pytest.fixture(autouse=True)
def _dataset(tmp_path: Path) -> None:
    (tmp_path / "data.py").write_text(DATA, encoding="utf-8")


# --- the graph walk, on graphs written by hand ---------------------------------------------


def node(message: Any, name: str, op: str, **attrs: Any) -> Any:
    """Add a NodeDef to `message` (a graph's node list or a function's node_def list)."""
    added = message.add(name=name, op=op)
    for key, value in attrs.items():
        entry = added.attr.add(key=key)
        if isinstance(value, bytes):
            entry.value.s = value
        elif isinstance(value, list):  # functions in a list (Case branches)
            for f in value:
                entry.value.list.func.add(name=f)
        else:  # a function, possibly with a function in its own attrs
            name_, inner = value if isinstance(value, tuple) else (value, None)
            entry.value.func.name = name_
            if inner:
                entry.value.func.attr.add(key="inner").value.func.name = inner
    return added


def function(library: Any, name: str) -> Any:
    added = library.function.add()
    added.signature.name = name
    return added


def hand_made() -> Any:
    """A SavedModel with a refused op at every depth the walk must reach, and the saver's own
    checkpoint ops where they belong (allowed) and where they do not (refused)."""
    saved = savedmodel._saved_model_class()()
    meta = saved.meta_graphs.add()
    meta.saver_def.save_tensor_name = "save_call:0"
    meta.saver_def.restore_op_name = "restore_all"
    graph, library = meta.graph_def.node, meta.graph_def.library
    node(graph, "serve", "StatefulPartitionedCall", f="serve_fn")
    node(graph, "printer", "PrintV2", output_stream=b"stderr")  # harmless
    node(graph, "to_file", "PrintV2", output_stream=b"file:///tmp/x")
    node(graph, "save_call", "StatefulPartitionedCall", f="saver_fn").input.append("filename")
    node(graph, "filename", "Placeholder")
    restore = node(graph, "restore_all", "NoOp")
    restore.input.append("^restore/RestoreV2")
    node(graph, "restore/RestoreV2", "RestoreV2")  # the saver's own, in the graph (TF1)
    node(graph, "stray_restore", "RestoreV2")  # not the saver's
    fn = function(library, "serve_fn")
    node(fn.node_def, "branch", "If", then_branch="then_fn", else_branch=("else_fn", "deep_fn"))
    node(fn.node_def, "cases", "Case", branches=["case0_fn", "case1_fn"])
    node(fn.node_def, "by_op", "by_op_fn")  # a function called by its name as the op
    node(function(library, "then_fn").node_def, "py", "PyFunc")
    function(library, "else_fn")
    node(function(library, "deep_fn").node_def, "files", "MatchingFiles")
    function(library, "case0_fn")
    node(function(library, "case1_fn").node_def, "reader", "TFRecordDatasetV2")
    node(function(library, "by_op_fn").node_def, "shared_call", "PartitionedCall", f="shared_fn")
    saver = function(library, "saver_fn")
    node(saver.node_def, "SaveV2", "SaveV2")  # the saver's own: allowed
    node(saver.node_def, "MergeV2Checkpoints", "MergeV2Checkpoints")
    node(saver.node_def, "sneaky", "WriteFile")  # in the saver, but not a checkpoint op
    node(saver.node_def, "shared_call", "PartitionedCall", f="shared_fn")
    node(function(library, "shared_fn").node_def, "shared_save", "SaveV2")  # the model calls it
    node(function(library, "unreached_fn").node_def, "lonely", "EagerPyFunc")  # still checked
    return saved


EXPECTED = {
    ("PrintV2", "to_file", None),
    ("RestoreV2", "stray_restore", None),
    ("PyFunc", "py", "then_fn"),
    ("MatchingFiles", "files", "deep_fn"),
    ("TFRecordDatasetV2", "reader", "case1_fn"),
    ("WriteFile", "sneaky", "saver_fn"),
    ("SaveV2", "shared_save", "shared_fn"),
    ("EagerPyFunc", "lonely", "unreached_fn"),
}


def found(folder: Path, allowed: tuple[str, ...] = ()) -> set[tuple[str, str, str | None]]:
    return {(g.op, g.node, g.function) for g in savedmodel.find_refused(folder, allowed)}


def test_every_depth_of_the_graph_is_read(tmp_path: Path) -> None:
    (tmp_path / "saved_model.pb").write_bytes(hand_made().SerializeToString())
    assert found(tmp_path) == EXPECTED
    allowed = found(tmp_path, ("PyFunc", "SaveV2", "PrintV2"))
    assert allowed == {f for f in EXPECTED if f[0] not in ("PyFunc", "SaveV2", "PrintV2")}


def test_the_text_format_is_read_alike(tmp_path: Path) -> None:
    from google.protobuf import text_format

    (tmp_path / "saved_model.pbtxt").write_text(text_format.MessageToString(hand_made()))
    assert found(tmp_path) == EXPECTED


def test_the_recipe_names_the_ops_nodes_and_key(tmp_path: Path, write_recipe) -> None:
    folder = tmp_path / "sm"
    folder.mkdir()
    (folder / "saved_model.pb").write_bytes(hand_made().SerializeToString())
    with pytest.raises(RecipeError) as info:
        load_recipe(write_recipe(recipe_text("sm")))
    (problem,) = info.value.problems
    assert (problem.key, problem.line) == ("source.model", 3)
    assert "\n    PyFunc (node 'py' in function then_fn): calls Python code\n" in problem.message
    assert "PrintV2 (node 'to_file' in the graph): prints into a file: output_stream " in (
        problem.message
    )
    assert "more" not in problem.message  # all 8 shown
    assert (
        problem.hint is not None and "source.allow_graph_ops: [PrintV2, RestoreV2" in problem.hint
    )
    every = sorted({op for op, _, _ in EXPECTED})
    allowed = load_recipe(write_recipe(recipe_text("sm", every)))  # all allowed: it validates
    key = recipe_slice(allowed, STAGES["tf_load"].reads)["source"]
    assert key["allow_graph_ops"] == every  # in tf_load's cache key


def test_allow_graph_ops_takes_refused_op_names_only(tmp_path: Path, write_recipe) -> None:
    folder = tmp_path / "sm"
    folder.mkdir()
    (folder / "saved_model.pb").write_bytes(b"")  # a SavedModel without graphs: nothing to refuse
    load_recipe(write_recipe(recipe_text("sm", ["WriteFile"])))
    for allow, message in (
        (["Writefile"], "'Writefile' is not an op edgeflow refuses"),
        (["MatMul"], "'MatMul' is not an op edgeflow refuses"),
        (["3"], "must be a valid string (got 3)"),
    ):
        with pytest.raises(RecipeError) as info:
            load_recipe(write_recipe(recipe_text("sm", allow)))
        (problem,) = info.value.problems
        assert problem.key == "source.allow_graph_ops[0]" and message in problem.message
    assert "did you mean 'WriteFile'" in str(
        _problems(write_recipe(recipe_text("sm", ["Writefile"])))
    )
    (tmp_path / "model.keras").write_bytes(b"k")
    keras = _problems(write_recipe(recipe_text("model.keras", ["WriteFile"])))
    assert "allow_graph_ops: applies to a SavedModel's graph" in keras


def _problems(path: Path) -> str:
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    return info.value.render()


def test_a_malformed_graph_is_refused_located(tmp_path: Path, write_recipe) -> None:
    folder = tmp_path / "sm"
    folder.mkdir()
    (folder / "saved_model.pb").write_bytes(b"\xff\xff\xff")
    text = _problems(write_recipe(recipe_text("sm")))
    assert "source.model: saved_model.pb in" in text and "does not parse as a SavedModel" in text


def test_the_op_list_is_consistent() -> None:
    table = savedmodel.refused_ops()
    assert table.saver <= set(table.always)  # the saver's ops are refused elsewhere
    assert not set(table.always) & set(table.unless)
    assert {"WriteFile", "ReadFile", "MatchingFiles", "PyFunc", "EagerPyFunc"} <= set(table.names)


# --- SavedModels TensorFlow saved ----------------------------------------------------------


@pytest.fixture(scope="module")
def tf() -> Any:
    return needs.module("tensorflow")


def save_writer(tf: Any, folder: Path, marker: Path) -> None:
    """A SavedModel whose serving function writes `marker` each time it runs."""

    class Writer(tf.Module):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            self.w = tf.Variable(2.0)

        @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32, name="x")])
        def serve(self, x: Any) -> dict[str, Any]:
            tf.io.write_file(str(marker), "written")
            return {"y": x * self.w}

    module = Writer()
    tf.saved_model.save(module, str(folder), signatures={"serving_default": module.serve})


def save_plain(tf: Any, folder: Path) -> None:
    """A plain SavedModel: a Dense layer, exported by Keras."""
    import keras

    x = keras.Input((4,), name="x")
    keras.Model(x, keras.layers.Dense(3, name="y")(x)).export(str(folder), verbose=False)


@pytest.fixture
def recipe_dir(tmp_path: Path) -> Path:
    return tmp_path  # data.py written (_dataset)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The command line in a process of its own, as a user runs it."""
    command = [sys.executable, "-m", "edgeflow", *args]
    return subprocess.run(command, capture_output=True, text=True, check=False, timeout=300)


def test_validate_and_run_refuse_the_writer_and_nothing_runs(tf, recipe_dir: Path) -> None:
    marker = recipe_dir / "marker.txt"
    save_writer(tf, recipe_dir / "writer", marker)
    path = recipe_dir / "recipe.yaml"
    path.write_text(recipe_text("writer"), encoding="utf-8")
    validate = cli("validate", str(path))
    assert validate.returncode == EXIT_USER, validate.stderr
    assert "recipe.yaml:3:10: source.model: the SavedModel" in validate.stderr
    assert "    WriteFile (node 'WriteFile' in function __inference_serve_" in validate.stderr
    assert "source.allow_graph_ops: [WriteFile]" in validate.stderr
    common = [f"cache_dir={recipe_dir}/cache", f"build_dir={recipe_dir}/build"]
    run = cli("run", f"recipe={path}", *common)
    assert run.returncode == EXIT_USER, run.stderr
    assert "source.model: the SavedModel" in run.stderr and "WriteFile" in run.stderr
    assert not marker.exists()


def stage_context(tmp_path: Path, path: Path) -> Any:
    from edgeflow.stages.base import StageContext

    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    return StageContext(STAGES["tf_load"], load_recipe(path), {}, out)


def test_tf_load_reads_the_graph_again_before_loading(tf, recipe_dir: Path) -> None:
    from edgeflow.stages import tf_load

    marker = recipe_dir / "marker.txt"
    save_writer(tf, recipe_dir / "writer", marker)
    save_plain(tf, recipe_dir / "sm")
    path = recipe_dir / "recipe.yaml"
    path.write_text(recipe_text("sm"), encoding="utf-8")
    ctx = stage_context(recipe_dir, path)  # validated while the folder was plain
    shutil.rmtree(recipe_dir / "sm")
    shutil.copytree(recipe_dir / "writer", recipe_dir / "sm")  # changed before the stage ran
    with pytest.raises(EdgeflowError) as info:
        tf_load.run(ctx)
    assert info.value.exit_code == EXIT_USER
    assert "recipe.yaml:3:10: source.model:" in info.value.message
    assert "WriteFile (node 'WriteFile' in function __inference_serve_" in info.value.message
    assert not marker.exists()


def test_allowed_ops_pass_the_check(tf, recipe_dir: Path) -> None:
    from edgeflow.stages import tf_load

    marker = recipe_dir / "marker.txt"
    save_writer(tf, recipe_dir / "writer", marker)
    path = recipe_dir / "recipe.yaml"
    path.write_text(recipe_text("writer", ["WriteFile"]), encoding="utf-8")
    assert cli("validate", str(path)).returncode == 0
    tf_load.run(stage_context(recipe_dir, path))
    assert marker.read_text() == "written"  # the check let it through: the model ran


def test_no_false_positive_on_plain_saved_models(tf, recipe_dir: Path) -> None:
    """Keras exports, a tf.Module with variables, and the canonical SavedModel of the
    repository's Keras demos: nothing refused, though each holds the saver's checkpoint ops."""
    from edgeflow.frameworks import tensorflow as tfw
    from edgeflow.schema.signatures import TensorSpec
    from edgeflow.zoo import digits_keras

    save_plain(tf, recipe_dir / "keras_export")

    class Scale(tf.Module):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            self.w = tf.Variable([1.0, 2.0, 3.0, 4.0])

        @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32, name="x")])
        def serve(self, x: Any) -> dict[str, Any]:
            tf.print("scaling", x)  # to stderr: allowed
            return {"y": x * self.w}

    module = Scale()
    tf.saved_model.save(module, str(recipe_dir / "module"), signatures=module.serve)
    demos = {"cnn": (digits_keras.digits_cnn, 8), "mobilenet": (digits_keras.digits_mobilenet, 32)}
    for name, (build, size) in demos.items():
        spec = TensorSpec(name="image", shape=[1, size, size, 1])
        tfw.save_canonical(tfw.from_keras(build(), name), [spec], ["logits"], recipe_dir / name)
    folders = ["keras_export", "module", "cnn", "mobilenet"]
    for folder in folders:
        assert savedmodel.find_refused(recipe_dir / folder) == [], folder
        saved = savedmodel.read(recipe_dir / folder)
        graph = saved.meta_graphs[0].graph_def
        ops = {n.op for f in graph.library.function for n in f.node_def}
        assert {"SaveV2", "RestoreV2", "MergeV2Checkpoints"} <= ops, folder
        assert ("PrintV2" in ops) == (folder == "module"), folder
    path = recipe_dir / "recipe.yaml"
    path.write_text(recipe_text("keras_export"), encoding="utf-8")
    assert cli("validate", str(path)).returncode == 0


def test_the_schema_and_the_op_names_are_tensorflows(tf) -> None:
    """The minimal schema's field numbers and types are TensorFlow's; every listed op exists."""
    from tensorflow.core.framework import (
        attr_value_pb2,
        function_pb2,
        graph_pb2,
        node_def_pb2,
        op_def_pb2,
    )
    from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2, saver_pb2

    real = {
        "SavedModel": saved_model_pb2.SavedModel,
        "MetaGraphDef": meta_graph_pb2.MetaGraphDef,
        "MetaInfoDef": meta_graph_pb2.MetaGraphDef.MetaInfoDef,
        "SaverDef": saver_pb2.SaverDef,
        "GraphDef": graph_pb2.GraphDef,
        "NodeDef": node_def_pb2.NodeDef,
        "AttrEntry": node_def_pb2.NodeDef.AttrEntry,
        "AttrValue": attr_value_pb2.AttrValue,
        "ListValue": attr_value_pb2.AttrValue.ListValue,
        "NameAttrList": attr_value_pb2.NameAttrList,
        "FunctionDefLibrary": function_pb2.FunctionDefLibrary,
        "FunctionDef": function_pb2.FunctionDef,
        "OpDef": op_def_pb2.OpDef,
    }
    assert set(real) == set(savedmodel._SCHEMA)
    for message, fields in savedmodel._SCHEMA.items():
        theirs = real[message].DESCRIPTOR.fields_by_name
        for name, number, kind, repeated, type_name in fields:
            field = theirs[name]
            assert (field.number, field.type) == (number, kind), (message, name)
            assert field.is_repeated == repeated, (message, name)
            if type_name:
                assert field.message_type.name == type_name, (message, name)
    table = savedmodel.refused_ops()
    missing = [op for op in [*table.names, *table.saver] if not hasattr(tf.raw_ops, op)]
    assert missing == []
