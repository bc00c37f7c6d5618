"""The recipe's sections as pydantic models: the spec types every layer reads.

A leaf module: rules, targets and the data code take TensorSpec, DatasetSpec and the other
sections from here; edgeflow.recipe.schema composes them (with the target profile and the
resolved rules) into the Recipe."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from edgeflow.core.refs import ImportRef


def user_error(message: str, hint: str | None = None, at: str = "") -> PydanticCustomError:
    """A validation error the recipe loader prints as it is; `at` relocates it to a dotted key."""
    ctx = {"message": message, "hint": hint or "", "at": at}
    return PydanticCustomError("edgeflow", "{message}", ctx)


def _base_dir(info: ValidationInfo) -> Path:
    context = info.context or {}
    return Path(context.get("base_dir", "."))


def _existing_file(value: Any, info: ValidationInfo) -> Path:
    if not isinstance(value, str | Path):
        raise user_error(f"expected a file path (got {value!r})")
    try:
        path = (_base_dir(info) / value).resolve()
        found = path.is_file()
    except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a name too long, NUL
        raise user_error(
            f"not a usable file path: {value!s:.200} ({type(exc).__name__}: {exc!s:.200})",
            "paths are relative to the recipe's folder; fix the path",
        ) from None
    if not found:
        raise user_error(
            f"file not found: {value} (resolved to {path})",
            "paths are relative to the recipe's folder; create the file or fix the path",
        )
    return path


def _import_ref(value: Any, info: ValidationInfo) -> ImportRef:
    if not isinstance(value, str):
        raise user_error(f"expected 'package.module:Name' (got {value!r})")
    try:
        ref = ImportRef.parse(value, _base_dir(info))
        ref.check()
    except ValueError as exc:
        raise user_error(str(exc), "write it as 'package.module:Name' or 'file.py:Name'") from None
    return ref


RecipeFile = Annotated[Path, BeforeValidator(_existing_file)]
CodeRef = Annotated[ImportRef, BeforeValidator(_import_ref)]


class Strict(BaseModel):
    """Recipe sections: unknown keys are errors, and values are taken as written (strict: a
    boolean is no number, a string no number; NaN and infinities are refused)."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        arbitrary_types_allowed=True,
        strict=True,
        allow_inf_nan=False,
    )


MAX_DIM = 2**31 - 1  # what ONNX and the runtimes index tensors with
MAX_ELEMENTS = 2**31  # per input tensor (8 GiB of float32): beyond it nothing here runs


Dtype = Literal["float32", "float16", "float64", "int64", "int32", "int8", "uint8", "bool"]
DTYPES: tuple[str, ...] = get_args(Dtype)


def _constant(value: Any, info: ValidationInfo) -> Any:
    """source.inputs[].value: a number, a nested list or a .npy file (the recipe's folder)."""
    if isinstance(value, str):
        if not value.endswith(".npy"):
            raise user_error(
                f"a constant is a number, a nested list or a .npy file (got {value!r:.80})",
                "write value: 16000, value: [[1, 2], [3, 4]] or value: path/to/array.npy",
            )
        return _existing_file(value, info)
    return value


class TensorSpec(Strict):
    """One model input: fed from the datasets, or (`value`) bound to a constant at export /
    ingest, so that the artifact has no such input."""

    name: str = Field(min_length=1)
    shape: list[Annotated[int, Field(ge=1, le=MAX_DIM)]] = Field(max_length=8)
    dtype: Dtype = "float32"
    # the axis the datasets' samples are stacked on; null: no batch, fed whole to every batch
    # (default 0; null for 0-D inputs and constants)
    batch_axis: int | None = Field(0, ge=0, le=7)
    value: Annotated[bool | int | float | list[Any] | Path | None, BeforeValidator(_constant)] = (
        None
    )

    @model_validator(mode="after")
    def _not_too_big(self) -> TensorSpec:
        elements = 1
        for dim in self.shape:
            elements *= dim
        if elements > MAX_ELEMENTS:
            raise user_error(
                f"{elements:,} elements per sample is more than {MAX_ELEMENTS:,}",
                "check the shape: one sample of the model's input",
                at="shape",
            )
        return self

    @model_validator(mode="after")
    def _signature(self) -> TensorSpec:
        """A declared batch axis within the rank; a constant's value of the declared shape and
        a dtype that holds it exactly (inferred from the value when not declared)."""
        declared = self.model_fields_set
        if self.value is not None or not self.shape:
            if "batch_axis" in declared and self.batch_axis is not None:
                what = "a constant" if self.value is not None else "a 0-D input"
                raise user_error(
                    f"{what} has no batch axis (got batch_axis: {self.batch_axis})",
                    "remove batch_axis (or set it to null)",
                    at="batch_axis",
                )
            object.__setattr__(self, "batch_axis", None)  # frozen: the default, by kind
        elif self.batch_axis is not None and self.batch_axis >= len(self.shape):
            raise user_error(
                f"batch_axis {self.batch_axis} is beyond the {len(self.shape)} axes of shape "
                f"{self.shape}",
                f"use an axis from 0 to {len(self.shape) - 1}, or null for no batch axis",
                at="batch_axis",
            )
        if self.value is not None:
            dtype = _constant_dtype(self.value, self.dtype if "dtype" in declared else None)
            object.__setattr__(self, "dtype", dtype)
            found = tuple(self.constant().shape)
            if found != tuple(self.shape):
                raise user_error(
                    f"the value has shape {list(found)}, shape declares {self.shape}",
                    f"set shape: {list(found)}, or give a value of shape {self.shape}",
                    at="value",
                )
        return self

    def constant(self) -> Any:
        """The bound value as a numpy array of the declared dtype (None for a fed input)."""
        import numpy as np

        if self.value is None:
            return None
        if isinstance(self.value, Path):
            return np.load(self.value, allow_pickle=False).astype(self.dtype, copy=False)
        return np.asarray(self.value, dtype=self.dtype)


