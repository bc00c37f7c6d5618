"""Load a recipe's calibration or evaluation samples and check them against the declared inputs."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeflow.core.errors import EdgeflowError, first_line
from edgeflow.core.filekinds import file_problem
from edgeflow.core.refs import ImportRef, user_frame
from edgeflow.schema.sections import DatasetSpec, StateLink, TensorSpec, data_inputs

LABEL_KEY = "label"


@dataclass(frozen=True)
class Samples:
    inputs: dict[str, np.ndarray]  # input name -> samples of the declared dtype
    labels: np.ndarray | None
    # the axis each input's samples are stacked on (absent: 0); None: one array, fed whole
    axes: Mapping[str, int | None] = field(default_factory=dict)
    # sequences of a stateful model: each sample is a sequence of `steps` chunks, on the axis
    # after its batch axis (axis 0 for an input without one; edgeflow.verify.stream)
    steps: int | None = None

    def __len__(self) -> int:
        name, axis = next(
            (k, self.axes.get(k, 0)) for k in self.inputs if self.axes.get(k, 0) is not None
        )
        assert axis is not None
        return int(self.inputs[name].shape[axis])

    def batches(self, batch: int, fixed: bool) -> Iterator[tuple[dict[str, np.ndarray], int]]:
        """(feeds, real size) per batch, each input sliced on its batch axis (an input without
        one is fed whole); with a fixed batch size the last batch is padded by repeating its
        last sample, and `real size` says how many outputs to keep."""
        total = len(self)
        for start in range(0, total, batch):
            size = min(batch, total - start)
            feeds = {}
            for name, arr in self.inputs.items():
                axis = self.axes.get(name, 0)
                if axis is None:
                    feeds[name] = arr
                    continue
                lead = (slice(None),) * axis
                part = arr[(*lead, slice(start, start + size))]
                if fixed and size < batch:
                    last = arr[(*lead, slice(start + size - 1, start + size))]
                    part = np.concatenate([part, np.repeat(last, batch - size, axis)], axis)
                feeds[name] = part
            yield feeds, size


def load_samples(
    spec: DatasetSpec, inputs: list[TensorSpec], what: str, state: list[StateLink] | None = None
) -> Samples:
    """Samples for `what` ('calibration' or 'evaluation') of the inputs the data feeds
    (constants are the recipe's), trimmed to `spec.samples`. With `state` (a stateful model),
    the samples are sequences: each array has a step axis after its batch axis, of one length
    for all, and the states are not in the data (the model feeds them back)."""
    fed = data_inputs(inputs, state or [])
    raw = _read(spec, what)
    if "__single__" in raw:  # a bare .npy holds the samples of a single-input model
        if len(fed) != 1:
            raise EdgeflowError(f"{what}: a .npy file only serves single-input models; use .npz")
        raw = {fed[0].name: raw["__single__"]}
    arrays: dict[str, np.ndarray] = {}
    for tensor in fed:
        if tensor.name not in raw:
            raise EdgeflowError(
                f"{what} dataset {spec.dataset} has no array named '{tensor.name}' "
                f"(has: {', '.join(raw) or 'nothing'})",
                "name the dataset's arrays after the recipe's source.inputs",
            )
        try:
            arr = np.asarray(raw[tensor.name]).astype(tensor.dtype, copy=False)
        except (TypeError, ValueError) as exc:
            raise EdgeflowError(
                f"{what} dataset {spec.dataset}: '{tensor.name}' cannot be read as "
                f"{tensor.dtype}: {exc}",
                "the dataset's arrays must hold numbers of the declared dtype",
            ) from exc
        mismatch = shape_mismatch(tuple(arr.shape), tensor, bool(state))
        if mismatch:
            raise EdgeflowError(f"{what} dataset {spec.dataset}: {mismatch}", SHAPE_HINT)
        arrays[tensor.name] = arr
    axes = {t.name: t.batch_axis for t in fed}
    steps = _steps(arrays, axes, f"{what} dataset {spec.dataset}") if state else None
    labels = np.asarray(raw[LABEL_KEY]) if LABEL_KEY in raw else None
    n = min(arrays[k].shape[axis] for k, axis in axes.items() if axis is not None)
    if spec.samples is not None:
        n = min(n, spec.samples)
    if n == 0:
        raise EdgeflowError(f"{what} dataset {spec.dataset} is empty")
    trimmed = {k: np.ascontiguousarray(first(v, n, axes[k])) for k, v in arrays.items()}
    if what == "calibration":  # a quantization range of NaN or infinity is no range
        _finite(trimmed, axes, f"{what} dataset {spec.dataset}")
    return Samples(trimmed, None if labels is None else labels[:n], axes, steps)


def _finite(arrays: Mapping[str, np.ndarray], axes: Mapping[str, int | None], what: str) -> None:
    """Refuse float arrays holding NaN or infinity, saying in how many samples."""
    for name, arr in arrays.items():
        if arr.dtype.kind != "f":
            continue
        bad = ~np.isfinite(arr)
        if not bad.any():
            continue
        axis = axes.get(name, 0)
        if axis is None or arr.ndim == 0:
            where = f"{int(bad.sum()):,} of its {arr.size:,} values (it has no batch axis)"
        else:
            others = tuple(i for i in range(arr.ndim) if i != axis)
            per_sample = bad.any(axis=others) if others else bad
            first_bad = int(np.argmax(per_sample))
            where = (
                f"{int(per_sample.sum()):,} of its {per_sample.size:,} samples (the first: "
                f"sample {first_bad})"
            )
        raise EdgeflowError(
            f"{what}: '{name}' holds NaN or infinity in {where}",
            "quantization ranges are measured on these values: drop or fix those samples "
            "(numpy.isfinite finds them)",
        )


def step_axis(batch_axis: int | None) -> int:
    """Where a sequence's steps are in a dataset array: after the batch axis (the sequences),
    or first for an input without one."""
    return 0 if batch_axis is None else batch_axis + 1


def _steps(arrays: dict[str, np.ndarray], axes: Mapping[str, int | None], what: str) -> int:
    """The one sequence length of all the sequences' arrays."""
    lengths = {k: int(v.shape[step_axis(axes[k])]) for k, v in arrays.items()}
    if len(set(lengths.values())) > 1:
        found = ", ".join(f"'{k}' {n}" for k, n in lengths.items())
        raise EdgeflowError(
            f"{what}: the inputs' sequences differ in length ({found} steps)",
            "give every input the same number of steps (the axis after its batch axis)",
        )
    if 0 in lengths.values():
        raise EdgeflowError(f"{what}: its sequences have no steps")
    return next(iter(lengths.values()))


def first(arr: np.ndarray, n: int, axis: int | None) -> np.ndarray:
    """The first `n` samples of `arr` on `axis` (None: it holds no samples; all of it)."""
    if axis is None:
        return arr
    return arr[(*(slice(None),) * axis, slice(n))]


SHAPE_HINT = "reshape the data or fix source.inputs (shape, batch_axis)"


def shape_mismatch(found: tuple[int, ...], tensor: TensorSpec, steps: bool = False) -> str | None:
    """What is wrong with a dataset array of shape `found` for `tensor` (None: it fits): the
    declared shape on every axis but the batch axis, which holds the samples; with `steps`
    (a stateful model's sequences) a step axis after the batch axis, of any length."""
    axis = tensor.batch_axis
    declared = list(tensor.shape)
    where = "no batch axis" if axis is None else f"samples on axis {axis}"
    if steps:
        at = step_axis(axis)
        if len(found) != len(declared) + 1:
            return (
                f"'{tensor.name}' has {len(found)} axes {list(found)}; a sequence of "
                f"{declared} ({where}) has {len(declared) + 1}, the steps on axis {at}"
            )
        found = found[:at] + found[at + 1 :]
    if len(found) != len(declared):
        return (
            f"'{tensor.name}' has {len(found)} axes {list(found)}, the recipe declares "
            f"{len(declared)} ({declared}, {where})"
        )
    for i, (have, want) in enumerate(zip(found, declared, strict=True)):
        if i != axis and have != want:
            return (
                f"'{tensor.name}' has size {have} on axis {i}, the recipe declares {want} "
                f"(shape {declared}, {where})"
            )
    return None


def _read(spec: DatasetSpec, what: str) -> Mapping[str, Any]:
    source: Any = spec.dataset
    if isinstance(source, Path):
        return _read_file(source, what)
    assert isinstance(source, ImportRef)
    fn = source.load()
    if not callable(fn):
        raise EdgeflowError(
            f"{what} dataset {source} is a {type(fn).__name__}, not a function",
            "name a function that returns the samples, or a .npz / .npy file",
        )
    kwargs = dict(spec.options)
    if spec.split is not None:
        kwargs["split"] = spec.split
    try:
        result = fn(**kwargs)
    except EdgeflowError:
        raise
    except Exception as exc:  # the dataset function's own error (built-in or the user's)
        raise EdgeflowError(
            f"{what} dataset {source} raised {type(exc).__name__}: {exc} ({user_frame(exc)})",
            f"call {source.attr}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}) in "
            "Python to reproduce it",
        ) from exc
    if isinstance(result, Mapping):
        return result
    if isinstance(result, Iterable):
        return _stack(list(result), f"{what} dataset {source}")
    raise EdgeflowError(f"{what} dataset {source} returned {type(result).__name__}")


def _read_file(path: Path, what: str) -> dict[str, np.ndarray]:
    """The arrays of a .npy or .npz file, read without pickle (object arrays are refused)."""
    import zipfile
    import zlib

    problem = file_problem(path)
    if problem:
        raise EdgeflowError(f"{what} dataset {path} {problem}", FILE_HINT)
    try:
        if path.suffix == ".npy":
            return {"__single__": np.load(path, allow_pickle=False)}
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except (ValueError, OSError, EOFError, MemoryError, zipfile.BadZipFile, zlib.error) as exc:
        why = first_line(exc)
        if "allow_pickle" in why:
            why = "it holds Python objects (an object array, pickled), which edgeflow never loads"
        raise EdgeflowError(f"{what} dataset {path} cannot be read: {why}", FILE_HINT) from exc


FILE_HINT = "save plain numeric arrays with numpy.save (.npy) / numpy.savez (.npz)"


def array_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """The shapes of a .npy or .npz file's arrays, read from their headers only ('__single__'
    for a .npy); {} where the file cannot be read (the stage that loads it says why)."""
    import zipfile

    try:
        if path.suffix == ".npy":
            return {"__single__": tuple(np.load(path, mmap_mode="r", allow_pickle=False).shape)}
        shapes = {}
        with zipfile.ZipFile(path) as archive:
            for member in archive.namelist():
                if not member.endswith(".npy"):
                    continue
                with archive.open(member) as f:
                    version = np.lib.format.read_magic(f)
                    read = (
                        np.lib.format.read_array_header_1_0
                        if version == (1, 0)
                        else np.lib.format.read_array_header_2_0
                    )
                    shapes[member[: -len(".npy")]] = tuple(read(f)[0])
        return shapes
    except (ValueError, OSError, EOFError, zipfile.BadZipFile):
        return {}


def _stack(items: list[Any], what: str) -> dict[str, np.ndarray]:
    if not items or not all(isinstance(i, Mapping) for i in items):
        raise EdgeflowError(f"{what} must return a mapping of arrays or yield mappings")
    return {k: np.stack([np.asarray(i[k]) for i in items]) for k in items[0]}
