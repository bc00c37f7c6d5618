"""The pipeline runner: cached re-runs, partial invalidation, native crashes as stage failures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edgeflow.core.errors import MissingDependency, StageFailed
from edgeflow.engine.cache import Cache
from edgeflow.engine.runner import run_build
from edgeflow.engine.worker import run_isolated
from edgeflow.recipe import load_recipe
from edgeflow.stages.base import Stage, StageContext
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
    assert lines[-1] == "  nothing to do: all 12 stages cached"

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
        "html": "ran",
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


def _pid(ctx: StageContext) -> None:
    (ctx.out_dir / "pid").write_text(f"{os.getpid()} {os.environ.get('EDGEFLOW_TEST_VALUE')}")


def _refuses(ctx: StageContext) -> None:
    raise StageFailed(ctx.stage.name, "the step changed what the model computes", "set x")


def test_one_warm_worker_runs_the_stages_and_a_crash_gets_a_fresh_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stages of a build share one worker process; after a native crash the next stage
    starts another; a changed environment is seen, as a new process would see it."""
    from edgeflow.engine.worker import Worker

    loaded = load_recipe(DEMO_RECIPE)
    pid = Stage(name="pid", description="its process", run=_pid, isolated=True)
    crashy = Stage(name="crashy", description="aborts", run=_abort, isolated=True)
    refuses = Stage(name="refuses", description="a user error", run=_refuses, isolated=True)

    def run(worker: Worker, stage: Stage, name: str) -> str:
        out = tmp_path / name
        out.mkdir()
        worker.run(StageContext(stage, loaded, {}, out))
        return (out / "pid").read_text()

    with Worker(tmp_path) as worker:
        first, second = run(worker, pid, "a"), run(worker, pid, "b")
        assert first == second and worker.started == 1
        (tmp_path / "c").mkdir()
        with pytest.raises(StageFailed) as info:
            worker.run(StageContext(refuses, loaded, {}, tmp_path / "c"))
        assert info.value.message == (
            "stage 'refuses' failed: the step changed what the model computes"
        )
        assert info.value.hint == "set x" and worker.started == 1
        (tmp_path / "d").mkdir()
        with pytest.raises(StageFailed) as crash:
            worker.run(StageContext(crashy, loaded, {}, tmp_path / "d"))
        assert "killed by SIGABRT" in crash.value.message
        assert (tmp_path / "d" / "worker.log").is_file()
        after = run(worker, pid, "e")
        assert after.split()[0] != first.split()[0] and worker.started == 2
        monkeypatch.setenv("EDGEFLOW_TEST_VALUE", "seen")
        assert run(worker, pid, "f").split()[1] == "seen" and worker.started == 3
        assert not any((tmp_path / d / ".job.pkl").exists() for d in "abcdef")


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


