"""Print the demo's cold run time, warm (fully cached) re-run time and `edgeflow --help` time.

Each figure is the median of several runs of the real CLI in a subprocess. Goals (issue 2):
warm re-run under 2 s and under 10% of the cold run; `--help` under 1 s.

    python benchmarks/timings.py [--cold-runs 3] [--warm-runs 5] [--help-runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUN = ["run", "recipe=digits_cnn", "target=onnxruntime_micro", "quantization=int8"]


def timed(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "edgeflow", *args],
        cwd=REPO,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold-runs", type=int, default=3)
    parser.add_argument("--warm-runs", type=int, default=5)
    parser.add_argument("--help-runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        build = f"build_dir={tmp}/build"
        cold = [timed([*RUN, f"cache_dir={tmp}/cold{i}", build]) for i in range(args.cold_runs)]
        warm_cache = f"cache_dir={tmp}/cold0"
        warm = [timed([*RUN, warm_cache, build]) for _ in range(args.warm_runs)]
    helps = [timed(["--help"]) for _ in range(args.help_runs)]
    c, w, h = statistics.median(cold), statistics.median(warm), statistics.median(helps)
    print(f"cold run of the demo     : {c:6.2f} s  (median of {len(cold)})")
    print(f"warm (cached) re-run     : {w:6.2f} s  (median of {len(warm)}; {w / c:.1%} of cold)")
    print(f"edgeflow --help          : {h:6.2f} s  (median of {len(helps)})")
    goals = {"warm < 2 s": w < 2.0, "warm < 10% of cold": w < 0.1 * c, "--help < 1 s": h < 1.0}
    for goal, met in goals.items():
        print(f"goal {goal:<20}: {'met' if met else 'MISSED'}")
    return 0 if all(goals.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
