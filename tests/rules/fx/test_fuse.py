"""fx.fuse_conv_bn: BatchNorm folded into the conv before it, on both kinds of graph."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from edgeflow.rules.base import Status
from edgeflow.rules.fx.fuse import FuseConvBn
from tests.rules.fx.helpers import (
    apply,
    check_rule,
    ctx_for,
    gate,
    is_export_graph,
    onnx_export,
    ops,
    randomize_batchnorms,
)
from tests.rules.sites import outcomes, wheres

CTX = ctx_for([2, 3, 8, 8])


class ConvBnNet(nn.Module):
    """Conv2d -> BN2d (fusable), Conv1d -> BN1d (fusable), conv whose output is also read
    elsewhere -> BN (not fusable)."""

    def __init__(self, untraceable: bool = False) -> None:
        super().__init__()
        self.untraceable = untraceable
        self.conv = nn.Conv2d(3, 4, 3, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.conv1d = nn.Conv1d(3, 5, 3, padding=1)
        self.bn1d = nn.BatchNorm1d(5)
        self.shared = nn.Conv2d(4, 4, 1)
        self.bn_shared = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.untraceable:
            x = gate(x)
        y = torch.relu(self.bn(self.conv(x)))
        s = self.shared(y)
        y = self.bn_shared(s) + s
        z = self.bn1d(self.conv1d(x.flatten(2)))
        return y, z


@pytest.mark.parametrize("untraceable", [False, True], ids=["symbolic_trace", "torch.export"])
def test_folds_batchnorm_into_the_conv_before_it(untraceable: bool) -> None:
    model = randomize_batchnorms(ConvBnNet(untraceable)).eval()
    result = check_rule(FuseConvBn, {}, model, CTX, atol=1e-5, rtol=1e-5)
    assert result.matches == 2
    assert is_export_graph(result) == untraceable
    after = ops(result.model)
    if untraceable:
        before = ops(torch.export.export(model, CTX.example_inputs()).module())
        assert before["aten.batch_norm.default"] == 3
        assert after["aten.batch_norm.default"] == 1
        assert after["aten.conv2d.default"] == 2 and after["aten.conv1d.default"] == 1
    else:
        assert after["BatchNorm2d"] == 1 and after["BatchNorm1d"] == 0
        assert after["Conv2d"] == 2 and after["Conv1d"] == 1
    [kept] = wheres(result, Status.KEPT)  # its conv's output has other users
    assert "bn_shared" in kept
    names = {n for n, _ in result.model.named_parameters()} | {
        n for n, _ in result.model.named_buffers()
    }
    assert not any(n.startswith(("bn.", "bn1d.")) for n in names)  # nothing left behind


def test_decomposed_export_graph() -> None:
    """aten.convolution + _native_batch_norm_legit_no_training, as run_decompositions gives."""
    model = randomize_batchnorms(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))).eval()
    gm = torch.export.export(model, CTX.example_inputs()).run_decompositions().module()
    assert ops(gm)["aten._native_batch_norm_legit_no_training.default"] == 1
    result = check_rule(FuseConvBn, {}, gm, CTX)
    after = ops(result.model)
    assert after["aten._native_batch_norm_legit_no_training.default"] == 0
    assert after["getitem"] == 0 and after["aten.convolution.default"] == 1


class FunctionalNet(nn.Module):
    """F.conv2d and F.batch_norm on the module's own tensors: get_attr nodes in symbolic_trace."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 3, 3, 3))
        self.register_buffer("mean", torch.rand(4))
        self.register_buffer("var", torch.rand(4) + 0.5)
        self.gamma = nn.Parameter(torch.rand(4) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(x, self.weight, padding=1)
        return F.batch_norm(y, self.mean, self.var, self.gamma, None, False, 0.1, 1e-3)


def test_functional_conv_and_batch_norm() -> None:
    result = check_rule(FuseConvBn, {}, FunctionalNet().eval(), CTX)
    after = ops(result.model)
    assert after["batch_norm"] == 0 and after["conv2d"] == 1
    assert "weight_fused" in result.model.code and "bias_fused" in result.model.code


def test_training_mode_batchnorm_is_kept() -> None:
    model = ConvBnNet().train()
    result = apply(FuseConvBn, {}, model, CTX)
    assert not result.changed and result.model is model
    assert [status for status, _ in outcomes(result)] == ["kept"] * 3  # in training mode


def test_nothing_to_fuse() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    result = apply(FuseConvBn, {}, model, CTX)
    assert not result.changed and outcomes(result) == [("not_applicable", "")]


def test_batchnorm_after_a_conv_called_twice_is_kept() -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 3, 1)
            self.bn = nn.BatchNorm2d(3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.bn(self.conv(x)) + self.conv(x)

    result = apply(FuseConvBn, {}, Twice().eval(), CTX)
    assert not result.changed
    assert outcomes(result) == [("kept", "bn (BatchNorm2d)")]  # conv is called more than once


def test_onnx_export_after_fusion(tmp_path: Path) -> None:
    model = randomize_batchnorms(ConvBnNet(untraceable=True)).eval()
    result = apply(FuseConvBn, {}, model, CTX)
    found = onnx_export(result.model, CTX, tmp_path / "model.onnx")
    assert found.count("BatchNormalization") <= 1 and "Conv" in found
