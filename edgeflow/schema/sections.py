"""The recipe's sections as pydantic models: the spec types every layer reads.

A leaf module: rules, targets and the data code take TensorSpec, DatasetSpec and the other
sections from here; edgeflow.recipe.schema composes them (with the target profile and the
resolved rules) into the Recipe. The base model and field types are in
edgeflow.schema.base, an input's signature (TensorSpec) in edgeflow.schema.signatures, the
`source` section's kinds in edgeflow.schema.source."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BeforeValidator,
    Field,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from edgeflow.core.islands import IslandKind
from edgeflow.core.refs import ImportRef
from edgeflow.schema.base import (
    Strict,
    _existing_file,
    _import_ref,
    user_error,
)

# An input's signature and the helpers the stages read it with, as every layer imports them
from edgeflow.schema.signatures import StateLink as StateLink
from edgeflow.schema.signatures import TensorSpec as TensorSpec
from edgeflow.schema.signatures import data_inputs as data_inputs
from edgeflow.schema.signatures import fed_inputs as fed_inputs


def _dataset_ref(value: Any, info: ValidationInfo) -> ImportRef | Path:
    if isinstance(value, str) and value.endswith((".npz", ".npy")):
        return _existing_file(value, info)
    return _import_ref(value, info)


class DatasetSpec(Strict):
    """Samples from a `module:callable` or from a .npz / .npy file (loaded without pickle)."""

    dataset: Annotated[ImportRef | Path, BeforeValidator(_dataset_ref)]
    split: str | None = None
    samples: int | None = Field(None, ge=1, le=10_000_000)
    options: dict[str, Any] = Field(default_factory=dict)


class Batched(Strict):
    """What every output kind shares: the axis its samples are on in the model's own layout
    (1 for a time-major [T, B, C] output); every comparison takes the output batch-first.
    Its other axes (`axis`) are counted in the model's own layout too."""

    batch_axis: int = Field(0, ge=0, le=7)

    def batch_first(self, axis: int, ndim: int) -> int | None:
        """Where the model's axis `axis` (negative: from the end) of an `ndim`-axis output is
        once the batch axis is moved to the front; None when it is the batch axis."""
        native = axis if axis >= 0 else ndim + axis
        if native == self.batch_axis:
            return None
        return native + 1 if native < self.batch_axis else native

    def _off_the_batch(self, axis: int, what: str, hint: str) -> None:
        """A kind's own axis (`what`, for the message) must not be the batch axis."""
        if axis == self.batch_axis:
            raise user_error(
                f"{what} {axis} is the batch axis (batch_axis: {self.batch_axis})", hint, at="axis"
            )


class ClassesOutput(Batched):
    """Class scores: top-1 agreement of the argmax over `axis`; [B, C] is one decision per
    sample, [B, T, C] (a text recogniser) or [B, C, H, W] (`axis: 1`, a segmenter) one per
    position, with whole-sample (sequence) agreement beside it."""

    kind: Literal["classes"]
    axis: int = Field(-1, ge=-8, le=7)
    # the whole sequence compared as greedy CTC decodes (repeats collapsed, this class removed)
    ctc_blank: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _not_the_batch(self) -> ClassesOutput:
        hint = "name the class axis: -1 (last, the default), or the axis the classes are on"
        self._off_the_batch(self.axis, "axis", hint)
        return self


class ProbabilityOutput(Batched):
    """Scores compared as decisions: `value >= threshold` (sigmoid scores at 0.5, logits at 0)."""

    kind: Literal["probability"]
    threshold: float = 0.5


class ValuesOutput(Batched):
    """Regression outputs, feature maps: compared by SQNR and relative error only."""

    kind: Literal["values"]


def _pair(value: Any) -> Any:
    """A pair as YAML writes it: [query, match]."""
    return tuple(value) if isinstance(value, list) else value


