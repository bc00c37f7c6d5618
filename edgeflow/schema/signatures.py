"""source.inputs: a model input's signature (name, shape, dtype, batch axis, or a constant
value bound at export / ingest), and the checks of a signature against a model's own dims."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BeforeValidator,
    Field,
    ValidationInfo,
    model_validator,
)

from edgeflow.schema.base import Strict, _existing_file, user_error

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
    arr = _numbers(value)
    if isinstance(arr, str):
        raise user_error(
            f"the value {arr} (got {value!r:.80})",
            "give one number, or nested lists of equal lengths, of finite numbers",
            at="value",
        )
    own = {"b": "bool", "f": "float32"}.get(arr.dtype.kind, "int64")
    target = declared or own
    kind, wanted = arr.dtype.kind, np.dtype(target).kind
    # true/false only as bool and bool only so; an integer input takes no fractions
    if (kind == "b") != (wanted == "b") or (kind == "f" and wanted in "iu"):
        raise user_error(
            f"the value {value!r:.60} does not fit {declared} (it reads as {own})",
            f"set dtype: {own}, or give {declared} values",
            at="value",
        )
    beyond = out_of_range(arr, target)
    if beyond:
        raise user_error(f"the value {beyond}", range_hint(target), at="value")
    return target


def _numbers(value: Any) -> Any:
    """`value` (a number or nested lists from the recipe) as a numpy array of booleans,
    integers (an object array for those beyond 64 bits) or finite floats, or what it is
    instead (a str: ragged lists, strings, NaN or infinities)."""
    import numpy as np

    try:
        arr = np.array(value)
    except (ValueError, OverflowError):
        return "is not a rectangular array of numbers"
    if arr.dtype.kind == "O":  # integers beyond 64 bits, or a mix of things
        leaves = arr.ravel().tolist()
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in leaves):
            return "is not a rectangular array of numbers"
        return arr
    if arr.dtype.kind not in "biuf":
        return "is not a rectangular array of numbers"
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        return "holds NaN or infinity"
    return arr


def out_of_range(arr: Any, dtype: str) -> str | None:
    """How the numbers of `arr` fall outside what `dtype` holds (None: they fit): an integer
    beyond an integer dtype's range, or a number beyond a float dtype's largest (it would
    become infinity)."""
    import numpy as np

    target = np.dtype(dtype)
    if arr.size == 0 or target.kind == "b":
        return None
    if target.kind in "iu":
        info = np.iinfo(target)
        low, high = arr.min(), arr.max()
        if low < int(info.min) or high > int(info.max):
            worst = low if low < int(info.min) else high
            return f"{worst} is outside {dtype}'s range ({info.min} to {info.max})"
        return None
    largest = float(np.finfo(target).max)
    worst = max(abs(arr.min()), abs(arr.max()))
    if worst > largest:
        return f"{worst:g} is beyond {dtype}'s largest ({largest:g}): it would become infinity"
    return None


WIDER = {"float16": "float32", "float32": "float64", "int64": "float64", "int32": "int64"}


def range_hint(dtype: str) -> str:
    """The fix for a value `out_of_range` of `dtype`."""
    wider = WIDER.get(dtype, "int32" if dtype in ("int8", "uint8") else "float64")
    return f"declare dtype: {wider}, or give values within {dtype}'s range"


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
    """The inputs the artifact takes: those not bound to a constant."""
    return [s for s in specs if s.value is None]


class StateLink(Strict):
    """source.state[]: a state the model carries from one call to the next (a streaming
    model's recurrent state): each step's output `output` is the next step's input `input`,
    and the first step's is `initial` (a number, a nested list or a .npy of the input's shape;
    default zeros). The datasets then hold sequences (docs/recipe.md, "Stateful models")."""

    input: str = Field(min_length=1)
    output: str = Field(min_length=1)
    initial: Annotated[int | float | list[Any] | Path | None, BeforeValidator(_constant)] = None

    def first(self, spec: TensorSpec, batch: int) -> Any:
        """The state fed to the first step of `batch` sequences at once: `initial` (zeros)
        broadcast to the input's shape, `batch` on its batch axis."""
        import numpy as np

        shape = list(spec.shape)
        if spec.batch_axis is not None:
            shape[spec.batch_axis] = batch
        if isinstance(self.initial, Path):
            value = np.load(self.initial, allow_pickle=False)
        else:
            value = np.asarray(0 if self.initial is None else self.initial)
        if spec.batch_axis is not None and value.ndim == len(shape):
            value = np.take(value, [0], axis=spec.batch_axis)  # one sequence's, for each
        return np.ascontiguousarray(np.broadcast_to(value.astype(spec.dtype), shape))

    def initial_fits(self, spec: TensorSpec) -> str | None:
        """How `initial` fails to fit the state input (None: it fits): finite real numbers the
        input's dtype holds; a number fits any shape, an array must have the input's shape."""
        import numpy as np

        if self.initial is None:
            return None
        if isinstance(self.initial, Path):
            try:
                arr = np.load(self.initial, allow_pickle=False, mmap_mode="r")
            except (ValueError, OSError, EOFError) as exc:
                return f"cannot read {self.initial.name} as a numpy array: {exc!s:.200}"
            what = f"{self.initial.name} ({arr.dtype})"
            if arr.dtype.kind not in "iuf":
                return f"{what} does not hold real numbers: a state is integers or floats"
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                bad = int((~np.isfinite(arr)).sum())
                return f"{what} holds {bad} NaN or infinite value(s) of {arr.size}"
        else:
            arr = _numbers(self.initial)
            what = f"initial {self.initial!r:.60}"
            if isinstance(arr, str):
                return f"{what} {arr}"
            if arr.dtype.kind == "b":
                return f"{what} holds booleans: a state is integers or floats"
        beyond = out_of_range(arr, spec.dtype)
        if beyond:
            return f"{what}: {beyond} (the input '{spec.name}' is {spec.dtype})"
        if arr.dtype.kind == "f" and spec.dtype[0] in "iu":
            return f"{what} holds fractions; the input '{spec.name}' is {spec.dtype}"
        if arr.shape and list(arr.shape) != list(spec.shape):
            return f"initial has shape {list(arr.shape)}, the input '{spec.name}' is {spec.shape}"
        return None


def data_inputs(specs: list[TensorSpec], state: list[StateLink]) -> list[TensorSpec]:
    """The inputs the datasets feed: neither constants nor states (fed back by the model)."""
    states = {link.input for link in state}
    return [s for s in fed_inputs(specs) if s.name not in states]
