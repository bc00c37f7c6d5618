"""The records stages write and other stages and processes read, as pydantic models.

A slot's record is validated when a stage writes it (`StageContext.write`) and when one reads
it (`StageContext.read`, `read_record`), so a renamed key fails where it is written, not at
report time in another process. The model of a slot is `RECORDS[slot]`; a slot without one
is a file the stage owns (a model, a CSV). A cache entry whose record no longer validates
(written by an older edgeflow) is damaged: it is computed again (engine/cache.py).

metrics.json keeps the shape DVC and CI read: `Metrics` dumps only the keys a build set,
and docs/metrics.schema.json is its JSON schema (tests/core/test_records.py keeps the two in
step).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, RootModel, ValidationError

from edgeflow.core.errors import EdgeflowError


class Record(BaseModel):
    """A stage's JSON record: every key declared, dumped with the keys that were set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def dump(self) -> Any:
        # python mode: an exact output's SQNR stays inf (JSON mode would write it as null)
        return self.model_dump(exclude_unset=True)


# --- verify.json -------------------------------------------------------------------------


class Latency(Record):
    """Latency on this machine, in ms, over `runs` timed runs after `warmup` ones."""

    p50: float
    p90: float
    runs: int
    warmup: int
    samples: list[float]  # every timed run, for the report's latency plot


class VerifyRecord(Record):
    """verify.json: the artifact run in the target's runtime against the source model."""

    runtime: str  # the backend that ran it
    samples: int
    metric: str  # evaluation.metric
    # the runtime cannot run here (TensorRT without a GPU): why; nothing was compared
    not_verified: str | None = None
    accuracy: dict[str, float] | None  # source, artifact, drop (top-1 with labels)
    # Comparison.agreement (edgeflow.verify.judge): the figures of every output
    agreement: dict[str, Any] | None
    latency_ms: Latency | None
    size_bytes: int
    extra: dict[str, Any]  # the runner's own figures (arena_bytes, armnn_version, ...)
    stream: dict[str, Any] | None = None  # a stateful model's per-step error and its drift
    steps: dict[str, Any] | None = None  # a TensorFlow source through ONNX: each step's error


# --- checks.json -------------------------------------------------------------------------


class Check(Record):
    """One threshold of the build, measured."""

    metric: str  # the recipe key, e.g. verify.min_sqnr_db
    value: float | int | None  # None: it could not be measured (non-finite outputs)
    threshold: float | int | None
    passed: bool
    message: str
    origin: str | None = None  # where the threshold came from (the recipe key or a default)
    output: str | int | None = None  # for a per-output threshold: the output


class Checks(RootModel[list[Check]]):
    """checks.json: every check of the build, in order."""

    def dump(self) -> Any:
        return [c.dump() for c in self.root]


# --- metrics.json ------------------------------------------------------------------------


class AccuracyFigures(Record):
    source: float
    artifact: float
    drop: float


class Retrieval(Record):
    """A sentence-embedding output: does the artifact rank the pairs as the source does?"""

    pairs: int
    candidates: int
    rank_kept: float
    recall_at_1_source: float
    recall_at_1_artifact: float
    mean_rank_source: float
    mean_rank_artifact: float


class OutputFigures(Record):
    """One output's figures: its kind, the scale-free ones, and its kind's own."""

    kind: str
    relative_error: float | None  # max |artifact - source| over the output's range
    sqnr_db: float | None = None
    max_abs_diff: float | None = None
    top1: float | None = None
    sequence: float | None = None
    sequences: int | None = None
    decision: float | None = None
    cosine_min: float | None = None
    cosine_mean: float | None = None
    retrieval: Retrieval | None = None
    retrieval_skipped: str | None = None
    batch_axis: int | None = None  # where its samples are, when not axis 0
    match_rate: float | None = None  # detections


class TaskMetric(Record):
    name: str
    value: float | None


class AgreementFigures(Record):
    """The artifact against the source model: over all outputs, and per output."""

    top1: float | None = None
    max_abs_diff: float | None = None
    max_relative_diff: float | None = None
    non_finite_samples: int | None = None
    min_sqnr_db: float | None = None
    outputs: dict[str, OutputFigures] | None = None
    task_metric: TaskMetric | None = None
    # evaluation.metric: detections
    match_rate: float | None = None
    matched: int | None = None
    reference_detections: int | None = None
    artifact_detections: int | None = None
    max_box_diff_px: float | None = None
    max_box_diff_relative: float | None = None
    max_score_diff: float | None = None