class EmbeddingOutput(Batched):
    """Embeddings (a sentence encoder's pooled vector, an image embedding): compared by the
    cosine similarity of the artifact's vector with the source's, per sample (over `axis`;
    the lowest and the mean), and with `pairs` by retrieval: for each (query, match) pair of
    evaluation samples, the rank of the match among all samples by cosine similarity to the
    query, from the source's embeddings and from the artifact's."""

    kind: Literal["embedding"]
    axis: int = Field(-1, ge=-8, le=7)  # the embedding's axis (others: positions)
    pairs: list[Annotated[tuple[int, int], BeforeValidator(_pair)]] = Field(
        default_factory=list, max_length=100_000
    )

    @model_validator(mode="after")
    def _two_samples_each(self) -> EmbeddingOutput:
        for i, (query, match) in enumerate(self.pairs):
            if query < 0 or match < 0 or query == match:
                raise user_error(
                    f"pair {i} ({query}, {match}): a pair is two different evaluation samples, "
                    "counted from 0",
                    "give [query, its true match] as sample indices of the evaluation dataset",
                    at=f"pairs.{i}",
                )
        return self

    @model_validator(mode="after")
    def _not_the_batch(self) -> EmbeddingOutput:
        self._off_the_batch(self.axis, "axis", "name the embedding's axis: -1 (last, the default)")
        return self


class Span(Strict):
    """Positions [start, stop) along a detection head's layout axis (stop null: to the end)."""

    start: int = Field(ge=0)
    stop: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> Span:
        if self.stop is not None and self.stop <= self.start:
            raise user_error(
                f"stop ({self.stop}) must be above start ({self.start})", "fix the span", at="stop"
            )
        return self


def _span(value: Any) -> Any:
    """[start, stop] and a bare start are short forms of {start, stop}."""
    if isinstance(value, list) and len(value) == 2:
        return {"start": value[0], "stop": value[1]}
    if isinstance(value, int) and not isinstance(value, bool):
        return {"start": value}
    return value


class DetectionsOutput(Batched):
    """A raw detector head, boxes and scores in one tensor ([B, N, 4 + classes], or
    [B, 4 + classes, N] with `axis: 1`): the layout names the slices of `axis`; candidates
    scoring at least `score_threshold` are matched as detections (verify.detections)."""

    kind: Literal["detections"]
    axis: int = -1  # the layout axis: -1 (or 2) for [B, N, F], 1 for [B, F, N]
    boxes: int = Field(0, ge=0)  # the first of 4 box coordinates
    box_format: Literal["xyxy", "cxcywh"] = "xyxy"
    scores: Annotated[Span, BeforeValidator(_span)] = Span(start=4)  # class scores
    objectness: int | None = Field(None, ge=0)  # YOLOv5-style: a candidate's score is obj * cls
    score_threshold: float = Field(0.25, ge=0)

    @field_validator("axis")
    @classmethod
    def _layout_axis(cls, axis: int) -> int:
        if axis not in (-1, 1, 2):
            raise user_error(
                f"a detector head's layout axis is -1 (or 2) or 1, not {axis}",
                "axis: -1 for [batch, N, 4 + classes], axis: 1 for [batch, 4 + classes, N]",
            )
        return axis

    @model_validator(mode="after")
    def _apart(self) -> DetectionsOutput:
        box = set(range(self.boxes, self.boxes + 4))
        stop = self.scores.stop
        overlap = box & set(range(self.scores.start, stop if stop is not None else 1 << 16))
        if overlap or (self.objectness is not None and self.objectness in box):
            raise user_error(
                f"the box coordinates {self.boxes}..{self.boxes + 3} overlap the scores or the "
                "objectness",
                "give boxes, scores and objectness separate positions of the layout axis",
                at="boxes",
            )
        hint = "set axis to the axis of 4 + classes features, batch_axis to the samples' axis"
        self._off_the_batch(self.axis, "the layout axis", hint)
        return self


OutputSpec = Annotated[
    ClassesOutput | ProbabilityOutput | ValuesOutput | EmbeddingOutput | DetectionsOutput,
    Field(discriminator="kind"),
]


def default_output_names(count: int) -> list[str]:
    """The exported graph's output names when source.outputs does not set them."""
    return ["output"] if count == 1 else [f"output_{i}" for i in range(count)]


class Evaluation(DatasetSpec):
    # top1: classification (needs a 'label' array); agreement: outputs compared with the
    # source model's only, no labels (random weights, models without a labelled dataset);
    # detections: boxes/scores/labels compared as sets with the source model's
    metric: Literal["top1", "agreement", "detections"] = "top1"
    # what each output is, by its name; an output not named here is judged by its shape
    outputs: dict[str, OutputSpec] = Field(default_factory=dict)


