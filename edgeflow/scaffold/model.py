"""`edgeflow init`, what it reads from a model file: its inputs, dtypes and outputs.

Files describe themselves: an ONNX graph's inputs, a Keras model's, a SavedModel signature's.
A size the model leaves open (-1, 0, '?' or a named dim) is taken from `--input`, from the
`--data` file's array, from another input that names the same dim, or gets a default that
the recipe's comment names. Models in code (PyTorch, JAX): edgeflow.scaffold.code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edgeflow.core.errors import EdgeflowError, first_line
from edgeflow.core.suggest import did_you_mean
from edgeflow.schema.signatures import DTYPES

KINDS = ("onnx", "tensorflow", "pytorch", "jax")
BATCH = 1  # the size an open leading (batch) dim gets
RECURRENT = ("LSTM", "GRU", "RNN")  # ONNX's: layout 0 (the default) is [sequence, batch, ...]
OPEN = 32  # the size any other open dim gets (a length, a height): set the real one
SHAPE_SYNTAX = "sizes joined by x (1x3x32x32), or scalar for a 0-D input"


@dataclass(frozen=True)
class Given:
    """One `--input NAME:SHAPE[:DTYPE]`."""

    name: str
    shape: tuple[int, ...]
    dtype: str | None
    text: str  # as typed (or as a hint would type it)


@dataclass
class Asked:
    """What the command line says about the inputs: --input shapes, the --data arrays'
    shapes (for open dims), and each named dim's size once chosen (shared by the inputs)."""

    given: Mapping[str, Given] = field(default_factory=dict)
    data: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    named: dict[str, int] = field(default_factory=dict)
    defaulted: set[str] = field(default_factory=set)  # named dims whose size is a default


@dataclass(frozen=True)
class Tensor:
    """A model input as the recipe declares it: static, with what init had to choose."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    open_batch: bool = False  # dim 0 was open in the model: a batch, BATCH here
    chosen: tuple[int, ...] = ()  # the other open dims that got OPEN: to be set
    from_data: tuple[int, ...] = ()  # open dims sized by the --data array
    # the X of an ONNX LSTM/GRU/RNN of layout 0 ([sequence, batch, features]): batch on axis 1
    sequence_first: bool = False


@dataclass(frozen=True)
class Output:
    name: str
    shape: tuple[int | None, ...] | None  # None: not known; a None dim: open
    of_input: str | None = None  # the code returns this input's variable again (a state)
    named_by: str = ""  # where the name comes from, for the recipe's comment


@dataclass(frozen=True)
class Model:
    """What the recipe's `source` says about a model."""

    kind: str  # one of KINDS
    reference: str  # source.model for code ("file.py:Name" as given, or "pkg.module:Name")
    path: Path | None  # the model's file or folder, or the code's file
    inputs: tuple[Tensor, ...]
    outputs: tuple[Output, ...]
    init: Mapping[str, Any] = field(default_factory=dict)
    what: str = ""  # for messages: the file's name or the reference


def parse_input(text: str) -> Given:
    """`NAME:SHAPE[:DTYPE]`; the name may hold colons itself (`serving_default_x:0:1x4`)."""
    head, _, last = text.rpartition(":")
    dtype = None
    if last in DTYPES:
        dtype = last
        head, _, last = head.rpartition(":")
    if not head or not last:
        raise EdgeflowError(
            f"--input {text}: expected NAME:SHAPE or NAME:SHAPE:DTYPE",
            f"e.g. --input image:1x3x32x32:float32 (SHAPE: {SHAPE_SYNTAX}; DTYPE: one of "
            f"{', '.join(DTYPES)})",
        )
    if last == "scalar":
        return Given(head, (), dtype, text)
    dims = last.split("x")
    if not all(d.isdigit() and int(d) > 0 for d in dims):
        raise EdgeflowError(
            f"--input {text}: '{last}' is not a shape",
            f"write SHAPE as {SHAPE_SYNTAX}; DTYPE (optional) is one of {', '.join(DTYPES)}",
        )
    return Given(head, tuple(int(d) for d in dims), dtype, text)