class LatencyFigures(Record):
    p50: float
    p90: float


class StreamOutput(Record):
    first: float
    last: float
    worst: float
    growth: float | None


class StreamFigures(Record):
    steps: int
    outputs: dict[str, StreamOutput]


class ConversionFigures(Record):
    """A TensorFlow or JAX source: its path, and the error each step added."""

    framework: str
    path: str  # native or onnx
    source_to_onnx: float | None = None
    onnx_to_target: float | None = None
    source_to_target: float | None = None


class FallbackFigures(Record):
    mixes: int
    seconds: float | None
    met: bool
    stopped_by: str | None


class NpuFigures(Record):
    """An NPU build's figures (ethos_u, edgeflow/report/npu.py): where the operators run and
    the memory, from the compiler's output; the time, its estimate (`estimated` names those
    figures; `basis` says what the build verified)."""

    accelerator: str
    system_config: str
    memory_mode: str
    compiler: str
    basis: str
    estimated: list[str]
    operators_npu: int
    operators_cpu: int
    cpu_operators: list[str]
    macs: int  # on the NPU
    cycles: int  # estimated
    clock_hz: int
    clock_from: str  # the board's, or that of the compiler's system configuration
    latency_ms: float  # estimated: cycles at clock_hz
    inferences_per_second: float | None  # estimated
    sram_bytes: int
    flash_bytes: int  # where the model lives: flash, or DRAM
    deployed_bytes: int  # model_vela.tflite


class Metrics(Record):
    """metrics.json, the file DVC and CI read (`dvc metrics show`, `dvc exp show`)."""

    recipe: str
    target: str
    quantization: str
    verified: bool
    not_verified: str | None = None  # why the runtime could not run here
    accuracy: AccuracyFigures | None
    agreement: AgreementFigures | None
    latency_ms: LatencyFigures | None
    size_bytes: int
    # the runner's own figures
    arena_bytes: int | None = None  # TFLite Micro: the smallest arena the model runs in
    arena_predicted_bytes: int | None = None  # the precheck's estimate of it
    armnn_version: str | None = None
    armnn_backend: str | None = None
    host_postprocess_ms_p50: float | None = None  # postprocess.cut: the host part's time
    ingest: list[str] | None = None  # what ingest did to a file from another exporter
    auto_rewrites: list[str] | None = None  # what `rewrites: auto` chose, as entries
    conversion: ConversionFigures | None = None
    stream: StreamFigures | None = None
    float_layers: int | None = None  # quantization.fallback: auto
    fallback: FallbackFigures | None = None
    npu: NpuFigures | None = None  # an NPU build (ethos_u): Vela's placement, memory, estimate


# --- quantize.json, convert.json ---------------------------------------------------------


class QuantizeRecord(Record):
    """quantize.json: what the quantize stage made of the optimized model (onnxruntime's
    quantizer, or the float model handed on to a converter that quantizes itself)."""

    mode: str
    nodes: int  # of the model it wrote
    ops: dict[str, int]
    delegated_to_converter: bool | None = None  # the converter quantizes (onnx2tf)
    # int8 and int8_weights (onnxruntime)
    per_channel: bool | None = None
    symmetric: bool | None = None
    reduce_range: bool | None = None
    reduce_range_auto: str | None = None  # why `auto` chose as it did
    method: str | None = None
    entropy_bins: int | None = None
    calibration_samples: int | None = None
    imposed_by_target: dict[str, bool] | None = None
    float_outputs: list[str] | None = None  # nodes writing the outputs, kept float
    float_infinities: list[str] | None = None  # nodes reading an infinite constant
    refused_by_quantizer: list[str] | None = None  # nodes the quantizer failed on
    float_islands: dict[str, Any] | None = None  # quantization.keep_float
    opset_converted: dict[str, Any] | None = None  # the source was below opset 13
    shape_inference: dict[str, Any] | None = None
    fallback: dict[str, Any] | None = None  # quantization.fallback: auto, the search
    scheme: str | None = None  # int8_weights: in words
    weights: dict[str, Any] | None = None
    int8_tensors: int | None = None
    kept_float: dict[str, Any] | None = None
    qat: bool | None = None  # method qat: the exported Q/DQ as it is
    weights_folded_to_int8: int | None = None


