"""Shared fixtures: the repository's demo recipe, a shared stage cache, recipe writers."""

from __future__ import annotations

import logging
import sys
import textwrap
from pathlib import Path

import pytest

from tests import needs

REPO = Path(__file__).resolve().parent.parent
DEMO_RECIPE = REPO / "recipes" / "digits_cnn.yaml"
DEMO_WEIGHTS = REPO / "models" / "digits_cnn.pt"


def demo_onnx(folder: Path, opset: int = 17) -> Path:
    """The demo's trained CNN as folder/digits.onnx (input `image`, output `logits`), and
    sklearn's digits calibration split as folder/calib.npz, for ONNX sources."""
    import numpy as np
    import torch

    from edgeflow.datasets import sklearn_digits
    from edgeflow.zoo.digits import DigitsCNN

    model = DigitsCNN().eval()
    model.load_state_dict(torch.load(DEMO_WEIGHTS, weights_only=True))
    path = folder / "digits.onnx"
    torch.onnx.export(
        model,
        (torch.zeros(1, 1, 8, 8),),
        str(path),
        dynamo=False,
        opset_version=opset,
        input_names=["image"],
        output_names=["logits"],
    )
    np.savez(folder / "calib.npz", **sklearn_digits("calibration"))
    return path


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "needs(*names): dependencies of tests/needs.py; a skip, a failure under CI"
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """needs.mark(...): checked before any fixture is made (a module's builds among them)."""
    for marker in item.iter_markers("needs"):
        try:
            needs.require(*marker.args)
        except pytest.skip.Exception as skip:  # reported at the test, as skipif's skips are
            raise pytest.skip.Exception(skip.msg, _use_item_location=True) from None


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """One stage cache for the whole run, so the demo's export runs once: under pytest-xdist
    one for all workers (the cache is safe for concurrent builds, as Hydra's parallel
    sweeps use it), in the run's own temporary folder."""
    if not hasattr(request.config, "workerinput"):  # not a pytest-xdist worker
        return tmp_path_factory.mktemp("cache")
    folder = tmp_path_factory.getbasetemp().parent / "shared-cache"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture
def write_recipe(tmp_path: Path):
    """Write a recipe (dedented) into tmp_path and return its path."""

    def write(text: str, name: str = "recipe.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
        return path

    return write


@pytest.fixture(autouse=True)
def _log_handlers_outlive_captured_streams():
    """Libraries imported in-process during a test keep the stream pytest captured for that
    test (TensorFlow's and absl's handlers; absl's even closes it when a later logging.config
    call, Hydra's, shuts all handlers down). Point them at the real stderr afterwards."""
    yield
    real = (sys.__stderr__, sys.__stdout__)
    for ref in list(logging._handlerList):  # every live handler: shutdown() closes them all
        handler = ref()
        if handler is logging.lastResort or type(handler).__module__.startswith("_pytest"):
            continue  # follows sys.stderr by itself / pytest's own log capture
        if isinstance(handler, logging.StreamHandler) and handler.stream not in real:
            handler.stream = sys.__stderr__
