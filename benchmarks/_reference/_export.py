"""The first two tool calls both reference scripts make: the PyTorch model's outputs on the
evaluation samples (batch 1, as the artifact runs them) and the dynamo ONNX export."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def reference_and_export(
    model: torch.nn.Module, samples: np.ndarray, onnx_path: Path, output_name: str
) -> np.ndarray:
    """The model's outputs on `samples`, one at a time; writes its dynamo export (opset 18)."""
    with torch.inference_mode():
        reference = np.concatenate([model(torch.from_numpy(x[None])).numpy() for x in samples])
    torch.onnx.export(
        model,
        (torch.from_numpy(samples[:1]),),
        str(onnx_path),
        opset_version=18,
        input_names=["image"],
        output_names=[output_name],
        dynamo=True,
        external_data=False,
        verbose=False,
    )
    return reference