# The opsets each PyTorch exporter writes (torch 2.13): the dynamo exporter's lowest is 18 (it
# silently writes 18 when asked for less); the TorchScript exporter's highest is 20.
EXPORTER_OPSETS = {"dynamo": (18, 23), "torchscript": (13, 20)}


class ExportOptions(Strict):
    """The ONNX export: its opset, and for a PyTorch source the exporter (the opsets each
    writes are checked with the source, edgeflow.recipe.checks)."""

    opset: int = Field(18, ge=13, le=23)
    exporter: Literal["dynamo", "torchscript"] = "dynamo"


def exporter_opset_problem(options: ExportOptions) -> tuple[str, str] | None:
    """(message, hint) when a PyTorch exporter cannot write the asked opset."""
    low, high = EXPORTER_OPSETS[options.exporter]
    if low <= options.opset <= high:
        return None
    other = "torchscript" if options.exporter == "dynamo" else "dynamo"
    return (
        f"the {options.exporter} exporter writes opsets {low} to {high}, not {options.opset}",
        f"set export.opset between {low} and {high}, or export.exporter: {other}",
    )


class HostPostprocess(Strict):
    """The model's tail that runs on the host instead of in the artifact (docs/detection.md):
    the artifact ends at the `cut` tensors of the exported graph; the graph from them to the
    model's outputs is shipped beside it as postprocess.onnx with a generated postprocess.py
    (ONNX Runtime on the host), and verify checks the two together against the source."""

    cut: list[str] = Field(min_length=1)


class OptimizeOptions(Strict):
    onnxscript: bool = True
    passes: list[str] = Field(
        default_factory=lambda: [
            "eliminate_deadend",
            "eliminate_identity",
            "eliminate_nop_transpose",
        ]
    )

    @field_validator("passes")
    @classmethod
    def _known_passes(cls, passes: list[str]) -> list[str]:
        import onnxoptimizer

        known = onnxoptimizer.get_available_passes()
        for name in passes:
            if name not in known:
                from edgeflow.core.suggest import did_you_mean

                raise user_error(f"unknown onnxoptimizer pass '{name}'", did_you_mean(name, known))
        return passes


# quantization.mode: float32, float16 weights, int8 (weights and activations), or int8 weights
# with float activations (int8_weights: the runtime's dynamic-range / hybrid kernels quantize
# each activation per inference; nothing is calibrated)
QuantizationMode = Literal["none", "fp16", "int8", "int8_weights"]
# The keys that set how int8 activations are calibrated and stored, at the values that leave
# them unset: int8_weights keeps activations float, so any other value would be ignored there.
ACTIVATION_KEYS: dict[str, tuple[Any, str]] = {
    "symmetric": (False, "a symmetric grid for the calibrated activations"),
    "method": ("minmax", "how activation ranges are calibrated"),
    "activations": ("int8", "the stored activations' type"),
}


