"""Search for the smallest TFLite Micro arena, in a process of its own.

TFLite Micro can crash (SIGSEGV) when the arena is too small, not only fail: seen with a
MEAN model at arena sizes both far below and just above its persistent ("tail") allocations.
edgeflow.targets.tflite_micro.backend runs this file with the model path, a range and a guess (the
total TFLM's recording allocator reported, usually a few bytes above the smallest): low does
not allocate; high does, or is 0 when no size is known to allocate. The guess is tried
first; from there the search gallops (steps from 16 bytes, TFLM's buffer alignment, each
twice the distance from the guess) down from the smallest size that allocates, or up from
the largest that does not, until both sides are known, then halves the range. A load costs
time in proportion to the model (11 s for a model of 35,000 operators); a guess a few bytes
off takes about 6 loads, where halving from 0 took 20. It prints `try:N` before each
attempt and `ok:N` / `fail:N` after, so when the process dies the parent knows which size
killed it, counts it as not allocating and starts this search again above it. The last
line is `min:N`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ALIGNMENT = 16  # bytes: TFLM aligns every buffer in the arena to this


def main(path: str, low: int, high: int, guess: int) -> None:
    from tflite_micro import runtime

    model = Path(path).read_bytes()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)  # TFLM's allocation messages; the parent only needs the verdicts
    anchor, tried = guess, False
    while high <= 0 or high - low > 1:
        # the gallop's step: twice the distance from the guess, so that it doubles from one
        # attempt to the next and in a restarted search too (a crash ends the process)
        if not tried and low < anchor and (high <= 0 or anchor < high):
            mid, tried = anchor, True
        elif high <= 0:  # up from the largest size that failed
            mid = low + max(ALIGNMENT, 2 * (low - anchor))
        elif high - low > 2 * max(ALIGNMENT, 2 * (anchor - high)):  # down from an ok
            mid = high - max(ALIGNMENT, 2 * (anchor - high))
        else:
            mid = (low + high) // 2
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