class ConvertRecord(Record):
    """convert.json: what the target's converter wrote (the artifact's files, its operators,
    its I/O layout, and each backend's own figures)."""

    artifact: str  # the main file's name
    files: list[str]  # every file written
    target: str
    size_bytes: int
    operators: list[str] | None = None
    converter: str | None = None  # the tool and its version
    convert_seconds: float | None = None
    path: str | None = None  # "native": TensorFlow's own converter
    io: dict[str, Any] | None = None  # the .tflite's inputs and outputs: index, layout, name
    # where the file the device loads is not the artifact edgeflow verifies (ethos_u: Vela's
    # model_vela.tflite, compiled from the verified model.tflite)
    deployed: str | None = None
    npu: dict[str, Any] | None = None  # what the NPU's compiler reported (ethos_u: Vela)
    emitted: list[dict[str, Any]] | None = None  # the artifact's operators against the profile
    imposed_by_target: dict[str, bool] | None = None
    int8: dict[str, Any] | None = None  # a converter that quantizes itself: its scheme
    int8_weights: dict[str, Any] | None = None
    fallback: dict[str, Any] | None = None  # the fallback search of a converter's build
    retry: dict[str, Any] | None = None  # onnx2tf's parameter replacement, when it took one
    host: dict[str, Any] | None = None  # postprocess.cut: the part that runs on the host
    arena_bytes: int | None = None  # TFLite Micro: the smallest arena it allocates in
    arena_recorded_bytes: int | None = None
    engine: str | None = None  # TensorRT: the engine file (None: no GPU to build it)
    tensorrt: str | None = None  # its version
    not_verified: str | None = None  # why the runtime cannot run here


# --- precheck.json -----------------------------------------------------------------------


class FindingRecord(Record):
    """One precheck finding (edgeflow.targets.precheck.Finding, as written)."""

    operator: str
    reason: str
    nodes: list[str]  # the first 20
    count: int
    rule: str  # the suggested rule ("" when none removes it)
    options: dict[str, Any]
    severity: str  # error or warning
    tried: list[str]  # rules that declare it and leave it on this model


class MemoryRecord(Record):
    """The memory estimate against the board (edgeflow.targets.memory)."""

    quantization: str
    weights_bytes: int
    activations_bytes: int
    overhead_bytes: int
    arena_bytes: int
    peak_node: str
    unknown_sizes: list[str]
    board: str | None
    ram_bytes: int | None
    flash_bytes: int | None


class NpuPrediction(Record):
    """Where Vela is expected to put the model's nodes, from the profile's placements
    measured on the probe graphs (edgeflow.targets.placement): node counts by operator."""

    accelerator: str
    generation: str  # u55, u65, u85: whose measured placements
    nodes: int
    npu: int  # nodes wholly on the NPU
    cpu: dict[str, int]  # operator -> nodes left on the CPU
    partly: dict[str, int]  # ... partly on the CPU
    fails: dict[str, int]  # ... Vela failed on (measured on a probe)
    moves: dict[str, int]  # ... for which Vela adds transposes or reshapes on the NPU
    unmeasured: dict[str, int]  # ... of operators no probe placed


class PrecheckRecord(Record):
    """precheck.json: the model against the target, before converting."""

    target: str
    passed: bool
    findings: list[FindingRecord]
    memory: MemoryRecord | None  # None on TensorFlow's native path
    ops: dict[str, int]  # operator counts (ONNX ops, or the builtins the native path wrote)
    path: str | None = None  # the native path: what was checked
    npu: NpuPrediction | None = None  # an NPU build (ethos_u): where Vela should put them


# --- diff.json, bisect.json --------------------------------------------------------------


class Divergence(Record):
    tensor: str
    op: str
    node: str
    fused_nodes: list[str]
    artifact_tensor: str
    paired_by: str
    worst_part: str | None
    parts: list[str]
    sqnr_db: float | str | None  # "inf" for an exact tensor (JSON has no inf)
    inputs_sqnr_db: float | str | None
    # an NPU build (ethos_u): the operator Vela compiled this tensor's into, where it put it
    npu_layer: NpuLayer | None = None


