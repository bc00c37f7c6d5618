"""What ingest does to an ONNX file from another or an older exporter before anything else
reads it, each step said in a note (source.json, the report, metrics.json):

- initializers the file also lists as graph inputs (every IR-3 file; some later exporters
  too) become constants, or fed inputs where the recipe declares them;
- a file onnxruntime has no kernels for, or whose ops' versions some built-in target has no
  kernel for, is moved with onnx's version converter to the lowest opset that works;
- declared shapes (value_info, graph outputs) that contradict what shape inference derives
  from the declared inputs are dropped and inferred again;
- an `If` whose condition is a constant becomes its branch, and every node whose inputs are
  all constants becomes an initializer (whatever the op: ConstantOfShape, Range, Tile, the
  Shape of a tensor whose shape is static);
- a file that is already quantized (integer and QLinear ops) is recognised.

ingest (edgeflow/stages/ingest.py) checks that the result computes what the file did."""

from __future__ import annotations

import functools
from collections import Counter
from typing import TYPE_CHECKING, Any

from edgeflow.core.errors import EdgeflowError, first_line
from edgeflow.core.onnxgraph import copy_model, opset_version

if TYPE_CHECKING:
    import onnx

# The largest constant ingest computes and stores (elements): weights built in the graph
# (ConstantOfShape, Tile of a constant) are folded however large they are, up to 1 GiB of
# float32; a larger one stays a node and the precheck judges it.
MAX_FOLDED = 1 << 28
# onnxruntime guarantees kernels from opset 7 on (older versions load "depending upon
# legacy support"); onnx's version converter knows no opset below 1.
ORT_FLOOR = 7
# Ops that mean the file is quantized already: onnxruntime's QOperator and integer formats.
QUANTIZED_OPS = frozenset(
    {
        "ConvInteger",
        "MatMulInteger",
        "DynamicQuantizeLinear",
        "QLinearConv",
        "QLinearMatMul",
        "QLinearAdd",
        "QLinearMul",
        "QLinearSigmoid",
        "QLinearLeakyRelu",
        "QLinearAveragePool",
        "QLinearGlobalAveragePool",
        "QLinearConcat",
        "QLinearSoftmax",
        "QGemm",
        "DynamicQuantizeMatMul",
        "MatMulIntegerToFloat",
    }
)


def initializer_inputs(model: onnx.ModelProto, declared: set[str]) -> list[str]:
    """Settle each initializer the graph also lists as an input (in place): one the recipe
    declares is fed (its initializer goes), the others are constants (their input goes).
    IR-3 files list every initializer so, and rules, onnx's version converter and the
    targets read such an input as one to feed. Notes; the IR version is raised to 4, the
    first that allows an initializer that is not an input."""
    graph = model.graph
    stored = {t.name for t in graph.initializer}
    listed = [v.name for v in graph.input if v.name in stored]
    notes: list[str] = []
    if listed:
        fed = [n for n in listed if n in declared]
        kept = [v for v in graph.input if v.name not in stored or v.name in declared]
        del graph.input[:]
        graph.input.extend(kept)
        weights = [t for t in graph.initializer if t.name not in fed]
        del graph.initializer[:]
        graph.initializer.extend(weights)
        constants = len(listed) - len(fed)
        if constants:
            notes.append(
                f"{constants} initializer(s) the file also lists as graph inputs are constants"
            )
        if fed:
            notes.append(f"fed as declared, not the file's stored values: {', '.join(fed)}")
    if model.ir_version < 4:
        notes.append(f"IR version {model.ir_version} -> 4")
        model.ir_version = 4
    return notes


@functools.cache
def target_kernels() -> dict[str, tuple[tuple[tuple[int, int | None], ...], ...]]:
    """op -> for each built-in target that lists kernel versions for it, its (since, until)
    ranges (until None: every later version)."""
    from edgeflow.core import resources
    from edgeflow.targets import load_profile

    found: dict[str, list[tuple[tuple[int, int | None], ...]]] = {}
    for path in sorted(resources.builtin_dir("targets").glob("*.yaml")):
        for op, spec in (load_profile(path.stem).operators or {}).items():
            if spec.kernels:
                found.setdefault(op, []).append(tuple((k.since, k.until) for k in spec.kernels))
    return {op: tuple(spans) for op, spans in found.items()}


