"""The keyword-spotting demo: a small DS-CNN ("Hello Edge", Zhang et al. 2017) on MFCC features
of words spoken by espeak-ng (edgeflow.speech), and its reproducible training.

`python -m edgeflow.zoo.keywords --out models/keyword_spotter.pt` trains it (a few minutes on a
2-core CPU, fixed seed; needs espeak-ng to make the data) and writes a state_dict that
recipes/keyword_spotter.yaml loads with weights_only=True.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from edgeflow.zoo.digits import fit


def depthwise_separable(channels: int) -> nn.Sequential:
    """Depthwise 3x3 (BN, ReLU), pointwise 1x1 (BN, ReLU)."""
    return nn.Sequential(
        nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False),
        nn.BatchNorm2d(channels),
        nn.ReLU(),
        nn.Conv2d(channels, channels, 1, bias=False),
        nn.BatchNorm2d(channels),
        nn.ReLU(),
    )


class KeywordDSCNN(nn.Module):
    """DS-CNN as in "Hello Edge": a 10x4 convolution with stride 2 over the (49 frames x 10
    MFCC) input, four depthwise-separable blocks, global average pooling, a linear layer
    (width 64: ~23k parameters, ~2.8M multiply-adds per second of audio)."""

    def __init__(self, num_classes: int = 12, width: int = 64, blocks: int = 4) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(1, width, (10, 4), stride=2, padding=(5, 1), bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
        )
        self.blocks = nn.Sequential(*(depthwise_separable(width) for _ in range(blocks)))
        self.classifier = nn.Linear(width, num_classes)

    def forward(self, mfcc: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(mfcc))
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def train(out: Path, seed: int = 0, epochs: int = 20, lr: float = 3e-3) -> tuple[float, float]:
    """Train on the 'train' split, save the state_dict; returns top-1 accuracy on the 'train'
    and 'test' splits (test speakers and five of its unknown words are never heard in training)."""
    from edgeflow.datasets import synthetic_keywords

    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    train_set, test_set = synthetic_keywords("train"), synthetic_keywords("test")
    x, y = torch.from_numpy(train_set["mfcc"]), torch.from_numpy(train_set["label"])
    model = KeywordDSCNN()
    fit(model, x, y, epochs, lr, seed, cosine=True)
    model.eval()
    with torch.no_grad():
        train_pred = model(x).argmax(1).numpy()
        test_pred = model(torch.from_numpy(test_set["mfcc"])).argmax(1).numpy()
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out)
    return float(np.mean(train_pred == train_set["label"])), float(
        np.mean(test_pred == test_set["label"])
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("models/keyword_spotter.pt"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    torch.set_num_threads(1)  # bit-for-bit reproducible weights on any core count
    train_acc, test_acc = train(args.out, args.seed, args.epochs)
    print(
        f"trained {args.out} in {time.perf_counter() - start:.1f} s: "
        f"top-1 train {train_acc:.4f}, test {test_acc:.4f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