def _constant_dtype(value: Any, declared: str | None) -> str:
    """The dtype of a constant: the declared one where it holds the value exactly, else the
    value's own (int64 for integers, float32 for floats, bool)."""
    import numpy as np

    if isinstance(value, Path):
        try:
            arr = np.load(value, allow_pickle=False, mmap_mode="r")
        except (ValueError, OSError, EOFError) as exc:
            raise user_error(
                f"cannot read {value.name} as a numpy array: {exc!s:.200}",
                "save it with numpy.save (plain numbers, no Python objects)",
                at="value",
            ) from None
        own = str(arr.dtype)
        if own not in DTYPES:
            raise user_error(
                f"{value.name} holds {own}, which no model input takes",
                f"save it as one of {', '.join(DTYPES)}",
                at="value",
            )
        if declared is not None and declared != own:
            raise user_error(
                f"{value.name} holds {own}, dtype declares {declared}",
                f"set dtype: {own}, or save the array as {declared}",
                at="value",
            )
        return own
    try:
        arr = np.array(value)
    except ValueError:
        arr = None
    if arr is None or arr.dtype.kind not in "biuf":
        raise user_error(
            f"the value is not a rectangular array of numbers (got {value!r:.80})",
            "give one number, or nested lists of equal lengths",
            at="value",
        )
    own = {"b": "bool", "f": "float32"}.get(arr.dtype.kind, "int64")
    if declared is None:
        return own
    target = np.dtype(declared)
    if target.kind == "b" or arr.dtype.kind == "b":
        exact = target.kind == arr.dtype.kind  # true/false only as bool, and bool only so
    elif target.kind in "iu":
        info = np.iinfo(target)
        exact = arr.dtype.kind in "iu" and info.min <= arr.min(initial=0)
        exact = exact and arr.max(initial=0) <= info.max
    else:
        exact = True  # a float input takes integers and floats
    if not exact:
        raise user_error(
            f"the value {value!r:.60} does not fit {declared} (it reads as {own})",
            f"set dtype: {own}, or give {declared} values",
            at="value",
        )
    return declared


SHAPE_HINT = (
    "declare the model's own size on that axis; only its -1, 0 or symbolic dims take the "
    "recipe's size"
)


def shape_clash(model_dims: list[Any], spec: TensorSpec) -> str | None:
    """How the recipe's shape of an input contradicts the model's (None: it does not): the
    rank, or a fixed positive dim (-1, 0 and symbolic dims take any size)."""
    if len(model_dims) != len(spec.shape):
        return f"the model has {len(model_dims)} axes {model_dims}, shape declares {spec.shape}"
    for axis, (dim, want) in enumerate(zip(model_dims, spec.shape, strict=True)):
        if isinstance(dim, int) and dim > 0 and dim != want:
            return f"axis {axis} is {dim} in the model, shape declares {want} ({spec.shape})"
    return None


def fed_inputs(specs: list[TensorSpec]) -> list[TensorSpec]:
    """The inputs the datasets feed: those not bound to a constant."""
    return [s for s in specs if s.value is None]


class DynamicBatch(Strict):
    min: PositiveInt = 1
    max: int = Field(64, ge=1, le=65536)

    @model_validator(mode="after")
    def _ordered(self) -> DynamicBatch:
        if self.min > self.max:
            raise user_error(f"min ({self.min}) is above max ({self.max})", "swap them", at="min")
        return self


