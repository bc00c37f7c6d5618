"""onnxruntime's static quantizer (and its dynamic one, for int8_weights), kept from crashing
where the float model works.

Three things go wrong with it on real models, each handled here and recorded in quantize.json:
- a graph below opset 13 (other frameworks' exporters write 11 or 12): the per-channel
  DequantizeLinear it writes carries `axis`, which only opset 13 defines, so the quantized model
  is invalid. The model is converted to opset 13 first.
- its symbolic shape inference (run by quant_pre_process) crashes with "object of type
  'NoneType' has no len()" where it leaves a tensor without a shape: it infers each node alone
  with the initializers removed, so ops that take a constant as an input since opset 18
  (ReduceMax, ReduceMin, ReduceL2, ... with `axes`) and that it has no handler for get no
  shape, and the next Add/Mul/Div reads the missing shape's length. Pre-processing is then
  retried with onnx's own shape inference only, which reads the initializers.
- a node the quantizer itself cannot handle: it is kept float (`nodes_to_exclude`) and the
  quantizer runs again, each such node recorded with the error it raised; a node it cannot
  handle even then is a ToolCrashed that names it, not a traceback. The one such case with an
  exact fix, a Gemm with a 2-D bias `[1, N]` (quant_pre_process's MatMulAddFusion writes it
  from a MatMul and an Add of a `[1, N]` constant), is fixed first: the bias becomes `[N]`,
  which Gemm broadcasts the same. An exception the quantizer raises outside any node, or one
  raised in edgeflow's own code (the calibration reader), stays a bug.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

from edgeflow.core.errors import ToolCrashed, first_line
from edgeflow.core.onnxgraph import opset_version

# How many nodes the quantizer may fail on, each then kept float, before the build stops.
MAX_REFUSED_NODES = 8

QDQ_OPSET = 13  # QuantizeLinear/DequantizeLinear gained `axis` (per-channel) in opset 13
QDQ_WHY = "int8 needs opset 13 (per-channel DequantizeLinear)"
DYNAMIC_OPSET = 11  # DynamicQuantizeLinear, which int8_weights puts before each int8 kernel
# Entropy calibration searches thresholds between half the histogram and all of it in steps of
# one bin. onnxruntime's quantize_static builds it with 128 bins and 128 quantized bins (and
# passes no option to change that): one candidate, the min/max range, so "entropy" computed
# exactly minmax's scales. 2048 bins is TensorRT's histogram (its 128 quantized bins kept).
ENTROPY_BINS = 2048


def upgrade_opset(
    src: Path,
    dst: Path,
    opset: int = QDQ_OPSET,
    why: str = QDQ_WHY,
) -> dict[str, int] | None:
    """Write src converted to `opset` into dst when it is below; None when it is not. `why`
    it is needed, for the message when onnx cannot convert it."""
    import onnx

    model = onnx.load(str(src))
    current = opset_version(model)
    if current >= opset:
        return None
    try:
        converted = onnx.version_converter.convert_version(model, opset)
        onnx.checker.check_model(converted)
    except (RuntimeError, ValueError, onnx.checker.ValidationError) as exc:
        raise ToolCrashed(
            f"{why}, and onnx's version converter cannot convert this opset-{current} "
            f"model: {first_line(exc)}",
            f"replace the op it names, then convert with {{rule: onnx.convert_opset, opset: "
            f"{opset}}}; or build with quantization.mode: fp16",
        ) from exc
    onnx.save(converted, str(dst))
    return {"from": current, "to": opset}


def pre_process(src: Path, dst: Path) -> dict[str, Any]:
    """quant_pre_process with symbolic shape inference; without it where that crashes."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    try:
        quant_pre_process(str(src), str(dst), skip_symbolic_shape=False)
        return {"symbolic": True, "gemm_biases_flattened": flatten_gemm_biases(dst)}
    except Exception as exc:
        frame = _innermost(exc, "symbolic_shape_infer.py")
        if frame is None:
            raise
        node = _node_in(frame)
        where = f" at {node[1]} node '{node[0]}'" if node else ""
        shapeless = _shapeless_producers(frame)
        if shapeless:
            where += f" (no shape inferred for the output of {', '.join(shapeless)})"
        reason = f"onnxruntime's symbolic shape inference failed{where}: {first_line(exc)}"
    quant_pre_process(str(src), str(dst), skip_symbolic_shape=True)
    return {
        "symbolic": False,
        "symbolic_failed": reason,
        "gemm_biases_flattened": flatten_gemm_biases(dst),
    }