@functools.cache
def target_floor() -> int:
    """The lowest opset every built-in target's profile accepts."""
    from edgeflow.core import resources
    from edgeflow.targets import load_profile

    paths = sorted(resources.builtin_dir("targets").glob("*.yaml"))
    return max(load_profile(p.stem).opset.min for p in paths)


def kernel_opset(model: onnx.ModelProto, start: int) -> int:
    """The lowest opset >= `start` at which each default-domain op of the model resolves to
    a version that every built-in target listing the op has a kernel for (an op no opset
    satisfies is left to the precheck to report)."""
    import onnx

    newest = onnx.defs.onnx_opset_version()
    kernels = target_kernels()
    wanted = start
    for op in {n.op_type for n in _nodes(model) if n.domain in ("", "ai.onnx")}:
        per_target = kernels.get(op, ())
        for version in range(start, newest + 1):
            since = _since(op, version)
            if since is not None and all(
                any(lo <= since <= (hi or since) for lo, hi in spans) for spans in per_target
            ):
                wanted = max(wanted, version)
                break
    return wanted


def _since(op: str, opset: int) -> int | None:
    import onnx

    try:
        return int(onnx.defs.get_schema(op, opset, "").since_version)
    except onnx.defs.SchemaError:
        return None


def _nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    from edgeflow.core.onnxgraph import all_nodes

    return list(all_nodes(model))


def loads(model: onnx.ModelProto) -> str | None:
    """None when onnxruntime creates a session for the model (its graph optimizations off:
    edgeflow.core.onnxsession), else onnxruntime's first line."""
    from edgeflow.core.onnxsession import checking_session

    try:
        checking_session(model)
    except Exception as exc:  # onnxruntime's errors are not typed
        return first_line(exc)
    return None


def upgrade_opset(
    model: onnx.ModelProto, file: str, problem: str | None
) -> tuple[onnx.ModelProto, list[str]]:
    """The model at the lowest opset >= its own that onnxruntime loads and each built-in
    target has kernels for (the model itself when that is its own), and a note. `problem`:
    why onnxruntime cannot load the file as it is (None: it can). A file onnxruntime cannot
    load that the version converter cannot move either is a located error naming the op;
    one it loads stays as it is, noted, for the precheck to judge."""
    import onnx

    current = opset_version(model)
    wanted = kernel_opset(model, max(current, ORT_FLOOR, target_floor()))
    if wanted == current:
        if problem is None or "NOT_IMPLEMENTED" not in problem:
            return model, []  # it loads, or not for its opset: ingest says why
        wanted += 1  # a kernel onnxruntime has at a later version of the op
    last, tried = None, wanted
    try:
        for tried in range(wanted, onnx.defs.onnx_opset_version() + 1):
            converted = _convert(model, tried, file)
            last = loads(converted)
            if last is None:
                note = f"opset {current} -> {tried} at ingest (onnx's version converter)"
                return converted, [note]
            if "NOT_IMPLEMENTED" not in last:  # only a missing kernel may be a later opset's
                break
    except EdgeflowError as exc:
        if problem is not None:
            raise
        return model, [f"kept at opset {current}: {exc.message.removeprefix(file + ': ')}"]
    upto = f"opset {tried}" if tried == wanted else f"opsets {wanted}..{tried}"
    if problem is None:
        return model, [f"kept at opset {current}: onnxruntime cannot load it at {upto}: {last}"]
    raise EdgeflowError(
        f"{file}: onnxruntime cannot load the file at opset {current}, nor converted to "
        f"{upto}: {last}",
        "export the model again at a recent opset",
    )


# Ops that took `broadcast` (and `axis`) attributes before opset 7's numpy broadcasting.
BROADCAST_OPS = frozenset(
    {"Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Greater", "Less"}
)