class PyTorchSource(Strict):
    kind: Literal["pytorch"]
    model: CodeRef
    init: dict[str, Any] = {}
    weights: RecipeFile | None = None
    inputs: list[TensorSpec] = Field(min_length=1)
    outputs: list[str] | None = None
    dynamic_batch: DynamicBatch | None = None

    @model_validator(mode="after")
    def _signatures(self) -> PyTorchSource:
        return _check_signatures(self)


class OnnxSource(Strict):
    kind: Literal["onnx"]
    model: RecipeFile
    inputs: list[TensorSpec] = Field(min_length=1)
    outputs: list[str] | None = None
    dynamic_batch: DynamicBatch | None = None

    @field_validator("model")
    @classmethod
    def _onnx_suffix(cls, value: Path) -> Path:
        if Path(value).suffix != ".onnx":
            raise user_error("an onnx source must be a .onnx file", "export the model to ONNX")
        return value

    @model_validator(mode="after")
    def _signatures(self) -> OnnxSource:
        return _check_signatures(self)


def _check_signatures(source: Any) -> Any:
    """Unique input names, and one fed input with a batch axis (the batch size of every run)."""
    names = [s.name for s in source.inputs]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise user_error(
                f"two inputs are named '{name}'", "give each input its own name", at="inputs"
            )
    if not any(s.batch_axis is not None for s in fed_inputs(source.inputs)):
        raise user_error(
            "no fed input has a batch axis: the samples cannot be batched",
            "give one input a shape with a batch axis (batch_axis: 0, the default)",
            at="inputs",
        )
    return source


def batch_size(specs: list[TensorSpec]) -> int:
    """The declared batch: the size of the first fed input's batch axis."""
    spec = next(s for s in fed_inputs(specs) if s.batch_axis is not None)
    assert spec.batch_axis is not None
    return spec.shape[spec.batch_axis]


Source = Annotated[PyTorchSource | OnnxSource, Field(discriminator="kind")]


def _dataset_ref(value: Any, info: ValidationInfo) -> ImportRef | Path:
    if isinstance(value, str) and value.endswith((".npz", ".npy")):
        return _existing_file(value, info)
    return _import_ref(value, info)


class DatasetSpec(Strict):
    """Samples from a `module:callable` or from a .npz / .npy file (loaded without pickle)."""

    dataset: Annotated[ImportRef | Path, BeforeValidator(_dataset_ref)]
    split: str | None = None
    samples: int | None = Field(None, ge=1, le=10_000_000)
    options: dict[str, Any] = {}


class ClassesOutput(Strict):
    """Class scores: top-1 agreement of the argmax over `axis`; [B, C] is one decision per
    sample, [B, T, C] (a text recogniser) or [B, C, H, W] (`axis: 1`, a segmenter) one per
    position, with whole-sample (sequence) agreement beside it."""

    kind: Literal["classes"]
    axis: int = Field(-1, ge=-8, le=7)
    # the whole sequence compared as greedy CTC decodes (repeats collapsed, this class removed)
    ctc_blank: int | None = Field(None, ge=0)

    @field_validator("axis")
    @classmethod
    def _not_the_batch(cls, axis: int) -> int:
        if axis == 0:
            raise user_error(
                "axis 0 is the batch", "name the class axis: -1 (last, the default) or 1"
            )
        return axis


class ProbabilityOutput(Strict):
    """Scores compared as decisions: `value >= threshold` (sigmoid scores at 0.5, logits at 0)."""

    kind: Literal["probability"]
    threshold: float = 0.5


class ValuesOutput(Strict):
    """Regression outputs, embeddings, feature maps: compared by SQNR and relative error only."""

    kind: Literal["values"]


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


class DetectionsOutput(Strict):
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
        return self


OutputSpec = Annotated[
    ClassesOutput | ProbabilityOutput | ValuesOutput | DetectionsOutput,
    Field(discriminator="kind"),
]
OUTPUT_KINDS = ("classes", "probability", "values", "detections")


def default_output_names(count: int) -> list[str]:
    """The exported graph's output names when source.outputs does not set them."""
    return ["output"] if count == 1 else [f"output_{i}" for i in range(count)]


class Evaluation(DatasetSpec):
    # top1: classification (needs a 'label' array); agreement: outputs compared with the
    # source model's only, no labels (random weights, models without a labelled dataset);
    # detections: boxes/scores/labels compared as sets with the source model's
    metric: Literal["top1", "agreement", "detections"] = "top1"
    # what each output is, by its name; an output not named here is judged by its shape
    outputs: dict[str, OutputSpec] = {}


# The opsets each PyTorch exporter writes (torch 2.13): the dynamo exporter's lowest is 18 (it
# silently writes 18 when asked for less); the TorchScript exporter's highest is 20.
EXPORTER_OPSETS = {"dynamo": (18, 23), "torchscript": (13, 20)}


