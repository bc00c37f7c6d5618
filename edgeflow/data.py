"""Load a recipe's calibration or evaluation samples and check them against the declared inputs."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeflow.core.errors import EdgeflowError, first_line
from edgeflow.core.refs import ImportRef, user_frame
from edgeflow.core.specs import DatasetSpec, TensorSpec

LABEL_KEY = "label"


@dataclass(frozen=True)
class Samples:
    inputs: dict[str, np.ndarray]  # input name -> (N, ...) array of the declared dtype
    labels: np.ndarray | None

    def __len__(self) -> int:
        return len(next(iter(self.inputs.values())))

    def batches(self, batch: int, fixed: bool) -> Iterator[tuple[dict[str, np.ndarray], int]]:
        """(feeds, real size) per batch; with a fixed batch size the last batch is padded
        by repeating its last sample, and `real size` says how many outputs to keep."""
        for start in range(0, len(self), batch):
            feeds = {k: v[start : start + batch] for k, v in self.inputs.items()}
            size = len(next(iter(feeds.values())))
            if fixed and size < batch:
                pad = batch - size
                feeds = {
                    k: np.concatenate([v, np.repeat(v[-1:], pad, 0)]) for k, v in feeds.items()
                }
            yield feeds, size


def load_samples(spec: DatasetSpec, inputs: list[TensorSpec], what: str) -> Samples:
    """Samples for `what` ('calibration' or 'evaluation'), trimmed to `spec.samples`."""
    raw = _read(spec, what)
    if "__single__" in raw:  # a bare .npy holds the samples of a single-input model
        if len(inputs) != 1:
            raise EdgeflowError(f"{what}: a .npy file only serves single-input models; use .npz")
        raw = {inputs[0].name: raw["__single__"]}
    arrays: dict[str, np.ndarray] = {}
    for tensor in inputs:
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
        if tuple(arr.shape[1:]) != tuple(tensor.shape[1:]):
            raise EdgeflowError(
                f"{what} dataset {spec.dataset}: '{tensor.name}' has samples of shape "
                f"{tuple(arr.shape[1:])}, the recipe declares {tuple(tensor.shape[1:])}",
                "reshape the data or fix source.inputs",
            )
        arrays[tensor.name] = arr
    labels = np.asarray(raw[LABEL_KEY]) if LABEL_KEY in raw else None
    n = min(len(a) for a in arrays.values())
    if spec.samples is not None:
        n = min(n, spec.samples)
    if n == 0:
        raise EdgeflowError(f"{what} dataset {spec.dataset} is empty")
    trimmed = {k: np.ascontiguousarray(v[:n]) for k, v in arrays.items()}
    return Samples(trimmed, None if labels is None else labels[:n])


def _read(spec: DatasetSpec, what: str) -> Mapping[str, Any]:
    source: Any = spec.dataset
    if isinstance(source, Path):
        return _read_file(source, what)
    assert isinstance(source, ImportRef)
    fn = source.load()
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

    try:
        if path.suffix == ".npy":
            return {"__single__": np.load(path, allow_pickle=False)}
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except (ValueError, OSError, EOFError, MemoryError, zipfile.BadZipFile) as exc:
        why = first_line(exc)
        if "allow_pickle" in why:
            why = "it holds Python objects (pickled data), which edgeflow never loads"
        raise EdgeflowError(
            f"{what} dataset {path} cannot be read: {why}",
            "save plain numeric arrays with numpy.save / numpy.savez",
        ) from exc


def _stack(items: list[Any], what: str) -> dict[str, np.ndarray]:
    if not items or not all(isinstance(i, Mapping) for i in items):
        raise EdgeflowError(f"{what} must return a mapping of arrays or yield mappings")
    return {k: np.stack([np.asarray(i[k]) for i in items]) for k in items[0]}
