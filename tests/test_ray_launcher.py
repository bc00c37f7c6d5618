"""A sweep on a Ray cluster with Hydra's Ray launcher: a local cluster on 127.0.0.1, started
and stopped by the test, runs the jobs; they share one stage cache and write one summary."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from edgeflow.engine.cache import Cache
from tests import needs
from tests.conftest import DEMO_RECIPE

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_sweep_on_a_local_ray_cluster(tmp_path: Path) -> None:
    ray = needs.command("ray")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    port = free_port()
    head = [ray, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}"]
    head += ["--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats"]
    subprocess.run(head, env=env, capture_output=True, text=True, check=True, timeout=180)
    try:
        args = ["-m", "hydra/launcher=ray", f"hydra.launcher.ray.init.address=127.0.0.1:{port}"]
        # the launcher asks for an object store size, which Ray 2 refuses when it joins a
        # running cluster; null lets the cluster's own setting stand
        args += ["+hydra.launcher.ray.init.object_store_memory=null"]
        args += [f"recipe={DEMO_RECIPE}", "quantization=none,int8"]
        args += [f"cache_dir={tmp_path}/cache", f"build_dir={tmp_path}/build"]
        args += [f"hydra.sweep.dir={tmp_path}/sweep"]
        run = subprocess.run(
            [sys.executable, "-m", "edgeflow", "run", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=900,
        )
    finally:
        subprocess.run([ray, "stop", "--force"], env=env, capture_output=True, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "_run_job pid=" in run.stdout + run.stderr  # the jobs ran as Ray tasks
    events = Cache(tmp_path / "cache").events()  # counted by the Ray workers
    assert events["export", "ran"] == 1 and events["export", "hit"] == 1
    jobs = json.loads((tmp_path / "build" / "sweep.json").read_text())["jobs"]
    assert sorted(j["build"] for j in jobs) == ["onnxruntime_micro-int8", "onnxruntime_micro-none"]
    assert all(j["status"] == "verified" for j in jobs)