@pytest.mark.parametrize("damage", ["flipped", "truncated", "emptied", "deleted", "all deleted"])
def test_a_damaged_artifact_in_the_cache_is_rebuilt_not_published(
    damage: str, tmp_path: Path, shared_cache: Path, capsys
) -> None:
    """The converted model.ort damaged after it was cached: the rerun recomputes it (with a
    warning), verifies it, and publishes the sound one."""
    import shutil

    from edgeflow.cli import main

    cache = tmp_path / "cache"
    shutil.copytree(shared_cache, cache, dirs_exist_ok=True, symlinks=True)
    args = ["run", "recipe=digits_cnn", f"cache_dir={cache}", f"build_dir={tmp_path / 'b'}"]
    assert main(args) == 0
    published = tmp_path / "b" / "digits_cnn" / "onnxruntime_micro-int8" / "model.ort"
    sound = published.read_bytes()
    # Every cached artifact with these bytes is damaged: the copied cache may hold other
    # builds' entries with the same model (keys differ, bytes do not), and the one this build
    # reads must be among them.
    entries = [
        p for p in (cache / "convert").glob("*/*/artifact/model.ort") if p.read_bytes() == sound
    ]
    assert entries
    for ort in entries:
        if damage == "flipped":
            data = bytearray(ort.read_bytes())
            data[len(data) // 2] ^= 0xFF
            ort.write_bytes(bytes(data))
        elif damage == "truncated":
            ort.write_bytes(ort.read_bytes()[: len(sound) // 2])
        elif damage == "emptied":
            ort.write_bytes(b"")
        elif damage == "deleted":
            ort.unlink()
        else:
            for path in ort.parent.parent.rglob("*"):
                if path.is_file():
                    path.unlink()
    capsys.readouterr()
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "warning: cache entry" in err and "of stage 'convert' is damaged" in err
    assert "  convert        ran" in out and "verified: every threshold" in out
    assert published.read_bytes() == sound  # .ort conversion is byte-reproducible


def _bug(ctx: StageContext) -> None:
    (ctx.out_dir / "half.txt").write_text("written before the bug")
    _ = {}["missing"]  # a bug in edgeflow's own stage code


@pytest.mark.parametrize("isolated", [False, True])
def test_a_bug_in_a_stage_is_an_internal_error_with_its_traceback_kept(
    isolated: bool, tmp_path: Path
) -> None:
    from edgeflow.core.errors import EdgeflowError, InternalError
    from edgeflow.engine.runner import execute

    stage = Stage(name="buggy", description="raises", run=_bug, isolated=isolated)
    cache = Cache(tmp_path / "cache")
    with pytest.raises(InternalError) as info:
        cache.get_or_create(
            "buggy", "b" * 64, lambda out: execute(stage, load_recipe(DEMO_RECIPE), {}, out), {}
        )
    error = info.value
    assert not isinstance(error, EdgeflowError) and error.exit_code == 1
    assert str(error) == "internal error in stage 'buggy' (a bug in edgeflow): KeyError: 'missing'"
    kept = tmp_path / "cache" / "failed" / f"buggy-{'b' * 16}"
    assert error.details == kept
    traceback = (kept / "traceback.txt").read_text()
    assert "Traceback (most recent call last)" in traceback and "in _bug" in traceback
    assert (kept / "half.txt").is_file()
    assert f"full traceback: {kept}/traceback.txt" in error.render()


def test_sigterm_and_ctrl_c_stop_a_build_cleanly(tmp_path: Path) -> None:
    """A cold build stopped while its worker runs: exit 128+signal, no traceback, no worker
    process and no temporary folder left behind."""
    import signal
    import subprocess
    import sys
    import time

    for sig, group in ((signal.SIGTERM, False), (signal.SIGINT, True)):
        cache = tmp_path / f"cache-{sig.name}"
        cmd = [sys.executable, "-m", "edgeflow", "run", "recipe=digits_cnn"]
        cmd += [f"cache_dir={cache}", f"build_dir={tmp_path / 'b'}", "quantization=none"]
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            # as in a terminal: a suite started in the background (`cmd &` in a script)
            # passes SIGINT on ignored, and the build would then ignore Ctrl-C
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        deadline = time.monotonic() + 120
        # the worker exports (~2 s)
        while not list((cache / "tmp").glob("export-*/content/.job.pkl")):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        if group:
            os.killpg(proc.pid, sig)  # Ctrl-C reaches the whole foreground group
        else:
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + sig.value, err
        assert "Traceback" not in err and f"stopped by {sig.name}" in err
        time.sleep(0.5)
        workers = subprocess.run(
            ["pgrep", "-f", f"edgeflow.engine.worker {cache}"], capture_output=True, check=False
        )
        assert workers.stdout == b""
        assert list((cache / "tmp").iterdir()) == []


def test_a_shared_read_only_cache_serves_a_build_and_names_itself_when_it_lacks_one(
    tmp_path: Path, capsys
) -> None:
    """A complete cache mounted read-only: hits are served (nothing is logged into it); a
    stage it lacks, and a read-only build folder, are exit-2 errors naming the folder."""
    import subprocess

    from edgeflow.cli import main

    shared, mounted = tmp_path / "shared", tmp_path / "mounted"
    mounted.mkdir()
    build = ["run", "recipe=digits_cnn", f"build_dir={tmp_path / 'b'}"]
    assert main([*build, f"cache_dir={shared}"]) == 0
    if subprocess.run(["mount", "--bind", str(shared), str(mounted)], check=False).returncode:
        pytest.skip("cannot bind-mount here (needs root)")
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", str(mounted)], check=False).returncode:
            pytest.skip("cannot remount read-only here")
        capsys.readouterr()
        assert main([*build, f"cache_dir={mounted}"]) == 0
        assert "nothing to do: all 12 stages cached" in capsys.readouterr().out
        assert main([*build, f"cache_dir={mounted}", "quantization=none"]) == 2
        err = capsys.readouterr().err
        assert f"the cache {mounted} is read-only and has no entry for stage" in err
        assert main([*build[:2], f"build_dir={mounted / 'b'}", f"cache_dir={mounted}"]) == 2
        err = capsys.readouterr().err
        assert f"cannot create the build folder {mounted / 'b'}" in err and "Traceback" not in err
    finally:
        subprocess.run(["umount", str(mounted)], check=False)


def test_an_epsilon_that_keeps_a_log_finite_survives_the_optimizer(tmp_path: Path) -> None:
    """The optimize stage used to delete `+ 1e-10` before a Log (onnxscript's x + 0 rule with
    a tolerance), so the float build output -inf on silence where the source gives -23."""
    import numpy as np
    import onnx
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    nodes = [helper.make_node("Add", ["x", "eps"], ["a"]), helper.make_node("Log", ["a"], ["y"])]
    eps = numpy_helper.from_array(np.array(1e-10, np.float32), "eps")
    graph = helper.make_graph(
        nodes,
        "log",
        [helper.make_tensor_value_info("x", T.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", T.FLOAT, [1, 16])],
        [eps],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]),
              str(tmp_path / "log.onnx"))  # fmt: skip
    power = np.random.default_rng(0).random((20, 16)).astype(np.float32)
    power[:5] = 0.0  # silence
    np.savez(tmp_path / "frames.npz", x=power)
    recipe = tmp_path / "log.yaml"
    recipe.write_text(
        "source: {kind: onnx, model: log.onnx, inputs: [{name: x, shape: [1, 16]}]}\n"
        "evaluation: {dataset: frames.npz, metric: agreement}\n"
        "target: onnxruntime_micro\nverify: {max_abs_diff: 1.0e-4}\n"
    )
    result = run_build(load_recipe(recipe), Cache(tmp_path / "c"), tmp_path / "b", print)
    assert result.metrics["verified"] is True
    assert result.metrics["agreement"]["non_finite_samples"] == 0
    assert result.metrics["agreement"]["max_abs_diff"] <= 1e-4
