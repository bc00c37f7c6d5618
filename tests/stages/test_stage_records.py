"""Each stage on its own: the files it is given in, the record it writes out, and its
errors (stagekit runs a stage in this process, without the engine or the cache).

The models are the demos' trained digits CNNs (PyTorch, exported to ONNX for the ONNX
pipeline, Keras and Flax); the figures are theirs on sklearn's digits test split (360 images)."""

from __future__ import annotations

import html
import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest

from edgeflow.core.errors import EdgeflowError
from edgeflow.core.records import VerifyRecord
from edgeflow.recipe import LoadedRecipe, find_recipe, load_recipe
from edgeflow.rules import builtin_rules
from edgeflow.rules.order import misordered
from edgeflow.targets import load_profile
from tests.conftest import demo_onnx
from tests.stages.stagekit import Slots

HEAD = ["ingest", "rewrite_onnx", "rewrite_target", "optimize", "precheck"]
RECIPE = """\
source:
  kind: onnx
  model: digits.onnx
  inputs: [{name: image, shape: [1, 1, 8, 8]}]
calibration: {dataset: calib.npz}
evaluation: {dataset: "edgeflow.datasets:sklearn_digits", split: test}
target: onnxruntime_micro
verify: {max_accuracy_drop: 0.02, min_sqnr_db: 20}
"""


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("stages")
    demo_onnx(folder)
    (folder / "recipe.yaml").write_text(RECIPE, encoding="utf-8")
    return folder / "recipe.yaml"


def loaded(recipe: Path, **overrides: object) -> LoadedRecipe:
    return load_recipe(recipe, {k.replace("__", "."): v for k, v in overrides.items()})


@pytest.fixture(scope="module")
def float32(recipe: Path, tmp_path_factory: pytest.TempPathFactory) -> Slots:
    """The float32 build, stage by stage through html."""
    slots = Slots.seeded(loaded(recipe), tmp_path_factory.mktemp("float32"))
    slots.through([*HEAD, "quantize", "convert", "verify", "report", "html"])
    return slots


@pytest.fixture(scope="module")
def int8(recipe: Path, tmp_path_factory: pytest.TempPathFactory) -> Slots:
    slots = Slots.seeded(loaded(recipe, quantization__mode="int8"), tmp_path_factory.mktemp("i8"))
    slots.through([*HEAD, "quantize", "convert", "verify", "report"])
    return slots


def test_ingest_binds_the_declared_input_and_runs_the_source(float32: Slots) -> None:
    model = onnx.load(str(float32.paths["onnx"].parent.parent / "ingest" / "model.onnx"))
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert [i.name for i in model.graph.input] == ["image"] and dims == [1, 1, 8, 8]
    reference = np.load(float32.paths["reference"])
    assert reference["arr_0"].shape == (360, 10)  # the test split's logits
    source = float32.record("source")
    assert source["evaluation_samples"] == 360 and source["normalised"] == []
    assert source["output_shapes"] == [[10]]


def test_ingest_names_an_input_the_file_no_longer_has(recipe: Path, tmp_path: Path) -> None:
    """The file changed after the recipe was validated (its input renamed): ingest stops and
    names both."""
    fine = loaded(recipe)
    model = onnx.load(str(recipe.parent / "digits.onnx"))
    model.graph.input[0].name = "pixels"
    for node in model.graph.node:
        node.input[:] = ["pixels" if i == "image" else i for i in node.input]
    onnx.save(model, str(tmp_path / "digits.onnx"))
    slots = Slots.seeded(fine, tmp_path / "b")
    slots.paths["onnx"] = tmp_path / "digits.onnx"
    with pytest.raises(EdgeflowError) as found:
        slots.run("ingest")
    assert "'image'" in found.value.message and "pixels" in found.value.render()


def test_optimize_records_what_it_changed(float32: Slots) -> None:
    record = float32.record("optimize")
    assert 0 < record["nodes_after"] <= record["nodes_before"]
    assert record["checked"].startswith("outputs within")
    assert sum(record["ops_after"].values()) == record["nodes_after"]


