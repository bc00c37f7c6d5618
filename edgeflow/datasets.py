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


def sklearn_digits(
    split: str = "train", input_name: str = "image", scale: int = 1
) -> dict[str, np.ndarray]:
    """scikit-learn's digits as {input_name: (N, 1, 8*scale, 8*scale) float32, 'label': (N,)
    int64}; `scale` > 1 enlarges each pixel to a scale x scale block (nearest neighbour)."""
    from sklearn.datasets import load_digits

    if split not in DIGITS_SPLITS:
        raise ValueError(f"unknown split '{split}' (choose {', '.join(DIGITS_SPLITS)})")
    digits = load_digits()
    order = np.random.default_rng(DIGITS_SEED).permutation(len(digits.target))
    start, stop = DIGITS_SPLITS[split]
    idx = order[start:stop]
    images = (digits.images[idx] / 16.0).astype(np.float32)[:, None, :, :]
    if scale > 1:
        images = np.ascontiguousarray(images.repeat(scale, axis=2).repeat(scale, axis=3))
    return {input_name: images, "label": digits.target[idx].astype(np.int64)}


# scikit-learn's two sample photographs (china.jpg and flower.jpg, 427 x 640 RGB; reading
# them needs Pillow). Crops of `size` on a fixed grid of offsets; "test" and "calibration"
# take different offsets, so the two splits share no crop.
SAMPLE_IMAGE_SPLITS = {"test": 0, "calibration": 1}


def sample_image_crops(
    split: str = "test",
    size: tuple[int, int] | list[int] = (320, 320),
    count: int = 8,
    input_name: str = "images",
) -> dict[str, np.ndarray]:
    """Crops of scikit-learn's sample photographs as {input_name: (count, 3, H, W) float32 in
    [0, 1]}; no labels (for comparing a detector with its artifact, not for accuracy)."""
    from sklearn.datasets import load_sample_images

    if split not in SAMPLE_IMAGE_SPLITS:
        raise ValueError(f"unknown split '{split}' (choose {', '.join(SAMPLE_IMAGE_SPLITS)})")
    photos = load_sample_images().images
    height, width = size
    if height > photos[0].shape[0] or width > photos[0].shape[1]:
        raise ValueError(f"crops of {height}x{width} do not fit the 427x640 sample photographs")
    per_photo = -(-count // len(photos))
    shift = SAMPLE_IMAGE_SPLITS[split]
    crops = []
    for i in range(per_photo):
        for photo in photos:
            # 2 * per_photo offsets across the free room; test takes the even ones.
            t = (2 * i + shift) / max(1, 2 * per_photo - 1)
            top = round(t * (photo.shape[0] - height))
            left = round(t * (photo.shape[1] - width))
            crops.append(photo[top : top + height, left : left + width])
    images = np.stack(crops[:count]).astype(np.float32).transpose(0, 3, 1, 2) / 255.0
    images = np.ascontiguousarray(images)
    return {input_name: images}


def synthetic_keywords(
    split: str = "train", input_name: str = "mfcc", per_class: int | None = None
) -> dict[str, np.ndarray]:
    """Spoken keywords for the keyword-spotting demo as {input_name: (N, 1, 49, 10) float32
    MFCC, 'label': (N,) int64 over edgeflow.speech.CLASSES}: words synthesized with espeak-ng
    (different speakers per split), noise and silence; see edgeflow.speech. Default sizes per
    class: train 400, calibration 30, test 100 (12 classes)."""
    from edgeflow import speech

    features, labels = speech.keywords(split, per_class)
    return {input_name: np.ascontiguousarray(features[:, None]), "label": labels}
