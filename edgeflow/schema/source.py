"""The recipe's `source` section: one pydantic model per source kind (pytorch, onnx,
tensorflow, jax), their shared signature fields and checks, and which pipeline each takes
to a target (conversion_path). Re-exported by edgeflow.schema.sections."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from edgeflow.core import savedmodel
from edgeflow.core.errors import EdgeflowError
from edgeflow.core.refs import ImportRef
from edgeflow.core.suggest import closest
from edgeflow.schema.base import (
    CodeRef,
    RecipeFile,
    Strict,
    TorchModuleRef,
    _base_dir,
    _existing_file,
    _import_ref,
    user_error,
)
from edgeflow.schema.signatures import (
    StateLink,
    TensorSpec,
    data_inputs,
    fed_inputs,
)


class DynamicBatch(Strict):
    min: PositiveInt = 1
    max: int = Field(64, ge=1, le=65536)

    @model_validator(mode="after")
    def _ordered(self) -> DynamicBatch:
        if self.min > self.max:
            raise user_error(f"min ({self.min}) is above max ({self.max})", "swap them", at="min")
        return self


class Signature(Strict):
    """What every source kind declares: its inputs, output names, state links, batch."""

    inputs: list[TensorSpec] = Field(min_length=1)
    outputs: list[str] | None = None
    state: list[StateLink] = Field(default_factory=list, max_length=16)
    dynamic_batch: DynamicBatch | None = None


class PyTorchSource(Signature):
    kind: Literal["pytorch"]
    model: TorchModuleRef
    init: dict[str, Any] = Field(default_factory=dict)
    weights: RecipeFile | None = None
    # where the state_dict sits in a checkpoint that holds more: a key, dotted for nesting
    weights_key: str | None = Field(None, max_length=200)

    @field_validator("weights_key")
    @classmethod
    def _dotted_key(cls, value: str | None) -> str | None:
        if value is not None and "" in value.split("."):
            raise user_error(
                f"an empty key or part of a dotted key (got {value!r})",
                "name the checkpoint's keys down to the state_dict, joined by dots: "
                "checkpoint.model",
            )
        return value

    @model_validator(mode="after")
    def _signatures(self) -> PyTorchSource:
        if self.weights_key is not None and self.weights is None:
            raise user_error(
                "weights_key: picks the state_dict inside source.weights; no weights are given",
                "add source.weights (the checkpoint file), or remove source.weights_key",
                at="weights_key",
            )
        return _check_signatures(self)


class OnnxSource(Signature):
    kind: Literal["onnx"]
    model: RecipeFile

    @field_validator("model")
    @classmethod
    def _onnx_suffix(cls, value: Path) -> Path:
        if Path(value).suffix != ".onnx":
            raise user_error("an onnx source must be a .onnx file", "export the model to ONNX")
        return value

    @model_validator(mode="after")
    def _signatures(self) -> OnnxSource:
        return _check_signatures(self)


# A SavedModel folder holds one of these; a .keras file is Keras 3's whole-model format
# (.h5 its legacy one, which older Keras also wrote as .hdf5).
SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")
KERAS_SUFFIXES = (".keras", ".h5", ".hdf5")


def _tf_model(value: Any, info: ValidationInfo) -> Path | ImportRef:
    """A SavedModel folder, a .keras file, or a builder `file.py:fn` / `pkg.module:fn`."""
    if not isinstance(value, str):
        raise user_error(
            f"expected a SavedModel folder, a .keras file or 'module:function' (got {value!r:.80})"
        )
    try:
        path = (_base_dir(info) / value).resolve()
        exists, folder = path.exists(), path.is_dir()
    except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a name too long, NUL
        raise user_error(
            f"not a usable path: {value!s:.200} ({type(exc).__name__}: {exc!s:.200})",
            "paths are relative to the recipe's folder; fix the path",
        ) from None
    if ":" in value and not exists:
        return _import_ref(value, info)
    if folder:
        if not any((path / name).is_file() for name in SAVED_MODEL_FILES):
            raise user_error(
                f"{value} is a folder without saved_model.pb: not a SavedModel",
                "name the folder tf.saved_model.save / model.export wrote, a .keras file, or "
                "a 'module:function' that builds the model",
            )
        return path
    if path.suffix not in KERAS_SUFFIXES:
        raise user_error(
            f"{value}: a tensorflow source is a SavedModel folder, a .keras (or legacy .h5, "
            ".hdf5) file or a 'module:function' returning a Keras model",
            "save the model with model.save('model.keras') or model.export('saved_model')",
        )
    return _existing_file(value, info)


def _refused_op(value: str) -> str:
    """An op of graph_ops.yaml: allowing any other would allow nothing (a typo)."""
    names = savedmodel.refused_ops().names
    if value not in names:
        guess = closest(value, names)
        raise user_error(
            f"'{value:.80}' is not an op edgeflow refuses in a SavedModel: allowing it changes "
            "nothing",
            f"did you mean '{guess}'?"
            if guess
            else "name ops the refusal listed (the list: edgeflow/core/graph_ops.yaml)",
        )
    return value


class TensorFlowSource(Signature):
    """A Keras model or SavedModel: loaded with TensorFlow, converted by TensorFlow's own TFLite
    converter (convert.via: native) or through tf2onnx into the ONNX pipeline (via: onnx)."""

    kind: Literal["tensorflow"]
    model: Annotated[Path | ImportRef, BeforeValidator(_tf_model)]
    init: dict[str, Any] = Field(default_factory=dict)  # the builder function's arguments
    weights: RecipeFile | None = None  # a Keras weights file (.weights.h5), loaded by name
    # ops of a SavedModel's graph that reach outside the model (files, Python), run anyway
    allow_graph_ops: list[Annotated[str, AfterValidator(_refused_op)]] = Field(
        default_factory=list, max_length=128
    )

    @property
    def builder(self) -> ImportRef | None:
        return self.model if isinstance(self.model, ImportRef) else None

    @model_validator(mode="after")
    def _signatures(self) -> TensorFlowSource:
        saved_model = isinstance(self.model, Path) and self.model.is_dir()
        if self.init and self.builder is None:
            raise user_error(
                "init: passes arguments to a builder function; this source is a saved file",
                "remove init:, or name a 'module:function' that builds the model",
                at="init",
            )
        if self.weights is not None and saved_model:
            raise user_error(
                "a SavedModel holds its own weights: weights: would not be used",
                "remove weights:, or build the model with a 'module:function' and load them",
                at="weights",
            )
        if self.dynamic_batch is not None:
            raise user_error(
                "dynamic_batch is not supported for tensorflow sources yet",
                "remove it: the build takes the declared batch size",
                at="dynamic_batch",
            )
        if self.allow_graph_ops and not saved_model:
            raise user_error(
                "allow_graph_ops: applies to a SavedModel's graph; this source is not one",
                "remove allow_graph_ops:",
                at="allow_graph_ops",
            )
        if isinstance(self.model, Path) and saved_model:  # its graph, read before anything
            try:  # runs: no file, Python or network ops
                savedmodel.check(self.model, self.allow_graph_ops)
            except EdgeflowError as exc:
                raise user_error(exc.message, exc.hint, at="model") from None
        return _check_signatures(self)


class JaxSource(Signature):
    """A JAX function and its parameters (a Flax module's apply and variables), exported to
    ONNX with jax2onnx, then the ONNX pipeline."""

    kind: Literal["jax"]
    model: CodeRef  # a function returning (apply_fn, params); apply_fn(params, *inputs)
    init: dict[str, Any] = Field(default_factory=dict)  # its arguments
    # trained params (flax.serialization msgpack), restored into the params it returns
    weights: RecipeFile | None = None

    @model_validator(mode="after")
    def _signatures(self) -> JaxSource:
        if self.dynamic_batch is not None:
            raise user_error(
                "dynamic_batch is not supported for jax sources yet",
                "remove it: the export takes the declared batch size",
                at="dynamic_batch",
            )
        return _check_signatures(self)


def _check_signatures(source: Any) -> Any:
    """Unique input names, and one fed input with a batch axis (the batch size of every run)."""
    names = [s.name for s in source.inputs]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise user_error(
                f"two inputs are named '{name}'", "give each input its own name", at="inputs"
            )
    outputs = source.outputs or []
    for i, name in enumerate(outputs):
        if name in names:
            raise user_error(
                f"output '{name}' has the name of an input",
                "give the output a name no input has",
                at=f"outputs.{i}",
            )
        if name in outputs[:i]:
            raise user_error(
                f"two outputs are named '{name}' (outputs[{outputs.index(name)}] and outputs[{i}])",
                "name each of the model's outputs once, in the model's order",
                at=f"outputs.{i}",
            )
    if not any(s.batch_axis is not None for s in fed_inputs(source.inputs)):
        raise user_error(
            "no fed input has a batch axis: the samples cannot be batched",
            "give one input a shape with a batch axis (batch_axis: 0, the default)",
            at="inputs",
        )
    _check_state(source)
    return source


def _check_state(source: Any) -> None:
    """Each state link joins a fed input to a declared output, once; the datasets still feed
    some input with a batch axis (the sequences)."""
    by_name = {s.name: s for s in source.inputs}
    for i, link in enumerate(source.state):
        spec = by_name.get(link.input)
        if spec is None:
            raise user_error(
                f"state input '{link.input}' is not one of source.inputs ({', '.join(by_name)})",
                "name the model input that takes the state, and declare it in source.inputs",
                at=f"state.{i}.input",
            )
        if spec.value is not None:
            raise user_error(
                f"state input '{link.input}' is bound to a constant (value:)",
                "remove its value: a state is fed back by the model, step by step",
                at=f"state.{i}.input",
            )
        if source.outputs is not None and link.output not in source.outputs:
            raise user_error(
                f"state output '{link.output}' is not one of source.outputs "
                f"({', '.join(source.outputs)})",
                "name the model output that holds the next step's state",
                at=f"state.{i}.output",
            )
        for j, other in enumerate(source.state[:i]):
            for key in ("input", "output"):
                if getattr(other, key) == getattr(link, key):
                    raise user_error(
                        f"state[{j}] and state[{i}] both name the {key} '{getattr(link, key)}'",
                        "link each state input to its own output",
                        at=f"state.{i}.{key}",
                    )
        if spec.batch_axis is None:
            raise user_error(
                f"state input '{link.input}' has no batch axis",
                "declare the axis its sequences run side by side on (batch_axis: 1 for a "
                "[layers, batch, features] state)",
                at=f"state.{i}.input",
            )
        misfit = link.initial_fits(spec)
        if misfit:
            raise user_error(
                misfit,
                f"give a finite {spec.dtype} number or an array of shape {spec.shape}",
                at=f"state.{i}.initial",
            )
    data = data_inputs(source.inputs, source.state) if source.state else []
    if source.state and not data:
        raise user_error(
            "every fed input is a state: no input is fed the sequences' data",
            "declare the input the data comes in on (a chunk of audio, a frame) in source.inputs",
            at="state",
        )
    for spec in data:
        if spec.batch_axis is None:
            raise user_error(
                f"'{spec.name}' has no batch axis: a stateful model's data inputs hold one "
                "step of each sequence, side by side on a batch axis",
                "give it a batch axis, or bind it to a constant (value:)",
                at="state",
            )


def batch_size(specs: list[TensorSpec]) -> int:
    """The declared batch: the size of the first fed input's batch axis."""
    spec = next(s for s in fed_inputs(specs) if s.batch_axis is not None)
    assert spec.batch_axis is not None
    return spec.shape[spec.batch_axis]


Source = Annotated[
    PyTorchSource | OnnxSource | TensorFlowSource | JaxSource, Field(discriminator="kind")
]


class ConvertOptions(Strict):
    """How a TensorFlow source reaches the target: TensorFlow's own TFLite converter
    (native: the TFLite family only) or tf2onnx and the ONNX pipeline (onnx). Unset: native
    for the TFLite family, onnx for the other targets."""

    via: Literal["native", "onnx"] | None = None


# Sources whose tensors are channel-last already (Keras, Flax): onnx2tf keeps their inputs as
# declared instead of moving their channel axis last (it would make [1, 8, 8, 1] [1, 8, 1, 8]).
CHANNEL_LAST_KINDS = ("tensorflow", "jax")


def kept_layout(source: Any) -> tuple[str, ...]:
    """The fed inputs a TFLite-family artifact takes in the declared layout (a channel-last
    source's), by name; () for PyTorch and ONNX sources (onnx2tf makes them channel-last)."""
    if source.kind not in CHANNEL_LAST_KINDS:
        return ()
    return tuple(s.name for s in fed_inputs(source.inputs))


def onnx_only_settings(quantization: Any) -> list[str]:
    """The quantization keys set in a recipe that only the ONNX path carries out (TensorFlow's
    own converter has no fallback search, no float outputs or islands, and takes min/max
    ranges): with any of them a tensorflow source takes tf2onnx unless the recipe says
    `convert.via`."""
    if quantization is None or quantization.mode != "int8":
        return []
    keys = {
        "fallback": quantization.fallback == "auto",
        "float_outputs": quantization.float_outputs,
        "keep_float": bool(quantization.keep_float),
        "method": quantization.method in ("percentile", "mse")
        and quantization.activations == "int8",
    }
    return [f"quantization.{key}" for key, on in keys.items() if on]


def default_via(native: bool, quantization: Any = None) -> str:
    """A tensorflow source's path when the recipe names none: TensorFlow's own converter where
    it builds for the target (`native`: Backend.tensorflow_native, the TFLite family), unless
    a quantization setting needs the ONNX path."""
    if native and not onnx_only_settings(quantization):
        return "native"
    return "onnx"


def conversion_path(kind: str, via: str | None, native: bool, quantization: Any = None) -> str:
    """The pipeline a source of this kind takes to a target (`native`: whether TensorFlow's
    own converter builds for it, Backend.tensorflow_native): its kind, or
    for a tensorflow source `tensorflow` (through ONNX) or `tensorflow_native`
    (`convert.via`, else `default_via`)."""
    if kind != "tensorflow":
        return kind
    chosen = via or default_via(native, quantization)
    return "tensorflow_native" if chosen == "native" else "tensorflow"
