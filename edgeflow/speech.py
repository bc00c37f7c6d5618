"""Keyword-spotting data made on this machine: words spoken by espeak-ng in many voices, rates
and pitches, mixed with noise, as MFCC features (numpy only), cached on disk.

Twelve classes as in "Hello Edge" (Zhang et al., 2017) and the Speech Commands benchmark:
"silence" (noise only), "unknown" (other words) and ten keywords. Each split has its own
speakers: espeak-ng voice variants are dealt out once (fixed seed) into train, calibration and
test, so no test speaker is heard in training, and the test split's unknown words include five
that training never hears. Every sample's voice, rate, pitch, level, position in the 1 s
window and noise are drawn from a generator seeded by (split, class, index): the data are the
same on every call and every machine with the same espeak-ng.

espeak-ng must be installed (Debian: apt-get install -y espeak-ng), though it is imported by
nothing and run only when a split is not cached yet: the features land in $EDGEFLOW_DATA_CACHE
or ~/.cache/edgeflow/keywords, keyed by this file's content, the espeak-ng version and the
split's size (making the 4,800 training clips takes ~40 s on two cores).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeflow.core.errors import EdgeflowError

SAMPLE_RATE = 16_000
CLIP = SAMPLE_RATE  # one second
KEYWORDS = ("yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go")
CLASSES = ("silence", "unknown", *KEYWORDS)
UNKNOWN_WORDS = (
    "bed", "bird", "cat", "dog", "eight", "five", "four", "happy", "house", "marvin",
    "nine", "one", "seven", "sheila", "six", "three", "tree", "two", "wow", "zero",
)  # fmt: skip
UNSEEN_UNKNOWN_WORDS = ("backward", "forward", "follow", "learn", "visual")  # test split only
ACCENTS = (
    "en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-gb-x-gbclan", "en-gb-x-gbcwmd",
    "en-029", "en-us-nyc",
)  # fmt: skip
# espeak-ng 1.51's voice variants (voices/!v), less the whispered ones (no voiced sound to
# tell from noise) and "Mr serious" (a space in its name).
VARIANTS = (
    "Alex", "Alicia", "Andrea", "Andy", "Annie", "AnxiousAndy", "Demonic", "Denis", "Diogo",
    "Gene", "Gene2", "Henrique", "Hugo", "Jacky", "Lee", "Marco", "Mario", "Michael", "Mike",
    "Nguyen", "RicishayMax", "RicishayMax2", "RicishayMax3", "Storm", "Tweaky", "UniRobot",
    "adam", "anika", "anikaRobot", "announcer", "antonio", "aunty", "belinda", "benjamin",
    "boris", "caleb", "croak", "david", "ed", "edward", "edward2", "f1", "f2", "f3", "f4", "f5",
    "fast", "grandma", "grandpa", "gustave", "iven", "iven2", "iven3", "iven4", "john",
    "kaukovalta", "klatt", "klatt2", "klatt3", "klatt4", "klatt5", "klatt6", "linda", "m1",
    "m2", "m3", "m4", "m5", "m6", "m7", "m8", "marcelo", "max", "michel", "miguel", "norbert",
    "pablo", "paul", "pedro", "quincy", "rob", "robert", "robosoft", "robosoft2", "robosoft3",
    "robosoft4", "robosoft5", "robosoft6", "robosoft7", "robosoft8", "sandro", "shelby",
    "steph", "steph2", "steph3", "travis", "victor", "zac",
)  # fmt: skip
# How many of the shuffled variants each split takes, and its default samples per class.
SPLIT_VARIANTS = {"test": 22, "calibration": 10, "train": len(VARIANTS) - 32}
SPLIT_PER_CLASS = {"train": 400, "calibration": 30, "test": 100}
SPLIT_SEEDS = {"train": 1, "calibration": 2, "test": 3}
VARIANT_SEED = 17

# MFCC as in "Hello Edge": 40 ms frames every 20 ms (49 frames in 1 s), 40 mel bands from
# 20 Hz to 4 kHz, log, DCT-II, the first 10 coefficients.
FRAME, HOP, NFFT, MEL_BANDS, COEFFS = 640, 320, 1024, 40, 10
FRAMES = 1 + (CLIP - FRAME) // HOP
MEL_RANGE = (20.0, 4000.0)
LOG_FLOOR = 1e-6


def split_variants(split: str) -> tuple[str, ...]:
    """The voice variants that speak in `split` (disjoint across splits)."""
    _check_split(split)
    order = np.random.default_rng(VARIANT_SEED).permutation(len(VARIANTS))
    start = 0
    for name, count in SPLIT_VARIANTS.items():
        if name == split:
            return tuple(VARIANTS[i] for i in sorted(order[start : start + count]))
        start += count
    raise AssertionError(split)


@dataclass(frozen=True)
class Utterance:
    """One sample's recipe: what is said by whom, and how it is placed and mixed."""

    label: int
    word: str | None  # None: silence
    voice: str  # espeak-ng -v, "accent+variant"
    rate: int  # words per minute
    pitch: int  # 0..99
    gain_db: float  # speech peak level, dB below full scale
    offset: float  # 0..1: where the word sits in the window
    noise: str  # white | pink | brown
    snr_db: float  # speech-to-noise ratio; for silence, the noise level in dBFS