def explicit_broadcast(model: onnx.ModelProto) -> int:
    """Before opset 7, `Add(A, B, broadcast=1, axis=k)` aligned B with A's axes from k on;
    onnx 1.23's version converter unsqueezes B the wrong way (a bias [C] to [C, 1, 1, 1] for
    an NCHW A, which then broadcasts to [C, C, H, W]) and types the new tensor 0. Write
    the alignment as an Unsqueeze of B's trailing axes instead, in place, and drop the
    attributes (numpy broadcasting then means the same): the nodes rewritten."""
    import onnx
    from onnx import helper

    if opset_version(model) >= 7:
        return 0
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # onnx's inference errors are not one type: the converter gets it as is
        return 0
    ranks = {
        v.name: len(v.type.tensor_type.shape.dim)
        for v in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output)
        if v.type.tensor_type.HasField("shape")
    }
    ranks.update({t.name: len(t.dims) for t in model.graph.initializer})
    nodes, changed = [], 0
    for node in model.graph.node:
        attrs = {a.name: a.i for a in node.attribute}
        a, b = (node.input[0], node.input[1]) if len(node.input) == 2 else ("", "")
        if node.op_type not in BROADCAST_OPS or not attrs.get("broadcast"):
            nodes.append(node)
            continue
        axis = attrs.get("axis")
        if axis is not None and a in ranks and b in ranks:
            trailing = ranks[a] - (axis % ranks[a]) - ranks[b]
            if trailing > 0:
                aligned = f"{b}__aligned_{changed}"
                axes = list(range(ranks[b], ranks[b] + trailing))
                nodes.append(helper.make_node("Unsqueeze", [b], [aligned], axes=axes))
                node.input[1] = aligned
        elif axis is not None:  # ranks unknown: the converter's guess it is
            nodes.append(node)
            continue
        kept = [x for x in node.attribute if x.name not in ("broadcast", "axis")]
        del node.attribute[:]
        node.attribute.extend(kept)
        nodes.append(node)
        changed += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return changed


def evaluated(model: onnx.ModelProto, feeds: dict[str, Any]) -> list[Any] | None:
    """The file's outputs by onnx's reference evaluator, which keeps the old op versions
    onnxruntime dropped (old broadcasting made explicit first: the evaluator broadcasts the
    numpy way whatever the opset); None where it cannot run the file either."""
    from onnx.reference import ReferenceEvaluator

    model = copy_model(model)
    explicit_broadcast(model)
    try:
        return list(ReferenceEvaluator(model).run(None, feeds))
    except Exception:  # an op or version the evaluator lacks: the caller notes it unchecked
        return None


def _convert(model: onnx.ModelProto, opset: int, file: str) -> onnx.ModelProto:
    """onnx's version converter, its failure a located error naming the op; value_info it
    leaves untyped (elem_type 0, which onnxruntime refuses) is dropped."""
    import onnx

    current = opset_version(model)
    try:
        model = copy_model(model)
        explicit_broadcast(model)
        out = onnx.version_converter.convert_version(model, opset)
    except (RuntimeError, ValueError, IndexError, onnx.version_converter.ConvertError) as exc:
        detail = str(exc).splitlines()[0].split("failed: ")[-1]  # drop the C++ file:line
        ops = sorted({f"{n.op_type} (opset {current})" for n in model.graph.node})
        raise EdgeflowError(
            f"{file}: onnx's version converter cannot move the file from opset {current} to "
            f"{opset}: {detail} (the file's ops: {', '.join(ops)})",
            "export the model again at opset 13 or later, or convert it with "
            "onnx.version_converter and replace the op it names",
        ) from exc
    out.ir_version = max(
        out.ir_version, onnx.helper.find_min_ir_version_for(list(out.opset_import), True)
    )
    typed = [v for v in out.graph.value_info if v.type.tensor_type.elem_type]
    del out.graph.value_info[:]
    out.graph.value_info.extend(typed)
    if current < 11 <= opset:
        _asymmetric_resize(out)
    return out


def _asymmetric_resize(model: onnx.ModelProto) -> None:
    """Upsample and Resize before opset 11 map an output pixel x to x / scale in the input
    ('asymmetric', nearest rounded down); Resize-11's defaults are 'half_pixel' and
    'round_prefer_floor', and onnx 1.23's version converter does not say the old ones (an
    opset-9 Upsample(linear) moved to 11 differed by 3.9 on a feature map). Say them, in
    place, on each Resize that does not."""
    from onnx import helper

    for node in model.graph.node:
        if node.op_type != "Resize" or node.domain not in ("", "ai.onnx"):
            continue
        attrs = {a.name: a for a in node.attribute}
        if "coordinate_transformation_mode" not in attrs:
            node.attribute.append(
                helper.make_attribute("coordinate_transformation_mode", "asymmetric")
            )
        if "nearest_mode" not in attrs:
            node.attribute.append(helper.make_attribute("nearest_mode", "floor"))


