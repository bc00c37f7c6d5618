"""TensorFlow SavedModel -> ONNX with tf2onnx: the "via ONNX" path of `source.kind: tensorflow`.

tf2onnx 1.17.0 traps handled here (measured beside tensorflow 2.21, keras 3.15, onnx 1.23,
numpy 2.4, protobuf 7): its Python API converts with continue_on_error=True, so a TensorFlow op
without an ONNX handler stays in the graph under its TensorFlow name and only a log line says
so (we collect those lines and the nodes left unconverted, and fail); it writes opsets up to 18
(19 and above fail deep inside with "make_sure failure"); `from_function` takes a tf.function,
not the loaded signature's ConcreteFunction (we wrap it); a dict of outputs comes out in sorted
key order, not the declared one (we reorder); it declares the ai.onnx.ml opset even when no node
uses it (we drop unused domains). Layout is kept: NHWC inputs stay NHWC (no inputs_as_nchw).
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from edgeflow.core.errors import EdgeflowError, MissingDependency, first_line

SIGNATURE = "serving_default"
# Import name -> pip package, for "install it" messages.
PACKAGES = {"tensorflow": "tensorflow", "tf2onnx": "tf2onnx", "keras": "keras"}
# tf2onnx 1.17.0 (tfonnx.tensorflow_onnx_mapping): the error it logs for an op it cannot map.
UNSUPPORTED = "Tensorflow op [%s: %s] is not supported"
# tf2onnx 1.17.0 (tfonnx.tensorflow_onnx_mapping): a handler that raised (exc_info attached).
FAILED = "Failed to convert node %r (fct=%r)\n%r"
# tf2onnx 1.17.0 (tfonnx.process_parsed_graph): the Counter of all unsupported ops, once more.
UNSUPPORTED_SUMMARY = "Unsupported ops: %s"
# tf2onnx 1.17.0 (optimizer.optimize_graph): an optimizer raised; the graph before it is kept.
OPTIMIZER_FAILED = "Failed to apply %s"


def require(module: str) -> ModuleType:
    """Import an optional tool (slow: TensorFlow costs seconds), or say how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing = (exc.name or module).split(".")[0]
        raise MissingDependency(
            "source kind tensorflow", PACKAGES.get(missing, missing), "tflite"
        ) from exc


def export_onnx(
    saved_model: Path, input_names: list[str], output_names: list[str], opset: int, out: Path
) -> dict[str, Any]:
    """Convert the SavedModel's serving_default signature to one .onnx file at `out`, inputs and
    outputs named and ordered as declared, shapes and dtypes as in the signature."""
    tf, tf2onnx = require("tensorflow"), require("tf2onnx")
    converter = f"tf2onnx {tf2onnx.__version__}, tensorflow {tf.__version__}"
    highest = max(tf2onnx.constants.OPSET_TO_IR_VERSION)
    if opset > highest:
        raise EdgeflowError(
            f"{converter} writes ONNX opsets up to {highest} (got opset {opset})",
            f"set the opset to {highest} or lower",
        )
    loaded = tf.saved_model.load(str(saved_model))  # kept alive: the signature uses its variables
    function, specs = _signature(tf, loaded, saved_model, input_names, output_names)
    start = time.perf_counter()
    with _tf2onnx_log() as log:
        try:
            model, _ = tf2onnx.convert.from_function(
                function, input_signature=specs, opset=opset, custom_rewriter=[_scalar_addends]
            )
        except Exception as exc:
            raise EdgeflowError(
                f"tf2onnx could not convert {saved_model}: {first_line(exc)}",
                "check that every layer of the model has an ONNX equivalent at this opset",
            ) from exc
    seconds = time.perf_counter() - start
    _check_converted(model, log, converter, opset)
    _name_outputs(model, output_names)
    _check_signature(model, specs, input_names)
    _drop_unused_domains(model)
    _write(model, out, converter)
    ops = collections.Counter(node.op_type for node in _nodes(model.graph))
    return {
        "converter": converter,
        "opset": opset,
        "seconds": seconds,
        "ops": dict(ops),
        "warnings": log.warnings,
    }


