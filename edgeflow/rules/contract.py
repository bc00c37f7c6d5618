"""Every graph-changing step proves itself while a build runs, not only in the tests.

A step (a rule, the optimizer) must leave its input model as it was, give a model that passes
the ONNX checker (ONNX steps), and compute what its input computed on the declared inputs,
within its stated tolerance. The declared inputs are probed twice: seeded random values of
the declared shapes and dtypes, and all zeros (silence, a black image: where an epsilon that
keeps a Log or a division finite matters). Allowed: `(tolerance + NOISE) * max(1, range)`,
the range being the largest |value| of the output before the step.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeflow.core.errors import first_line
from edgeflow.schema.sections import TensorSpec

NOISE = 1e-5  # float32 rounding when a step reorders arithmetic, relative to the output range


@dataclass(frozen=True)
class Outputs:
    """A model's outputs on each probe (or why they could not be computed)."""

    per_probe: list[list[np.ndarray]] | None
    error: str | None = None


def probes(specs: list[TensorSpec]) -> list[dict[str, np.ndarray]]:
    """The declared inputs as feeds: seeded random values, then zeros (a constant: its value)."""
    rng = np.random.default_rng(0)
    random, zeros = {}, {}
    for spec in specs:
        if spec.value is not None:
            random[spec.name] = zeros[spec.name] = spec.constant()
            continue
        dtype = np.dtype(spec.dtype)
        if np.issubdtype(dtype, np.floating):
            random[spec.name] = rng.random(spec.shape).astype(dtype)
        else:
            random[spec.name] = np.zeros(spec.shape, dtype)
        zeros[spec.name] = np.zeros(spec.shape, dtype)
    return [random, zeros]


def onnx_digest(model: Any) -> str:
    return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()


def onnx_outputs(model: Any, feeds: list[dict[str, np.ndarray]]) -> Outputs:
    """The model's outputs in ONNX Runtime on each feed."""
    return onnx_snapshot(model, feeds)[1]


def onnx_snapshot(model: Any, feeds: list[dict[str, np.ndarray]]) -> tuple[str, Outputs]:
    """(onnx_digest(model), its outputs in ONNX Runtime on each feed). The same model bytes
    on the same feeds are run once per process: a rule that matched nothing returns its
    input, and the next step starts from the model the last one checked."""
    data = model.SerializeToString(deterministic=True)
    digest = hashlib.sha256(data).hexdigest()
    key = (digest, _feeds_digest(feeds))
    if key not in _RUN:
        _RUN[key] = _run_onnx(data, feeds)
        while len(_RUN) > RUN_MEMO:
            _RUN.pop(next(iter(_RUN)))
    return digest, _RUN[key]


RUN_MEMO = 8  # models whose outputs are kept (per process; outputs of the probes only)
_RUN: dict[tuple[str, str], Outputs] = {}


def _feeds_digest(feeds: list[dict[str, np.ndarray]]) -> str:
    h = hashlib.sha256()
    for feed in feeds:
        for name, value in feed.items():
            h.update(f"{name}|{value.dtype.str}|{value.shape}|".encode())
            h.update(np.ascontiguousarray(value).tobytes())
    return h.hexdigest()


def _run_onnx(data: bytes, feeds: list[dict[str, np.ndarray]]) -> Outputs:
    from edgeflow.core.onnxsession import as_declared, checking_session

    try:
        session = checking_session(data)  # what the graph computes, not ORT's optimizer's
        types = {i.name: i.type for i in session.get_inputs()}
        return Outputs(
            [
                [
                    np.asarray(o)
                    for o in session.run(
                        None, {k: as_declared(v, types[k]) for k, v in f.items() if k in types}
                    )
                ]
                for f in feeds
            ]
        )
    except Exception as exc:  # onnxruntime's errors are not typed
        return Outputs(None, f"onnxruntime cannot run it: {first_line(exc)}")


def torch_outputs(module: Any, feeds: list[dict[str, np.ndarray]], specs: list[Any]) -> Outputs:
    """The module's outputs (flattened as the ONNX exporter does) on each feed."""
    import torch

    from edgeflow.source import flat_tensors

    found = []
    with torch.inference_mode():
        for feed in feeds:
            args = [torch.from_numpy(feed[s.name].copy()) for s in specs]
            try:
                result = module(*args)
            except Exception as exc:  # the module's own error, reported as the step's
                return Outputs(None, f"it raises {type(exc).__name__}: {exc}")
            found.append([t.detach().float().numpy().copy() for t in flat_tensors(result)])
    return Outputs(found)


def difference(before: Outputs, after: Outputs, tolerance: float) -> str | None:
    """Why `after` does not compute what `before` did within the tolerance (None: it does)."""
    if before.per_probe is None:
        return None  # nothing to compare with; the caller records that it was not checked
    if after.per_probe is None:
        return f"its output model fails where its input ran: {after.error}"
    for probe, (old, new) in enumerate(zip(before.per_probe, after.per_probe, strict=True)):
        which = ("declared random", "declared all-zero")[probe] if probe < 2 else str(probe)
        if len(old) != len(new):
            return f"it changes the number of outputs from {len(old)} to {len(new)}"
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            if a.shape != b.shape:
                return f"output {i} changes shape from {list(a.shape)} to {list(b.shape)}"
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            finite_before = np.isfinite(a64)
            if (finite_before & ~np.isfinite(b64)).any():
                return (
                    f"output {i} becomes NaN or Inf on the {which} inputs where its input "
                    "model's was finite"
                )
            scale = max(1.0, float(np.abs(a64[finite_before]).max(initial=0.0)))
            diff = float(np.abs(a64 - b64)[finite_before].max(initial=0.0))
            allowed = (tolerance + NOISE) * scale
            if diff > allowed:
                return (
                    f"output {i} changes by {diff:.3g} on the {which} inputs (allowed "
                    f"{allowed:.3g}: tolerance {tolerance:g} + {NOISE:g}, times range {scale:.3g})"
                )
    return None


def torch_state(module: Any) -> str:
    """A hash of a module's parameters and buffers: whether a step changed its input."""
    import torch

    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        h.update(name.encode())
        if isinstance(tensor, torch.Tensor) and not tensor.is_quantized:
            h.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().data)
        else:  # quantized tensors and extra state: their printed form
            h.update(repr(tensor).encode())
    return h.hexdigest()
