"""Development models for conversion coverage: architectures real edge models have, built in
code, for tests and for the recipes that ship them (recipes/speech_lstm_encoder.yaml,
digits_prelu.yaml, digits_paddle_style.yaml).

- `SpeechLSTMEncoder`: stacked LSTMs over log mel frames, a projection, an L2-normalised
  embedding (a speaker or keyword encoder); exports LSTM, ReduceL2 and Div. Seeded random
  weights, not trained: its outputs are compared with the artifact's, not scored.
- `DigitsPReLU`: a CNN with per-channel and single-slope PReLU activations on 8x8 digits,
  trained in seconds (`train_prelu`: random weights give near-tied logits, and int8's top-1
  agreement would measure the ties, not the conversion).
- `paddle_style_onnx`: an ONNX graph as Paddle2ONNX writes them: a -1 batch dimension and the
  flattening done by Shape -> Gather -> Unsqueeze -> Concat -> Reshape; seeded random weights.

`python -m edgeflow.zoo.devmodels paddle_style --out models/digits_paddle_style.onnx` writes
the ONNX model and `python -m edgeflow.zoo.devmodels prelu --out models/digits_prelu.pt` the
trained state_dict that the recipes read (stages `generate_digits_paddle_style` and
`train_digits_prelu` of this repository's dvc.yaml). The same seed gives the same weights in
every process; building a model leaves torch's global generator as it was.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

# Log mel energies of edgeflow.speech (natural log, floor 1e-6) on the calibration split:
# mean -4.90, standard deviation 4.19. The encoder centres and scales by them, as a
# trained one would, so that random gates are not saturated.
LOG_MEL_MEAN, LOG_MEL_STD = -4.9, 4.2


class SpeechLSTMEncoder(nn.Module):
    """Log mel frames [batch, 49, 40] -> every `stride`-th frame (frame-rate reduction, as
    speech encoders do: 13 steps of 80 ms) -> 2 stacked LSTMs (hidden 32) -> the last layer's
    final hidden state -> Linear(32, 16) -> e / ||e||_2: a unit-length embedding [batch, 16].
    The stride keeps the unrolled graph of the TFLite family small: over all 49 frames, onnx2tf
    took 3.5 CPU-minutes to convert it."""

    def __init__(
        self,
        mels: int = 40,
        hidden: int = 32,
        layers: int = 2,
        embedding: int = 16,
        stride: int = 4,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.stride = stride
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.lstm = nn.LSTM(mels, hidden, num_layers=layers, batch_first=True)
            self.proj = nn.Linear(hidden, embedding)

    def forward(self, log_mel: torch.Tensor) -> torch.Tensor:
        _, (h, _) = self.lstm((log_mel[:, :: self.stride] - LOG_MEL_MEAN) / LOG_MEL_STD)
        e = self.proj(h[-1])
        return e / torch.linalg.vector_norm(e, dim=-1, keepdim=True)


class DigitsPReLU(nn.Module):
    """image [batch, 1, 8, 8] -> three 3x3 convolutions with per-channel PReLU (slopes drawn
    in [0.05, 0.5]), a max pool, global average pooling, a hidden Linear with one shared
    PReLU slope, logits [batch, 10]."""

    def __init__(self, num_classes: int = 10, width: int = 16, seed: int = 0) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.features = nn.Sequential(
                nn.Conv2d(1, width, 3, padding=1),
                nn.PReLU(width),
                nn.Conv2d(width, 2 * width, 3, padding=1),
                nn.PReLU(2 * width),
                nn.MaxPool2d(2),
                nn.Conv2d(2 * width, 2 * width, 3, padding=1),
                nn.PReLU(2 * width),
            )
            self.hidden = nn.Sequential(nn.Linear(2 * width, 2 * width), nn.PReLU())
            self.classifier = nn.Linear(2 * width, num_classes)
            with torch.no_grad():
                for module in self.modules():
                    if isinstance(module, nn.PReLU):
                        module.weight.uniform_(0.05, 0.5)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.features(image).mean(dim=(2, 3))
        return self.classifier(self.hidden(x))


def keyword_log_mel(
    split: str = "train", input_name: str = "log_mel", per_class: int | None = None
) -> dict[str, np.ndarray]:
    """The keyword spotter's speech (edgeflow.speech: the same clips and labels as
    edgeflow.datasets:synthetic_keywords) as log mel frames {input_name: (N, 49, 40) float32,
    frames x mel bands, 'label': (N,) int64}: the input of SpeechLSTMEncoder. Made here, not in
    edgeflow.speech, which the demo weights' training depends on; cached beside its splits."""
    import hashlib
    import os
    import subprocess
    import tempfile

    from edgeflow import speech

    speech._check_split(split)
    per_class = speech.SPLIT_PER_CLASS[split] if per_class is None else per_class
    espeak = speech._espeak()
    version = subprocess.run([espeak, "--version"], capture_output=True, text=True, check=True)
    key = hashlib.sha256(Path(speech.__file__).read_bytes() + Path(__file__).read_bytes())
    key.update(f"{version.stdout.strip()}|{split}|{per_class}|log_mel".encode())
    path = speech.cache_dir() / f"log_mel-{split}-{per_class}-{key.hexdigest()[:16]}.npz"
    if path.exists():
        with np.load(path, allow_pickle=False) as npz:
            mel, labels = npz["log_mel"], npz["labels"]
    else:
        from concurrent.futures import ThreadPoolExecutor

        items = speech.plan(split, per_class)
        with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
            audio = np.stack(list(pool.map(lambda u: speech.render(u, espeak), items)))
        mel = log_mel(audio)
        labels = np.array([u.label for u in items], dtype=np.int64)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz.tmp")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, log_mel=mel, labels=labels)
        os.replace(tmp, path)  # whole, or not there: concurrent builds never read half a file
    return {input_name: np.ascontiguousarray(mel), "label": labels}


