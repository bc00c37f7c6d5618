"""The digits demo in Keras: edgeflow.zoo.digits' networks, channel-last, and their training.

`python -m edgeflow.zoo.digits_keras --out models/digits_keras.weights.h5` trains the CNN (a few
seconds on a CPU, fixed seed, bit-for-bit reproducible) and writes Keras weights that a
`source.kind: tensorflow` recipe loads into `digits_cnn()` with `weights:`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

# PyTorch's BatchNorm2d and Adam defaults, so both frameworks train the same network.
BN = {"momentum": 0.9, "epsilon": 1e-5}
ADAM_EPSILON = 1e-8


def digits_cnn(num_classes: int = 10, width: int = 16) -> Any:
    """DigitsCNN channel-last (untrained): Conv-BN-ReLU x2, max-pool, conv-ReLU, global average
    pool, dense logits; input `image` (N, 8, 8, 1), output layer `logits`."""
    import keras
    from keras import layers

    image = keras.Input((8, 8, 1), name="image")
    x = layers.Conv2D(width, 3, padding="same", name="conv1")(image)
    x = layers.ReLU(name="relu1")(layers.BatchNormalization(**BN, name="bn1")(x))
    x = layers.Conv2D(2 * width, 3, padding="same", name="conv2")(x)
    x = layers.ReLU(name="relu2")(layers.BatchNormalization(**BN, name="bn2")(x))
    x = layers.MaxPooling2D(2, name="pool")(x)
    x = layers.Conv2D(2 * width, 3, padding="same", activation="relu", name="conv3")(x)
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    logits = layers.Dense(num_classes, name="logits")(x)
    return keras.Model(image, logits, name="digits_cnn")


def _separable(x: Any, cout: int, stride: int, se: bool, name: str) -> Any:
    """Depthwise 3x3 (BN, hard swish), optional squeeze-excite, pointwise 1x1 (BN)."""
    from keras import layers

    cin = x.shape[-1]
    x = layers.DepthwiseConv2D(3, stride, "same", use_bias=False, name=f"{name}_dw")(x)
    x = layers.BatchNormalization(**BN, name=f"{name}_dw_bn")(x)
    x = layers.Activation("hard_swish", name=f"{name}_dw_hswish")(x)
    if se:
        w = layers.GlobalAveragePooling2D(keepdims=True, name=f"{name}_se_pool")(x)
        w = layers.Conv2D(max(8, cin // 4), 1, activation="relu", name=f"{name}_se_reduce")(w)
        # Keras 3's hard_sigmoid is relu6(x + 3) / 6, PyTorch's hardsigmoid.
        w = layers.Conv2D(cin, 1, activation="hard_sigmoid", name=f"{name}_se_expand")(w)
        x = layers.Multiply(name=f"{name}_se_scale")([x, w])
    x = layers.Conv2D(cout, 1, use_bias=False, name=f"{name}_pw")(x)
    return layers.BatchNormalization(**BN, name=f"{name}_pw_bn")(x)


def digits_mobilenet(num_classes: int = 10) -> Any:
    """DigitsMobileNet channel-last (untrained), for the digits enlarged to 32x32: a stem,
    depthwise-separable blocks with hard swish, squeeze-excite (hard sigmoid) and a residual,
    global pooling and dense logits; input `image` (N, 32, 32, 1), output layer `logits`.
    Stride-2 'same' convolutions pad bottom/right only (PyTorch's padding=1: both sides)."""
    import keras
    from keras import layers

    image = keras.Input((32, 32, 1), name="image")
    x = layers.Conv2D(16, 3, 2, "same", use_bias=False, name="stem")(image)
    x = layers.BatchNormalization(**BN, name="stem_bn")(x)
    x = layers.Activation("hard_swish", name="stem_hswish")(x)
    x = layers.Add(name="block1_add")([x, _separable(x, 16, 1, se=True, name="block1")])
    x = _separable(x, 32, 2, se=False, name="block2")
    x = _separable(x, 48, 2, se=True, name="block3")
    x = layers.Conv2D(96, 1, activation="hard_swish", name="head")(x)
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    logits = layers.Dense(num_classes, name="logits")(x)
    return keras.Model(image, logits, name="digits_mobilenet")


def digits_nhwc(
    split: str = "train", input_name: str = "image", scale: int = 1
) -> dict[str, np.ndarray]:
    """edgeflow.datasets.sklearn_digits channel-last: {input_name: (N, 8*scale, 8*scale, 1)
    float32, 'label': (N,) int64}."""
    from edgeflow.datasets import sklearn_digits

    data = sklearn_digits(split, input_name, scale)
    data[input_name] = np.ascontiguousarray(data[input_name].transpose(0, 2, 3, 1))
    return data


def train(out: Path, seed: int = 0, epochs: int = 15, lr: float = 3e-3, arch: str = "cnn") -> float:
    """Adam on shuffled mini-batches of 64 with a cosine schedule (fixed seeds, deterministic
    ops), save the weights, return top-1 accuracy on the 'test' split. arch: "cnn" (8x8) or
    "mobilenet" (digits enlarged to 32x32)."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()
    scale = 4 if arch == "mobilenet" else 1
    train_set, test_set = digits_nhwc("train", scale=scale), digits_nhwc("test", scale=scale)
    build = digits_mobilenet if arch == "mobilenet" else digits_cnn
    model = build()
    steps = epochs * -(-len(train_set["label"]) // 64)
    schedule = keras.optimizers.schedules.CosineDecay(lr, max(1, steps))
    model.compile(
        optimizer=keras.optimizers.Adam(schedule, epsilon=ADAM_EPSILON),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(train_set["image"], train_set["label"], batch_size=64, epochs=epochs, verbose=0)
    logits = model.predict(test_set["image"], batch_size=len(test_set["label"]), verbose=0)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Saved from an uncompiled copy: the trained model's file would hold Adam's state too.
    bare = build()
    bare.set_weights(model.get_weights())
    bare.save_weights(out)
    return float(np.mean(logits.argmax(1) == test_set["label"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("models/digits_keras.weights.h5"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--arch", choices=["cnn", "mobilenet"], default="cnn")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    import tensorflow as tf

    # One thread each: bit-for-bit reproducible weights on any core count.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    acc = train(args.out, args.seed, args.epochs, arch=args.arch)
    print(f"trained {args.out} in {time.perf_counter() - start:.1f} s: test top-1 {acc:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
