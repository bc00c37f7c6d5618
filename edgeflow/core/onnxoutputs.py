"""Graph outputs as the later stages need them: named as the recipe says, each with a type
and a shape (ONNX lets a file declare an output by name alone)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgeflow.core.errors import EdgeflowError, first_line

if TYPE_CHECKING:
    import onnx

UNTYPED_HINT = (
    "declare the output's type and shape in the file (onnx.helper.make_tensor_value_info), "
    "or export the model again with shapes"
)


def untyped(value: onnx.ValueInfoProto) -> bool:
    """An output without an element type or a shape (rank); unknown dims are fine."""
    tensor = value.type.tensor_type
    return (
        not value.type.HasField("tensor_type")
        or not tensor.elem_type
        or not tensor.HasField("shape")
    )


def type_outputs(model: onnx.ModelProto, file: str) -> list[str]:
    """Give each graph output declared without a type or shape the one onnx's shape inference
    derives from the (bound, static) inputs; the names typed. An output inference leaves
    untyped is the user's to declare: an error naming it and inference's reason."""
    import onnx

    graph = model.graph
    missing = [v.name for v in graph.output if untyped(v)]
    if not missing:
        return []
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    found = {v.name: v for v in inferred.graph.output}
    for value in graph.output:
        if value.name in missing and not untyped(found[value.name]):
            value.type.CopyFrom(found[value.name].type)
    left = [v.name for v in graph.output if untyped(v)]
    if left:
        try:  # strict, for the reason the lenient pass kept to itself
            onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
            reason = "it leaves them unknown"
        except Exception as exc:  # onnx's inference errors are not one type
            reason = first_line(exc)
        raise EdgeflowError(
            f"{file}: graph output(s) {', '.join(repr(n) for n in left)} declare no "
            f"{'shape' if all(_has_elem_type(graph, n) for n in left) else 'type'}, and "
            f"onnx's shape inference cannot derive it from the declared inputs: {reason}",
            UNTYPED_HINT,
        )
    return missing


def _has_elem_type(graph: onnx.GraphProto, name: str) -> bool:
    value = next(v for v in graph.output if v.name == name)
    return bool(value.type.tensor_type.elem_type)
