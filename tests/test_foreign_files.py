"""benchmarks/_foreign: the foreign-files benchmark's files are what they claim to be (valid by
their exporter's standard, run where they should), and its bookkeeping reads the precheck."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from _foreign.build import followable, recipe_text, suggestions, write_inputs  # noqa: E402
from _foreign.files import FILES, Foreign  # noqa: E402

BUILT = {name: build() for name, build in FILES.items()}


def _feeds(foreign: Foreign) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for spec in foreign.inputs:
        if spec.value is not None:
            feeds[spec.name] = np.array(spec.value, dtype=spec.dtype)
        elif "int" in spec.dtype:
            feeds[spec.name] = rng.integers(0, 8, spec.shape).astype(spec.dtype)
        else:
            feeds[spec.name] = rng.standard_normal(spec.shape).astype(np.float32)
    return feeds


def _opset(model: Any) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def test_the_set_covers_what_the_issue_lists() -> None:
    models = [f.model for f in BUILT.values()]
    assert len(models) >= 40
    assert {6, 7, 8, 9, 10, 11, 12} <= {_opset(m) for m in models}
    assert sum(_opset(m) >= 13 for m in models) >= 4
    assert {3, 4, 5, 6, 7} <= {m.ir_version for m in models}
    ops = {n.op_type for m in models for n in m.graph.node}
    families = {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "Gemm", "MatMul", "LSTM",
                "GRU", "BatchNormalization", "Concat", "Split", "Slice", "Reshape", "Transpose",
                "Flatten", "Squeeze", "Unsqueeze", "Pad", "Upsample", "Resize", "Softmax",
                "ReduceMean", "ConvInteger", "DynamicQuantizeLinear", "QLinearConv",
                "ConstantOfShape", "If"}  # fmt: skip
    assert families <= ops
    names = {v for m in models for n in m.graph.node for v in [*n.input, *n.output]}
    assert all(any(c in name for name in names) for c in "@:/")
    dims = [d for m in models for v in m.graph.input for d in v.type.tensor_type.shape.dim]
    assert any(d.dim_value == -1 for d in dims) and any(d.dim_param for d in dims)


@pytest.mark.parametrize("name", [n for n, f in BUILT.items() if f.model.ir_version < 4])
def test_ir3_files_list_every_initializer_as_an_input(name: str) -> None:
    graph = BUILT[name].model.graph
    assert {t.name for t in graph.initializer} <= {v.name for v in graph.input}


@pytest.mark.parametrize("name", list(BUILT))
def test_each_file_is_valid_by_its_exporters_standard(name: str) -> None:
    foreign = BUILT[name]
    model = onnx.load_from_string(foreign.model.SerializeToString())  # it round-trips
    if foreign.checker:
        onnx.checker.check_model(model)
    else:  # a file onnx's checker refuses though runtimes load it: the flag must be true
        with pytest.raises(onnx.checker.ValidationError):
            onnx.checker.check_model(model)
    declared = {v.name for v in model.graph.input}
    assert {spec.name for spec in foreign.inputs} <= declared


@pytest.mark.parametrize("name", list(BUILT))
def test_the_runtime_it_names_runs_it(name: str) -> None:
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator

    foreign = BUILT[name]
    data = foreign.model.SerializeToString()
    if foreign.runs == "onnxruntime":
        session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        outputs = session.run(None, _feeds(foreign))
    elif foreign.runs == "reference":
        outputs = ReferenceEvaluator(foreign.model).run(None, _feeds(foreign))
    else:  # an opset onnxruntime has no kernels for any more: what ingest must handle
        with pytest.raises(Exception, match="NOT_IMPLEMENTED"):
            ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        return
    first = np.asarray(outputs[0], dtype=np.float64)
    assert np.isfinite(first).all() and first.std() > 1e-3  # seeded weights: not trivial


def test_a_file_recipe_and_data_load_as_a_valid_recipe(tmp_path: Path) -> None:
    from edgeflow.recipe import load_recipe

    foreign = BUILT["lstm_op7_ir3"]  # time-major: the data stacks samples on axis 1
    model, data = write_inputs(foreign, tmp_path)
    assert np.load(data)["seq"].shape == (6, 8, 8)
    recipe = tmp_path / "lstm__tflite.yaml"
    recipe.write_text(recipe_text(foreign, "tflite", model, data), encoding="utf-8")
    loaded = load_recipe(recipe)
    (spec,) = loaded.recipe.source.inputs
    assert (spec.name, list(spec.shape), spec.batch_axis) == ("seq", [6, 1, 8], 1)


def test_suggestions_are_read_as_printed() -> None:
    printed = """the model does not pass the tflite precheck:
| Operator | Count | Reason | Nodes | Suggested rule |
|---|---|---|---|---|
| (opset) | 1 | opset 7 is outside the 11..20 |  | `{rule: onnx.convert_opset, opset: 11}` |
| Erf | 1 | not supported |  | `onnx.decompose` |
| ConstantOfShape | 2 | not measured | a, b | (onnx.fold_constants tried: leaves it) |
| (float16) | 1 | no kernel |  | `quantization.mode: none` |
hint: apply the suggested rules"""
    found = suggestions(printed)
    assert found == [
        "{rule: onnx.convert_opset, opset: 11}",
        "onnx.decompose",
        "quantization.mode: none",
    ]
    rules = [{"rule": "onnx.convert_opset", "opset": 11}, "onnx.decompose"]
    assert followable(found) == (rules, ["quantization.mode: none"])