class ExportOptions(Strict):
    opset: int = Field(18, ge=13, le=23)
    exporter: Literal["dynamo", "torchscript"] = "dynamo"

    @model_validator(mode="after")
    def _opset_the_exporter_writes(self) -> ExportOptions:
        low, high = EXPORTER_OPSETS[self.exporter]
        if not low <= self.opset <= high:
            other = "torchscript" if self.exporter == "dynamo" else "dynamo"
            raise user_error(
                f"the {self.exporter} exporter writes opsets {low} to {high}, not {self.opset}",
                f"set export.opset between {low} and {high}, or export.exporter: {other}",
                at="opset",
            )
        return self


class HostPostprocess(Strict):
    """The model's tail that runs on the host instead of in the artifact (docs/detection.md):
    the artifact ends at the `cut` tensors of the exported graph; the graph from them to the
    model's outputs is shipped beside it as postprocess.onnx with a generated postprocess.py
    (ONNX Runtime on the host), and verify checks the two together against the source."""

    cut: list[str] = Field(min_length=1)


class OptimizeOptions(Strict):
    onnxscript: bool = True
    passes: list[str] = ["eliminate_deadend", "eliminate_identity", "eliminate_nop_transpose"]

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


class Quantization(Strict):
    mode: Literal["none", "fp16", "int8"] = "none"
    per_channel: bool = True
    symmetric: bool = False
    # qat: the model carries its own scales (fake-quantize modules, see ast.freeze_fake_quant)
    method: Literal["minmax", "entropy", "percentile", "qat"] = "minmax"
    # 7-bit weights: avoids int16 saturation in x86 AVX2 (non-VNNI) u8s8 kernels; auto: where
    # this machine's kernels saturate (onnxruntime_micro; edgeflow.core.host); see docs.
    reduce_range: bool | Literal["auto"] = "auto"
    # int16: int8 weights with int16 activations (TFLite's 16x8 mode; tflite, tflite_micro)
    activations: Literal["int8", "int16"] = "int8"
    # auto: where int8 misses verify's thresholds on the calibration samples, keep the fewest,
    # most sensitive layers float until they hold (edgeflow.verify.fallback)
    fallback: Literal["none", "auto"] = "none"

    @model_validator(mode="after")
    def _fallback_of_int8(self) -> Quantization:
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
            "e.g. min_sqnr_db: 25; auto is 15 dB for int8 builds; null turns it off",
        )
    return float(value)


# verify.min_sqnr_db where an int8 build's recipe does not set it (docs/recipe.md#verify).
DEFAULT_MIN_SQNR_DB = {"int8": 15.0}


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
    max_latency_ms: float | None = Field(None, gt=0)
    max_size_bytes: PositiveInt | None = None
    latency_runs: int = Field(100, ge=1, le=10_000)  # each is one inference: bounded
    warmup_runs: int = Field(10, ge=0, le=1_000)
    detections: DetectionChecks = DetectionChecks()
    # accept a build whose runtime is absent here (TensorRT without a GPU): exit 0, not 3;
    # metrics.json and the report still say verified: false and why
    allow_unverified: bool = False


# The thresholds quantization.fallback: auto keeps to (edgeflow.verify.fallback), and the
# recipe keys a stage that runs its search reads: its cache key and DVC params.
FALLBACK_BUDGET = (
    "max_accuracy_drop",
    "min_top1_agreement",
    "max_relative_diff",
    "max_abs_diff",
    "min_sqnr_db",
)
FALLBACK_READS = (*(f"verify.{key}" for key in FALLBACK_BUDGET), "evaluation.metric")


def fallback_budget(verify: Any, metric: str) -> dict[str, float]:
    """The thresholds of `verify` a fallback search measures: those set, accuracy only where
    evaluation.metric is top1 (labels)."""
    budget = {}
    for key in FALLBACK_BUDGET:
        value = getattr(verify, key)
        if key == "min_sqnr_db" and value == "auto":
            value = DEFAULT_MIN_SQNR_DB["int8"]  # fallback is for int8 builds, whose default
        if value is not None and (key != "max_accuracy_drop" or metric == "top1"):
            budget[key] = float(value)
    return budget


class Diff(Strict):
    """The per-layer diff: `edgeflow diff`, and after a build that misses an accuracy or
    agreement threshold (docs/debugging.md)."""

    samples: int = Field(16, ge=1, le=10_000)  # evaluation samples compared, the first ones
    # below this SQNR a tensor has diverged; default by mode: none 60, fp16 40, int8 15 dB
    min_sqnr_db: float | None = None
    on_failure: bool = True  # run it when a build misses an accuracy or agreement threshold
