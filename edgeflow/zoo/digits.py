"""The digits demo: a small CNN for scikit-learn's 8x8 digits and its reproducible training.

`python -m edgeflow.zoo.digits --out models/digits_cnn.pt` trains it (a few seconds on a CPU,
fixed seed) and writes a state_dict that recipes/digits_cnn.yaml loads with weights_only=True.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn


class DigitsCNN(nn.Module):
    """Conv-BN-ReLU x2, max-pool, conv, global average pool, linear: ~10k parameters."""

    def __init__(self, num_classes: int = 10, width: int = 16) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(2 * width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(2 * width, num_classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(image), 1))


class SqueezeExcite(nn.Module):
    """Channel attention as in MobileNetV3: global pool, 1x1 reduce, ReLU, 1x1 expand,
    hard sigmoid, scale."""

    def __init__(self, channels: int, reduced: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(channels, reduced, 1)
        self.expand = nn.Conv2d(reduced, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = nn.functional.adaptive_avg_pool2d(x, 1)
        w = nn.functional.hardsigmoid(self.expand(torch.relu(self.reduce(w))))
        return x * w


def separable(cin: int, cout: int, stride: int, se: bool) -> nn.Sequential:
    """Depthwise 3x3 (BN, hard swish), optional squeeze-excite, pointwise 1x1 (BN)."""
    layers: list[nn.Module] = [
        nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False),
        nn.BatchNorm2d(cin),
        nn.Hardswish(),
    ]
    if se:
        layers.append(SqueezeExcite(cin, max(8, cin // 4)))
    layers += [nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers)


class DigitsMobileNet(nn.Module):
    """A MobileNetV3-style network for the digits enlarged to 32x32: a stem, depthwise-separable
    blocks with hard swish, squeeze-excite (hard sigmoid) and a residual, global pooling and a
    classifier: the operators the small demo does not use (~20k parameters)."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(1, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish()
        )
        self.block1 = separable(16, 16, 1, se=True)  # residual
        self.block2 = separable(16, 32, 2, se=False)
        self.block3 = separable(32, 48, 2, se=True)
        self.head = nn.Sequential(nn.Conv2d(48, 96, 1), nn.Hardswish())
        self.classifier = nn.Linear(96, num_classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.stem(image)
        x = x + self.block1(x)
        x = self.block3(self.block2(x))
        x = self.head(x)
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def act_fake_quant() -> nn.Module:
    """int8 per-tensor affine fake quantization of activations, observed with a moving average."""
    from torch.ao.quantization import FakeQuantize, MovingAverageMinMaxObserver

    return FakeQuantize(
        observer=MovingAverageMinMaxObserver,
        quant_min=-128,
        quant_max=127,
        dtype=torch.qint8,
        qscheme=torch.per_tensor_affine,
    )


def weight_fake_quant() -> nn.Module:
    """7-bit ([-64, 63]) per-output-channel symmetric fake quantization of weights: x86 int8
    kernels without VNNI saturate with full 8-bit weights (docs/debugging.md)."""
    from torch.ao.quantization import FakeQuantize, MovingAveragePerChannelMinMaxObserver

    return FakeQuantize(
        observer=MovingAveragePerChannelMinMaxObserver,
        quant_min=-64,
        quant_max=63,
        dtype=torch.qint8,
        qscheme=torch.per_channel_symmetric,
        ch_axis=0,
    )


class DigitsQAT(nn.Module):
    """The digits CNN for quantization-aware training: BatchNorm folded into the convolutions,
    torch.ao.quantization FakeQuantize modules on the input, after every activation and on
    every weight (int8: per-tensor affine activations, per-channel symmetric weights)."""

    def __init__(self, num_classes: int = 10, width: int = 16) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.conv3 = nn.Conv2d(2 * width, 2 * width, 3, padding=1)
        self.classifier = nn.Linear(2 * width, num_classes)
        self.weight_fq = nn.ModuleList([weight_fake_quant() for _ in range(4)])
        self.act_fq = nn.ModuleList([act_fake_quant() for _ in range(6)])

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        fq, wq = self.act_fq, self.weight_fq
        x = fq[0](image)
        c1, c2, c3 = self.conv1, self.conv2, self.conv3
        x = fq[1](torch.relu(nn.functional.conv2d(x, wq[0](c1.weight), c1.bias, padding=1)))
        x = fq[2](torch.relu(nn.functional.conv2d(x, wq[1](c2.weight), c2.bias, padding=1)))
        x = nn.functional.max_pool2d(x, 2)
        x = fq[3](torch.relu(nn.functional.conv2d(x, wq[2](c3.weight), c3.bias, padding=1)))
        x = fq[4](x.mean((2, 3)))
        head = self.classifier
        return fq[5](nn.functional.linear(x, wq[3](head.weight), head.bias))

    @classmethod
    def from_float(cls, model: DigitsCNN) -> DigitsQAT:
        """A QAT model with the float model's weights, BatchNorm folded into the convs."""
        f: Any = model.features
        qat = cls(model.classifier.out_features, f[0].out_channels)
        pairs = ((f[0], f[1]), (f[3], f[4]), (f[7], None))
        with torch.no_grad():
            for conv, (src, bn) in zip((qat.conv1, qat.conv2, qat.conv3), pairs, strict=True):
                weight, bias = src.weight, src.bias
                if bn is not None:
                    gain = bn.weight / torch.sqrt(bn.running_var + bn.eps)
                    weight = weight * gain[:, None, None, None]
                    bias = (bias - bn.running_mean) * gain + bn.bias
                assert conv.bias is not None
                conv.weight.copy_(weight)
                conv.bias.copy_(bias)
            qat.classifier.load_state_dict(model.classifier.state_dict())
        return qat


def fit(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    epochs: int,
    lr: float,
    seed: int,
    cosine: bool,
) -> None:
    """Adam on shuffled mini-batches of 64 (fixed seed), optionally with a cosine schedule."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs) if cosine else None
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(x), generator=gen).split(64):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
        if sched is not None:
            sched.step()


def train_qat(
    float_weights: Path, out: Path, seed: int = 0, epochs: int = 3, lr: float = 3e-4
) -> tuple[float, float]:
    """Fine-tune the trained float model with fake quantization (BatchNorm folded); observers
    are frozen before saving, so the state_dict holds the learned scales. Returns the test
    accuracy of the float model and of the QAT model."""
    from torch.ao.quantization import disable_observer

    from edgeflow.datasets import sklearn_digits

    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    float_model = DigitsCNN()
    float_model.load_state_dict(torch.load(float_weights, weights_only=True))
    float_model.eval()
    model = DigitsQAT.from_float(float_model)
    train_set, test_set = sklearn_digits("train"), sklearn_digits("test")
    x, y = torch.from_numpy(train_set["image"]), torch.from_numpy(train_set["label"])
    test_x = torch.from_numpy(test_set["image"])
    with torch.no_grad():
        model.train()
        model(x)  # observers first see the whole training set
    fit(model, x, y, epochs, lr, seed, cosine=False)
    model.apply(disable_observer)
    model.eval()
    with torch.no_grad():
        float_pred = float_model(test_x).argmax(1).numpy()
        qat_pred = model(test_x).argmax(1).numpy()
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out)
    labels = test_set["label"]
    return float(np.mean(float_pred == labels)), float(np.mean(qat_pred == labels))


def train(out: Path, seed: int = 0, epochs: int = 15, lr: float = 3e-3, arch: str = "cnn") -> float:
    """Train on the 'train' split, save the state_dict, return accuracy on the 'test' split.
    arch: "cnn" (DigitsCNN, 8x8) or "mobilenet" (DigitsMobileNet, digits enlarged to 32x32)."""
    from edgeflow.datasets import sklearn_digits

    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    scale = 4 if arch == "mobilenet" else 1
    train_set, test_set = sklearn_digits("train", scale=scale), sklearn_digits("test", scale=scale)
    x, y = torch.from_numpy(train_set["image"]), torch.from_numpy(train_set["label"])
    model: nn.Module = DigitsMobileNet() if arch == "mobilenet" else DigitsCNN()
    fit(model, x, y, epochs, lr, seed, cosine=True)
    model.eval()
    with torch.no_grad():
        pred = model(torch.from_numpy(test_set["image"])).argmax(1).numpy()
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out)
    return float(np.mean(pred == test_set["label"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("models/digits_cnn.pt"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument(
        "--qat-from", type=Path, help="fine-tune these float weights with QAT (DigitsQAT)"
    )
    parser.add_argument("--arch", choices=["cnn", "mobilenet"], default="cnn")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    torch.set_num_threads(1)  # bit-for-bit reproducible weights on any core count
    if args.qat_from is not None:
        float_acc, acc = train_qat(args.qat_from, args.out, args.seed, args.epochs)
        print(f"float model: test top-1 {float_acc:.4f}")
    else:
        acc = train(args.out, args.seed, args.epochs, arch=args.arch)
    print(f"trained {args.out} in {time.perf_counter() - start:.1f} s: test top-1 {acc:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