def _signature(
    tf: ModuleType, loaded: Any, path: Path, input_names: list[str], output_names: list[str]
) -> tuple[Any, list[Any]]:
    """A tf.function calling the serving signature with positional inputs in declared order,
    and its input specs named as declared."""
    if SIGNATURE not in loaded.signatures:
        raise EdgeflowError(
            f"{path} has no {SIGNATURE} signature (has: {', '.join(loaded.signatures) or 'none'})",
            "export the model with a serving_default endpoint",
        )
    concrete = loaded.signatures[SIGNATURE]
    declared_inputs = concrete.structured_input_signature[1]
    declared_outputs = concrete.structured_outputs
    for what, have, want in (
        ("inputs", list(declared_inputs), input_names),
        ("outputs", list(declared_outputs), output_names),
    ):
        if sorted(have) != sorted(want):
            raise EdgeflowError(
                f"{path}: {SIGNATURE} {what} are {sorted(have)}, the recipe declares {want}",
                f"name the signature's {what} like the recipe's, or rename them in the recipe",
            )
    specs = [
        tf.TensorSpec(declared_inputs[name].shape, declared_inputs[name].dtype, name=name)
        for name in input_names
    ]

    def call(*args: Any) -> Any:
        return concrete(**dict(zip(input_names, args, strict=True)))

    return tf.function(call, input_signature=specs), specs


class _Log(logging.Handler):
    """tf2onnx's records that matter: ops it has no handler for, handlers or rewriters that
    raised (errors it continues past), optimizers that failed (a correct but slower graph)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.unsupported: dict[str, list[str]] = collections.defaultdict(list)
        self.failed: list[str] = []
        self.warnings: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        reason = first_line(record.exc_info[1]) if record.exc_info and record.exc_info[1] else ""
        if record.msg == UNSUPPORTED and len(args) == 2:
            self.unsupported[str(args[1])].append(str(args[0]))
        elif record.msg == FAILED and args:
            self.failed.append(f"node {args[0]}: {reason}")
        elif record.msg == OPTIMIZER_FAILED and args:
            self.warnings.append(f"tf2onnx's {args[0]} failed ({reason}); the graph is unoptimized")
        elif record.levelno >= logging.ERROR and record.msg != UNSUPPORTED_SUMMARY:
            self.failed.append((record.getMessage().strip().splitlines() or [str(record.msg)])[0])


def _scalar_addends(g: Any, ops: list[Any]) -> list[Any]:
    """Give 0-D constants added to a tensor the shape [1] (the same broadcast): tf2onnx 1.17.0's
    transpose optimizer fails on Conv -> Add(0-D constant), hard_swish's `x + 3`, ("max() arg is
    an empty sequence") and then leaves every NHWC<->NCHW Transpose of the graph in place."""
    for node in ops:
        if node.type not in ("Add", "AddV2") or len(node.input) != 2:
            continue
        for index, name in enumerate(node.input):
            rank = g.get_rank(node.input[1 - index])
            if not g.is_const(name) or rank is None or rank < 1:
                continue
            value = g.get_tensor_value(name, as_list=False)
            if value.ndim == 0:
                const = g.make_const(f"{node.name}/addend{index}", value.reshape([1]))
                g.replace_input(node, name, const.output[0], index)
    return list(g.get_nodes())


