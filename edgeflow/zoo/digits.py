"""The digits demo: a small CNN for scikit-learn's 8x8 digits and its reproducible training.

`python -m edgeflow.zoo.digits --out models/digits_cnn.pt` trains it (a few seconds on a CPU,
fixed seed) and writes a state_dict that recipes/digits_cnn.yaml loads with weights_only=True.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

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


def train(out: Path, seed: int = 0, epochs: int = 15, lr: float = 3e-3) -> float:
    """Train on the 'train' split, save the state_dict, return accuracy on the 'test' split."""
    from edgeflow.datasets import sklearn_digits

    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    train_set, test_set = sklearn_digits("train"), sklearn_digits("test")
    x, y = torch.from_numpy(train_set["image"]), torch.from_numpy(train_set["label"])
    model = DigitsCNN()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(x), generator=gen).split(64):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
        sched.step()
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
    args = parser.parse_args(argv)
    start = time.perf_counter()
    torch.set_num_threads(1)  # bit-for-bit reproducible weights on any core count
    acc = train(args.out, args.seed, args.epochs)
    print(f"trained {args.out} in {time.perf_counter() - start:.1f} s: test top-1 {acc:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
