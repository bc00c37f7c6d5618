"""Feeding a .tflite made by onnx2tf: the recipe's (NCHW) tensors in, the source's layout out.

Shared by the LiteRT and TFLite Micro runners. The layout comes from the convert info
(`io`: per input and output, its position in the .tflite and a permutation); int8 inputs are
quantized with the tensor's scale and zero point and int8 outputs dequantized, so verify
compares float values in the source model's layout with the source model's.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Quant:
    """A tensor's type and affine quantization (scale 0 means not quantized)."""

    dtype: Any
    scale: float = 0.0
    zero_point: int = 0

    @property
    def quantized(self) -> bool:
        return self.scale > 0 and np.issubdtype(np.dtype(self.dtype), np.integer)

    def quantize(self, x: np.ndarray) -> np.ndarray:
        if not self.quantized:
            return x.astype(self.dtype, copy=False)
        info = np.iinfo(self.dtype)
        q = np.round(x.astype(np.float32) / self.scale) + self.zero_point
        return np.clip(q, info.min, info.max).astype(self.dtype)

    def dequantize(self, q: np.ndarray) -> np.ndarray:
        if not self.quantized:
            return q.astype(np.float32, copy=False)
        return (q.astype(np.float32) - self.zero_point) * np.float32(self.scale)


class TfliteRunner:
    """run(feeds) for a .tflite interpreter; subclasses provide _reset, _set, _invoke and
    _get. Every run is one whole input: a sequence operator's state (the variable tensors of
    UNIDIRECTIONAL_SEQUENCE_LSTM, which a runtime keeps between invocations) starts from zero,
    as the ONNX model's does."""

    def __init__(self, io: dict[str, Any], inputs: list[Quant], outputs: list[Quant]) -> None:
        self.io = io
        self.inputs = inputs  # by .tflite input position
        self.outputs = outputs  # by .tflite output position

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        self._reset()
        for spec in self.io["inputs"]:
            pos = spec["index"]
            data = self.inputs[pos].quantize(np.transpose(feeds[spec["name"]], spec["perm"]))
            self._set(pos, np.ascontiguousarray(data))
        self._invoke()
        results = []
        for spec in self.io["outputs"]:
            pos = spec["index"]
            value = self.outputs[pos].dequantize(self._get(pos))
            results.append(np.ascontiguousarray(np.transpose(value, spec["perm"])))
        return results

    def _reset(self) -> None:
        raise NotImplementedError

    def _set(self, pos: int, data: np.ndarray) -> None:
        raise NotImplementedError

    def _invoke(self) -> None:
        raise NotImplementedError

    def _get(self, pos: int) -> np.ndarray:
        raise NotImplementedError


class CStderr:
    """Captures what native code writes to file descriptor 2 while inside `with`."""

    def __init__(self) -> None:
        # one file for the runner's life: reused by every invoke, closed when collected
        self.file = tempfile.TemporaryFile()  # noqa: SIM115

    def __enter__(self) -> CStderr:
        with contextlib.suppress(ValueError, OSError):  # a replaced, closed sys.stderr
            sys.stderr.flush()
        self.file.seek(0)
        self.file.truncate()
        self.saved = os.dup(2)
        os.dup2(self.file.fileno(), 2)
        return self

    def __exit__(
        self, kind: type | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        os.dup2(self.saved, 2)
        os.close(self.saved)

    def text(self) -> str:
        self.file.seek(0)
        return self.file.read().decode(errors="replace").strip()
