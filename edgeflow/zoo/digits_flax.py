"""The digits demo in Flax: edgeflow.zoo.digits' networks channel-last, and their training.

`python -m edgeflow.zoo.digits_flax --out models/digits_flax.msgpack` trains DigitsCNN (a few
seconds on a CPU, fixed seed) and writes its variables with flax.serialization (msgpack, no
pickle); `--arch mobilenet --out models/digits_flax_mobilenet.msgpack` trains DigitsMobileNet
on the digits enlarged to 32x32. A recipe with `source.kind: jax` references
`edgeflow.zoo.digits_flax:digits_cnn` (or `:digits_mobilenet`), which returns (apply function
in inference mode, initial variables) for edgeflow.frameworks.jax, and loads that file with
`weights:`.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

INPUT_SHAPE = (8, 8, 1)  # H, W, C: the 8x8 digits, channel-last
MOBILENET_SCALE = 4  # DigitsMobileNet's input: each pixel a 4x4 block, 32x32
MOBILENET_INPUT_SHAPE = (8 * MOBILENET_SCALE, 8 * MOBILENET_SCALE, 1)


def _module(num_classes: int = 10, width: int = 16) -> Any:
    """The Flax linen module (built here so that importing this file does not import flax)."""
    import jax.numpy as jnp
    from flax import linen as nn

    class DigitsCNN(nn.Module):
        """Conv-BN-ReLU x2, max-pool, conv, global average pool, dense: ~10k parameters."""

        num_classes: int = 10
        width: int = 16

        @nn.compact
        def __call__(self, image: Any, train: bool = False) -> Any:
            # PyTorch's BatchNorm2d defaults: momentum 0.1 (Flax counts the other way), eps 1e-5
            def bn() -> nn.BatchNorm:
                return nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5)

            x = nn.relu(bn()(nn.Conv(self.width, (3, 3), padding=1)(image)))
            x = nn.relu(bn()(nn.Conv(2 * self.width, (3, 3), padding=1)(x)))
            # keywords: jax2onnx patches nn.max_pool while tracing with a keyword-only signature
            x = nn.max_pool(x, window_shape=(2, 2), strides=(2, 2))
            x = nn.relu(nn.Conv(2 * self.width, (3, 3), padding=1)(x))
            return nn.Dense(self.num_classes)(jnp.mean(x, axis=(1, 2)))

    return DigitsCNN(num_classes, width)


def _mobilenet_module(num_classes: int = 10) -> Any:
    """DigitsMobileNet as a Flax linen module; layers named as digits_keras.digits_mobilenet's."""
    import jax.numpy as jnp
    from flax import linen as nn

    class DigitsMobileNet(nn.Module):
        """Stem, depthwise-separable blocks with hard swish, squeeze-excite (hard sigmoid) and
        a residual, global average pool, dense: 9,882 trainable parameters, as in PyTorch.
        Convolutions pad 1 on every side (PyTorch's padding=1), not Flax's 'SAME'."""

        num_classes: int = 10

        @nn.compact
        def __call__(self, image: Any, train: bool = False) -> Any:
            def bn(name: str) -> nn.BatchNorm:  # PyTorch's BatchNorm2d defaults, as DigitsCNN
                return nn.BatchNorm(
                    use_running_average=not train, momentum=0.9, epsilon=1e-5, name=name
                )

            def separable(x: Any, cout: int, stride: int, se: bool, name: str) -> Any:
                cin = x.shape[-1]
                x = nn.Conv(
                    cin,
                    (3, 3),
                    stride,
                    padding=1,
                    feature_group_count=cin,
                    use_bias=False,
                    name=f"{name}_dw",
                )(x)
                x = nn.hard_swish(bn(f"{name}_dw_bn")(x))
                if se:
                    w = jnp.mean(x, axis=(1, 2), keepdims=True)
                    w = nn.relu(nn.Conv(max(8, cin // 4), (1, 1), name=f"{name}_se_reduce")(w))
                    w = nn.hard_sigmoid(nn.Conv(cin, (1, 1), name=f"{name}_se_expand")(w))
                    x = x * w
                x = nn.Conv(cout, (1, 1), use_bias=False, name=f"{name}_pw")(x)
                return bn(f"{name}_pw_bn")(x)

            x = nn.Conv(16, (3, 3), 2, padding=1, use_bias=False, name="stem")(image)
            x = nn.hard_swish(bn("stem_bn")(x))
            x = x + separable(x, 16, 1, se=True, name="block1")
            x = separable(x, 32, 2, se=False, name="block2")
            x = separable(x, 48, 2, se=True, name="block3")
            x = nn.hard_swish(nn.Conv(96, (1, 1), name="head")(x))
            return nn.Dense(self.num_classes, name="logits")(jnp.mean(x, axis=(1, 2)))

    return DigitsMobileNet(num_classes)


def _nhwc(split: str, scale: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """edgeflow.datasets.sklearn_digits(split, scale=scale) as (images (N, 8*scale, 8*scale, 1)
    float32, labels)."""
    from edgeflow.datasets import sklearn_digits

    data = sklearn_digits(split, scale=scale)
    return np.ascontiguousarray(data["image"].transpose(0, 2, 3, 1)), data["label"]


def _init_variables(module: Any, seed: int, shape: tuple[int, ...] = INPUT_SHAPE) -> Any:
    import jax
    import jax.numpy as jnp

    return module.init(jax.random.key(seed), jnp.zeros((1, *shape), jnp.float32))


def digits_cnn(seed: int = 0) -> tuple[Callable[..., Any], Any]:
    """(apply(variables, image) -> logits in inference mode, variables initialised with
    `seed`): a recipe's `source.weights` (models/digits_flax.msgpack, flax.serialization)
    restores the trained values into these variables, as a state_dict fills a module."""
    module = _module()

    def apply(variables: Any, image: Any) -> Any:
        return module.apply(variables, image, train=False)

    return apply, _init_variables(module, seed)


def digits_mobilenet(seed: int = 0) -> tuple[Callable[..., Any], Any]:
    """(apply(variables, image (N, 32, 32, 1)) -> logits in inference mode, variables
    initialised with `seed`), for models/digits_flax_mobilenet.msgpack, as digits_cnn."""
    module = _mobilenet_module()

    def apply(variables: Any, image: Any) -> Any:
        return module.apply(variables, image, train=False)

    return apply, _init_variables(module, seed, MOBILENET_INPUT_SHAPE)


def train(out: Path, seed: int = 0, epochs: int = 15, lr: float = 3e-3, arch: str = "cnn") -> float:
    """Adam on shuffled mini-batches of 64 (fixed seed), a cosine schedule stepped per epoch
    as in edgeflow.zoo.digits.fit; save the variables, return accuracy on the 'test' split.
    arch: "cnn" (DigitsCNN, 8x8) or "mobilenet" (DigitsMobileNet, digits enlarged to 32x32)."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import serialization

    if arch == "mobilenet":
        module, scale, shape = _mobilenet_module(), MOBILENET_SCALE, MOBILENET_INPUT_SHAPE
    else:
        module, scale, shape = _module(), 1, INPUT_SHAPE
    x, labels = _nhwc("train", scale)
    y = labels.astype(np.int32)  # int64 would be cut to int32 by JAX anyway (x64 off)
    test_x, test_y = _nhwc("test", scale)
    variables = _init_variables(module, seed, shape)
    params, stats = variables["params"], variables["batch_stats"]
    steps = -(-len(x) // 64)

    def schedule(step: Any) -> Any:
        epoch = step // steps
        return lr * 0.5 * (1 + jnp.cos(jnp.pi * epoch / epochs))

    opt = optax.adam(schedule)
    opt_state = opt.init(params)

    @jax.jit
    def step(params: Any, stats: Any, opt_state: Any, xb: Any, yb: Any) -> Any:
        def loss_fn(params: Any) -> Any:
            logits, updates = module.apply(
                {"params": params, "batch_stats": stats}, xb, train=True, mutable=["batch_stats"]
            )
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()
            return loss, updates["batch_stats"]

        grads, stats = jax.grad(loss_fn, has_aux=True)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), stats, opt_state

    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for start in range(0, len(x), 64):
            idx = order[start : start + 64]
            params, stats, opt_state = step(params, stats, opt_state, x[idx], y[idx])
    variables = {"params": params, "batch_stats": stats}
    logits = module.apply(variables, test_x, train=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(serialization.to_bytes(variables))
    return float(np.mean(np.asarray(logits).argmax(1) == test_y))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("models/digits_flax.msgpack"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--arch", choices=["cnn", "mobilenet"], default="cnn")
    args = parser.parse_args(argv)
    # Bit-for-bit reproducible weights on any core count: XLA's CPU backend sizes its thread
    # pool from the CPUs this process may use, and its results depend on that size
    # (XLA_FLAGS --xla_cpu_multi_thread_eigen=false does not make them equal); one CPU, as
    # edgeflow.zoo.digits does with torch.set_num_threads(1). Set before jax first runs.
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    start = time.perf_counter()
    acc = train(args.out, args.seed, args.epochs, arch=args.arch)
    print(f"trained {args.out} in {time.perf_counter() - start:.1f} s: test top-1 {acc:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
