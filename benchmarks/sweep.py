"""How much a sweep shares: a 4-target x 2-quantization sweep of the digits demo against one
full build and downstream-only rebuilds.

    python benchmarks/sweep.py            (from the repository root; about 5 minutes)

Prints the total sweep time; the time of one full build (fresh cache: every stage); the time
of one downstream-only rebuild (the same recipe and target, another quantization: load,
rewrite, export and precheck come from the cache); and the ratio
total / (one full build + 7 downstream rebuilds). Goal: <= 1.3. Every run uses its own cache
and build folder in a temporary directory, so nothing here is reused from earlier runs. The
armnn jobs need Debian's Arm NN (see docs/targets.md); without it they fail fast.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGETS = ("tflite_micro", "onnxruntime_micro", "armnn", "tflite")
MODES = ("int8", "none")


def edgeflow(args: list[str], work: Path) -> float:
    """Seconds that `edgeflow run ARGS` takes in `work` (its own cache and build folder)."""
    command = [sys.executable, "-m", "edgeflow", "run", *args]
    command += [f"cache_dir={work / 'cache'}", f"build_dir={work / 'build'}"]
    start = time.perf_counter()
    run = subprocess.run(command, cwd=work, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if run.returncode != 0:
        print(run.stdout[-3000:], run.stderr[-3000:], sep="\n")
        raise SystemExit(f"edgeflow run {' '.join(args)} failed ({run.returncode})")
    return seconds


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="edgeflow-bench-") as tmp:
        root = Path(tmp)
        (root / "sweep").mkdir()
        (root / "single").mkdir()
        grid = [f"target={','.join(TARGETS)}", f"quantization.mode={','.join(MODES)}"]
        total = edgeflow(["-m", "recipe=digits_cnn", *grid], root / "sweep")
        job = ["recipe=digits_cnn", f"target={TARGETS[0]}"]
        full = edgeflow([*job, f"quantization.mode={MODES[0]}"], root / "single")
        downstream = edgeflow([*job, f"quantization.mode={MODES[1]}"], root / "single")
    jobs = len(TARGETS) * len(MODES)
    ideal = full + (jobs - 1) * downstream
    print(f"sweep of {jobs} builds ({len(TARGETS)} targets x {len(MODES)} modes): {total:.1f} s")
    print(f"one full build ({TARGETS[0]}, {MODES[0]}, fresh cache): {full:.1f} s")
    print(f"one downstream-only rebuild ({TARGETS[0]}, {MODES[1]}): {downstream:.1f} s")
    print(f"ratio total / (full + {jobs - 1} x downstream) = {total / ideal:.2f} (goal <= 1.3)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