class Quantization(Strict):
    mode: QuantizationMode = "none"
    per_channel: bool = True
    symmetric: bool = False
    # qat: the model carries its own scales (fake-quantize modules, see ast.freeze_fake_quant)
    # mse: the TFLite family's (edgeflow.targets._tflite_ranges)
    method: Literal["minmax", "entropy", "percentile", "mse", "qat"] = "minmax"
    # 7-bit weights: avoids int16 saturation in x86 AVX2 (non-VNNI) u8s8 kernels; auto: where
    # this machine's kernels saturate (onnxruntime_micro; edgeflow.core.host); see docs.
    reduce_range: bool | Literal["auto"] = "auto"
    # int16: int8 weights with int16 activations (TFLite's 16x8 mode; tflite, tflite_micro)
    activations: Literal["int8", "int16"] = "int8"
    # auto: where int8 misses verify's thresholds on the calibration samples, keep the fewest,
    # most sensitive layers float until they hold (edgeflow.verify.fallback)
    fallback: Literal["none", "auto"] = "none"
    # the operators that write the model's outputs stay float, and the outputs are float32
    # (int8 inside): a softmax over many classes or a map read at 0.5 off an 8-bit grid
    float_outputs: bool = False
    # what one search may spend: mixes built and run, and seconds (no mix starts after them)
    fallback_max_trials: int = Field(32, ge=1, le=1_000)
    fallback_max_seconds: float = Field(900.0, gt=0)
    # the operators of these kinds stay float in an int8 build, found by what they compute
    # (edgeflow.core.islands); unset: the target's default (its profile's int8_keep_float)
    keep_float: list[IslandKind] | None = None

    @model_validator(mode="after")
    def _fallback_of_int8(self) -> Quantization:
        if self.float_outputs and (self.mode != "int8" or self.activations != "int8"):
            raise user_error(
                f"float_outputs keeps the outputs of an int8 model float; mode is {self.mode}"
                + (", activations int16" if self.activations != "int8" else ""),
                "set quantization.mode: int8 with 8-bit activations, or remove "
                "quantization.float_outputs",
                at="float_outputs",
            )
        if self.keep_float:
            self._int8_activations("keep_float keeps operators of an int8 model float")
        if self.fallback == "none":
            return self
        if self.mode != "int8":
            raise user_error(
                f"fallback keeps layers of an int8 model float; mode is {self.mode}",
                "set quantization.mode: int8, or remove quantization.fallback",
                at="fallback",
            )
        if self.method == "qat":
            raise user_error(
                "fallback calibrates again; a QAT model's scales are its own",
                "remove quantization.fallback, or use method minmax",
                at="fallback",
            )
        if self.activations != "int8":
            raise user_error(
                "fallback is offered for int8 activations only (not TFLite's 16x8 mode)",
                "remove quantization.fallback, or set quantization.activations: int8",
                at="fallback",
            )
        return self

    def _int8_activations(self, what: str) -> None:
        """`what` (a key's effect) needs calibrated int8 activations: mode int8, 8-bit
        activations, scales edgeflow sets."""
        if self.mode != "int8":
            raise user_error(
                f"{what}; mode is {self.mode}",
                "set quantization.mode: int8, or remove quantization.keep_float",
                at="keep_float",
            )
        if self.activations != "int8" or self.method == "qat":
            raise user_error(
                f"{what}; it is offered for calibrated int8 activations (not "
                + (
                    "TFLite's 16x8 mode)"
                    if self.activations != "int8"
                    else "a QAT model's own scales)"
                ),
                "remove quantization.keep_float (or set it to [])",
                at="keep_float",
            )

    @model_validator(mode="after")
    def _weight_only(self) -> Quantization:
        """int8_weights calibrates nothing and keeps activations float: a key that sets the
        activations' grid is refused, not ignored."""
        if self.mode != "int8_weights":
            return self
        for key, (unset, what) in ACTIVATION_KEYS.items():
            value = getattr(self, key)
            if value != unset:
                raise user_error(
                    f"{key} sets {what}; int8_weights keeps activations float (its kernels "
                    f"quantize them per inference) and calibrates nothing (got {value})",
                    f"remove quantization.{key}, or set quantization.mode: int8",
                    at=key,
                )
        return self


QUANTIZATION_KEYS = tuple(Quantization.model_fields)
# The `quantization=` presets of `edgeflow run` and params.yaml: each sets some keys; the
# rest stay as the recipe has them.
QUANTIZATION_PRESETS: dict[str, dict[str, Any]] = {
    "recipe": {},
    "none": {"mode": "none"},
    "fp16": {"mode": "fp16"},
    "int8": {"mode": "int8"},
    "int8_per_tensor": {"mode": "int8", "per_channel": False},
    "int8_symmetric": {"mode": "int8", "symmetric": True},
    "int16_act": {"mode": "int8", "activations": "int16"},
    "int8_fallback": {"mode": "int8", "fallback": "auto"},
    "int8_float_outputs": {"mode": "int8", "float_outputs": True},
    "int8_weights": {"mode": "int8_weights"},
}


class PrecheckOptions(Strict):
    continue_on_failure: bool = False  # convert anyway and let the real tool decide
    board: str | None = None  # a memory preset of the target profile; default: its default_board


