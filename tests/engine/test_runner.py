"""The pipeline runner: cached re-runs, partial invalidation, native crashes as stage failures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edgeflow.engine.cache import Cache
from edgeflow.engine.runner import run_build
from edgeflow.engine.stage import Stage, StageContext
from edgeflow.engine.worker import run_isolated
from edgeflow.errors import MissingDependency, StageFailed
from edgeflow.recipe import load_recipe
from tests.conftest import DEMO_RECIPE

pytestmark = pytest.mark.slow


def statuses(result) -> dict[str, str]:
    return {o.stage: o.status for o in result.outcomes}


def test_rerun_is_cached_and_quantization_change_reruns_only_downstream(tmp_path: Path) -> None:
    cache, build = Cache(tmp_path / "cache"), tmp_path / "build"
    lines: list[str] = []
    first = run_build(load_recipe(DEMO_RECIPE), cache, build, lines.append)
    assert set(statuses(first).values()) == {"ran"}

    lines.clear()
    again = run_build(load_recipe(DEMO_RECIPE), cache, build, lines.append)
    assert set(statuses(again).values()) == {"cached"}
    assert lines[-1] == "  nothing to do: all 11 stages cached"

    changed = run_build(
        load_recipe(DEMO_RECIPE, {"quantization.per_channel": False}), cache, build, print
    )
    assert statuses(changed) == {
        "load": "cached",
        "rewrite": "cached",
        "export": "cached",
        "rewrite_onnx": "cached",
        "rewrite_target": "cached",
        "precheck": "cached",
        "optimize": "cached",
        "quantize": "ran",
        "convert": "ran",
        "verify": "ran",
        "report": "ran",
    }
    assert cache.stats.ran.count("export") == 1


def _abort(ctx: StageContext) -> None:
    os.abort()  # what a native converter does when it hits an assertion


def test_native_crash_in_a_worker_is_a_stage_failure(tmp_path: Path) -> None:
    stage = Stage(name="crashy", description="aborts", run=_abort, isolated=True)
    ctx = StageContext(stage, load_recipe(DEMO_RECIPE), {}, tmp_path)
    with pytest.raises(StageFailed) as info:
        run_isolated(ctx)
    assert "killed by SIGABRT" in info.value.message


def _needs_a_tool(ctx: StageContext) -> None:
    raise MissingDependency("target tflite", "onnx2tf", "tflite")


def test_missing_tool_in_a_worker_keeps_its_message_and_exit_status(tmp_path: Path) -> None:
    stage = Stage(name="needy", description="needs a tool", run=_needs_a_tool, isolated=True)
    ctx = StageContext(stage, load_recipe(DEMO_RECIPE), {}, tmp_path)
    with pytest.raises(StageFailed) as info:
        run_isolated(ctx)
    assert info.value.exit_code == 2
    assert "target tflite needs onnx2tf: install it with pip install 'edgeflow[tflite]'" in str(
        info.value
    )
