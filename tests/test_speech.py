"""The keyword-spotting data (edgeflow.speech behind edgeflow.datasets:synthetic_keywords):
classes, shapes, speakers kept apart per split, determinism, the cache, the MFCC arithmetic,
and the error when espeak-ng is missing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgeflow import speech
from edgeflow.core.errors import EdgeflowError
from edgeflow.datasets import synthetic_keywords
from tests import needs

needs_espeak = needs.mark("espeak-ng")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EDGEFLOW_DATA_CACHE", str(tmp_path / "keywords"))
    return tmp_path / "keywords"


def test_classes_and_split_speakers() -> None:
    assert speech.CLASSES[:2] == ("silence", "unknown") and len(speech.CLASSES) == 12
    voices = {s: set(speech.split_variants(s)) for s in ("train", "calibration", "test")}
    assert {s: len(v) for s, v in voices.items()} == {"train": 66, "calibration": 10, "test": 22}
    assert not voices["train"] & voices["test"]
    assert not voices["train"] & voices["calibration"]
    assert not voices["calibration"] & voices["test"]
    assert set().union(*voices.values()) == set(speech.VARIANTS)


def test_plan_is_balanced_shuffled_and_holds_out_unknown_words() -> None:
    train, test = speech.plan("train", 40), speech.plan("test", 40)
    assert np.bincount([u.label for u in train]).tolist() == [40] * 12
    assert [u.label for u in train[:12]] != sorted(u.label for u in train[:12])  # shuffled
    assert {u.word for u in train if u.label == 0} == {None}
    assert {u.word for u in train if u.label >= 2} == set(speech.KEYWORDS)
    unknown = {u.word for u in test if u.label == 1}
    assert unknown & set(speech.UNSEEN_UNKNOWN_WORDS)
    assert not {u.word for u in train} & set(speech.UNSEEN_UNKNOWN_WORDS)
    variants = {u.voice.split("+")[1] for u in test}
    assert variants <= set(speech.split_variants("test"))
    assert speech.plan("test", 40) == test  # the same plan on every call
    assert all(110 <= u.rate <= 230 and 15 <= u.pitch <= 85 for u in train)


def test_mfcc_of_digital_silence_and_a_tone() -> None:
    quiet = speech.mfcc(np.zeros((1, speech.CLIP)))
    assert quiet.shape == (1, 49, 10) and quiet.dtype == np.float32
    # log(1e-6) in all 40 bands: the orthonormal DCT puts sqrt(40) * log(1e-6) in c0 only.
    np.testing.assert_allclose(quiet[0, :, 0], np.sqrt(40) * np.log(1e-6), rtol=1e-6)
    np.testing.assert_allclose(quiet[0, :, 1:], 0.0, atol=1e-4)
    t = np.arange(speech.CLIP) / speech.SAMPLE_RATE
    tone = speech.mfcc(0.5 * np.sin(2 * np.pi * 1000 * t)[None])
    assert tone[0, :, 0].min() > quiet[0, 0, 0] + 20  # the bands round 1 kHz lift c0
    np.testing.assert_allclose(tone[0], np.tile(tone[0, 24], (49, 1)), atol=1e-3)  # a steady tone
    dct = speech.dct_matrix()
    np.testing.assert_allclose(dct @ dct.T, np.eye(10), atol=1e-12)
    bank = speech.mel_filterbank()
    assert bank.shape == (40, 513) and np.all(bank.max(1) > 0.5)
    freqs = np.fft.rfftfreq(speech.NFFT, 1 / speech.SAMPLE_RATE)
    assert 20 <= freqs[bank[0].argmax()] < 80 and 3700 < freqs[bank[-1].argmax()] < 4000


def test_colored_noise_has_unit_rms_and_its_slope() -> None:
    rng = np.random.default_rng(0)
    for kind, low_over_high in (("white", (0.5, 2.0)), ("pink", (10, 1e3)), ("brown", (1e3, 1e6))):
        noise = speech.colored_noise(kind, rng)
        assert np.sqrt(np.mean(noise**2)) == pytest.approx(1.0)
        power = np.abs(np.fft.rfft(noise)) ** 2
        ratio = power[50:500].mean() / power[5000:8000].mean()  # 50-500 Hz over 5-8 kHz
        assert low_over_high[0] < ratio < low_over_high[1], (kind, ratio)


def test_missing_espeak_names_the_install_command(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(speech.shutil, "which", lambda name: None)
    with pytest.raises(EdgeflowError) as info:
        synthetic_keywords("test", per_class=1)
    assert "espeak-ng" in info.value.message
    assert info.value.hint is not None and "apt-get install -y espeak-ng" in info.value.hint


def test_unknown_split() -> None:
    with pytest.raises(ValueError, match="unknown split 'val'"):
        synthetic_keywords("val")


@needs_espeak
def test_dataset_shapes_determinism_and_cache(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = synthetic_keywords("calibration", per_class=4)
    assert data["mfcc"].shape == (48, 1, 49, 10) and data["mfcc"].dtype == np.float32
    assert data["label"].dtype == np.int64
    assert np.bincount(data["label"]).tolist() == [4] * 12
    assert data["label"].tolist() == [u.label for u in speech.plan("calibration", 4)]
    assert np.isfinite(data["mfcc"]).all()
    # speech carries more energy (c0) than the silence class's noise
    c0 = data["mfcc"][:, 0, :, 0].max(1)
    assert np.median(c0[data["label"] >= 2]) > np.median(c0[data["label"] == 0]) + 20
    [cached] = cache.glob("calibration-4-*.npz")

    monkeypatch.setenv("EDGEFLOW_DATA_CACHE", str(tmp_path / "elsewhere"))
    again = synthetic_keywords("calibration", per_class=4)  # made anew: the same numbers
    np.testing.assert_array_equal(again["mfcc"], data["mfcc"])
    np.testing.assert_array_equal(again["label"], data["label"])

    monkeypatch.setenv("EDGEFLOW_DATA_CACHE", str(cache))
    monkeypatch.setattr(speech, "speak", _no_synthesis)
    hit = synthetic_keywords("calibration", per_class=4)  # from the cache, no espeak-ng run
    np.testing.assert_array_equal(hit["mfcc"], data["mfcc"])
    assert cached.exists() and not list(cache.glob("*.tmp"))


def _no_synthesis(*args: object) -> np.ndarray:
    raise AssertionError("synthesized although the split was cached")


@needs_espeak
def test_splits_differ_and_speech_sits_inside_the_window(cache: Path) -> None:
    item = next(u for u in speech.plan("test", 2) if u.word == "stop")
    audio = speech.render(item, needs.command("espeak-ng"))
    assert audio.shape == (speech.CLIP,) and audio.dtype == np.float32
    assert np.abs(audio).max() <= 1.0
    peak_db = 20 * np.log10(np.abs(audio).max())
    assert peak_db == pytest.approx(item.gain_db, abs=3.0)  # the planned level, plus noise
    a = synthetic_keywords("test", per_class=2)["mfcc"]
    b = synthetic_keywords("calibration", per_class=2)["mfcc"]
    assert a.shape == b.shape and not np.allclose(a, b)