class DetectionChecks(Strict):
    """How detections are compared when evaluation.metric is detections."""

    max_detections: int = Field(100, ge=1, le=100_000)  # rows per image in the padded form
    box_atol: float = Field(1e-3, gt=0)  # per box coordinate, in box_units
    box_units: Literal["pixels", "relative"] = "relative"  # relative: fraction of the image side
    score_atol: float = Field(1e-4, ge=0)
    min_match_rate: float = Field(1.0, ge=0, le=1)  # share of source detections matched


def _sqnr_floor(value: Any) -> Any:
    """verify.min_sqnr_db: a number of dB, auto or null, in one message when it is neither."""
    if value is None or value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise user_error(
            f"must be a number of dB, auto or null (got {value!r:.40})",
            "e.g. min_sqnr_db: 25; auto is 15 dB for int8 builds, 25 for int8_weights; null "
            "turns it off",
        )
    return float(value)


# verify.min_sqnr_db where a build's recipe does not set it, by quantization mode
# (docs/recipe.md#verify): an int8 output below 15 dB has lost what a float one keeps; int8
# weights with float activations lose less (healthy builds measured 34.8-51.4 dB): 25 dB.
DEFAULT_MIN_SQNR_DB = {"int8": 15.0, "int8_weights": 25.0}
MODES: tuple[str, ...] = get_args(QuantizationMode)  # the keys of verify.by_mode


def _mode_sqnr_floor(value: Any) -> Any:
    if value == "inherit":
        return value
    if value == "auto":
        raise user_error(
            "auto is verify.min_sqnr_db's default; a mode's own floor is a number of dB",
            "e.g. min_sqnr_db: 25, or remove the key to keep the default",
        )
    return _sqnr_floor(value)


# A key of verify.by_mode.<mode> not given there: the mode takes verify's own value. A value,
# not "unset", so that the cache keys tell it from an explicit null (off for that mode).
Inherit = Literal["inherit"]
INHERIT: Inherit = "inherit"


def _limit(low: float | None = None, high: float | None = None, above: bool = False) -> Any:
    """A by_mode threshold: a number within [low, high] (above low, with `above`), null, or
    not given; one message for a value that is none of them."""

    def check(value: Any) -> Any:
        if value is None or value == INHERIT:
            return value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise user_error(
                f"must be a number or null (got {value!r:.40})",
                "e.g. 0.05; null turns the threshold off for this mode",
            )
        if low is not None and (value <= low if above else value < low):
            raise user_error(f"must be {'above' if above else 'at least'} {low:g} (got {value})")
        if high is not None and value > high:
            raise user_error(f"must be at most {high:g} (got {value})")
        return value

    return BeforeValidator(check)


class ModeThresholds(Strict):
    """verify.by_mode.<mode>: thresholds for the builds of one quantization mode; a key set
    here wins over the same key of verify for those builds (null: off for them)."""

    max_abs_diff: Annotated[float | Inherit | None, _limit(0)] = INHERIT
    max_relative_diff: Annotated[float | Inherit | None, _limit(0)] = INHERIT
    max_accuracy_drop: Annotated[float | Inherit | None, _limit(0, 1)] = INHERIT
    min_top1_agreement: Annotated[float | Inherit | None, _limit(0, 1)] = INHERIT
    min_sqnr_db: Annotated[float | Inherit | None, BeforeValidator(_mode_sqnr_floor)] = INHERIT
    min_decision_agreement: Annotated[float | Inherit | None, _limit(0, 1)] = INHERIT
    min_sequence_agreement: Annotated[float | Inherit | None, _limit(0, 1)] = INHERIT
    min_cosine_similarity: Annotated[float | Inherit | None, _limit(-1, 1)] = INHERIT
    max_latency_ms: Annotated[float | Inherit | None, _limit(0, above=True)] = INHERIT
    max_size_bytes: Annotated[int | Inherit | None, _limit(0, above=True)] = INHERIT
    task_metric: Annotated[float | Inherit | None, _limit()] = INHERIT  # verify.task_metric's

    def given(self, key: str) -> bool:
        return getattr(self, key) != INHERIT