def test_precheck_passes_the_model_and_estimates_its_memory(float32: Slots) -> None:
    record = float32.record("precheck")
    assert record.passed and record.target == "onnxruntime_micro"
    assert not [f for f in record.findings if f.severity == "error"]
    assert record.memory is not None and record.memory.weights_bytes > 10_000
    assert record.ops["Conv"] == 3


def test_precheck_fails_on_an_operator_the_target_lacks(recipe: Path, tmp_path: Path) -> None:
    """A target profile without Conv: the record says which nodes, and the stage stops."""
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "no_conv.yaml").write_text(
        "extends: onnxruntime_micro\nname: no_conv\noperators: {Conv: {kernels: []}}\n"
    )
    cwd = Path.cwd()
    os.chdir(tmp_path)
    try:
        slots = Slots.seeded(loaded(recipe, target="no_conv"), tmp_path / "b")
        slots.through(HEAD[:-1])
        with pytest.raises(EdgeflowError, match="does not pass the no_conv precheck"):
            slots.run("precheck")
    finally:
        os.chdir(cwd)
    record = slots.record("precheck")  # written before the stage stopped
    assert not record.passed
    (conv,) = [f for f in record.findings if f.operator == "Conv"]
    assert conv.count == 3 and conv.severity == "error"


def test_quantize_passes_float32_through_and_quantizes_int8(float32: Slots, int8: Slots) -> None:
    passed = float32.record("quantize")
    assert passed.mode == "none" and not passed.delegated_to_converter
    assert (
        float32.paths["onnx"].read_bytes()
        == (float32.root / "optimize" / "model.onnx").read_bytes()
    )
    record = int8.record("quantize")
    assert record.mode == "int8" and record.method == "minmax" and record.calibration_samples
    model = onnx.load(str(int8.root / "quantize" / "model.onnx"))
    assert sum(n.op_type == "QuantizeLinear" for n in model.graph.node) >= 3


def test_convert_writes_the_ort_file_and_its_operators(float32: Slots) -> None:
    record = float32.record("convert")
    assert record.artifact == "model.ort" and record.target == "onnxruntime_micro"
    artifact = float32.paths["artifact"] / "model.ort"
    assert record.size_bytes == artifact.stat().st_size
    # onnxruntime's fixed optimizations fused Conv and Relu
    assert record.operators and "com.microsoft;1;FusedConv" in record.operators


def test_verify_compares_the_artifact_with_the_source(float32: Slots, int8: Slots) -> None:
    exact: VerifyRecord = float32.record("verify")
    assert exact.runtime == "onnxruntime_micro" and exact.samples == 360
    assert exact.agreement is not None and exact.agreement["top1"] == 1.0
    assert exact.accuracy is not None and exact.accuracy["drop"] == 0.0
    assert exact.latency_ms is not None and len(exact.latency_ms.samples) == exact.latency_ms.runs
    quantized: VerifyRecord = int8.record("verify")
    assert quantized.agreement is not None and quantized.agreement["min_sqnr_db"] > 20


def test_report_judges_the_record_it_is_given(float32: Slots, recipe: Path) -> None:
    metrics = float32.record("metrics")
    assert metrics.verified and metrics.accuracy.drop == 0.0
    assert [c.passed for c in float32.record("checks").root] == [True] * 2
    # the same verify record held to an SQNR it misses: the check fails and says why
    strict = loaded(recipe, verify__min_sqnr_db=400)
    out = float32.run("report", strict)
    checks = json.loads((out / "checks.json").read_text())
    (sqnr,) = [c for c in checks if c["metric"] == "verify.min_sqnr_db"]
    assert not sqnr["passed"] and "is below the threshold 400" in sqnr["message"]
    assert json.loads((out / "metrics.json").read_text())["verified"] is False
    assert "**NOT VERIFIED**" in (out / "report.md").read_text()


