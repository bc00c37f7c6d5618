"""Binary search for the smallest TFLite Micro arena, in a process of its own.

TFLite Micro can crash (SIGSEGV) when the arena is too small, not only fail: seen with a
MEAN model at arena sizes both far below and just above its persistent ("tail") allocations.
edgeflow.targets.tflite_micro runs this file with the model path, a range and a guess: low
does not allocate; high does, or is 0 when no size is known to allocate (the search then
tries the guess, then doubles from low). It prints `try:N` before each attempt and `ok:N` /
`fail:N` after, so when the process dies the parent knows which size killed it, counts it as
not allocating and starts this search again above it. The last line is `min:N`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main(path: str, low: int, high: int, guess: int) -> None:
    from tflite_micro import runtime

    model = Path(path).read_bytes()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)  # TFLM's allocation messages; the parent only needs the verdicts
    while high <= 0 or high - low > 1:
        if high > 0:
            mid = (low + high) // 2
        elif guess > low:
            mid, guess = guess, 0
        else:
            mid = max(2 * low, 1024)
        print(f"try:{mid}", flush=True)
        try:
            runtime.Interpreter.from_bytes(model, arena_size=mid)
        except RuntimeError:
            print(f"fail:{mid}", flush=True)
            low = mid
        else:
            print(f"ok:{mid}", flush=True)
            high = mid
    print(f"min:{high}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:5]))