def log_mel(audio: np.ndarray) -> np.ndarray:
    """(N, 16000) audio -> (N, 49, 40) float32 log mel energies, as edgeflow.speech.mfcc
    computes them before its DCT: Hann-windowed 40 ms frames every 20 ms, power spectrum, 40
    mel bands (20 Hz-4 kHz), natural log."""
    from edgeflow import speech

    idx = np.arange(speech.FRAME)[None, :] + speech.HOP * np.arange(speech.FRAMES)[:, None]
    frames = audio[:, idx] * np.hanning(speech.FRAME)
    power = np.abs(np.fft.rfft(frames, speech.NFFT)) ** 2
    return np.log(power @ speech.mel_filterbank().T + speech.LOG_FLOOR).astype(np.float32)


def paddle_style_onnx(seed: int = 0, channels: int = 8) -> Any:
    """image [-1, 1, 8, 8] -> Conv 3x3 + Relu -> Conv 3x3 stride 2 + Relu -> [-1, 2c, 4, 4],
    flattened as Paddle2ONNX writes it (Shape -> Gather(0) -> Unsqueeze -> Concat with [-1] ->
    Reshape) -> MatMul + Add -> logits [-1, 10]; opset 13, He-scaled random weights."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def he(*shape: int) -> np.ndarray:
        fan_in = int(np.prod(shape[1:])) if len(shape) == 4 else shape[0]
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    flat = 2 * channels * 16
    arrays = {
        "conv1.weight": he(channels, 1, 3, 3),
        "conv1.bias": (0.1 * rng.standard_normal(channels)).astype(np.float32),
        "conv2.weight": he(2 * channels, channels, 3, 3),
        "conv2.bias": (0.1 * rng.standard_normal(2 * channels)).astype(np.float32),
        "fc.weight": he(flat, 10),
        "fc.bias": (0.1 * rng.standard_normal(10)).astype(np.float32),
        "gather.index": np.array(0, np.int64),
        "unsqueeze.axes": np.array([0], np.int64),
        "reshape.rest": np.array([-1], np.int64),
    }
    node = helper.make_node
    nodes = [
        node("Conv", ["image", "conv1.weight", "conv1.bias"], ["c1"], pads=[1] * 4, name="conv1"),
        node("Relu", ["c1"], ["r1"], name="relu1"),
        node(
            "Conv",
            ["r1", "conv2.weight", "conv2.bias"],
            ["c2"],
            pads=[1] * 4,
            strides=[2, 2],
            name="conv2",
        ),
        node("Relu", ["c2"], ["r2"], name="relu2"),
        node("Shape", ["r2"], ["shape"], name="shape"),
        node("Gather", ["shape", "gather.index"], ["batch"], axis=0, name="gather"),
        node("Unsqueeze", ["batch", "unsqueeze.axes"], ["batch1"], name="unsqueeze"),
        node("Concat", ["batch1", "reshape.rest"], ["target"], axis=0, name="concat"),
        node("Reshape", ["r2", "target"], ["flat"], name="reshape"),
        node("MatMul", ["flat", "fc.weight"], ["fc"], name="fc"),
        node("Add", ["fc", "fc.bias"], ["logits"], name="fc_bias"),
    ]
    graph = helper.make_graph(
        nodes,
        "digits_paddle_style",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [-1, 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [-1, 10])],
        [numpy_helper.from_array(a, name) for name, a in arrays.items()],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="edgeflow.zoo.devmodels"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def train_prelu(out: Path, seed: int = 0, epochs: int = 40, lr: float = 3e-3) -> float:
    """Train DigitsPReLU on the digits' 'train' split (Adam, cosine schedule; a few seconds),
    save the state_dict, return top-1 accuracy on the 'test' split."""
    from edgeflow.datasets import sklearn_digits
    from edgeflow.zoo.digits import fit

    torch.use_deterministic_algorithms(True)
    train_set, test_set = sklearn_digits("train"), sklearn_digits("test")
    x, y = torch.from_numpy(train_set["image"]), torch.from_numpy(train_set["label"])
    model = DigitsPReLU(seed=seed)
    fit(model, x, y, epochs, lr, seed, cosine=True)
    model.eval()
    with torch.no_grad():
        pred = model(torch.from_numpy(test_set["image"])).argmax(1).numpy()
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out)
    return float(np.mean(pred == test_set["label"]))


def main(argv: list[str] | None = None) -> int:
    import onnx

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=["paddle_style", "prelu"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=40, help="prelu: training epochs")
    args = parser.parse_args(argv)
    if args.model == "prelu":
        torch.set_num_threads(1)  # bit-for-bit reproducible weights on any core count
        accuracy = train_prelu(args.out, args.seed, args.epochs)
        print(f"trained {args.out}: test top-1 {accuracy:.4f}")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(paddle_style_onnx(args.seed), str(args.out))
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