def plan(split: str, per_class: int) -> list[Utterance]:
    """Every sample of a split, in a fixed shuffled order (so a prefix covers all classes)."""
    variants = split_variants(split)
    unknown = UNKNOWN_WORDS + (UNSEEN_UNKNOWN_WORDS if split == "test" else ())
    items = []
    for label, name in enumerate(CLASSES):
        for i in range(per_class):
            rng = np.random.default_rng([SPLIT_SEEDS[split], label, i])
            word = {"silence": None, "unknown": str(rng.choice(unknown))}.get(name, name)
            items.append(
                Utterance(
                    label=label,
                    word=word,
                    voice=f"{rng.choice(ACCENTS)}+{rng.choice(variants)}",
                    rate=int(rng.integers(110, 231)),
                    pitch=int(rng.integers(15, 86)),
                    gain_db=float(rng.uniform(-30.0, 0.0)),
                    offset=float(rng.uniform()),
                    noise=str(rng.choice(["white", "pink", "brown"])),
                    snr_db=float(rng.uniform(-90.0, -35.0) if word is None else rng.uniform(5, 35)),
                )
            )
    order = np.random.default_rng(SPLIT_SEEDS[split]).permutation(len(items))
    return [items[i] for i in order]


def keywords(split: str, per_class: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(features (N, 49, 10) float32, labels (N,) int64) of a split, from the cache or made now."""
    _check_split(split)
    per_class = SPLIT_PER_CLASS[split] if per_class is None else per_class
    if per_class < 1:
        raise ValueError(f"per_class must be at least 1 (got {per_class})")
    espeak = _espeak()
    version = subprocess.run(
        [espeak, "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    key = hashlib.sha256(Path(__file__).read_bytes())
    key.update(f"{version}|{split}|{per_class}".encode())
    path = cache_dir() / f"{split}-{per_class}-{key.hexdigest()[:16]}.npz"
    if path.exists():
        with np.load(path, allow_pickle=False) as npz:
            return npz["features"], npz["labels"]
    items = plan(split, per_class)
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        audio = np.stack(list(pool.map(lambda u: render(u, espeak), items)))
    features = mfcc(audio)
    labels = np.array([u.label for u in items], dtype=np.int64)
    _save(path, features, labels)
    return features, labels


def cache_dir() -> Path:
    """Where made splits are kept: $EDGEFLOW_DATA_CACHE, else ~/.cache/edgeflow/keywords."""
    configured = os.environ.get("EDGEFLOW_DATA_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "edgeflow" / "keywords"


def render(u: Utterance, espeak: str) -> np.ndarray:
    """One second of 16 kHz float32 audio in [-1, 1]: the word placed and mixed with noise."""
    rng = np.random.default_rng(abs(hash_utterance(u)))
    clip = np.zeros(CLIP, np.float64)
    if u.word is not None:
        speech = _trim(speak(u.word, u.voice, u.rate, u.pitch, espeak))
        speech = speech[:CLIP] * (10 ** (u.gain_db / 20) / max(np.abs(speech).max(), 1e-9))
        start = round(u.offset * (CLIP - len(speech)))
        clip[start : start + len(speech)] = speech
        signal_rms = np.sqrt(np.mean(speech**2))
        noise_rms = signal_rms / 10 ** (u.snr_db / 20)
    else:
        noise_rms = 10 ** (u.snr_db / 20)
    clip += noise_rms * colored_noise(u.noise, rng)
    return np.clip(clip, -1.0, 1.0).astype(np.float32)


def hash_utterance(u: Utterance) -> int:
    """A stable 63-bit seed for a sample's noise (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256(repr(u).encode()).digest()[:8], "little") >> 1


def speak(word: str, voice: str, rate: int, pitch: int, espeak: str) -> np.ndarray:
    """espeak-ng's rendering of `word`, resampled to 16 kHz, float64 in [-1, 1]."""
    from scipy.signal import resample_poly

    cmd = [espeak, "-v", voice, "-s", str(rate), "-p", str(pitch), "--stdout", word]
    wav = subprocess.run(cmd, capture_output=True, check=True).stdout
    rate_hz, pcm = _parse_wav(wav)
    audio = pcm.astype(np.float64) / 32768.0
    if rate_hz != SAMPLE_RATE:
        g = np.gcd(rate_hz, SAMPLE_RATE)
        audio = resample_poly(audio, SAMPLE_RATE // g, rate_hz // g)
    return audio


def colored_noise(kind: str, rng: np.random.Generator) -> np.ndarray:
    """One second of unit-RMS white, pink (1/f) or brown (1/f^2) noise."""
    white = rng.standard_normal(CLIP)
    if kind != "white":
        spectrum = np.fft.rfft(white)
        f = np.fft.rfftfreq(CLIP, 1 / SAMPLE_RATE)
        f[0] = f[1]
        spectrum /= f ** (0.5 if kind == "pink" else 1.0)
        white = np.fft.irfft(spectrum, CLIP)
    return white / np.sqrt(np.mean(white**2))


def mfcc(audio: np.ndarray) -> np.ndarray:
    """(N, 16000) audio -> (N, 49, 10) float32 MFCC: Hann-windowed 40 ms frames every 20 ms,
    power spectrum, 40 mel bands (20 Hz-4 kHz), natural log, orthonormal DCT-II."""
    idx = np.arange(FRAME)[None, :] + HOP * np.arange(FRAMES)[:, None]
    frames = audio[:, idx] * np.hanning(FRAME)  # (N, 49, 640)
    power = np.abs(np.fft.rfft(frames, NFFT)) ** 2
    mel = np.log(power @ mel_filterbank().T + LOG_FLOOR)  # (N, 49, 40)
    return (mel @ dct_matrix().T).astype(np.float32)


def mel_filterbank() -> np.ndarray:
    """(40, 513) triangular filters on the mel scale (HTK formula)."""

    def to_mel(hz: np.ndarray) -> np.ndarray:
        return 2595.0 * np.log10(1.0 + hz / 700.0)

    low, high = to_mel(np.array(MEL_RANGE))
    edges_mel = np.linspace(low, high, MEL_BANDS + 2)
    edges = 700.0 * (10 ** (edges_mel / 2595.0) - 1.0)
    freqs = np.fft.rfftfreq(NFFT, 1 / SAMPLE_RATE)
    lower, center, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (freqs - lower) / (center - lower)
    falling = (upper - freqs) / (upper - center)
    return np.maximum(0.0, np.minimum(rising, falling))


def dct_matrix() -> np.ndarray:
    """(10, 40) orthonormal DCT-II rows: the first COEFFS cepstral coefficients."""
    n = np.arange(MEL_BANDS)
    k = np.arange(COEFFS)[:, None]
    basis = np.cos(np.pi * k * (2 * n + 1) / (2 * MEL_BANDS)) * np.sqrt(2.0 / MEL_BANDS)
    basis[0] /= np.sqrt(2.0)
    return basis


def _trim(audio: np.ndarray, floor_db: float = -40.0) -> np.ndarray:
    """The audio between the first and last sample above floor_db of its peak; a word longer
    than the window keeps its loudest second."""
    loud = np.flatnonzero(np.abs(audio) > np.abs(audio).max() * 10 ** (floor_db / 20))
    audio = audio[loud[0] : loud[-1] + 1] if len(loud) else audio
    if len(audio) > CLIP:
        energy = np.convolve(audio**2, np.ones(CLIP), mode="valid")
        start = int(np.argmax(energy))
        audio = audio[start : start + CLIP]
    return audio


def _parse_wav(data: bytes) -> tuple[int, np.ndarray]:
    """(sample rate, int16 samples) of espeak-ng's --stdout WAV, whose header gives no length."""
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise EdgeflowError("espeak-ng wrote no WAV audio", "run espeak-ng --stdout test by hand")
    rate = int.from_bytes(data[24:28], "little")
    start = data.find(b"data", 12) + 8
    body = data[start : start + (len(data) - start) // 2 * 2]
    return rate, np.frombuffer(body, "<i2")


def _espeak() -> str:
    found = shutil.which("espeak-ng")
    if found is None:
        raise EdgeflowError(
            "the keyword-spotting data are synthesized with espeak-ng, which is not installed",
            "install espeak-ng with apt-get install -y espeak-ng (Debian/Ubuntu)",
        )
    return found


def _check_split(split: str) -> None:
    if split not in SPLIT_SEEDS:
        raise ValueError(f"unknown split '{split}' (choose {', '.join(SPLIT_SEEDS)})")


def _save(path: Path, features: np.ndarray, labels: np.ndarray) -> None:
    """Write atomically, so concurrent builds never read a half-written file. A cache that
    cannot be written costs time, not correctness: it warns and goes on."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz.tmp")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, features=features, labels=labels)
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        warnings.warn(f"keyword data not cached in {path.parent}: {exc}", stacklevel=2)
