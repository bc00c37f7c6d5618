"""Runs a .tflite model in Arm NN; started by edgeflow.targets.armnn.backend in its own process.

Run with the Python that Debian's python3-pyarmnn is built for (/usr/bin/python3), not
edgeflow's: this file imports only pyarmnn and numpy. Arm NN aborts the whole process on
some graphs, so it lives apart from the pipeline: the parent sees the pipe close and reports.

Protocol on stdin/stdout, each message an 8-byte little-endian length and an .npz body:
- after loading, the worker sends {"meta": JSON}: inputs and outputs in the model's order,
  each {name, dtype, shape, scale, zero_point};
- then, for each request (arrays arr_0.. in input order) it sends the outputs (arr_0..).
"""

from __future__ import annotations

import io
import json
import os
import struct
import sys
from typing import Any, BinaryIO

import numpy as np

DTYPES = {
    "Float32": "float32", "Float16": "float16", "QAsymmS8": "int8", "QSymmS8": "int8",
    "QAsymmU8": "uint8", "Signed32": "int32", "Signed64": "int64", "Boolean": "bool",
}  # fmt: skip


def send(stream: BinaryIO, arrays: dict[str, Any]) -> None:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    body = buf.getvalue()
    stream.write(struct.pack("<Q", len(body)) + body)
    stream.flush()


def receive(stream: BinaryIO) -> list[Any] | None:
    head = stream.read(8)
    if len(head) < 8:
        return None
    (size,) = struct.unpack("<Q", head)
    with np.load(io.BytesIO(stream.read(size))) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


def describe(info: Any) -> dict[str, Any]:
    import pyarmnn as ann

    kind = {v: k for k, v in vars(ann).items() if k.startswith("DataType_")}.get(
        info.GetDataType(), "?"
    )
    dtype = DTYPES.get(kind.removeprefix("DataType_"), kind)
    return {
        "dtype": dtype,
        "shape": list(info.GetShape()),
        "scale": float(info.GetQuantizationScale()),
        "zero_point": int(info.GetQuantizationOffset()),
    }


def main(path: str, backend: str) -> None:
    # The protocol gets its own descriptor; anything Arm NN or pyarmnn print goes to stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    inp = sys.stdin.buffer
    import pyarmnn as ann

    parser = ann.ITfLiteParser()
    network = parser.CreateNetworkFromBinaryFile(path)
    in_names = parser.GetSubgraphInputTensorNames(0)
    out_names = parser.GetSubgraphOutputTensorNames(0)
    runtime = ann.IRuntime(ann.CreationOptions())
    optimized, _ = ann.Optimize(
        network, [ann.BackendId(backend)], runtime.GetDeviceSpec(), ann.OptimizerOptions()
    )
    net_id, _ = runtime.LoadNetwork(optimized)
    ins = [parser.GetNetworkInputBindingInfo(0, n) for n in in_names]
    outs = [parser.GetNetworkOutputBindingInfo(0, n) for n in out_names]
    meta = {
        "version": ann.ARMNN_VERSION,
        "inputs": [{"name": n, **describe(b[1])} for n, b in zip(in_names, ins, strict=True)],
        "outputs": [{"name": n, **describe(b[1])} for n, b in zip(out_names, outs, strict=True)],
    }
    send(out, {"meta": np.array(json.dumps(meta))})
    while (arrays := receive(inp)) is not None:
        tensors_in = ann.make_input_tensors(ins, arrays)
        tensors_out = ann.make_output_tensors(outs)
        runtime.EnqueueWorkload(net_id, tensors_in, tensors_out)
        results = ann.workload_tensors_to_ndarray(tensors_out)
        send(out, {f"arr_{i}": r for i, r in enumerate(results)})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "CpuRef")
