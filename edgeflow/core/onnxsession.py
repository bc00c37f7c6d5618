"""onnxruntime sessions that check what a graph computes, without onnxruntime's graph optimizer.

A check (a rule's contract, the optimize stage's, the precheck's reference, a per-layer diff,
a reference for a converter) asks what the ONNX graph computes, not how fast onnxruntime runs
it; onnxruntime's optimizer is a second converter that can fail on a graph its kernels run:
with its graph optimizations on, onnxruntime 1.2x cannot create a session for some models
whose `If` branches on a constant initializer with static input shapes (Graph::InlineIfSubgraph
errors, or a SIGSEGV while inlining the branch). With them off, the graph runs node by node as
written. Sessions that measure a runtime's latency or produce a verified artifact's outputs
keep onnxruntime's defaults: that is what runs on the device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def checking_session(model: Any, log_severity: int = 3) -> Any:
    """An onnxruntime InferenceSession on the CPU provider with graph optimizations disabled,
    from a ModelProto, serialized bytes or a path. `log_severity` 3 keeps onnxruntime's
    warnings off the console (4: its errors too); its failures still raise."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = log_severity
    if isinstance(model, Path):
        model = str(model)
    elif not isinstance(model, (str, bytes)):
        model = model.SerializeToString()
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def as_declared(value: Any, declared: str) -> Any:
    """An integer feed in the type a graph declares for it ("tensor(int32)", as onnxruntime's
    session inputs say), where every value is exact in that type; any other feed as it is. A
    graph whose int64 inputs were narrowed (onnx.int64_to_int32 with io: int32, a default of
    tflite_micro) or fed as float (onnx.ids_as_float, a default of armnn) is fed the recipe's
    int64 samples so."""
    import numpy as np

    kind = declared.removeprefix("tensor(").removesuffix(")")
    if kind == "float" and value.dtype.kind in "iu":  # float32 holds integers to 2**24
        exact = not value.size or max(-int(value.min()), int(value.max())) <= 2**24
        return value.astype(np.float32) if exact else value
    narrower: Any = {"int32": np.int32, "int16": np.int16, "int8": np.int8, "uint8": np.uint8}.get(
        kind
    )
    if narrower is None or value.dtype.kind not in "iu" or value.dtype == narrower:
        return value
    info = np.iinfo(narrower)
    if value.size and (value.min() < info.min or value.max() > info.max):
        return value
    return value.astype(narrower)
