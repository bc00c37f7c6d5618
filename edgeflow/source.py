"""Build the recipe's PyTorch module and run it: the reference every artifact is compared with."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeflow.core import progress
from edgeflow.core.errors import EdgeflowError
from edgeflow.core.refs import ImportRef, user_frame
from edgeflow.schema.sections import TensorSpec
from edgeflow.schema.source import PyTorchSource

if TYPE_CHECKING:
    import torch

    from edgeflow.data import Samples
    from edgeflow.verify.runners import BatchAxes


# The module this process built last, pristine, by what built it (its code's hash, its
# arguments, its weights' hash), with what loading its weights noted: a build's load, rewrite
# and export stages run in one worker and each needs the module, which is built once and
# copied (constructing it and loading a checkpoint again costs more than a copy).
_BUILT: dict[str, tuple[torch.nn.Module, list[str]]] = {}


def build_module(source: PyTorchSource, notes: list[str] | None = None) -> torch.nn.Module:
    """Instantiate `source.model(**init)`, load its weights (weights_only=True), set eval mode;
    `notes` gets what loading the checkpoint had to do (edgeflow.checkpoint). A module built
    before in this process from the same code, arguments and weights is copied instead."""
    import contextlib
    import copy
    import pickle

    key = _built_key(source)
    if key in _BUILT:
        module, noted = _BUILT[key]
        if notes is not None:
            notes += noted
        return copy.deepcopy(module)
    noted = []
    module = _build(source, noted)
    if notes is not None:
        notes += noted
    _BUILT.clear()
    # what deepcopy raises for a module it cannot copy: that one is built each time
    uncopyable = (TypeError, RuntimeError, AttributeError, copy.Error, pickle.PicklingError)
    with contextlib.suppress(*uncopyable):
        _BUILT[key] = (copy.deepcopy(module), noted)
    return module


def _built_key(source: PyTorchSource) -> str:
    import json

    from edgeflow.core.refs import file_sha256

    ref: Any = source.model
    weights = source.weights
    parts = [
        ref.fingerprint() if isinstance(ref, ImportRef) else str(ref),
        source.init,
        None if weights is None else [str(weights), file_sha256(Path(weights))],
        source.weights_key,
    ]
    return json.dumps(parts, sort_keys=True, default=repr)


def _build(source: PyTorchSource, notes: list[str]) -> torch.nn.Module:
    import torch

    from edgeflow.checkpoint import load_weights

    ref: Any = source.model
    assert isinstance(ref, ImportRef)
    cls = ref.load()
    # what the recipe's source could not show, checked before anything is called
    if isinstance(cls, type) and not issubclass(cls, torch.nn.Module):
        raise EdgeflowError(
            f"{ref} is a class that does not subclass torch.nn.Module",
            "name your torch.nn.Module subclass, or a function that returns the module",
        )
    if not callable(cls):
        raise EdgeflowError(
            f"{ref} is a {type(cls).__name__}, not a class or function",
            "name your torch.nn.Module subclass, or a function that returns the module",
        )
    try:
        # Fixed seed: a recipe without weights builds the same module in every stage.
        with torch.random.fork_rng():
            torch.manual_seed(0)
            module = cls(**source.init)
    except TypeError as exc:
        raise EdgeflowError(
            f"cannot build {ref}({', '.join(source.init)}): {exc}", "fix source.init"
        ) from exc
    except ModuleNotFoundError as exc:
        raise EdgeflowError(
            f"cannot build {ref}: it imports '{exc.name}', which is not installed",
            f"install the package that provides '{exc.name}' in this environment",
        ) from exc
    except EdgeflowError:
        raise
    except Exception as exc:  # the user's constructor: their error, said as such
        raise EdgeflowError(
            f"{ref}({', '.join(source.init)}) raised {type(exc).__name__}: {exc} "
            f"({user_frame(exc)})",
            "run the constructor in Python with source.init's arguments to reproduce it",
        ) from exc
    if not isinstance(module, torch.nn.Module):
        raise EdgeflowError(f"{ref} built a {type(module).__name__}, not a torch.nn.Module")
    if source.weights is not None:
        note = load_weights(module, source.weights, source.weights_key, str(ref))
        if note:
            notes.append(note)
    return module.eval()


def example_inputs(specs: list[TensorSpec], batch: int | None = None) -> tuple[torch.Tensor, ...]:
    """Random inputs of the declared shapes and dtypes (fixed seed), constants as bound;
    `batch` replaces the size of each batch axis."""
    import torch

    gen = torch.Generator().manual_seed(0)
    out = []
    for spec in specs:
        if spec.value is not None:
            out.append(torch.from_numpy(spec.constant().copy()))
            continue
        shape = list(spec.shape)
        if batch and spec.batch_axis is not None:
            shape[spec.batch_axis] = batch
        dtype = getattr(torch, spec.dtype)
        if dtype.is_floating_point:
            out.append(torch.rand(shape, generator=gen).to(dtype))
        else:
            out.append(torch.zeros(shape, dtype=dtype))
    return tuple(out)


def bound_module(module: torch.nn.Module, specs: list[TensorSpec]) -> torch.nn.Module:
    """`module` taking the fed inputs only, the constants of `specs` bound in its forward:
    torch.onnx.export traces them as constants (a branch on one becomes static) and the
    exported graph has no input for them."""
    import torch

    if all(s.value is None for s in specs):
        return module

    class Bound(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = module

        def forward(self, *fed: torch.Tensor) -> Any:
            given = iter(fed)
            args = [
                next(given)
                if s.value is None
                else torch.tensor(s.constant().tolist(), dtype=getattr(torch, s.dtype))
                for s in specs
            ]
            return self.inner(*args)

    return Bound().eval()


def run_module(
    module: torch.nn.Module,
    samples: Samples,
    specs: list[TensorSpec],
    batch: tuple[int, bool],
    max_detections: int | None = None,
    axes: BatchAxes | None = None,
) -> list[np.ndarray]:
    """Outputs of the module on all samples, one array per output, fed in batches as the
    artifact will be (`batch`: size, and whether it is fixed: a model declared with batch 1
    gets one sample at a time). With `max_detections`, the module is a detector and its
    outputs are given in the padded form of `edgeflow.verify.detections` (boxes, scores,
    labels, valid). Outputs are batch-first (`axes`: each one's batch axis in the module's
    own layout)."""
    from edgeflow.verify.runners import BatchAxes, joined, unpadded

    axes = axes or BatchAxes()
    runner = ModuleRunner(module, specs, max_detections)
    chunks: list[list[np.ndarray]] = []
    with progress.task("reference outputs", total=len(samples), unit="samples") as task:
        for feeds, size in samples.batches(*batch):
            outs = axes.first(runner.run(feeds))
            chunks.append([unpadded(o, size, *batch) for o in outs])
            task.advance(size)
    return [joined([c[i] for c in chunks]) for i in range(len(chunks[0]))]


class ModuleRunner:
    """A PyTorch module as a runner (edgeflow.verify.runners): fed by input name, the
    constants of source.inputs added, its outputs flattened in the exporter's order."""

    def __init__(
        self, module: torch.nn.Module, specs: list[TensorSpec], max_detections: int | None = None
    ) -> None:
        self.module, self.specs, self.max_detections = module, specs, max_detections

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        import torch

        from edgeflow.verify.detections import padded

        args = [
            torch.from_numpy(feeds[s.name] if s.value is None else s.constant().copy())
            for s in self.specs
        ]
        try:
            with torch.inference_mode():
                result = self.module(*args)
        except Exception as exc:  # the user's model code: say so, not "a bug in edgeflow"
            shapes = ", ".join(
                f"{s.name} {list(a.shape)}" for s, a in zip(self.specs, args, strict=True)
            )
            raise EdgeflowError(
                f"the model raised {type(exc).__name__} on evaluation inputs ({shapes}): {exc}",
                "run the model on inputs of the declared source.inputs shapes in Python "
                "to reproduce it",
            ) from exc
        if self.max_detections is not None:
            return padded(result, self.max_detections)
        return [t.detach().float().numpy() for t in flat_tensors(result)]


def flat_tensors(result: object) -> list[torch.Tensor]:
    """A module's outputs as a flat list of tensors, in the order the ONNX exporter uses."""
    import torch

    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, dict):
        return [t for v in result.values() for t in flat_tensors(v)]
    if isinstance(result, list | tuple):
        return [t for v in result for t in flat_tensors(v)]
    return []
