"""Run a model in a runtime over a whole sample set, batched where its input shape allows."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from edgeflow.core import progress
from edgeflow.core.errors import AtRecipeKey, EdgeflowError
from edgeflow.data import Samples
from edgeflow.schema.sections import default_output_names
from edgeflow.schema.source import batch_size


class Runner(Protocol):
    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]: ...


class OnnxRunner:
    """An onnxruntime session (.onnx or .ort) on the CPU execution provider."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.declared = {i.name: i.type for i in session.get_inputs()}

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
        from edgeflow.core.onnxsession import as_declared

        declared = self.declared
        fed = {k: as_declared(v, declared[k]) if k in declared else v for k, v in feeds.items()}
        return [np.asarray(o) for o in self.session.run(None, fed)]


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


@dataclass(frozen=True)
class BatchAxes:
    """Each output's batch axis, by name (evaluation.outputs.<name>.batch_axis, else 0):
    outputs are taken batch-first where they enter edgeflow, so that every comparison, the
    reference file and the report count samples on axis 0."""

    declared: Mapping[str, int] = field(default_factory=dict)  # the axes that are not 0
    names: tuple[str, ...] | None = None  # the outputs' names (None: the export's defaults)

    @classmethod
    def of(cls, declared: Mapping[str, Any], names: Sequence[str] | None) -> BatchAxes:
        """The axes `declared` (evaluation.outputs) gives the outputs called `names`."""
        axes = {n: spec.batch_axis for n, spec in declared.items() if spec.batch_axis}
        return cls(axes, tuple(names) if names else None)

    def first(self, outputs: Sequence[np.ndarray], keep: Sequence[int] = ()) -> list[np.ndarray]:
        """`outputs` (all of one run) with each batch axis moved to the front (but those at
        the positions `keep`)."""
        if not self.declared:
            return list(outputs)
        names = self.names or tuple(default_output_names(len(outputs)))
        return [o if i in keep else self._moved(names[i], o) for i, o in enumerate(outputs)]

    def _moved(self, name: str, output: np.ndarray) -> np.ndarray:
        axis = self.declared.get(name, 0)
        if axis == 0:
            return output
        if output.ndim <= axis:
            raise AtRecipeKey(
                f"evaluation.outputs.{name}.batch_axis",
                f"output '{name}' has shape {list(output.shape)}, no axis {axis} (got {axis})",
                f"set batch_axis to the axis of {list(output.shape)} that holds the samples",
            )
        return np.moveaxis(output, axis, 0)


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
    runner: Runner,
    samples: Samples,
    batch: int,
    fixed: bool,
    what: str = "inference",
    axes: BatchAxes = BatchAxes(),
) -> list[np.ndarray]:
    """Outputs for every sample, one array per model output, batch-first (`axes`: where each
    output's batch axis is in the model's own layout) in sample order (`what`: the task's
    name in the progress shown). A 0-D output of a one-sample batch is that sample's value
    (a regressor that squeezes its batch axis away: speechmos' PLCMOS); of a larger batch, an
    error."""
    chunks = []
    with progress.task(what, total=len(samples), unit="samples") as task:
        for feeds, size in samples.batches(batch, fixed):
            outs = axes.first(runner.run(feeds))
            if any(o.ndim == 0 for o in outs):
                if batch != 1:
                    raise EdgeflowError(
                        f"an output is 0-D: one value for a batch of {batch} samples, with no "
                        "axis that holds them",
                        "declare the inputs with a batch of 1, or give the output a batch axis",
                    )
                outs = [o.reshape(1) if o.ndim == 0 else o for o in outs]
            chunks.append([unpadded(o, size, batch, fixed) for o in outs])
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
