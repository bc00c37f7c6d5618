"""Run `edgeflow ARGS` in this process and print the CPU seconds of each stage as JSON.

Used by benchmarks/timings.py for its per-stage breakdown:

    python benchmarks/_stage_cpu.py run recipe=... cache_dir=... build_dir=...

A stage's CPU time is what this process spent in it, plus what the worker process spent on
it: the job's own figure from a warm worker (edgeflow.engine.worker.Worker.cpu_seconds), or,
for a worker that exits after each stage, the ended children's time. The worker's start-up
(interpreter, imports before its first job) is counted apart, as is this process's time
outside the stages (imports, Hydra, recipe loading, keys, publishing).
"""

from __future__ import annotations

import json
import resource
import sys
from typing import Any


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def main(argv: list[str]) -> int:
    start = _cpu()
    import edgeflow.engine.runner as runner
    from edgeflow.cli import main as edgeflow_main

    stages: list[dict[str, Any]] = []
    execute = runner.execute

    def measured(stage: Any, *args: Any, **kwargs: Any) -> None:
        worker = kwargs.get("worker") or (args[3] if len(args) > 3 else None)
        jobs = len(getattr(worker, "cpu_seconds", []))
        before = _cpu()
        try:
            execute(stage, *args, **kwargs)
        finally:
            after = _cpu()
            done = getattr(worker, "cpu_seconds", [])
            in_worker = done[jobs][1] if len(done) > jobs else after[1] - before[1]
            stages.append(
                {"stage": stage.name, "parent": after[0] - before[0], "worker": in_worker}
            )

    runner.execute = measured  # type: ignore[assignment]
    try:
        code = edgeflow_main(argv)
    finally:
        end = _cpu()
        in_stages = sum(s["parent"] for s in stages)
        in_jobs = sum(s["worker"] for s in stages)
        result = {
            "stages": stages,
            "parent_outside_stages": end[0] - start[0] - in_stages,
            "worker_outside_jobs": end[1] - start[1] - in_jobs,
        }
        print("STAGE-CPU " + json.dumps(result))
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