@contextlib.contextmanager
def _tf2onnx_log() -> Iterator[_Log]:
    """Collect tf2onnx's error records while it converts."""
    handler, logger = _Log(), logging.getLogger("tf2onnx")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def _nodes(graph: Any) -> Iterator[Any]:
    """Every node of an ONNX graph, those of its subgraphs (If, Loop, Scan bodies) included."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _nodes(attr.g)
            for sub in attr.graphs:
                yield from _nodes(sub)


def _check_converted(model: Any, log: _Log, converter: str, opset: int) -> None:
    """Fail on ops tf2onnx left unconverted: logged as unsupported, or nodes of the default
    domain that no ONNX operator is named like (TensorFlow op types it carried over)."""
    onnx = require("onnx")
    left = collections.Counter(
        node.op_type
        for node in _nodes(model.graph)
        if node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type)
    )
    unsupported = sorted(set(log.unsupported) | set(left))
    if unsupported:
        where = "; ".join(
            f"{op} ({', '.join(log.unsupported[op]) or f'{left[op]} node(s)'})"
            for op in unsupported
        )
        raise EdgeflowError(
            f"{converter} has no ONNX conversion at opset {opset} for TensorFlow op(s) {where}",
            "rewrite the layers that use them with supported TensorFlow ops, or try a higher opset",
        )
    if log.failed:
        raise EdgeflowError(
            f"{converter} failed to convert {len(log.failed)} node(s): {log.failed[0]}",
            "rewrite that layer with other TensorFlow ops, or try another opset",
        )


def _name_outputs(model: Any, output_names: list[str]) -> None:
    """Put the graph's outputs in the declared order (tf2onnx writes a dict's in key order)."""
    by_name = {value.name: value for value in model.graph.output}
    if sorted(by_name) != sorted(output_names):
        raise EdgeflowError(
            f"tf2onnx wrote outputs {sorted(by_name)}, the recipe declares {output_names}",
            "give every output of the serving signature a distinct tensor",
        )
    ordered = [type(by_name[name])() for name in output_names]
    for value, name in zip(ordered, output_names, strict=True):
        value.CopyFrom(by_name[name])
    del model.graph.output[:]
    model.graph.output.extend(ordered)


def _check_signature(model: Any, specs: list[Any], input_names: list[str]) -> None:
    """Inputs named and shaped as the signature; no float64 unless the signature has one."""
    onnx = require("onnx")
    graph = model.graph
    names = [value.name for value in graph.input]
    if names != input_names:
        raise EdgeflowError(
            f"tf2onnx wrote inputs {names}, the recipe declares {input_names}",
            "give every input of the serving signature its recipe name",
        )
    for value, spec in zip(graph.input, specs, strict=True):
        dims = [
            d.dim_value if d.HasField("dim_value") else None
            for d in value.type.tensor_type.shape.dim
        ]
        if dims != list(spec.shape.as_list()):
            raise EdgeflowError(
                f"tf2onnx wrote input {value.name} of shape {dims}, the signature has "
                f"{spec.shape.as_list()}",
                "export the SavedModel with static input shapes",
            )
    if any(spec.dtype.name == "float64" for spec in specs):
        return
    double = onnx.TensorProto.DOUBLE
    found = [
        value.name
        for value in [*graph.input, *graph.output, *graph.value_info]
        if value.type.tensor_type.elem_type == double
    ]
    found += [t.name for t in graph.initializer if t.data_type == double]
    for node in _nodes(graph):
        for attr in node.attribute:
            if (attr.name in ("to", "dtype") and attr.i == double) or (
                attr.HasField("t") and attr.t.data_type == double
            ):
                found.append(f"{node.name} ({node.op_type})")
    if found:
        raise EdgeflowError(
            f"the ONNX model computes in float64, the signature in float32: {', '.join(found[:5])}",
            "cast to float32 in the model: a float64 constant or tf.cast promotes the graph",
        )


def _drop_unused_domains(model: Any) -> None:
    """Remove opset imports no node uses (tf2onnx always declares ai.onnx.ml)."""
    used = {node.domain for node in _nodes(model.graph)} | {"", "ai.onnx"}
    kept = [(op.domain, op.version) for op in model.opset_import if op.domain in used]
    del model.opset_import[:]
    for domain, version in kept:
        model.opset_import.add(domain=domain, version=version)


def _write(model: Any, out: Path, converter: str) -> None:
    """Check the model and write it as one file (no external data: protobuf's 2 GB limit)."""
    onnx = require("onnx")
    try:
        onnx.checker.check_model(model)
        data = model.SerializeToString()
    except (onnx.checker.ValidationError, ValueError) as exc:
        raise EdgeflowError(
            f"{converter} wrote an ONNX model that is invalid or over 2 GB: {first_line(exc)}",
            "try another opset; a model over 2 GB cannot be one .onnx file",
        ) from exc
    out.write_bytes(data)
