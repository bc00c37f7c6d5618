"""Keras model files as packages ship them: a legacy HDF5 file under either of its suffixes
(.h5, and .hdf5 as older Keras wrote it) validates and loads like a .keras file."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from tests import needs

keras = needs.module("keras")  # TensorFlow's

from edgeflow.frameworks import tensorflow as tfw  # noqa: E402
from edgeflow.recipe import load_recipe  # noqa: E402

RECIPE = """
source:
  kind: tensorflow
  model: {model}
  inputs: [{{name: image, shape: [1, 8, 8, 1]}}]
  outputs: [logits]
evaluation: {{dataset: "edgeflow.zoo.digits_keras:digits_nhwc", split: test, metric: agreement}}
target: tflite
"""


def tiny_model():
    keras.utils.set_random_seed(0)
    image = keras.Input((8, 8, 1), name="image")
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(image)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(image, keras.layers.Dense(10, name="logits")(x))


@pytest.mark.parametrize("suffix", [".h5", ".hdf5"])
def test_a_legacy_hdf5_file_validates_and_loads(tmp_path: Path, write_recipe, suffix) -> None:
    model = tiny_model()
    model.save(tmp_path / "saved.h5")  # Keras 3 writes legacy HDF5 under .h5 only
    path = tmp_path / f"net{suffix}"
    if suffix != ".h5":
        shutil.copyfile(tmp_path / "saved.h5", path)
    else:
        (tmp_path / "saved.h5").rename(path)
    loaded = load_recipe(write_recipe(RECIPE.format(model=path.name)))
    assert loaded.recipe.source.model == path
    found = tfw.load(loaded.recipe.source)
    assert found.input_names == ["image"] and found.what == path.name
    x = np.random.default_rng(0).random((2, 8, 8, 1), dtype=np.float32)
    expected = np.asarray(model(x))
    got = np.asarray(found.call({"image": x})[0])
    assert np.abs(expected).max() > 0  # the weights came along, not zeros
    np.testing.assert_array_equal(got, expected)
