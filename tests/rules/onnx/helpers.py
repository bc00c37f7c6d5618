"""Shared test helpers: build tiny graphs, run them in onnxruntime, apply a rule with checks."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgeflow.core.onnxgraph import op_counts, same_graph
from edgeflow.rules.base import RewriteContext, RuleResult
from edgeflow.schema.sections import TensorSpec

NP_TYPES = {
    TensorProto.FLOAT: np.float32,
    TensorProto.DOUBLE: np.float64,
    TensorProto.INT64: np.int64,
    TensorProto.INT32: np.int32,
    TensorProto.BOOL: np.bool_,
}
SPEC_TYPES = {
    np.float32: "float32",
    np.float64: "float64",
    np.int64: "int64",
    np.int32: "int32",
    np.bool_: "bool",
}


def model(
    nodes: list[onnx.NodeProto],
    inputs: list[tuple[str, int, list[Any]]],
    outputs: list[tuple[str, int, list[Any] | None]],
    initializers: dict[str, np.ndarray] | None = None,
    opset: int = 18,
) -> onnx.ModelProto:
    """A checked model from nodes, (name, elem type, shape) inputs/outputs and initializers."""
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    if any(shape is None for _, _, shape in outputs):  # let shape inference declare them
        m = onnx.shape_inference.infer_shapes(m)
        del m.graph.value_info[:]
    onnx.checker.check_model(m, full_check=True)
    return m


def run(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(
        m.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return [np.asarray(o) for o in session.run(None, feeds)]


def specs(m: onnx.ModelProto, shapes: dict[str, list[int]] | None = None) -> list[TensorSpec]:
    """TensorSpecs for the model's inputs (dynamic dims from `shapes`, else 1)."""
    inits = {t.name for t in m.graph.initializer}
    out = []
    for value in m.graph.input:
        if value.name in inits:
            continue
        t = value.type.tensor_type
        shape = (shapes or {}).get(value.name) or [d.dim_value or 1 for d in t.shape.dim]
        dtype = SPEC_TYPES[NP_TYPES[t.elem_type]]
        out.append(TensorSpec(name=value.name, shape=shape, dtype=dtype))  # type: ignore[arg-type]
    return out


def feeds(inputs: list[TensorSpec], seed: int = 0, scale: float = 3.0) -> dict[str, np.ndarray]:
    """Random inputs of the declared shapes: normal * scale for floats, small ints otherwise."""
    rng = np.random.default_rng(seed)
    out = {}
    for s in inputs:
        if s.dtype.startswith("float"):
            out[s.name] = (rng.standard_normal(s.shape) * scale).astype(s.dtype)
        else:
            out[s.name] = rng.integers(0, 4, s.shape).astype(s.dtype)
    return out


def apply(
    rule: type, m: onnx.ModelProto, inputs: list[TensorSpec] | None = None, **options: Any
) -> RuleResult[onnx.ModelProto]:
    """Apply a rule checking: input untouched, checker passes, applying again changes nothing."""
    before = m.SerializeToString()
    opts = rule.Options.model_validate(options)
    ctx = RewriteContext(inputs if inputs is not None else specs(m))
    result = rule().apply(m, opts, ctx)
    assert m.SerializeToString() == before, "the rule mutated its input"
    assert result.model is not m
    onnx.checker.check_model(result.model, full_check=True)
    again = rule().apply(result.model, opts, ctx)
    assert not again.changed, again.sites
    assert same_graph(again.model, result.model), "applying twice differs from once"
    return result


def ops(m: onnx.ModelProto) -> dict[str, int]:
    return dict(op_counts(m))