def test_report_of_an_artifact_that_could_not_run(
    float32: Slots, recipe: Path, tmp_path: Path
) -> None:
    record = float32.record("verify").dump()
    record |= {"not_verified": "no GPU here", "accuracy": None, "agreement": None}
    record["latency_ms"] = None
    (tmp_path / "verify.json").write_text(json.dumps(record))
    slots = Slots(
        loaded(recipe), tmp_path / "r", {**float32.paths, "verify": tmp_path / "verify.json"}
    )
    out = slots.run("report")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["verified"] is False and metrics["not_verified"] == "no GPU here"
    assert json.loads((out / "checks.json").read_text()) == []
    assert (out / "report.md").read_text().splitlines()[2].startswith("**NOT VERIFIED**: no GPU")


def test_report_md_and_html_come_from_one_record(float32: Slots) -> None:
    record = float32.record("report_record")
    assert (float32.root / "report" / "report.md").read_text() == record.markdown()
    assert [s.heading for s in record.sections] == ["Thresholds", "Per output", "Stages"]
    page = float32.paths["html"].read_text()
    assert html.escape(record.title) in page
    assert page.count("<svg") >= 3  # latency, outputs, confusion


def test_rewrite_onnx_records_each_recipe_rule_with_its_contract(
    recipe: Path, tmp_path: Path
) -> None:
    upgraded = loaded(recipe, rewrites=[{"rule": "onnx.convert_opset", "opset": 18}])
    slots = Slots.seeded(upgraded, tmp_path)
    slots.through(["ingest", "rewrite_onnx"])
    (rule,) = slots.record("rewrite_onnx")["rules"]
    assert rule["rule"] == "onnx.convert_opset" and rule["options"] == {"opset": 18}
    assert rule["sites"][0]["message"] == "opset 17 -> 18; 0 nodes adapted"
    assert "ONNX checker" in rule["contract"]
    model = onnx.load(str(slots.paths["onnx"]))
    assert {o.domain: o.version for o in model.opset_import}[""] == 18


def test_rewrite_target_applies_the_profile_defaults_in_their_order(
    recipe: Path, tmp_path: Path
) -> None:
    """armnn's defaults, each recorded (most do not apply to a CNN); a recipe that turns them
    off gets none."""
    slots = Slots.seeded(loaded(recipe, target="armnn"), tmp_path / "on")
    slots.through(["ingest", "rewrite_onnx", "rewrite_target"])
    record = slots.record("rewrite_target")
    names = [r["rule"] for r in record["rules"]]
    assert names == [r["rule"] for r in load_profile("armnn").rewrites]
    assert not misordered([builtin_rules()[n] for n in names])
    assert all(r["ops"]["after"]["Conv"] == 3 for r in record["rules"])
    off = Slots.seeded(loaded(recipe, target="armnn", target_rewrites=False), tmp_path / "off")
    off.through(["ingest", "rewrite_onnx", "rewrite_target"])
    assert off.record("rewrite_target")["off"] and not off.record("rewrite_target")["rules"]


@pytest.fixture(scope="module")
def pytorch(tmp_path_factory: pytest.TempPathFactory) -> Slots:
    """The demo's PyTorch head (load, rewrite, export) with an fx rule in its rewrites."""
    demo = load_recipe(
        find_recipe("digits_cnn"),
        {"rewrites": [{"rule": "fx.replace_activation", "from": "relu", "to": "relu6"}]},
    )
    slots = Slots.seeded(demo, tmp_path_factory.mktemp("pytorch"))
    slots.through(["load", "rewrite", "export"])
    return slots


def test_load_runs_the_module_on_the_evaluation_split(pytorch: Slots) -> None:
    source = pytorch.record("source")
    assert source["model"] == "edgeflow.zoo.digits:DigitsCNN" and source["parameters"] == 14474
    assert source["output_shapes"] == [[10]] and source["evaluation_samples"] == 360
    assert np.load(pytorch.paths["reference"])["arr_0"].shape == (360, 10)


def test_rewrite_records_each_site_and_what_it_changed(pytorch: Slots) -> None:
    record = pytorch.record("rewrite")
    (rule,) = record["rules"]
    assert rule["rule"] == "fx.replace_activation" and rule["level"] == "fx"
    assert [site["status"] for site in rule["sites"]] == ["changed"] * 3  # the three ReLUs
    # ReLU6 clips what ReLU passed above 6: the module computes something else, and says so
    assert record["numerics_changed_by"] == ["fx.replace_activation"]
    assert record["max_abs_diff"] > 1.0  # measured 3.50 on the test split


