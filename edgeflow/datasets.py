"""Built-in datasets that ship inside installed packages (no downloads).

A dataset callable takes `split` (and any `options:` from the recipe) and returns a mapping
from the model's input names to arrays of shape (N, ...), plus an optional `label` array.
"""

from __future__ import annotations

import numpy as np

# scikit-learn's digits: 1,797 real 8x8 handwritten digits (UCI ML hand-written digits test
# set). Fixed split from one permutation with seed 0: test = first 360, calibration = next 180,
# train = the remaining 1,257. Pixels 0..16 are scaled to [0, 1].
DIGITS_SPLITS = {"test": (0, 360), "calibration": (360, 540), "train": (540, 1797)}
DIGITS_SEED = 0


def sklearn_digits(split: str = "train", input_name: str = "image") -> dict[str, np.ndarray]:
    """scikit-learn's digits as {input_name: (N, 1, 8, 8) float32, 'label': (N,) int64}."""
    from sklearn.datasets import load_digits

    if split not in DIGITS_SPLITS:
        raise ValueError(f"unknown split '{split}' (choose {', '.join(DIGITS_SPLITS)})")
    digits = load_digits()
    order = np.random.default_rng(DIGITS_SEED).permutation(len(digits.target))
    start, stop = DIGITS_SPLITS[split]
    idx = order[start:stop]
    images = (digits.images[idx] / 16.0).astype(np.float32)[:, None, :, :]
    return {input_name: images, "label": digits.target[idx].astype(np.int64)}