def flatten_gemm_biases(path: Path) -> int:
    """Rewrite in place every Gemm whose bias is a `[1, N]` constant to take it as `[N]`
    (the same values, broadcast the same way), which onnxruntime's quantizer can quantize;
    the number of Gemms changed."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    constants = {t.name: t for t in graph.initializer}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    changed = 0
    for node in graph.node:
        if node.op_type != "Gemm" or len(node.input) < 3 or node.input[2] not in constants:
            continue
        bias = constants[node.input[2]]
        if len(bias.dims) != 2 or bias.dims[0] != 1:
            continue
        flat = numpy_helper.from_array(
            numpy_helper.to_array(bias).reshape(-1), f"{node.input[2]}_flat"
        )
        if readers[node.input[2]] == 1:  # read by this Gemm alone: replaced
            graph.initializer.remove(bias)
        graph.initializer.append(flat)
        node.input[2] = flat.name
        changed += 1
    if changed:
        onnx.save(model, str(path))
    return changed


def quantize(
    src: Path, dst: Path, reader: Any, refused: list[dict[str, str]], **options: Any
) -> None:
    """quantize_static with `refused` (the nodes it failed on before, appended to here) kept
    float: a failure inside onnxruntime while it handles a node keeps that node float too
    and runs it again; a node it fails on while kept float, or more than MAX_REFUSED_NODES,
    stops the build naming the node."""
    from onnxruntime.quantization import quantize_static

    excluded = list(options.pop("nodes_to_exclude", None) or ())

    def attempt(kept: list[str]) -> None:
        quantize_static(str(src), str(dst), reader(), nodes_to_exclude=kept, **options)

    _kept_float_on_failure(src, refused, excluded, attempt)


def quantize_weights(src: Path, dst: Path, refused: list[dict[str, str]], **options: Any) -> None:
    """quantize_dynamic (int8 weights; the activations each kernel reads quantized per
    inference), with the nodes it fails on kept float as `quantize` keeps them."""
    from onnxruntime.quantization import quantize_dynamic

    excluded = list(options.pop("nodes_to_exclude", None) or ())

    def attempt(kept: list[str]) -> None:
        quantize_dynamic(str(src), str(dst), nodes_to_exclude=kept, **options)

    _kept_float_on_failure(src, refused, excluded, attempt)


def _kept_float_on_failure(
    src: Path, refused: list[dict[str, str]], excluded: list[str], attempt: Any
) -> None:
    """`attempt(nodes kept float)` until it passes: see `quantize`."""
    import onnx

    while True:
        try:
            kept = [*excluded, *(r["node"] for r in refused)]
            attempt(kept)
            return
        except Exception as exc:
            frames = _frames(exc)
            if not frames or not _in_onnxruntime(frames[0]):
                raise  # edgeflow's code (the calibration reader) failed: a bug, with its traceback
            node = _failing_node(exc, onnx.load(str(src)))
            if node is None:
                raise
            name, op = node
            error = f"{type(exc).__name__}: {first_line(exc)}"
            if name in kept or len(refused) >= MAX_REFUSED_NODES:
                raise ToolCrashed(
                    f"onnxruntime's quantizer cannot quantize node '{name}' ({op}): {error}"
                    + (" (also when it is kept float)" if name in kept else ""),
                    "build with quantization.mode: fp16 (or none), or rewrite that node into a "
                    "form the quantizer takes (see docs/debugging.md)",
                ) from exc
            refused.append({"node": name, "op": op, "error": error})


def entropy_ranges(model: Path, reader: Any, symmetric: bool, work: Path) -> dict[str, Any]:
    """Per-tensor activation ranges from entropy calibration over a 2048-bin histogram, as
    quantize_static's TensorQuantOverrides (rmin/rmax)."""
    import numpy as np
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator

    options = {"num_bins": ENTROPY_BINS, "num_quantized_bins": 128, "symmetric": symmetric}
    calibrator = create_calibrator(
        model,
        None,
        augmented_model_path=str(work / "augmented.onnx"),
        calibrate_method=CalibrationMethod.Entropy,
        extra_options=options,
    )
    calibrator.collect_data(reader)
    ranges = calibrator.compute_data()
    (work / "augmented.onnx").unlink(missing_ok=True)
    return {
        name: [{"rmin": np.float32(d.range_value[0]), "rmax": np.float32(d.range_value[1])}]
        for name, d in ranges.items()
    }