def shape_text(shape: Sequence[int]) -> str:
    """A shape as --input takes it."""
    return "x".join(str(d) for d in shape) if shape else "scalar"


def checked_dtype(name: str, found: str, what: str) -> str:
    if found not in DTYPES:
        raise EdgeflowError(
            f"{what}: input '{name}' is {found}, which edgeflow does not feed "
            f"(it feeds {', '.join(DTYPES)})",
            "export the model with inputs of one of those types",
        )
    return found


def unknown_inputs(given: Mapping[str, Given], names: Sequence[str], what: str) -> None:
    """--input names the model lacks: an error, with "did you mean"."""
    for name, one in given.items():
        if name not in names:
            raise EdgeflowError(
                f"--input {one.text}: {what} has no input '{name}' "
                f"(its inputs: {', '.join(names) or 'none'})",
                did_you_mean(name, list(names)) or "name the model's inputs",
            )


def static(name: str, dims: Sequence[int | str], dtype: str, asked: Asked, what: str) -> Tensor:
    """A model input with static dims: the --input shape where given (checked against the
    model's fixed dims), else the model's, each open dim from the --data array, or the size
    its name already has, or a default."""
    fixed = [d if isinstance(d, int) and d > 0 else None for d in dims]
    given = asked.given.get(name)
    if given is not None:
        if given.dtype is not None and given.dtype != dtype:
            raise EdgeflowError(
                f"--input {given.text}: '{name}' is {dtype} in {what}",
                f"--input {name}:{shape_text(given.shape)}:{dtype}, or leave the dtype out",
            )
        clash = len(given.shape) != len(dims) or any(
            f is not None and f != g for f, g in zip(fixed, given.shape, strict=False)
        )
        if clash:
            shown = [f or "?" for f in fixed]
            sizes = [
                f or (given.shape[i] if i < len(given.shape) else OPEN) for i, f in enumerate(fixed)
            ]
            raise EdgeflowError(
                f"--input {given.text}: {what} takes '{name}' as {shown} ('?': any size)",
                f"--input {name}:{shape_text(sizes)}",
            )
        for dim, wanted in zip(dims, given.shape, strict=True):
            if isinstance(dim, str) and dim != "?":
                asked.named.setdefault(dim, wanted)
        return Tensor(name, given.shape, dtype)
    array = asked.data.get(name)
    steps = 1 if array is not None and len(array) == len(dims) + 1 else 0  # sequences
    shape: list[int] = []
    chosen: list[int] = []
    from_data: list[int] = []
    for axis, dim in enumerate(dims):
        named = isinstance(dim, str) and dim != "?"
        size: int | None = fixed[axis] or (asked.named.get(str(dim)) if named else None)
        if size is not None and named and dim in asked.defaulted and axis > 0:
            chosen.append(axis)
        if size is None and axis > 0 and array is not None and len(array) > axis + steps:
            size = array[axis + steps]
            from_data.append(axis)
        if size is None:
            size = BATCH if axis == 0 else OPEN
            if axis > 0:
                chosen.append(axis)
                if named:
                    asked.defaulted.add(str(dim))
        if named:
            asked.named.setdefault(str(dim), size)
        shape.append(size)
    leading_open = bool(dims) and fixed[0] is None
    return Tensor(name, tuple(shape), dtype, leading_open, tuple(chosen), tuple(from_data))


def statics(
    found: Sequence[tuple[str, Sequence[int | str], str]], asked: Asked, what: str
) -> tuple[Tensor, ...]:
    """static() of each (name, dims, dtype), in order; those --input gives first, so that
    their named dims size the other inputs that share them."""
    first = sorted(range(len(found)), key=lambda i: found[i][0] not in asked.given)
    made = {i: static(*found[i], asked, what) for i in first}
    return tuple(made[i] for i in range(len(found)))


