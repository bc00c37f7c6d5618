"""The Flax digits MobileNet (edgeflow.zoo.digits_flax.digits_mobilenet): DigitsMobileNet's
parameters and the committed weights' accuracy in JAX."""

from __future__ import annotations

import numpy as np

from tests import needs
from tests.conftest import REPO

needs.require("jax")

from edgeflow.frameworks import jax as fj  # noqa: E402
from edgeflow.zoo.digits_flax import MOBILENET_SCALE, _nhwc  # noqa: E402

MOBILENET = "edgeflow.zoo.digits_flax:digits_mobilenet"
WEIGHTS = REPO / "models" / "digits_flax_mobilenet.msgpack"


def test_the_mobilenet_has_digitsmobilenets_parameters() -> None:
    import jax

    model = fj.load(MOBILENET, None)
    params = model.params["params"]
    # DigitsMobileNet's (and digits_keras.digits_mobilenet's) 9,882 trainable parameters
    assert sum(np.size(p) for p in jax.tree_util.tree_leaves(params)) == 9_882
    assert params["block1_se_reduce"]["kernel"].shape == (1, 1, 16, 8)
    assert params["logits"]["kernel"].shape == (96, 10)


def test_the_committed_mobilenet_weights_reach_the_pytorch_models_accuracy() -> None:
    model = fj.with_weights(fj.load(MOBILENET, None), WEIGHTS)
    images, labels = _nhwc("test", MOBILENET_SCALE)
    assert images.shape == (360, 32, 32, 1)
    (logits,) = fj.run(model, {"image": images}, ["image"])
    assert np.mean(logits.argmax(1) == labels) >= 0.97  # 0.9806 measured
