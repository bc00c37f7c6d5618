"""The Backend registry: what each target family can do, declared once, in its own folder.

A target family is a package `edgeflow/targets/<family>/` whose `__init__.py` defines
`BACKEND = Backend(...)` (cheap to import: data only) and whose `backend.py` converts and runs
(`convert(job)`, `open_runner(artifact_dir, info)`; see targets/base.py). Every place that
asks "which backend can X" asks this registry (`get(name).X`, or `offering(...)` for the names
that can), never a list of backend names: tests/targets/test_registry.py fails when such a
list reappears in edgeflow's code, and every capability is a required field, so a backend
that leaves one undeclared does not load. docs/writing-backends.md walks through one.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Literal

from pydantic import BaseModel, ConfigDict

from edgeflow.schema.sections import QuantizationMode

CalibrationMethod = Literal["minmax", "entropy", "percentile", "mse"]


class TfliteRuntime(BaseModel):
    """How a runtime of .tflite files differs from the others; the onnx2tf build and the
    file passes of targets/_tflite_*.py read these. Each was measured (docs/targets.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    # the reference runtime (LiteRT): others' int8 kernels are measured against it, and the
    # per-layer diff runs its float32 oracle in it
    reference: bool
    # memory is one arena the interpreter plans (TFLite Micro): estimates add its overhead
    arena: bool
    # runs WHILE; else a recurrent layer's loop is unrolled in the file (Arm NN 22)
    while_loops: bool
    # takes 0-D outputs; else they are written as [1] (Arm NN 22)
    rank0_outputs: bool
    # takes a FULLY_CONNECTED with keep_num_dims; else it is flattened (Arm NN 22)
    kept_dims_fully_connected: bool
    # takes a FULLY_CONNECTED without a bias; else a zero bias is written (Arm NN 22)
    fully_connected_without_bias: bool
    # the modes in which it runs UNIDIRECTIONAL_SEQUENCE_LSTM right; else LSTMs are looped
    sequence_lstm: tuple[QuantizationMode, ...]
    # its int8 SOFTMAX is the reference kernel, wrong on wide inputs (TFLite Micro)
    reference_int8_softmax: bool


class Backend(BaseModel):
    """One target family's declared capabilities. Every field is required: a new backend
    states each one (tests/targets/test_registry.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str  # what a profile's `backend:` names; the package's folder name
    summary: str  # one line for docs and messages
    module: str  # the module with convert() and open_runner(), imported on demand
    artifact: Literal[".ort", ".tflite", ".onnx"]  # the type of file the build deploys
    converter: str  # the tool that writes the artifact, as messages name it
    # where its profile's operator list comes from (`python -m edgeflow.targets.derive`): the
    # runtime's kernel registry, its documentation, or probe graphs converted and run (an
    # operator no probe has is then unmeasured, not known to fail); "compiler": the measured
    # list of the runtime that runs what its compiler leaves on the CPU (the profile extends
    # that runtime's), and the compiler's own operator constraints say which run on the NPU
    operators_from: Literal["kernels", "docs", "probes", "compiler"]
    # distributions (or debian:PATTERN, host:FACT; engine/keys.py) whose versions enter the
    # key of every stage that converts or runs this backend's artifacts
    tools: tuple[str, ...]
    # True: the converter quantizes from the recipe's samples (the quantize stage hands it
    # the float model); False: int8 arrives as onnxruntime QDQ from the quantize stage
    quantizes_itself: bool
    # modes the family cannot build, each with why (a profile may offer only the others)
    refused_modes: dict[QuantizationMode, str]
    calibration: tuple[CalibrationMethod, ...]  # quantization.method values it calibrates with
    qat: bool  # runs a QAT model's exported Q/DQ scales as they are (quantization.method: qat)
    int16_activations: bool  # runs 16x8 models (int8 weights, int16 activations)
    fallback: bool  # builds a mixed int8/float artifact (quantization.fallback: auto)
    # its int8 kernels are onnxruntime's CPU ones, which saturate on x86 without VNNI
    # (quantization.reduce_range: auto then takes 7-bit weights)
    saturating_int8: bool
    tensorflow_native: bool  # TensorFlow's own TFLite converter builds for it (convert.via)
    layout: Literal["declared", "channel_last"]  # the artifact's input layout for rank 3-5
    intermediates: bool  # the per-layer diff can read the artifact's tensors
    bisect: bool  # `edgeflow bisect` can convert and run prefixes of the model here
    # compiles the artifact for a neural processing unit (Arm's Vela for the Ethos-U): its
    # profile names the accelerator (`npu:`), a recipe may choose another (`accelerator:`),
    # and the figures of the NPU's time are the compiler's estimates
    npu: bool
    tflite: TfliteRuntime | None  # for a .tflite runtime: how it differs from the others

    def load(self) -> ModuleType:
        """The module that converts and runs (imported on first use)."""
        return importlib.import_module(self.module)

    @property
    def modes(self) -> tuple[QuantizationMode, ...]:
        """The quantization modes the family can build."""
        every: tuple[QuantizationMode, ...] = ("none", "fp16", "int8", "int8_weights")
        return tuple(m for m in every if m not in self.refused_modes)


@functools.cache
def backends() -> dict[str, Backend]:
    """Every registered backend by name: each package under edgeflow/targets/ with a
    `BACKEND` (private packages, named _*, hold code the families share)."""
    found: dict[str, Backend] = {}
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if not info.ispkg or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"edgeflow.targets.{info.name}")
        declared = getattr(module, "BACKEND", None)
        if not isinstance(declared, Backend):
            raise AssertionError(f"edgeflow/targets/{info.name}/ declares no BACKEND")
        if declared.name != info.name:
            raise AssertionError(
                f"edgeflow/targets/{info.name}/ declares the backend '{declared.name}'"
            )
        found[declared.name] = declared
    return found


def get(name: str) -> Backend:
    """The backend of this name (a profile's `backend:` is validated against these)."""
    known = backends()
    if name not in known:
        raise AssertionError(f"no backend '{name}' (have: {', '.join(known)})")
    return known[name]


def offering(capability: Callable[[Backend], object]) -> list[str]:
    """The names of the backends with a capability, for messages and hints, e.g.
    `offering(lambda b: b.fallback)`."""
    return [name for name, b in backends().items() if capability(b)]


def reference_tflite() -> str:
    """The .tflite runtime others are measured against (LiteRT: TfliteRuntime.reference)."""
    (name,) = offering(lambda b: b.tflite is not None and b.tflite.reference)
    return name


def measured_tflite() -> list[str]:
    """The .tflite runtimes whose operator lists probe graphs measure (edgeflow.targets.trial,
    `python -m edgeflow.targets.derive tflite_family`)."""
    return offering(lambda b: b.tflite is not None and b.operators_from == "probes")


def tflite_runtime(name: str) -> TfliteRuntime:
    """How the .tflite runtime of this backend differs from the others."""
    traits = get(name).tflite
    if traits is None:
        raise AssertionError(f"backend '{name}' does not run .tflite files")
    return traits


def like(base: Backend, **differences: object) -> Backend:
    """A backend that shares `base`'s converter and is declared by what differs (validated:
    an unknown or mistyped capability is refused)."""
    return Backend.model_validate({**base.model_dump(), **differences})