def _frames(exc: BaseException) -> list[types.FrameType]:
    """The frames of the exception's traceback, innermost first."""
    frames, tb = [], exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames[::-1]


def _in_onnxruntime(frame: types.FrameType) -> bool:
    import onnxruntime

    return frame.f_code.co_filename.startswith(str(Path(onnxruntime.__file__).parent))


def _innermost(exc: BaseException, filename: str) -> types.FrameType | None:
    """The innermost frame of the traceback in a file of that name, if it passed through one."""
    return next((f for f in _frames(exc) if f.f_code.co_filename.endswith(filename)), None)


def _node_in(frame: types.FrameType) -> tuple[str, str] | None:
    """(name, op type) of the ONNX node a frame was working on: its `node` local."""
    node = frame.f_locals.get("node")
    if node is not None and hasattr(node, "op_type") and hasattr(node, "name"):
        return node.name, node.op_type
    return None


def _shapeless_producers(frame: types.FrameType) -> list[str]:
    """'<op> <name>' of the nodes whose outputs the failing node reads without a shape."""
    import onnx

    infer, node = frame.f_locals.get("self"), frame.f_locals.get("node")
    known = getattr(infer, "known_vi_", None)
    graph = getattr(getattr(infer, "out_mp_", None), "graph", None)
    if known is None or graph is None or not isinstance(node, onnx.NodeProto):
        return []
    missing = {
        i for i in node.input if i in known and not known[i].type.tensor_type.HasField("shape")
    }
    return [f"{n.op_type} '{n.name}'" for n in graph.node if missing & set(n.output)]


def _failing_node(exc: BaseException, model: Any) -> tuple[str, str] | None:
    """The node onnxruntime's quantizer was handling when it raised: a frame's `node` (a
    NodeProto), or a node named by `node_name` / an info object's `.node_name` (bias info)."""
    ops = {n.name: n.op_type for n in model.graph.node if n.name}
    for frame in _frames(exc):
        if not _in_onnxruntime(frame):
            continue
        found = _node_in(frame)
        if found:
            return found
        named = frame.f_locals.get("node_name")
        infos = [v for v in frame.f_locals.values() if isinstance(getattr(v, "node_name", 0), str)]
        for name in ([named] if isinstance(named, str) else []) + [v.node_name for v in infos]:
            if name in ops:
                return name, ops[name]
    return None


# Operators that move values without computing them: an output written by one is computed
# by the operator before it (a Softmax's probabilities reshaped).
MOVES = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity")


def output_writers(model: Any) -> list[str]:
    """The nodes that compute the model's outputs (quantization.float_outputs): each
    output's writer and, through the operators that only move values, the one before it."""
    writer = {out: node for node in model.graph.node for out in node.output}
    found: list[str] = []
    for output in model.graph.output:
        node = writer.get(output.name)
        while node is not None:
            found.append(node.name)
            if node.op_type not in MOVES or not node.input:
                break
            node = writer.get(node.input[0])
    return list(dict.fromkeys(found))


# Operators that carry a value through unchanged (an -inf mask value stays -inf): the walk
# down from a non-finite constant goes on through them; the first other reader (a Softmax,
# an Exp) takes it in float and is kept float, its output finite again.
CARRIES = (*MOVES, "Concat", "Expand", "Gather", "Max", "Min", "Pad", "Slice", "Tile", "Where")


def float_infinities(model: Any) -> list[str]:
    """The nodes an int8 build keeps float because a tensor they read can hold an infinity:
    the readers of a constant with a non-finite value (the -inf of a masked softmax's Where
    and Pad), through CARRIES operators, down to and with the first other one. An int8 grid
    for such a tensor has an infinite scale, and its DequantizeLinear writes NaN: measured
    2026-12 on swift-f0, whose pitch output was NaN on every sample."""
    import numpy as np
    from onnx import numpy_helper

    infinite = {
        t.name
        for t in model.graph.initializer
        if t.data_type in (1, 10, 11, 16)  # float, float16, double, bfloat16
        and not np.isfinite(numpy_helper.to_array(t)).all()
    }
    readers: dict[str, list[Any]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    kept: list[str] = []
    tensors = list(infinite)
    while tensors:
        for node in readers.get(tensors.pop(), []):
            if node.name in kept:
                continue
            kept.append(node.name)
            if node.op_type in CARRIES:
                tensors += list(node.output)
    return kept
