"""One headless Chromium per test module, for the pages its tests open; the builds whose
pages they look at."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeflow.cli import main
from tests.browser import Chromium, launch_chromium


@pytest.fixture(scope="module")
def chromium() -> Iterator[Chromium]:
    with launch_chromium() as browser:
        yield browser


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> Path:
    """In build/: a sweep of the demo over int8 and float32 on onnxruntime_micro (sweep.html),
    and its int8 build on tflite_micro (a measured arena); in failing/: the int8 build held
    to an SQNR it misses, so that the per-layer diff runs and finds a divergence."""
    root = tmp_path_factory.mktemp("reports")
    common = ["recipe=digits_cnn", f"cache_dir={shared_cache}"]
    build = f"build_dir={root / 'build'}"
    sweep = ["run", "-m", *common, "target=onnxruntime_micro", "quantization=int8,none", build]
    assert main(sweep) == 0
    assert main(["run", *common, "target=tflite_micro", "quantization=int8", build]) == 0
    failing = ["run", *common, "target=onnxruntime_micro", "quantization=int8"]
    failing += ["verify.min_sqnr_db=60", "diff.min_sqnr_db=60", f"build_dir={root / 'failing'}"]
    assert main(failing) == 1
    return root
