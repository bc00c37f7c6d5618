"""What a target backend module provides: edgeflow/targets/<family>/backend.py, named by the
family's registered Backend (targets/registry.py, which also declares what it can do).

A backend module defines:
- `convert(job: ConvertJob) -> dict`: write the artifact into `job.out_dir`; return at least
  {"artifact": main file name, "files": [every file written]}.
- `open_runner(artifact_dir: Path, info: dict) -> Runner`: the artifact in its real runtime
  (`run(feeds) -> outputs`; optionally `extra_metrics() -> dict`, e.g. {"arena_bytes": n}),
  or raise `NotVerified(reason)` when that runtime cannot run here (TensorRT without a GPU):
  the build then reports verified: false with the reason, and compares nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgeflow.core.islands import Island
    from edgeflow.data import Samples
    from edgeflow.schema.sections import Quantization, TensorSpec
    from edgeflow.targets.profile import TargetProfile
    from edgeflow.verify.fallback import Budget


class NotVerified(Exception):
    """The artifact's runtime cannot run on this machine; the message says why."""


@dataclass(frozen=True)
class ConvertJob:
    onnx: Path  # the optimized (and, unless the backend quantizes itself, quantized) model
    out_dir: Path  # where the artifact files go
    profile: TargetProfile
    quantization: Quantization
    inputs: list[TensorSpec]
    calibration: Samples | None  # only for backends that quantize themselves
    # quantization.fallback: auto: the thresholds a mix must meet on the calibration samples,
    # and how its outputs are compared (edgeflow.verify.fallback.Budget)
    budget: Budget | None = None
    # inputs whose layout onnx2tf keeps as declared (a channel-last source's: Keras, Flax)
    kept_layout: tuple[str, ...] = ()
    # judges the artifact the converter wrote (the TFLite family: its operators against the
    # profile's measured builtins) before any runtime loads it; raises to stop the build
    check: Callable[[Path], None] = lambda artifact: None
    # quantization.keep_float: the island kinds an int8 build keeps float, and the islands
    # found before the target's rewrites (edgeflow.core.islands)
    keep_float: tuple[str, ...] = ()
    float_islands: tuple[Island, ...] = ()

    @property
    def dense_per_tensor(self) -> bool:
        """Whether the fully-connected layers of a per-channel build get per-tensor weights:
        the profile's runtime takes no per-channel ones (a probe's job has no profile)."""
        return self.profile is not None and not self.profile.per_channel_dense

    def input_perm(self, spec: TensorSpec) -> tuple[int, ...]:
        """How a recipe tensor of this input is laid out for the .tflite: as declared, or
        channel-last (onnx2tf's default for rank 3-5)."""
        rank = len(spec.shape)
        return tuple(range(rank)) if spec.name in self.kept_layout else channel_last(rank)


def channel_last(rank: int) -> tuple[int, ...]:
    """The permutation onnx2tf applies to inputs of rank 3-5 (NCHW -> NHWC); identity else."""
    if rank in (3, 4, 5):
        return (0, *range(2, rank), 1)
    return tuple(range(rank))
