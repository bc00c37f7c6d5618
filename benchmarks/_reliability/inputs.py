"""Small input files that recipes name: a tiny ONNX model (or a broken variant) and datasets."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def tiny_onnx(folder: Path) -> tuple[Path, Path]:
    """The tiny valid ONNX model and an .npz dataset for it, written into `folder`."""
    model, data = folder / "tiny.onnx", folder / "tiny.npz"
    write_onnx(model)
    write_npz(data, {"x": (16, 64)})
    return model, data


def write_onnx(path: Path, variant: str = "valid") -> None:
    """A small ONNX model, x [1, 64] -> MatMul -> Relu -> y [1, 10], or a broken variant."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    width = 32 if variant == "input_shape" else 64
    dtype = TensorProto.INT64 if variant == "input_dtype" else TensorProto.FLOAT
    name = "not_x" if variant == "input_name" else "x"
    weight = np.random.default_rng(0).standard_normal((width, 10)).astype(np.float32)
    init = numpy_helper.from_array(weight, "w")
    op, domain = {"unknown_op": ("NoSuchOp", ""), "custom_domain": ("Frob", "com.example")}.get(
        variant, ("Relu", "")
    )
    matmul_in = "undefined_tensor" if variant == "dangling" else name
    nodes = [
        helper.make_node("MatMul", [matmul_in, "w"], ["h"]),
        helper.make_node(op, ["h"], ["y"], domain=domain),
    ]
    outputs = [] if variant == "no_outputs" else [helper.make_tensor_value_info("y", 1, [1, 10])]
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info(name, dtype, [1, width])], outputs, [init]
    )
    opsets = [helper.make_opsetid("", 99 if variant == "opset_99" else 17)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 99 if variant == "ir_99" else 8
    if variant in ("external_missing", "external_outside"):
        external_weights(model, path, variant)
    onnx.save(model, str(path))


def external_weights(model: Any, path: Path, variant: str) -> None:
    """Move the weights into external data: a missing file, or a path outside the folder."""
    from onnx.external_data_helper import set_external_data

    tensor = model.graph.initializer[0]
    location = "weights.bin" if variant == "external_missing" else "../../../../etc/hostname"
    set_external_data(tensor, location=location)
    tensor.ClearField("raw_data")
    tensor.data_location = 1  # EXTERNAL


def write_npz(path: Path, shapes: dict[str, tuple[int, ...]], labels: bool = False) -> None:
    """An .npz of random float32 arrays of the given shapes (and int64 labels)."""
    import numpy as np

    rng = np.random.default_rng(0)
    arrays = {k: rng.random(shape, dtype=np.float32) for k, shape in shapes.items()}
    if labels:
        arrays["label"] = rng.integers(0, 10, size=next(iter(shapes.values()))[0])
    np.savez(path, **arrays)  # type: ignore[arg-type]
