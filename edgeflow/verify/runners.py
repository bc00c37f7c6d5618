"""Run a model in a runtime over a whole sample set, batched where its input shape allows."""

from __future__ import annotations

import time
from typing import Any, Protocol

import numpy as np

from edgeflow.core import progress
from edgeflow.core.errors import EdgeflowError
from edgeflow.core.sources import batch_size
from edgeflow.data import Samples


class Runner(Protocol):
    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]: ...


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

    @classmethod
    def checking(cls, path: str) -> OnnxRunner:
        """A reference: what the graph computes, without onnxruntime's graph optimizer
        (edgeflow.core.onnxsession)."""
        from edgeflow.core.onnxsession import checking_session

        return cls(checking_session(path))

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return [np.asarray(o) for o in self.session.run(None, feeds)]


class WithConstants:
    """A runner fed the fed inputs, the constants (inputs bound with `value:`) added to every
    call: a source model run as its exported graph will be."""

    def __init__(self, inner: Any, constants: dict[str, np.ndarray]) -> None:
        self.inner, self.constants = inner, constants

    @classmethod
    def of(cls, inner: Any, specs: list[Any]) -> WithConstants:
        """`inner` with the constants the recipe's inputs bind."""
        return cls(inner, {s.name: s.constant() for s in specs if s.value is not None})

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return list(self.inner.run({**feeds, **self.constants}))


def batching(source: Any) -> tuple[int, bool]:
    """(batch size, whether it is fixed) for running a recipe's model over a sample set."""
    if source.dynamic_batch is not None:
        return min(64, source.dynamic_batch.max), False
    return batch_size(source.inputs), True


def deployment_batch(source: Any) -> int:
    """The batch size latency is measured at: the declared one, within a dynamic range."""
    declared = batch_size(source.inputs)
    dynamic = source.dynamic_batch
    return min(max(declared, dynamic.min), dynamic.max) if dynamic else declared


def run_all(
    runner: Runner, samples: Samples, batch: int, fixed: bool, what: str = "inference"
) -> list[np.ndarray]:
    """Outputs for every sample, one array per model output, in sample order (`what`: the
    task's name in the progress shown)."""
    chunks = []
    with progress.task(what, total=len(samples), unit="samples") as task:
        for feeds, size in samples.batches(batch, fixed):
            chunks.append([unpadded(o, size, batch, fixed) for o in runner.run(feeds)])
            task.advance(size)
    return [joined([c[i] for c in chunks]).astype(np.float32) for i in range(len(chunks[0]))]


def unpadded(output: np.ndarray, size: int, batch: int, fixed: bool) -> np.ndarray:
    """The outputs of a batch's `size` real samples: a padded batch's first `size` rows (an
    output is batched on axis 0); an unpadded batch's whole output, so that one whose batch
    is on another axis (a state [layers, batch, features]) is kept whole."""
    return output[:size] if fixed and size < batch else output


def joined(parts: list[np.ndarray]) -> np.ndarray:
    """One output's batches as one array: stacked on axis 0, or, where batches of different
    sizes differ on one other axis (a state [layers, batch, ...] under a dynamic batch), on
    that axis."""
    if len({p.shape[1:] for p in parts}) <= 1:
        return np.concatenate(parts)
    ndim = parts[0].ndim
    differ = [a for a in range(ndim) if len({p.shape[a] for p in parts if p.ndim == ndim}) > 1]
    if len(differ) != 1 or any(p.ndim != ndim for p in parts):
        shapes = ", ".join(str(list(p.shape)) for p in parts[:4])
        raise EdgeflowError(
            f"an output's batches have shapes {shapes}: they differ on more than a batch axis",
            "make each output's shape depend on the batch on one axis only",
        )
    return np.concatenate(parts, axis=differ[0])


def latency_ms(runner: Runner, feeds: dict[str, np.ndarray], warmup: int, runs: int) -> list[float]:
    """Wall-clock milliseconds of `runs` single inferences after `warmup` untimed ones."""
    for _ in range(warmup):
        runner.run(feeds)
    times = []
    with progress.task("latency", total=runs, unit="runs") as task:
        for _ in range(runs):
            start = time.perf_counter()
            runner.run(feeds)
            times.append((time.perf_counter() - start) * 1e3)
            task.advance()
    return times