def reinfer_shapes(model: onnx.ModelProto) -> list[str]:
    """Drop declared shapes that contradict what onnx's shape inference derives from the
    (bound) inputs, in place: intermediates' value_info go (inference fills them in), graph
    outputs take the inferred type. A note naming them; nothing where inference fails
    without the declarations too."""
    import onnx

    stripped = copy_model(model)
    del stripped.graph.value_info[:]
    for value in stripped.graph.output:
        value.type.tensor_type.ClearField("shape")
    try:
        inferred = onnx.shape_inference.infer_shapes(stripped, data_prop=True)
    except Exception:  # onnx's inference errors are not one type; nothing to compare with
        return []
    found = {v.name: v for v in (*inferred.graph.value_info, *inferred.graph.output)}
    wrong: list[str] = []
    kept = []
    for value in model.graph.value_info:
        if _contradicts(value, found.get(value.name)):
            wrong.append(f"{value.name} {_shape(value)} (inferred {_shape(found[value.name])})")
        else:
            kept.append(value)
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)
    for value in model.graph.output:
        if _contradicts(value, found.get(value.name)):
            wrong.append(f"{value.name} {_shape(value)} (inferred {_shape(found[value.name])})")
            value.type.CopyFrom(found[value.name].type)
    if not wrong:
        return []
    return [f"declared shapes that contradict shape inference, inferred again: {'; '.join(wrong)}"]


def _contradicts(declared: onnx.ValueInfoProto, inferred: onnx.ValueInfoProto | None) -> bool:
    if inferred is None or not declared.type.HasField("tensor_type"):
        return False
    have, got = declared.type.tensor_type, inferred.type.tensor_type
    if have.elem_type and got.elem_type and have.elem_type != got.elem_type:
        return True
    if not have.HasField("shape") or not got.HasField("shape"):
        return False
    if len(have.shape.dim) != len(got.shape.dim):
        return True
    return any(
        a.HasField("dim_value") and b.HasField("dim_value") and a.dim_value != b.dim_value
        for a, b in zip(have.shape.dim, got.shape.dim, strict=True)
    )


def _shape(value: onnx.ValueInfoProto) -> str:
    import onnx

    t = value.type.tensor_type
    dtype = onnx.TensorProto.DataType.Name(t.elem_type).lower() if t.elem_type else "?"
    if not t.HasField("shape"):
        return dtype
    dims = [
        str(d.dim_value) if d.HasField("dim_value") else d.dim_param or "?" for d in t.shape.dim
    ]
    return f"{dtype}[{', '.join(dims)}]"


def fold_constants(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """Every If whose condition is constant becomes its branch; then every node whose inputs
    are constants, or the shape of a tensor whose shape is static, becomes an initializer.
    Notes counting the ops folded."""
    from edgeflow.core.onnxgraph import op_counts
    from edgeflow.rules.base import RewriteContext
    from edgeflow.rules.onnx.fold import fold, fold_shapes
    from edgeflow.rules.onnx.fold_if import FoldIf

    notes: list[str] = []
    if any(n.op_type == "If" for n in model.graph.node):
        rule = FoldIf()
        result = rule.apply(model, rule.Options(), RewriteContext(inputs=[]))
        if result.changed:
            inlined = op_counts(model)["If"] - op_counts(result.model)["If"]
            model = result.model
            notes.append(f"If with a constant condition replaced by its branch: {inlined}")
    before = op_counts(model)
    for _ in range(8):  # a folded shape can make another shape static
        sites = fold_shapes(model) + fold(model, MAX_FOLDED)
        if not any(s.status.value == "changed" for s in sites):
            break
    gone = before - op_counts(model)
    gone.pop("Constant", None)
    if gone:
        listed = ", ".join(f"{op} x{n}" for op, n in sorted(gone.items()))
        notes.append(f"constant nodes folded into initializers: {listed}")
    return model, notes


def quantized(model: onnx.ModelProto) -> dict[str, int]:
    """The quantized ops a file holds already (op -> count): integer and QLinear ops."""
    counts = Counter(n.op_type for n in _nodes(model) if n.op_type in QUANTIZED_OPS)
    return dict(sorted(counts.items()))
