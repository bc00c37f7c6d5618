"""Stateful models run as they are deployed (source.state): sequence by sequence and step by
step, each step's state output fed back as the next step's state input, from the declared
initial state. The source model and the artifact are run the same way, so that every step's
outputs can be compared and the error's drift over a sequence measured.

Layout: a sequence dataset array has the steps on the axis after its batch axis (the
sequences); a streamed output is returned as [sequences * steps, ...], sequence-major, with
the output's batch axis (a state output's: its state input's) moved to the front."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeflow.core import progress
from edgeflow.core.errors import EdgeflowError
from edgeflow.data import Samples, load_samples, step_axis
from edgeflow.schema.sections import DatasetSpec, StateLink, TensorSpec, default_output_names
from edgeflow.verify.runners import BatchAxes, Runner, batching


@dataclass(frozen=True)
class Streamed:
    outputs: list[np.ndarray]  # per output: [sequences * steps, ...], batch axis first
    states: dict[str, np.ndarray]  # per state input: what each step was fed, on its batch axis
    sequences: int
    steps: int


def run_stream(
    runner: Runner,
    samples: Samples,
    source: Any,
    names: list[str] | None = None,
    batch_axes: BatchAxes | None = None,
) -> Streamed:
    """Run `runner` over every sequence of `samples`, the state fed back step by step (in
    groups of the batch size: a fixed batch's last group padded with its last sequence);
    `batch_axes`: the batch axis of each output that is not a state (a state output's is its
    state input's)."""
    assert samples.steps is not None, "run_stream takes sequences (load_samples with state)"
    batch_axes = batch_axes or BatchAxes()
    specs = {s.name: s for s in source.inputs}
    links: list[StateLink] = list(source.state)
    batch, fixed = batching(source)
    steps = samples.steps
    groups: list[list[np.ndarray]] = []
    fed: dict[str, list[np.ndarray]] = {link.input: [] for link in links}
    index: list[int] | None = None
    total = -(-len(samples) // batch) * steps  # a group of sequences steps together
    with progress.task("streamed sequences", total=total, unit="steps") as task:
        for feeds, size in samples.batches(batch, fixed):
            width = batch if fixed else size
            state = {link.input: link.first(specs[link.input], width) for link in links}
            per_step: list[list[np.ndarray]] = []
            states_in: dict[str, list[np.ndarray]] = {link.input: [] for link in links}
            for t in range(steps):
                chunk = _step(feeds, samples, t)
                for name, value in state.items():
                    states_in[name].append(value)
                outs = runner.run({**chunk, **state})
                if index is None:
                    index = _state_outputs(links, names or default_output_names(len(outs)))
                for link, i in zip(links, index, strict=True):
                    state[link.input] = _as_state(outs[i], specs[link.input], link, t)
                per_step.append(batch_axes.first(outs, keep=index or []))
                task.advance()
            axes = _output_axes(len(per_step[0]), links, index or [], specs)
            groups.append(
                [_stacked([s[i] for s in per_step], axes[i], size) for i in range(len(axes))]
            )
            for name, values in states_in.items():
                fed[name].append(_merged(values, _axis(specs[name]), size))
    outputs = [np.concatenate([g[i] for g in groups]) for i in range(len(groups[0]))]
    states = {name: np.concatenate(parts, _axis(specs[name])) for name, parts in fed.items()}
    return Streamed(outputs, states, len(samples), steps)


def _axis(spec: TensorSpec) -> int:
    """An input's batch axis; a stateful model's data and state inputs all have one (specs)."""
    assert spec.batch_axis is not None
    return spec.batch_axis


def _step(feeds: dict[str, np.ndarray], samples: Samples, t: int) -> dict[str, np.ndarray]:
    """The data inputs of step `t` of a group of sequences: their step axis taken."""
    return {k: np.take(v, t, axis=step_axis(samples.axes.get(k, 0))) for k, v in feeds.items()}


def _state_outputs(links: list[StateLink], names: list[str]) -> list[int]:
    """The position of each link's output among the model's outputs."""
    found = []
    for i, link in enumerate(links):
        if link.output not in names:
            raise EdgeflowError(
                f"source.state[{i}].output: the model has no output '{link.output}' (its "
                f"outputs: {', '.join(names)})",
                "name the output that holds the next step's state (source.outputs names them)",
            )
        found.append(names.index(link.output))
    return found


def _as_state(value: np.ndarray, spec: TensorSpec, link: StateLink, step: int) -> np.ndarray:
    """A state output as the next step's state input: of the input's shape and dtype."""
    want = list(spec.shape)
    if spec.batch_axis is not None:
        want[spec.batch_axis] = value.shape[spec.batch_axis] if value.ndim == len(want) else -1
    if list(value.shape) != want:
        raise EdgeflowError(
            f"source.state: output '{link.output}' has shape {list(value.shape)} at step "
            f"{step + 1}, the state input '{link.input}' takes {spec.shape}",
            "link the output that holds the next step's state, of the state input's shape",
        )
    return np.ascontiguousarray(value.astype(spec.dtype, copy=False))


def _output_axes(
    count: int, links: list[StateLink], index: list[int], specs: dict[str, TensorSpec]
) -> list[int]:
    """Each output's batch axis: a state output's is its state input's, any other's 0 (it
    was moved to the front already)."""
    axes = [0] * count
    for link, i in zip(links, index, strict=True):
        axes[i] = _axis(specs[link.input])
    return axes


def _stacked(per_step: list[np.ndarray], axis: int, size: int) -> np.ndarray:
    """One output's steps of a group as [size * steps, ...]: batch first, sequence-major."""
    if np.ndim(per_step[0]) <= axis:
        raise EdgeflowError(
            f"an output of shape {list(np.shape(per_step[0]))} has no batch axis {axis}: a "
            "stateful model's outputs are per sequence",
            "give every output a batch axis (axis 0; a state output its state input's)",
        )
    parts = [np.moveaxis(np.asarray(a), axis, 0)[:size] for a in per_step]
    stacked = np.stack(parts, axis=1)  # [size, steps, ...]
    return stacked.reshape(size * len(per_step), *stacked.shape[2:]).astype(np.float32)


def _merged(per_step: list[np.ndarray], axis: int, size: int) -> np.ndarray:
    """A state input's values over a group's steps, on its batch axis, sequence-major."""
    lead = (slice(None),) * axis
    stacked = np.stack([a[(*lead, slice(size))] for a in per_step], axis=axis + 1)
    shape = list(stacked.shape)
    return stacked.reshape(*shape[:axis], shape[axis] * shape[axis + 1], *shape[axis + 2 :])


def step_samples(samples: Samples, streamed: Streamed, source: Any) -> Samples:
    """The sequences' steps as plain samples, each with the state the run reached at it (the
    states of real sequences: what int8 calibration and the per-layer tools are fed)."""
    assert samples.steps is not None
    specs = {s.name: s for s in source.inputs}
    inputs: dict[str, np.ndarray] = {}
    for name, arr in samples.inputs.items():
        axis = _axis(specs[name])
        shape = list(arr.shape)
        inputs[name] = arr.reshape(*shape[:axis], shape[axis] * shape[axis + 1], *shape[axis + 2 :])
    inputs.update(streamed.states)
    labels = samples.labels
    if labels is not None:
        labels = labels.reshape(-1) if labels.ndim == 2 else np.repeat(labels, samples.steps)
    axes = {name: _axis(specs[name]) for name in inputs}
    return Samples(inputs, labels, axes)


def load_steps(spec: DatasetSpec, source: Any, what: str, model: Path) -> Samples:
    """A dataset's samples as the model is fed them: plain samples, or for a stateful model
    each step of each sequence with the state the float ONNX `model` (run in onnxruntime)
    reached at it."""
    if not source.state:
        return load_samples(spec, source.inputs, what)
    from edgeflow.verify.runners import OnnxRunner

    sequences = load_samples(spec, source.inputs, what, source.state)
    runner = OnnxRunner.checking(str(model))
    names = [o.name for o in runner.session.get_outputs()]
    streamed = run_stream(runner, sequences, source, names)
    return step_samples(sequences, streamed, source)


def first_step(samples: Samples, source: Any, batch: int) -> dict[str, np.ndarray]:
    """The feeds of the first step of the first `batch` sequences, from the initial state."""
    specs = {s.name: s for s in source.inputs}
    feeds, _ = next(samples.batches(batch, fixed=True))
    first = {link.input: link.first(specs[link.input], batch) for link in source.state}
    return {**_step(feeds, samples, 0), **first}


def last_steps(outputs: np.ndarray, steps: int) -> np.ndarray:
    """A streamed output's last step of each sequence: the decision after the whole input."""
    return outputs.reshape(-1, steps, *outputs.shape[1:])[:, -1]


def drift(
    reference: list[np.ndarray], actual: list[np.ndarray], names: list[str], steps: int
) -> dict[str, Any]:
    """Per output, the error at each step (max |artifact - source| over the sequences,
    relative to the output's range) and how it grows along the sequence: `growth` is the mean
    error over the last quarter of the steps over that of the first quarter (None where the
    first is 0). Steps where the artifact output NaN or Inf have no figure (None)."""
    per_output = []
    quarter = max(1, steps // 4)
    for name, ref, out in zip(names, reference, actual, strict=True):
        r = ref.reshape(-1, steps, int(np.prod(ref.shape[1:], dtype=np.int64))).astype(np.float64)
        o = out.reshape(r.shape).astype(np.float64)
        scale = float(np.max(np.abs(r))) or 1.0
        with np.errstate(invalid="ignore"):
            err = np.max(np.abs(r - o), axis=(0, 2)) / scale
        err[~np.isfinite(err)] = np.nan  # a step where some output is NaN or Inf
        head, tail = _mean(err[:quarter]), _mean(err[-quarter:])
        measured = not np.isnan(err).all()
        per_output.append(
            {
                "name": name,
                "per_step": [_figure(e) for e in err],
                "first": _figure(err[0]),
                "last": _figure(err[-1]),
                "worst": float(np.nanmax(err)) if measured else None,
                "worst_step": int(np.nanargmax(err)) + 1 if measured else None,
                "growth": tail / head if head and tail is not None else None,
            }
        )
    return {"steps": steps, "sequences": len(reference[0]) // steps, "outputs": per_output}


def _mean(values: np.ndarray) -> float | None:
    """The mean of the finite values (None: there are none)."""
    finite = values[~np.isnan(values)]
    return float(finite.mean()) if finite.size else None


def _figure(value: float) -> float | None:
    return None if np.isnan(value) else float(f"{value:.4g}")
