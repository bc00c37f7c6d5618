"""Reference outputs: the source model is fed as the artifact will be, and its own errors are
reported as such."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from edgeflow.core.errors import EdgeflowError
from edgeflow.data import Samples
from edgeflow.schema.sections import TensorSpec
from edgeflow.source import run_module

SPECS = [TensorSpec(name="x", shape=[1, 2, 3])]
X = np.arange(5 * 2 * 3, dtype=np.float32).reshape(5, 2, 3)


class FirstImage(nn.Module):
    """Written for its declared batch of 1 (as a detector's unrolled post-processing is)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x[0] * 2).unsqueeze(0)


def test_a_model_declared_with_batch_one_gets_one_sample_at_a_time() -> None:
    [out] = run_module(FirstImage(), Samples({"x": X}, None), SPECS, (1, True))
    np.testing.assert_array_equal(out, X * 2)  # batched by 64, it saw only the first sample


def test_a_fixed_batch_pads_the_last_one_and_keeps_only_the_real_outputs() -> None:
    [out] = run_module(nn.Identity(), Samples({"x": X}, None), SPECS, (2, True))
    np.testing.assert_array_equal(out, X)


def test_an_error_in_the_model_is_the_model_s_not_edgeflow_s() -> None:
    class Broken(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ torch.ones(5, 5)

    with pytest.raises(EdgeflowError, match=r"the model raised RuntimeError on evaluation") as e:
        run_module(Broken(), Samples({"x": X}, None), SPECS, (1, True))
    assert "x [1, 2, 3]" in e.value.message and "mat1 and mat2" in e.value.message