class TaskMetric(Strict):
    """verify.task_metric: the recipe's own figure of a build, computed by a function of the
    user's code from the source model's and the artifact's outputs (dicts of batch-first
    arrays by output name, over the same samples) and held to `min` or `max`; verify reports
    it and quantization.fallback: auto keeps to it."""

    function: Annotated[ImportRef, BeforeValidator(_import_ref)]
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _one_bound(self) -> TaskMetric:
        if (self.min is None) == (self.max is None):
            raise user_error(
                "a task metric is held to one bound: min (a score) or max (an error)",
                "set min: for a score that must stay high, or max: for an error",
            )
        return self

    @property
    def name(self) -> str:
        return self.function.attr

    @property
    def kind(self) -> str:
        return "min" if self.min is not None else "max"

    @property
    def bound(self) -> float:
        value = self.min if self.min is not None else self.max
        assert value is not None  # _one_bound
        return value


class Verify(Strict):
    max_abs_diff: float | None = Field(None, ge=0)
    # largest allowed |artifact - source| / max|source| of any output (scale-free max_abs_diff)
    max_relative_diff: float | None = Field(None, ge=0)
    max_accuracy_drop: float | None = Field(0.01, ge=0, le=1)
    min_top1_agreement: float | None = Field(None, ge=0, le=1)  # classes outputs only
    # per output: 10*log10(sum ref^2 / sum (ref - out)^2); auto: DEFAULT_MIN_SQNR_DB by mode
    # (a value, not "unset", so that the cache keys tell the default from an explicit null)
    min_sqnr_db: Annotated[float | Literal["auto"] | None, BeforeValidator(_sqnr_floor)] = "auto"
    min_decision_agreement: float | None = Field(None, ge=0, le=1)  # probability outputs
    min_sequence_agreement: float | None = Field(None, ge=0, le=1)  # classes, one per position
    min_cosine_similarity: float | None = Field(None, ge=-1, le=1)  # embeddings, per sample
    max_latency_ms: float | None = Field(None, gt=0)
    max_size_bytes: PositiveInt | None = None
    task_metric: TaskMetric | None = None  # the recipe's own figure (edgeflow.verify.judge)
    # thresholds of one quantization mode's builds: {int8: {min_sqnr_db: 20}, none: {...}}
    by_mode: dict[QuantizationMode, ModeThresholds] = Field(default_factory=dict)
    latency_runs: int = Field(100, ge=1, le=10_000)  # each is one inference: bounded
    warmup_runs: int = Field(10, ge=0, le=1_000)
    detections: DetectionChecks = DetectionChecks()
    # accept a build whose runtime is absent here (TensorRT without a GPU): exit 0, not 3;
    # metrics.json and the report still say verified: false and why
    allow_unverified: bool = False

    @model_validator(mode="after")
    def _task_bound_per_mode(self) -> Verify:
        for mode, limits in self.by_mode.items():
            if limits.given("task_metric") and self.task_metric is None:
                raise user_error(
                    "sets the bound of verify.task_metric, and the recipe names no task metric",
                    "name the function in verify.task_metric (function, and min or max), or "
                    "remove the key",
                    at=f"by_mode.{mode}.task_metric",
                )
        return self


# The thresholds of verify a build is judged by on its outputs (not latency or size): what
# quantization.fallback: auto keeps to (edgeflow.verify.fallback), and the recipe keys a stage
# that runs its search reads: its cache key and DVC params.
QUALITY_THRESHOLDS = (
    "max_accuracy_drop",
    "min_top1_agreement",
    "max_relative_diff",
    "max_abs_diff",
    "min_sqnr_db",
    "min_decision_agreement",
    "min_sequence_agreement",
    "min_cosine_similarity",
)
FALLBACK_READS = (
    *(f"verify.{key}" for key in QUALITY_THRESHOLDS),
    "verify.task_metric",
    "verify.by_mode",
    "verify.detections",  # a detector head's matching tolerances
    "evaluation.metric",
    "evaluation.outputs",  # kinds and batch axes: how the search compares outputs
    "source.inputs",  # a detector head's image size
)


class Diff(Strict):
    """The per-layer diff: `edgeflow diff`, and after a build that misses an accuracy or
    agreement threshold (docs/debugging.md)."""

    samples: int = Field(16, ge=1, le=10_000)  # evaluation samples compared, the first ones
    # below this SQNR a tensor has diverged; default by mode: none 60, fp16 40, int8 15,
    # int8_weights 20 dB
    min_sqnr_db: float | None = None
    on_failure: bool = True  # run it when a build misses an accuracy or agreement threshold
