"""The Keras digits demo (edgeflow.zoo.digits_keras): the committed weights' accuracy, and
training that writes the same bytes twice."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeflow.datasets import sklearn_digits
from tests import needs
from tests.conftest import REPO

keras = needs.module("keras")  # TensorFlow's

from edgeflow.zoo.digits_keras import digits_cnn, digits_mobilenet, digits_nhwc  # noqa: E402

WEIGHTS = {
    digits_cnn: (REPO / "models" / "digits_keras.weights.h5", 1),
    digits_mobilenet: (REPO / "models" / "digits_keras_mobilenet.weights.h5", 4),
}


def test_digits_nhwc_is_the_digits_channel_last() -> None:
    nchw, nhwc = sklearn_digits("calibration", scale=2), digits_nhwc("calibration", scale=2)
    assert nhwc["image"].shape == (180, 16, 16, 1) and nhwc["image"].flags.c_contiguous
    np.testing.assert_array_equal(nhwc["image"], nchw["image"].transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(nhwc["label"], nchw["label"])


@pytest.mark.parametrize("build", list(WEIGHTS), ids=lambda b: b.__name__)
def test_the_committed_weights_reach_the_pytorch_models_accuracy(build) -> None:
    path, scale = WEIGHTS[build]
    model = build()
    assert [t.name for t in model.inputs] == ["image"]
    assert model.layers[-1].name == "logits" and model.output.shape == (None, 10)
    model.load_weights(path)
    test = digits_nhwc("test", scale=scale)
    logits = model.predict(test["image"], batch_size=360, verbose=0)
    assert np.mean(logits.argmax(1) == test["label"]) >= 0.97


def test_the_cnn_has_digitscnns_layers() -> None:
    model = digits_cnn()
    kinds = [type(layer).__name__ for layer in model.layers]
    assert kinds == [
        "InputLayer",
        *("Conv2D", "BatchNormalization", "ReLU") * 2,
        "MaxPooling2D",
        "Conv2D",
        "GlobalAveragePooling2D",
        "Dense",
    ]
    # DigitsCNN's 14,474 parameters and BatchNorm's 96 moving statistics (buffers in PyTorch)
    assert model.count_params() == 14_570


def test_training_writes_the_same_weights_twice(tmp_path: Path) -> None:
    """One epoch twice in one fresh process (the seeds and op determinism are global)."""
    code = (
        "import sys; from pathlib import Path; from edgeflow.zoo.digits_keras import train\n"
        "for out in sys.argv[1:]: print(train(Path(out), epochs=1))"
    )
    outs = [tmp_path / "a.weights.h5", tmp_path / "b.weights.h5"]
    done = subprocess.run(
        [sys.executable, "-c", code, *map(str, outs)],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    first, second = (float(v) for v in done.stdout.split())
    assert first == second and first > 0.2  # one epoch: better than chance (0.1)
    assert outs[0].read_bytes() == outs[1].read_bytes()
