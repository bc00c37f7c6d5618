"""Bad input signatures: each is one located error naming its key, all of them in one run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from edgeflow.core.errors import EdgeflowError, RecipeError
from edgeflow.data import Samples, load_samples
from edgeflow.recipe import load_recipe
from edgeflow.schema.sections import DatasetSpec, TensorSpec
from tests.signatures.models import reshape_model

RECIPE = """
source:
  kind: onnx
  model: reshape.onnx
  inputs:
    - {name: x, shape: [1, 3, 4]}
evaluation: {dataset: x.npz, metric: agreement}
target: onnxruntime_micro
"""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    onnx.save(reshape_model(-1), str(tmp_path / "reshape.onnx"))
    np.savez(tmp_path / "x.npz", x=np.zeros((4, 3, 4), np.float32))
    return tmp_path


def problems(path: Path) -> list[str]:
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    return [p.render() for p in info.value.problems]


def test_the_good_recipe_loads(folder: Path, write_recipe) -> None:
    source = load_recipe(write_recipe(RECIPE)).recipe.source
    assert [(s.name, s.shape, s.batch_axis) for s in source.inputs] == [("x", [1, 3, 4], 0)]


def test_a_value_of_the_wrong_dtype(folder: Path, write_recipe) -> None:
    text = RECIPE.replace(
        "    - {name: x, shape: [1, 3, 4]}\n",
        "    - {name: x, shape: [1, 3, 4]}\n"
        "    - {name: rate, shape: [], dtype: int8, value: 16000}\n",
    )
    path = write_recipe(text)
    found = problems(path)
    assert found[0] == (
        f"{path}:6:51: source.inputs[1].value: the value 16000 is outside int8's range (-128 "
        "to 127)\n  hint: declare dtype: int32, or give values within int8's range"
    )
    assert len(found) == 1


def test_a_shape_that_contradicts_the_model(folder: Path, write_recipe) -> None:
    np.savez(folder / "x.npz", x=np.zeros((4, 3, 5), np.float32))  # the data fits the recipe
    path = write_recipe(RECIPE.replace("shape: [1, 3, 4]", "shape: [1, 3, 5]"))
    [problem] = problems(path)
    assert problem.startswith(
        f"{path}:5:17: source.inputs[0].shape: 'x': axis 2 is 4 in the model, shape declares 5 "
        "([1, 3, 5]) in reshape.onnx"
    )
    assert "hint: declare the model's own size on that axis" in problem


def test_a_dataset_array_with_a_wrong_axis_size(folder: Path, write_recipe) -> None:
    np.savez(folder / "x.npz", x=np.zeros((4, 3, 5), np.float32))
    path = write_recipe(RECIPE)
    assert problems(path) == [
        f"{path}:6:23: evaluation.dataset: x.npz: 'x' has size 5 on axis 2, the recipe declares "
        "4 (shape [1, 3, 4], samples on axis 0)\n"
        "  hint: reshape the data or fix source.inputs (shape, batch_axis)"
    ]


def test_every_signature_problem_at_once(folder: Path, write_recipe) -> None:
    onnx.save(reshape_model(-1, rate=True), str(folder / "reshape.onnx"))
    np.savez(folder / "x.npz", x=np.zeros((4, 3, 5), np.float32))
    (folder / "sub").mkdir()
    np.save(folder / "sub" / "rate.npy", np.array(16000.5))
    # the entries' own problems, each at its key
    entries = RECIPE.replace(
        "    - {name: x, shape: [1, 3, 4]}\n",
        "    - {name: x, shape: [1, 3, 6], batch_axis: 3}\n"
        "    - {name: rate, shape: [], dtype: int64, value: sub/rate.npy}\n",
    )
    found = problems(write_recipe(entries))
    assert [p.split(": ")[1] for p in found] == [
        "source.inputs[0].batch_axis",
        "source.inputs[1].value",
    ]
    assert "rate.npy holds float64, dtype declares int64" in found[1]
    # entries that validate, checked against the model and the dataset: all three at once
    against = entries.replace(", batch_axis: 3", "").replace(
        "dtype: int64, value: sub/rate.npy", "dtype: int32, value: 16000"
    )
    path = write_recipe(against)
    assert problems(path) == [
        f"{path}:5:17: source.inputs[0].shape: 'x': axis 2 is 4 in the model, shape declares 6 "
        "([1, 3, 6]) in reshape.onnx\n  hint: declare the model's own size on that axis; only "
        "its -1, 0 or symbolic dims take the recipe's size",
        f"{path}:6:38: source.inputs[1].dtype: 'rate' is int64 in reshape.onnx, the recipe has "
        "int32\n  hint: set dtype: int64",
        f"{path}:7:23: evaluation.dataset: x.npz: 'x' has size 5 on axis 2, the recipe declares "
        "6 (shape [1, 3, 6], samples on axis 0)\n"
        "  hint: reshape the data or fix source.inputs (shape, batch_axis)",
    ]


def test_a_batch_axis_beyond_the_shape_and_on_a_constant(folder: Path, write_recipe) -> None:
    text = RECIPE.replace(
        "    - {name: x, shape: [1, 3, 4]}\n",
        "    - {name: x, shape: [1, 3, 4], batch_axis: 3}\n"
        "    - {name: rate, shape: [], value: 16000, batch_axis: 0}\n",
    )
    found = problems(write_recipe(text))
    assert [p.split(": ", 2)[1:] for p in found] == [
        [
            "source.inputs[0].batch_axis",
            "batch_axis 3 is beyond the 3 axes of shape [1, 3, 4]\n"
            "  hint: use an axis from 0 to 2, or null for no batch axis",
        ],
        [
            "source.inputs[1].batch_axis",
            "a constant has no batch axis (got batch_axis: 0)\n"
            "  hint: remove batch_axis (or set it to null)",
        ],
    ]


def test_constants_take_their_dtype_from_the_value(tmp_path: Path) -> None:
    np.save(tmp_path / "window.npy", np.hanning(4).astype(np.float32))
    context = {"base_dir": tmp_path}
    window = TensorSpec.model_validate(
        {"name": "w", "shape": [4], "value": "window.npy"}, context=context
    )
    assert (window.dtype, window.batch_axis) == ("float32", None)
    assert np.array_equal(window.constant(), np.hanning(4).astype(np.float32))
    rate = TensorSpec(name="rate", shape=[], value=16000)
    assert (rate.dtype, rate.constant().dtype, rate.constant().shape) == ("int64", "int64", ())
    assert TensorSpec(name="m", shape=[2, 2], value=[[1, 0], [0, 1]], dtype="float32").dtype == (
        "float32"
    )
    with pytest.raises(ValueError, match="holds float32, dtype declares int64"):
        TensorSpec.model_validate(
            {"name": "w", "shape": [4], "value": "window.npy", "dtype": "int64"}, context=context
        )
    with pytest.raises(ValueError, match="not a rectangular array"):
        TensorSpec(name="m", shape=[2, 2], value=[[1, 0], [0]])
    with pytest.raises(ValueError, match="the value has shape \\[2\\], shape declares \\[3\\]"):
        TensorSpec(name="m", shape=[3], value=[1, 2])


def test_batches_follow_the_declared_axes() -> None:
    state = np.arange(2 * 5 * 3).reshape(2, 5, 3)
    x = np.arange(5 * 4).reshape(5, 4)
    window = np.ones(3)
    samples = Samples({"x": x, "state": state, "w": window}, None, {"state": 1, "w": None})
    assert len(samples) == 5
    batches = list(samples.batches(2, fixed=True))
    assert [size for _, size in batches] == [2, 2, 1]
    last, _ = batches[-1]
    assert last["state"].shape == (2, 2, 3)
    assert np.array_equal(last["state"], state[:, [4, 4]])  # padded by repeating sample 4
    assert np.array_equal(last["x"], x[[4, 4]])
    assert all(f["w"] is window for f, _ in batches)  # no batch axis: fed whole
    first, _ = next(samples.batches(2, fixed=False))
    assert np.array_equal(first["state"], state[:, :2])


def data_fn(**_: object) -> dict[str, np.ndarray]:
    return {"x": np.zeros((6, 16)), "state": np.zeros((2, 6, 15))}


def test_a_dataset_from_code_is_checked_on_every_axis_but_the_batch() -> None:
    from edgeflow.core.refs import ImportRef

    spec = DatasetSpec.model_construct(
        dataset=ImportRef.parse(f"{__name__}:data_fn", Path(".")),
        split=None,
        samples=None,
        options={},
    )
    inputs = [
        TensorSpec(name="x", shape=[1, 16]),
        TensorSpec(name="state", shape=[2, 1, 16], batch_axis=1),
        TensorSpec(name="rate", shape=[], value=16000),  # a constant: not in the dataset
    ]
    with pytest.raises(EdgeflowError) as info:
        load_samples(spec, inputs, "evaluation")
    assert info.value.message == (
        f"evaluation dataset {spec.dataset}: 'state' has size 15 on axis 2, the recipe declares "
        "16 (shape [2, 1, 16], samples on axis 1)"
    )
    inputs[1] = TensorSpec(name="state", shape=[2, 1, 15], batch_axis=1)
    samples = load_samples(spec.model_copy(update={"samples": 4}), inputs, "evaluation")
    assert sorted(samples.inputs) == ["state", "x"] and len(samples) == 4
    assert samples.inputs["state"].shape == (2, 4, 15)
