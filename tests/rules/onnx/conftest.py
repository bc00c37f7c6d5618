"""Fixtures: small models exported from torch once per session."""

from __future__ import annotations

import io
import warnings

import onnx
import pytest
import torch


class ConvBnNet(torch.nn.Module):
    """Conv -> BatchNorm -> ReLU -> flatten by x.size(0) -> Linear: BN, Identity, Shape ops."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4 * 6 * 6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(y.view(y.size(0), -1))


def export(
    module: torch.nn.Module, example: torch.Tensor, opset: int = 17, dynamic_batch: bool = True
) -> onnx.ModelProto:
    """A TorchScript export without constant folding (so BN, Identity and Shape ops remain)."""
    buffer = io.BytesIO()
    dynamic = {"x": {0: "batch"}, "y": {0: "batch"}} if dynamic_batch else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            (example,),
            buffer,
            dynamo=False,
            opset_version=opset,
            do_constant_folding=False,
            input_names=["x"],
            output_names=["y"],
            dynamic_axes=dynamic,
            training=torch.onnx.TrainingMode.EVAL,
        )
    return onnx.load_from_string(buffer.getvalue())


@pytest.fixture(scope="session")
def convbn() -> onnx.ModelProto:
    torch.manual_seed(0)
    net = ConvBnNet().eval()
    with torch.no_grad():  # non-trivial BN statistics, so folding it is visible in the numbers
        net.bn.running_mean.uniform_(-1, 1)
        net.bn.running_var.uniform_(0.5, 2)
        net.bn.weight.uniform_(0.5, 1.5)
    return export(net, torch.randn(1, 3, 8, 8))


class TinyBlock(torch.nn.Module):
    """Embedding -> LayerNorm -> attention -> GELU MLP -> HardSwish: a transformer-ish block."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.ln = torch.nn.LayerNorm(16)
        self.att = torch.nn.MultiheadAttention(16, 2, batch_first=True)
        self.ff = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16)
        )
        self.act = torch.nn.Hardswish()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        h = self.ln(x)
        a, _ = self.att(h, h, h, need_weights=False)
        x = x + a
        x = x + self.ff(self.ln(x))
        return self.act(x).mean(1)


@pytest.fixture(scope="session")
def block() -> onnx.ModelProto:
    """TinyBlock exported by TorchScript at opset 17 with input 'ids' [2, 7] (int64)."""
    torch.manual_seed(0)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            TinyBlock().eval(),
            (torch.randint(0, 50, (2, 7)),),
            buffer,
            dynamo=False,
            opset_version=17,
            input_names=["ids"],
            output_names=["y"],
        )
    return onnx.load_from_string(buffer.getvalue())
