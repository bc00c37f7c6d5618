"""Every tensor of a .tflite as LiteRT computes it: the fallback's sensitivity
(_tflite_fallback) and the float islands' pairing by value (_tflite_islands)."""

from __future__ import annotations

from typing import Any

import numpy as np

from edgeflow.targets._tflite_deps import require


def all_tensors(
    model: bytes, layout: dict[str, Any], feeds: list[dict[str, np.ndarray]]
) -> tuple[dict[str, list[np.ndarray]], list[tuple[str, list[str], list[str]]]]:
    """Every operator output (dequantized) and every input of the model, per batch, read in
    LiteRT with all tensors preserved; and the operators as (op, input names, output names)."""
    litert = require("ai_edge_litert.interpreter", "tflite")
    interp = litert.Interpreter(  # the builtin kernels: a delegate would hide the operators
        model_content=model,
        experimental_preserve_all_tensors=True,
        experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
    )
    interp.allocate_tensors()
    details = {d["index"]: d for d in interp.get_tensor_details()}
    ops = [
        (op["op_name"], [details[i]["name"] for i in op["inputs"] if i >= 0], op["outputs"])
        for op in interp._get_ops_details()
    ]
    inputs = interp.get_input_details()
    read = [d["index"] for d in inputs] + [t for _, _, outs in ops for t in outs]
    values: dict[str, list[np.ndarray]] = {}
    for batch in feeds:
        for spec in layout["inputs"]:
            detail = inputs[spec["index"]]
            data = np.ascontiguousarray(np.transpose(batch[spec["name"]], spec["perm"]))
            interp.set_tensor(detail["index"], _quantized(data, detail))
        interp.invoke()
        for t in read:
            values.setdefault(details[t]["name"], []).append(_dequantized(interp, details[t]))
    named = [(op, ins, [details[t]["name"] for t in outs]) for op, ins, outs in ops if len(outs)]
    return values, named


def _quantized(data: np.ndarray, detail: dict[str, Any]) -> np.ndarray:
    scale, zero = detail["quantization"]
    if detail["dtype"] == np.float32 or not scale:
        return data.astype(detail["dtype"])
    info = np.iinfo(detail["dtype"])
    return np.clip(np.round(data / scale + zero), info.min, info.max).astype(detail["dtype"])


def _dequantized(interp: Any, detail: dict[str, Any]) -> np.ndarray:
    value = interp.get_tensor(detail["index"])
    scale, zero = detail["quantization"]
    if np.issubdtype(value.dtype, np.integer) and scale:
        return (value.astype(np.float32) - zero) * scale
    return value.astype(np.float32)
