"""Whether a file is an ONNX model edgeflow can read, found without running anything: it
parses (its external data not loaded), it has a well-formed graph (core/onnxcheck), every
initializer holds its data or names an external file inside the model's folder that holds it
(the files are only stat'ed), and its weights fit in this machine's memory. validate,
`edgeflow precheck` and ingest ask it before onnx or onnxruntime read the model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from edgeflow.core.errors import EdgeflowError, first_line
from edgeflow.core.onnxcheck import graph_problems

if TYPE_CHECKING:
    import onnx

PROTOBUF_LIMIT = 2**31  # bytes: protobuf parses no larger message, hence external data
HINT = (
    "export the model again, or save it with its weights (onnx.save_model; over 2 GiB with "
    "save_as_external_data=True, the data beside the model)"
)
MEMORY_HINT = "run it on a machine with more memory (or a higher ulimit -v), or on a smaller model"
TOO_BIG = "its weights ("  # how a problem of memory begins


def onnx_problems(path: Path) -> list[str]:
    """What makes `path` unreadable as an ONNX model, one line per problem ([]: none)."""
    import onnx

    size = path.stat().st_size
    if size >= PROTOBUF_LIMIT:
        return [f"it is {size:,} bytes, over protobuf's 2 GiB limit for one .onnx file"]
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError and the like: the bytes are no model
        return [f"it does not parse as an ONNX protobuf: {first_line(exc)}"]
    if not model.ir_version or not model.HasField("graph"):
        return ["it parses, but holds no ONNX model (no ir_version or no graph)"]
    folder = path.resolve().parent
    problems = [p for t in _initializers(model.graph) for p in _tensor_problems(t, folder)]
    if not problems:  # every external length checked: their sum means something
        problems += _memory_problems(_external_size(model, size))
    return graph_problems(model) + problems


def _memory_problems(needed: int) -> list[str]:
    """Weights that cannot fit: beyond the machine's memory or the process's address space
    (onnx and onnxruntime read external data whole)."""
    import resource

    import psutil

    limit, what = psutil.virtual_memory().total, "this machine's memory"
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY and soft < limit:
        limit, what = soft, "this process's address-space limit (ulimit -v)"
    if needed <= limit:
        return []
    return [
        f"{TOO_BIG}{needed:,} bytes with its external data) do not fit in {what} ({limit:,} bytes)"
    ]


def hint_for(problems: list[str]) -> str:
    """The fix for these problems: more memory when that is all they are, else a new export."""
    return MEMORY_HINT if all(p.startswith(TOO_BIG) for p in problems) else HINT


def check_onnx_file(path: Path, what: str = "") -> None:
    """Raise an EdgeflowError naming `path` and every problem `onnx_problems` finds."""
    problems = onnx_problems(path)
    if problems:
        raise EdgeflowError(
            f"{what}{path} is not a readable ONNX model: {'; '.join(problems)}",
            hint_for(problems),
        )


def external_size(path: Path) -> int:
    """The bytes of a (readable) model file and the external data its initializers read."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return _external_size(model, path.stat().st_size)


def _external_size(model: onnx.ModelProto, total: int) -> int:
    """`total` plus the bytes of the external data the model's initializers read."""
    import onnx

    for tensor in _initializers(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            info = {entry.key: entry.value for entry in tensor.external_data}
            total += int(info.get("length", 0)) or (external_bytes(tensor) or 0)
    return total


def _initializers(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """The graph's initializers and those of its subgraphs (If branches, Loop bodies)."""
    import onnx

    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _initializers(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _initializers(sub)


FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")


def _tensor_problems(tensor: onnx.TensorProto, folder: Path) -> list[str]:
    import onnx

    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return _external_problems(tensor, folder)
    if not tensor.HasField("raw_data") and not any(len(getattr(tensor, f)) for f in FIELDS):
        elements = 1
        for dim in tensor.dims:
            elements *= dim
        if elements:
            return [
                f"initializer '{tensor.name}' holds no data (its shape {list(tensor.dims)}: "
                f"{elements:,} elements)"
            ]
    try:
        onnx.checker.check_tensor(tensor)
    except onnx.checker.ValidationError as exc:  # too little data, two kinds of it
        return [first_line(exc)]
    return []


def _external_problems(tensor: onnx.TensorProto, folder: Path) -> list[str]:
    """An external-data initializer's file: a regular file inside the model's folder (no
    absolute path, no `..` or symlink out of it) holding offset + length bytes."""
    info = {entry.key: entry.value for entry in tensor.external_data}
    name, location = tensor.name, info.get("location", "")
    where = f"initializer '{name}': external data '{location}'"
    if not location or Path(location).is_absolute():
        return [f"{where} is not a path relative to the model's folder"]
    try:
        file = (folder / location).resolve()
        inside = file.is_relative_to(folder)
        regular = inside and file.is_file()
    except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a NUL, a long name
        return [f"{where} cannot be resolved ({type(exc).__name__})"]
    if not inside:
        return [f"{where} is outside the model's folder {folder}"]
    if not regular:
        return [f"{where} is not a file in {folder}"]
    try:
        offset, length = int(info.get("offset", 0)), int(info.get("length", -1))
    except ValueError:
        return [f"{where}: offset and length must be integers (got {info})"]
    size = file.stat().st_size
    if length < 0:
        length = size - offset
    if offset < 0 or offset + length > size:
        return [f"{where} is {size:,} bytes; the tensor reads {length:,} from offset {offset:,}"]
    needed = external_bytes(tensor)
    if needed is not None and length < needed:
        return [f"{where}: {length:,} bytes, the tensor's shape and type need {needed:,}"]
    return []


# onnx.TensorProto data types of whole bytes per element (not the 4-bit and string ones)
WHOLE_BYTES = (1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 16)


def external_bytes(tensor: onnx.TensorProto) -> int | None:
    """The bytes a tensor's shape and type take (None: a type packed below a byte, a string)."""
    import onnx

    if tensor.data_type not in WHOLE_BYTES:
        return None
    elements = 1
    for dim in tensor.dims:
        elements *= dim
    return elements * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
