"""Run a model in a runtime over a whole sample set, batched where its input shape allows."""

from __future__ import annotations

import time
from typing import Any, Protocol

import numpy as np

from edgeflow.data import Samples


class Runner(Protocol):
    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]: ...

    def max_batch(self) -> int: ...


class OnnxRunner:
    """An onnxruntime session (.onnx or .ort) on the CPU execution provider."""

    def __init__(self, session: Any) -> None:
        self.session = session

    @classmethod
    def from_file(cls, path: str) -> OnnxRunner:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3
        return cls(ort.InferenceSession(path, options, providers=["CPUExecutionProvider"]))

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return [np.asarray(o) for o in self.session.run(None, feeds)]

    def max_batch(self) -> int:
        dims = [i.shape[0] if i.shape else 1 for i in self.session.get_inputs()]
        return 64 if all(not isinstance(d, int) for d in dims) else 1

    def run_all(self, samples: Samples) -> list[np.ndarray]:
        return run_all(self, samples)


def run_all(runner: Runner, samples: Samples) -> list[np.ndarray]:
    """Outputs for every sample, one array per model output, in sample order."""
    step = runner.max_batch()
    chunks = []
    for start in range(0, len(samples), step):
        feeds = {k: v[start : start + step] for k, v in samples.inputs.items()}
        chunks.append(runner.run(feeds))
    return [
        np.concatenate([c[i] for c in chunks]).astype(np.float32) for i in range(len(chunks[0]))
    ]


def latency_ms(runner: Runner, feeds: dict[str, np.ndarray], warmup: int, runs: int) -> list[float]:
    """Wall-clock milliseconds of `runs` single inferences after `warmup` untimed ones."""
    for _ in range(warmup):
        runner.run(feeds)
    from tqdm import tqdm

    times = []
    for _ in tqdm(range(runs), desc="latency", unit="run", disable=None, leave=False):
        start = time.perf_counter()
        runner.run(feeds)
        times.append((time.perf_counter() - start) * 1e3)
    return times