def read_onnx(path: Path, asked: Asked) -> Model:
    """An ONNX file's graph inputs (initializers left out), dtypes and outputs; one run in
    onnxruntime on zeros checks the sizes and gives the outputs' shapes."""
    import onnx

    from edgeflow.core.onnxfile import check_onnx_file
    from edgeflow.core.onnxgraph import graph_inputs

    check_onnx_file(path)
    found = graph_inputs(path)
    unknown_inputs(asked.given, list(found), path.name)
    inputs = statics(
        [
            (name, dims, checked_dtype(name, dtype, path.name))
            for name, (dtype, dims) in found.items()
        ],
        asked,
        path.name,
    )
    graph = onnx.load(str(path), load_external_data=False).graph
    sequence_first = {
        node.input[0]
        for node in graph.node
        if node.op_type in RECURRENT
        and not any(a.name == "layout" and a.i == 1 for a in node.attribute)
    }
    inputs = tuple(replace(t, sequence_first=t.name in sequence_first) for t in inputs)
    declared = {
        v.name: tuple(
            d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
            for d in v.type.tensor_type.shape.dim
        )
        if v.type.tensor_type.HasField("shape")
        else None
        for v in graph.output
    }
    ran = _run_onnx(path, inputs, asked.given)
    outputs = tuple(
        Output(name, ran.get(name, declared[name]), named_by="the graph's") for name in declared
    )
    return Model("onnx", "", path, inputs, outputs, what=path.name)


def _run_onnx(
    path: Path, inputs: Sequence[Tensor], given: Mapping[str, Given]
) -> dict[str, tuple[int | None, ...]]:
    """The outputs' shapes on zeros. A file onnxruntime cannot load (an old opset, which
    ingest converts) keeps its declared ones; a run that fails is an error, with the sizes
    to set where init chose some."""
    import numpy as np

    from edgeflow.core.onnxsession import checking_session

    try:
        session = checking_session(path)
    except Exception:  # onnxruntime's own types; ingest converts what it cannot load
        return {}
    feeds = {t.name: np.zeros(t.shape, t.dtype) for t in inputs}
    names = [o.name for o in session.get_outputs()]
    try:
        results = session.run(names, feeds)
    except Exception as exc:  # onnxruntime's own error types
        chosen = [t for t in inputs if t.name not in given and (t.chosen or t.open_batch)]
        if not chosen:
            raise EdgeflowError(
                f"{path.name} does not run in onnxruntime on zeros of its inputs' shapes: "
                f"{first_line(exc)}",
                "check the file with onnxruntime: edgeflow builds what onnxruntime runs",
            ) from exc
        sizes = ", ".join(f"{t.name} {list(t.shape)}" for t in chosen)
        flags = " ".join(f"--input {t.name}:{shape_text(t.shape)}" for t in chosen)
        raise EdgeflowError(
            f"{path.name} does not run in onnxruntime with the sizes edgeflow init gave its "
            f"open dims ({sizes}): {first_line(exc)}",
            f"give the sizes the model takes: {flags} (with your sizes)",
        ) from exc
    return {n: tuple(int(d) for d in r.shape) for n, r in zip(names, results, strict=True)}


def read_tensorflow(path: Path, asked: Asked) -> Model:
    """A SavedModel's serving signature, or a .keras / .h5 model's inputs and outputs."""
    from edgeflow.frameworks import tensorflow as tfw

    return tf_model(tfw.load_file(path), asked, "", path)


def tf_model(
    found: Any,
    asked: Asked,
    reference: str,
    path: Path | None,
    init: Mapping[str, Any] | None = None,
) -> Model:
    """A loaded TensorFlow model (edgeflow.frameworks.tensorflow.TfModel) as init reads it."""
    names = list(found.input_names)
    unknown_inputs(asked.given, names, found.what)
    shapes = {n: [-1 if d is None else int(d) for d in found.input_shapes[n]] for n in names}
    dtypes = {n: checked_dtype(n, found.input_dtypes[n], found.what) for n in names}
    inputs = statics([(n, shapes[n], dtypes[n]) for n in names], asked, found.what)
    outputs = tuple(
        Output(n, found.output_shapes.get(n), named_by="the model's") for n in found.output_names
    )
    return Model("tensorflow", reference, path, inputs, outputs, init or {}, found.what)