class NpuLayer(Record):
    op: str  # the original operator, as Vela names it (Conv2D)
    lowered: list[str]  # what Vela made of it (Conv2D, Relu: a fused activation)
    target: str  # NPU or CPU
    cycles: int  # Vela's estimate


class Worst(Record):
    tensor: str
    sqnr_db: float | str | None


class DiffRecord(Record):
    """diff.json: every tensor of the artifact against the source (layers_diff.csv has each)."""

    target: str
    runtime: str
    mode: str
    samples: int
    pairing: str  # how the artifact's tensors were paired with the source's
    source_tensors: int
    artifact_tensors: int
    compared: int
    paired_by: dict[str, int]
    min_sqnr_db: float
    first_divergence: Divergence | None
    line: str  # the finding, one line
    hint: str | None
    bisect: str | None  # why the diff could not locate it: the bisection's turn
    worst: Worst | None


class Attempt(Record):
    """One prefix of the model, cut at a tensor, converted and run."""

    index: int  # the cut tensor's position among the candidates
    tensor: str
    op: str
    node: str
    verdict: str  # ok, diverges, convert, run, crash
    detail: str
    sqnr_db: float | None


class BisectRecord(Record):
    """bisect.json: the shortest prefix of the model that fails."""

    target: str
    mode: str
    candidates: int
    min_sqnr_db: float
    attempts: list[Attempt]
    first_failing: Attempt | None
    last_passing: Attempt | None
    line: str


# --- report.json -------------------------------------------------------------------------


class Section(Record):
    heading: str
    body: str  # markdown


class ReportRecord(Record):
    """report.md as data: report.md joins it, report.html renders it with its plots."""

    title: str  # the build, then the recipe's own name and description
    intro: str  # the verdict line and the headline figures (markdown)
    sections: list[Section]

    def markdown(self) -> str:
        parts = [f"# {self.title}", "", self.intro.rstrip("\n"), ""]
        for section in self.sections:
            parts += [f"## {section.heading}", "", section.body.rstrip("\n"), ""]
        return "\n".join(parts).rstrip("\n") + "\n"


# The record of each slot that has one (a slot's name means the same data in every pipeline).
RECORDS: dict[str, type[Record] | type[Checks]] = {
    "verify": VerifyRecord,
    "checks": Checks,
    "metrics": Metrics,
    "report_record": ReportRecord,
    "precheck": PrecheckRecord,
    "quantize": QuantizeRecord,
    "convert": ConvertRecord,
    "diff": DiffRecord,
    "bisect": BisectRecord,
}


def read_record(slot: str, path: Path) -> Any:
    """The record of `slot` in `path`, validated; a file an older edgeflow wrote, or one
    edited by hand, is an error that says so."""
    try:
        return _validated(slot, path)
    except ValidationError as exc:
        raise EdgeflowError(
            f"{path} is not a {slot} record this edgeflow reads: {_problems(exc)}",
            "build it again with this edgeflow (`edgeflow run`); cached entries are remade",
        ) from exc
    except OSError as exc:
        raise EdgeflowError(f"cannot read {path}: {exc}") from exc


def stale(slot: str, path: Path) -> str | None:
    """What is wrong with the record of `slot` in `path` (None: it validates)."""
    try:
        _validated(slot, path)
    except (ValidationError, OSError) as exc:
        return f"{path.name} is not this edgeflow's {slot} record: {_problems(exc)}"
    return None


def _validated(slot: str, path: Path) -> Any:
    """The file's record (pydantic's JSON parser: malformed JSON is a ValidationError too)."""
    return RECORDS[slot].model_validate_json(path.read_text(encoding="utf-8"))


def _problems(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        errors = [
            f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}"
            for e in exc.errors()
        ]
        more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
        return "; ".join(errors[:3]) + more
    return str(exc).splitlines()[0]


def metrics_schema() -> str:
    """metrics.json's JSON schema, as docs/metrics.schema.json holds it."""
    schema = Metrics.model_json_schema(mode="serialization")
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":  # python -m edgeflow.core.records > docs/metrics.schema.json
    print(metrics_schema(), end="")
