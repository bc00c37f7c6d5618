"""A streaming keyword spotter, the development model of stateful conversion (source.state):
10 ms chunks of 16 kHz audio in, one GRU step per chunk with its state as an explicit input
and output, and a 0-D sample-rate input that selects the front end with an `If`.

A development model for conversion coverage: seeded random weights (nothing here is trained),
so its figures say how faithfully each target computes it, not how well it spots keywords.
Its data, `keyword_streams`, is the keyword demo's espeak-ng speech (edgeflow.speech) cut
into chunks: real audio, with the state ranges real sequences reach.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

CHUNK = 160  # samples per step: 10 ms at 16 kHz
STEPS = 100  # steps per one-second clip


class StreamingKeywordGRU(nn.Module):
    """Per chunk: a filter bank (linear 160 -> `bands`, one per sample rate, chosen by
    `torch.cond` on the 0-D `sample_rate`), log(1 + power) compression, a `layers`-layer GRU
    step from `state` [layers, batch, hidden], and a linear head over `classes`.

    forward(chunk [B, 160], state [layers, B, hidden], sample_rate []) -> (logits [B, classes],
    new_state [layers, B, hidden])."""

    def __init__(
        self, bands: int = 40, hidden: int = 64, layers: int = 2, classes: int = 12, seed: int = 0
    ) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.front_16k = nn.Linear(CHUNK, bands)
        self.front_8k = nn.Linear(CHUNK, bands)
        self.gru = nn.GRU(bands, hidden, num_layers=layers)
        self.head = nn.Linear(hidden, classes)

    def forward(
        self, chunk: torch.Tensor, state: torch.Tensor, sample_rate: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        bands = torch.cond(
            sample_rate == 16000,
            lambda x: self.front_16k(x),
            lambda x: self.front_8k(x),
            (chunk * 32.0,),  # audio in [-1, 1] to the filters' working range
        )
        features = torch.log(bands * bands + 1.0)  # log(1 + power): compressed, finite at 0
        out, new_state = self.gru(features[None], state)
        return self.head(out[0]), new_state


def keyword_streams(
    split: str = "test",
    per_class: int = 2,
    input_name: str = "chunk",
) -> dict[str, np.ndarray]:
    """One-second spoken keywords (edgeflow.speech: espeak-ng voices over noise) as sequences
    of `STEPS` chunks: {input_name: (N, 100, 160) float32 audio, 'label': (N,) int64 over
    edgeflow.speech.CLASSES}, N = 12 * per_class, the split's first utterances."""
    from edgeflow import speech

    items = speech.plan(split, per_class)
    espeak = speech._espeak()
    audio = np.stack([speech.render(u, espeak) for u in items])  # (N, 16000)
    labels = np.array([u.label for u in items], dtype=np.int64)
    return {input_name: audio.reshape(len(items), STEPS, CHUNK), "label": labels}