def test_export_writes_a_checked_model_with_the_declared_names(pytorch: Slots) -> None:
    record = pytorch.record("export")
    assert record["inputs"] == ["image"] and record["outputs"] == ["logits"]
    assert record["ops"]["Conv"] == 3 and record["nodes"] == sum(record["ops"].values())
    model = onnx.load(str(pytorch.paths["onnx"]))
    onnx.checker.check_model(model, full_check=True)
    assert {o.domain: o.version for o in model.opset_import}[""] == record["opset"]


@pytest.fixture(scope="module")
def keras(tmp_path_factory: pytest.TempPathFactory) -> Slots:
    """The Keras demo's head (tf_load), then TensorFlow's own converter, int8 (tf_convert)."""
    demo = load_recipe(
        find_recipe("digits_keras"), {"target": "tflite", "quantization.mode": "int8"}
    )
    slots = Slots.seeded(demo, tmp_path_factory.mktemp("keras"))
    slots.through(["tf_load", "tf_convert"])
    return slots


def test_tf_load_runs_the_keras_model_and_saves_it(keras: Slots) -> None:
    source = keras.record("source")
    assert source["model"] == "edgeflow.zoo.digits_keras:digits_cnn"
    assert source["framework"].startswith("tensorflow ") and source["parameters"] == 14570
    assert source["inputs"][0]["shape"] == [1, 8, 8, 1]  # channel-last, as Keras declares it
    assert (keras.paths["saved_model"] / "saved_model.pb").is_file()


def test_tf_convert_checks_the_builtins_it_wrote(keras: Slots) -> None:
    """TensorFlow's converter, full-integer: the precheck record is of the .tflite's
    builtins against the profile's measured ones, and convert.json says which path."""
    precheck = keras.record("precheck")
    assert precheck.passed and precheck.memory is None
    assert precheck.path is not None and precheck.path.startswith("native")
    assert "CONV_2D(RELU)" in precheck.ops
    convert = keras.record("convert")
    assert convert.path == "native" and convert.artifact == "model.tflite"
    assert convert.int8 is not None and convert.converter and "TFLiteConverter" in convert.converter


def test_tf_export_measures_what_tf2onnx_changed(keras: Slots, tmp_path: Path) -> None:
    demo = load_recipe(find_recipe("digits_keras"), {"target": "tflite", "convert.via": "onnx"})
    slots = Slots(demo, tmp_path, dict(keras.paths))
    slots.run("tf_export")
    record = slots.record("export")
    assert record["exporter"] == "tf2onnx" and record["outputs"] == ["logits"]
    (error,) = record["error_vs_source"]  # the ONNX model in onnxruntime against Keras
    assert error["name"] == "logits" and error["max_abs_diff"] < 1e-4
    assert "onnx_reference" in slots.paths


def test_the_jax_head_loads_and_exports_the_flax_model(tmp_path: Path) -> None:
    """jax_load runs the Flax demo on the evaluation split; jax_export (jax2onnx) writes a
    model whose outputs it measured against those (error_vs_source)."""
    slots = Slots.seeded(load_recipe(find_recipe("digits_jax")), tmp_path)
    slots.through(["jax_load", "jax_export"])
    source = slots.record("source")
    assert source["framework"].startswith("jax ") and source["parameters"] == 14570
    assert source["model"] == "edgeflow.zoo.digits_flax:digits_cnn"
    record = slots.record("export")
    assert record["exporter"] == "jax2onnx" and record["ops"]["Conv"] == 3
    (error,) = record["error_vs_source"]
    assert error["name"] == "logits" and error["max_abs_diff"] < 1e-4  # measured 5.7e-6
    model = onnx.load(str(slots.paths["onnx"]))
    assert [o.name for o in model.graph.output] == record["outputs"] == ["logits"]
