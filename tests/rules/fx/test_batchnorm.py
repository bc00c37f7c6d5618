"""fx.remove_batchnorm: identity BatchNorms removed; with fold, others folded where exact."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from edgeflow.rules.base import Status
from edgeflow.rules.fx.batchnorm import RemoveBatchnorm
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


class IdentityNet(nn.Module):
    """Fresh BatchNorms (mean 0, var 1, weight 1, bias 0) and one trained one."""

    def __init__(self, untraceable: bool = False) -> None:
        super().__init__()
        self.untraceable = untraceable
        self.fc = nn.Linear(6, 6)
        self.bn = nn.BatchNorm1d(6)  # identity
        self.conv = nn.Conv2d(1, 2, 1)
        self.bn2d = nn.BatchNorm2d(2)  # identity
        self.trained = randomize_batchnorms(nn.BatchNorm1d(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.untraceable:
            x = gate(x)
        h = self.bn(self.fc(x))
        c = self.bn2d(self.conv(h.view(-1, 1, 2, 3)))
        return self.trained(c.flatten(1)[:, :6] + h)


CTX_ID = ctx_for([4, 6])


@pytest.mark.parametrize("untraceable", [False, True], ids=["symbolic_trace", "torch.export"])
def test_removes_identity_batchnorms_only(untraceable: bool) -> None:
    model = IdentityNet(untraceable).eval()
    # scale = 1 / sqrt(1 + eps) = 1 - 5e-6: within atol, and so within the rule's tolerance
    result = check_rule(RemoveBatchnorm, {}, model, CTX_ID, atol=5e-5, rtol=1e-5)
    assert result.matches == 2
    assert is_export_graph(result) == untraceable
    assert [status for status, _ in outcomes(result)] == ["changed", "changed", "kept"]
    assert "trained" in wheres(result, Status.KEPT)[0]  # not an identity: fold: true folds it
    after = ops(result.model)
    bn_count = after["aten.batch_norm.default"] if untraceable else after["BatchNorm1d"]
    assert bn_count == 1 and after["BatchNorm2d"] == 0


def test_atol_zero_keeps_them() -> None:
    result = apply(RemoveBatchnorm, {"atol": 0}, IdentityNet().eval(), CTX_ID)
    assert not result.changed and [s for s, _ in outcomes(result)] == ["kept"] * 3


class FoldNet(nn.Module):
    """BN before a linear op, BN after one, BN before a 1x1 conv, and two that cannot fold:
    BN before a padded conv, BN whose channels are not the linear op's features."""

    def __init__(self, untraceable: bool = False) -> None:
        super().__init__()
        self.untraceable = untraceable
        self.bn_in = nn.BatchNorm1d(5)  # -> fc: folds into fc's input channels
        self.fc = nn.Linear(5, 5)
        self.bn_out = nn.BatchNorm1d(5)  # fc -> : folds into fc's output channels
        self.bn_conv = nn.BatchNorm2d(3)  # -> 1x1 conv: folds into the conv's input channels
        self.conv = nn.Conv2d(3, 4, 1)
        self.bn_pad = nn.BatchNorm2d(3)  # -> padded conv: kept
        self.padded = nn.Conv2d(3, 4, 3, padding=1)
        self.seq = nn.Linear(5, 5)
        self.bn_seq = nn.BatchNorm1d(5)  # (N, 5, 5) linear -> BN over dim 1: kept

    def forward(self, v: torch.Tensor, img: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.untraceable:
            v = gate(v)
        a = self.bn_out(self.fc(self.bn_in(v)))
        b = self.conv(self.bn_conv(img)) + self.padded(self.bn_pad(img))
        c = torch.relu(self.bn_seq(self.seq(v.unsqueeze(1).expand(-1, 5, -1))))
        return a, b, c


CTX_FOLD = ctx_for([4, 5], [2, 3, 6, 6])


@pytest.mark.parametrize("untraceable", [False, True], ids=["symbolic_trace", "torch.export"])
def test_fold_where_exact(untraceable: bool) -> None:
    model = randomize_batchnorms(FoldNet(untraceable)).eval()
    result = check_rule(RemoveBatchnorm, {"fold": True}, model, CTX_FOLD, atol=1e-5, rtol=1e-5)
    assert result.matches == 3
    folded, kept = wheres(result, Status.CHANGED), wheres(result, Status.KEPT)
    assert [n for w in folded for n in ("bn_in", "bn_out", "bn_conv") if n in w] == [
        "bn_in",
        "bn_out",
        "bn_conv",
    ]
    # bn_pad: the conv after it pads its input; bn_seq: the linear's features are not dim 1
    assert [n for w in kept for n in ("bn_pad", "bn_seq") if n in w] == ["bn_pad", "bn_seq"]
    after = ops(result.model)
    if untraceable:
        assert after["aten.batch_norm.default"] == 2
    else:
        assert after["BatchNorm1d"] + after["BatchNorm2d"] == 2


def test_onnx_export_after_folding(tmp_path: Path) -> None:
    model = randomize_batchnorms(FoldNet(untraceable=True)).eval()
    result = apply(RemoveBatchnorm, {"fold": True}, model, CTX_FOLD)
    found = onnx_export(result.model, CTX_FOLD, tmp_path / "model.onnx")
    assert "Gemm" in found or "MatMul" in found


def test_tolerance_follows_atol() -> None:
    rule = RemoveBatchnorm()
    assert rule.tolerance(RemoveBatchnorm.Options()) == pytest.approx(1e-4)
    assert rule.tolerance(RemoveBatchnorm.Options(atol=0)) == 1e-5
