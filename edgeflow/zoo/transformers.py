"""Development transformers for conversion coverage (issue 35): attention, LayerNorm, GELU and
token inputs as small edge transformers have them, built in code, for tests and for the
recipes that ship them (recipes/sentence_encoder.yaml, vit_digits.yaml, keyword_attention.yaml).

- `SentenceEncoder`: a BERT-style sentence embedder as packages ship them: int64 `input_ids`
  and `attention_mask`, token + position embeddings, post-LN encoder layers with erf GELU, the
  additive mask `(1 - m) * finfo.min`, masked mean pooling and an L2 normalisation. Trained in
  seconds by contrast over the sentences of `token_sentences` (each sentence against its
  perturbed copy, the other sentences of the batch as negatives).
- `ViTTiny`: a ViT-tiny-style classifier of 8x8 digits: 2x2 patches by a strided Conv, a class
  token, pre-LN layers, trained in seconds.
- `KeywordAttention`: a keyword spotter over log mel frames (edgeflow.zoo.devmodels:
  keyword_log_mel): a strided Conv1d front end, pre-LN attention layers, mean pooling over
  time, logits; trained in about a minute (the data needs espeak-ng).

`python -m edgeflow.zoo.transformers {sentence,vit,keywords} --out models/<name>.pt` writes the
trained state_dicts that the recipes read (stages `train_sentence_encoder`, `train_vit_digits`
and `train_keyword_attention` of this repository's dvc.yaml). The same seed gives the same
weights in every process; building a model leaves torch's global generator as it was.
"""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from edgeflow.zoo.devmodels import LOG_MEL_MEAN, LOG_MEL_STD


class Attention(nn.Module):
    """Multi-head self-attention with one fused q/k/v projection (Split), scores scaled by
    1/sqrt(head width), an optional additive bias on them, Softmax on the last axis."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        b, t, h = x.shape
        d = h // self.heads
        q, k, v = (
            part.view(b, t, self.heads, d).transpose(1, 2) for part in self.qkv(x).split(h, -1)
        )
        scores = torch.matmul(q, k.transpose(-1, -2)) / (d**0.5)
        if bias is not None:
            scores = scores + bias
        ctx = torch.matmul(scores.softmax(dim=-1), v).transpose(1, 2).reshape(b, t, h)
        return self.out(ctx)


class Block(nn.Module):
    """An encoder layer: attention and a GELU (erf) feed-forward, each with a residual and a
    LayerNorm after it (post-LN, BERT) or before it (pre-LN, ViT)."""

    def __init__(self, hidden: int, heads: int, ffn: int, pre_norm: bool) -> None:
        super().__init__()
        self.pre_norm = pre_norm
        self.attn = Attention(hidden, heads)
        self.ln1 = nn.LayerNorm(hidden)
        self.ff1 = nn.Linear(hidden, ffn)
        self.ff2 = nn.Linear(ffn, hidden)
        self.ln2 = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.attn(self.ln1(x), bias)
            return x + self.ff2(F.gelu(self.ff1(self.ln2(x))))
        x = self.ln1(x + self.attn(x, bias))
        return self.ln2(x + self.ff2(F.gelu(self.ff1(x))))


class SentenceEncoder(nn.Module):
    """input_ids, attention_mask [batch, T] int64 (T <= length) -> token + position embeddings
    (positions from arange(T)), LayerNorm -> post-LN layers, the padding masked by the additive
    bias (1 - mask) * finfo.min on the scores -> the mean over unmasked tokens -> x / ||x||_2:
    a unit-length sentence embedding [batch, hidden]."""

    def __init__(
        self,
        vocab: int = 1000,
        length: int = 32,
        hidden: int = 64,
        heads: int = 4,
        layers: int = 2,
        ffn: int = 256,
        seed: int = 0,
    ) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.tok = nn.Embedding(vocab, hidden)
            self.pos = nn.Embedding(length, hidden)
            self.ln = nn.LayerNorm(hidden)
            self.layers = nn.ModuleList(Block(hidden, heads, ffn, False) for _ in range(layers))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        x = self.ln(self.tok(input_ids) + self.pos(positions))
        keep = attention_mask.to(x.dtype)
        bias = (1.0 - keep[:, None, None, :]) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, bias)
        m = keep.unsqueeze(-1)
        pooled = (x * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, p=2, dim=1)


class ViTTiny(nn.Module):
    """image [batch, 1, 8, 8] -> patch x patch patches by a strided Conv -> a class token
    (expanded to the batch) before them, learned position embeddings -> pre-LN layers -> the
    class token's LayerNorm -> logits [batch, num_classes]."""

    def __init__(
        self,
        num_classes: int = 10,
        image: int = 8,
        patch: int = 2,
        hidden: int = 64,
        heads: int = 4,
        layers: int = 2,
        ffn: int = 256,
        seed: int = 0,
    ) -> None:
        super().__init__()
        tokens = (image // patch) ** 2 + 1
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.patches = nn.Conv2d(1, hidden, patch, stride=patch)
            self.cls = nn.Parameter(nn.init.trunc_normal_(torch.empty(1, 1, hidden), std=0.02))
            self.pos = nn.Parameter(nn.init.trunc_normal_(torch.empty(1, tokens, hidden), std=0.02))
            self.layers = nn.ModuleList(Block(hidden, heads, ffn, True) for _ in range(layers))
            self.norm = nn.LayerNorm(hidden)
            self.head = nn.Linear(hidden, num_classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.patches(image).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x[:, 0]))


class KeywordAttention(nn.Module):
    """log_mel [batch, 49, 40] -> centred and scaled -> Conv1d over time (kernel 3, stride 2:
    25 steps of 40 ms), GELU, learned position embeddings -> pre-LN layers -> LayerNorm -> the
    mean over time -> logits [batch, num_classes]."""

    def __init__(
        self,
        num_classes: int = 12,
        mels: int = 40,
        frames: int = 49,
        hidden: int = 64,
        heads: int = 4,
        layers: int = 2,
        ffn: int = 128,
        seed: int = 0,
    ) -> None:
        super().__init__()
        steps = (frames - 1) // 2 + 1
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.front = nn.Conv1d(mels, hidden, 3, stride=2, padding=1)
            self.pos = nn.Parameter(nn.init.trunc_normal_(torch.empty(1, steps, hidden), std=0.02))
            self.layers = nn.ModuleList(Block(hidden, heads, ffn, True) for _ in range(layers))
            self.norm = nn.LayerNorm(hidden)
            self.head = nn.Linear(hidden, num_classes)

    def forward(self, log_mel: torch.Tensor) -> torch.Tensor:
        x = (log_mel - LOG_MEL_MEAN) / LOG_MEL_STD
        x = F.gelu(self.front(x.transpose(1, 2))).transpose(1, 2) + self.pos
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x).mean(dim=1))


# --- token sentences: realistic text that ships with Python itself ---

# Pure-Python standard-library modules whose docstrings (the module's, and those of its public
# functions, classes and methods) are the text: the same on every machine that runs the same
# Python minor version, and defined alike on every platform (tempfile, for one, is not).
DOC_MODULES = (
    "argparse", "bisect", "calendar", "collections", "configparser", "contextlib", "copy",
    "csv", "dataclasses", "difflib", "email.message", "enum", "fractions", "functools",
    "gettext", "glob", "heapq", "hmac", "inspect", "ipaddress", "json", "json.decoder",
    "json.encoder", "logging", "logging.handlers", "mimetypes", "pathlib", "pprint", "queue",
    "random", "sched", "shlex", "smtplib", "statistics", "string", "tarfile",
    "textwrap", "threading", "tokenize", "traceback", "unittest.case", "urllib.parse",
    "uuid", "warnings", "weakref", "xml.dom.minidom", "zipfile",
)  # fmt: skip
VOCAB = 1000
PAD, UNK, CLS, SEP = 0, 1, 2, 3  # ids 4.. are words, most frequent first
LENGTH = 32  # tokens per sequence, [CLS] and [SEP] included
MIN_TOKENS = 9  # an original sentence's shortest; its perturbed copy has one token less
PAIRED = 64  # the test split: 64 sentences, then their perturbed copies in reverse order
SPLITS = ("train", "calibration", "test")
CALIBRATION = 256
DATA_SEED = 0


@functools.lru_cache(maxsize=1)
def sentences() -> tuple[tuple[str, ...], ...]:
    """The docstrings of DOC_MODULES as sentences of lower-case words (runs of a-z), those of
    at least MIN_TOKENS - 2 words, each once, in module and definition order."""
    import importlib
    import inspect
    import re
    import sys

    if sys.flags.optimize >= 2:
        raise RuntimeError("python -OO strips the docstrings this dataset reads: run without -OO")
    texts: list[str] = []
    for name in DOC_MODULES:
        module = importlib.import_module(name)
        texts.append(module.__doc__ or "")
        for attr, obj in vars(module).items():
            if attr.startswith("_") or getattr(obj, "__module__", None) != name:
                continue
            if inspect.isfunction(obj) or inspect.isclass(obj):
                texts.append(obj.__doc__ or "")
            if inspect.isclass(obj):
                texts += [
                    f.__doc__ or ""
                    for n, f in vars(obj).items()
                    if not n.startswith("_") and inspect.isfunction(f)
                ]
    found: dict[tuple[str, ...], None] = {}
    for text in texts:
        prose = " ".join(
            line for line in text.splitlines() if not line.strip().startswith((">>>", "..."))
        )
        for sentence in re.split(r"(?<=[.!?])\s+", prose):
            words = tuple(re.findall(r"[a-z]+", sentence.lower()))
            if len(words) >= MIN_TOKENS - 2:
                found.setdefault(words)
    return tuple(found)


@functools.lru_cache(maxsize=1)
def vocabulary() -> dict[str, int]:
    """word -> id: the VOCAB - 4 most frequent words of all the sentences (ties in alphabetical
    order) as ids 4.., after [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3."""
    from collections import Counter

    counts = Counter(word for words in sentences() for word in words)
    ranked = sorted(counts, key=lambda w: (-counts[w], w))[: VOCAB - 4]
    return {word: 4 + i for i, word in enumerate(ranked)}


def tokenize(words: tuple[str, ...] | list[str], length: int = LENGTH) -> list[int]:
    """[CLS] word ids [SEP], truncated to `length` tokens as BERT tokenizers do (the [SEP]
    kept); a word outside the vocabulary is [UNK]."""
    vocab = vocabulary()
    ids = [vocab.get(w, UNK) for w in words][: length - 2]
    return [CLS, *ids, SEP]


def perturb(ids: list[int], rng: np.random.Generator) -> list[int]:
    """A near copy of a tokenized sentence: one word dropped, then two neighbouring words
    swapped ([CLS] and [SEP] stay)."""
    words = ids[1:-1]
    del words[int(rng.integers(len(words)))]
    at = int(rng.integers(len(words) - 1))
    words[at], words[at + 1] = words[at + 1], words[at]
    return [ids[0], *words, ids[-1]]


@functools.lru_cache(maxsize=1)
def distinct() -> tuple[tuple[str, ...], ...]:
    """The sentences whose tokens (at LENGTH) no earlier sentence has: no two splits share a
    sequence, though two sentences may differ only in words outside the vocabulary."""
    seen: dict[tuple[int, ...], tuple[str, ...]] = {}
    for words in sentences():
        seen.setdefault(tuple(tokenize(words)), words)
    return tuple(seen.values())


def split_sentences(split: str, length: int = LENGTH) -> list[list[int]]:
    """The tokenized sentences of a split, unpadded: the sentences shuffled once (seed
    DATA_SEED), test the first PAIRED, calibration the next CALIBRATION, train the rest."""
    if split not in SPLITS:
        raise ValueError(f"unknown split '{split}' (choose {', '.join(SPLITS)})")
    if length < MIN_TOKENS:
        raise ValueError(f"length must be at least {MIN_TOKENS} tokens (got {length})")
    every = distinct()
    order = np.random.default_rng(DATA_SEED).permutation(len(every))
    bounds = {
        "test": (0, PAIRED),
        "calibration": (PAIRED, PAIRED + CALIBRATION),
        "train": (PAIRED + CALIBRATION, len(every)),
    }
    start, stop = bounds[split]
    return [tokenize(every[i], length) for i in order[start:stop]]


def token_sentences(split: str = "train", length: int = LENGTH) -> dict[str, np.ndarray]:
    """Tokenized sentences of Python's own documentation (DOC_MODULES' docstrings, a word-level
    vocabulary of VOCAB ids) as {'input_ids', 'attention_mask': (N, length) int64}, padded with
    id 0 and mask 0; 8 to `length` tokens each, [CLS] and [SEP] included. Splits: train
    (the rest: 2,055 on Python 3.11), calibration (256) and test: PAIRED sentences, then a copy
    of each perturbed (`perturb`, seed DATA_SEED) in reverse order, so that sample
    2 * PAIRED - 1 - i is the near copy of sample i (`sentence_pairs`)."""
    rows = split_sentences(split, length)
    if split == "test":
        rng = np.random.default_rng(DATA_SEED)
        rows = rows + [perturb(ids, rng) for ids in rows][::-1]
    input_ids = np.zeros((len(rows), length), np.int64)
    for i, ids in enumerate(rows):
        input_ids[i, : len(ids)] = ids
    return {"input_ids": input_ids, "attention_mask": (input_ids != PAD).astype(np.int64)}


def sentence_pairs() -> list[tuple[int, int]]:
    """The test split's retrieval pairs: (sentence i, its perturbed copy), as the recipe's
    evaluation.outputs.sentence.pairs lists them."""
    return [(i, 2 * PAIRED - 1 - i) for i in range(PAIRED)]


def pair_recall(model: nn.Module) -> float:
    """Of the test split's pairs, the fraction whose copy is the nearest of all other test
    samples to its sentence by cosine similarity (recall at 1)."""
    data = token_sentences("test")
    with torch.no_grad():
        e = model(torch.from_numpy(data["input_ids"]), torch.from_numpy(data["attention_mask"]))
    similar = e @ e.T
    similar.fill_diagonal_(-float("inf"))
    nearest = similar.argmax(1).numpy()
    return float(np.mean([nearest[q] == m for q, m in sentence_pairs()]))


# --- training ---


def train_sentence(
    out: Path, seed: int = 0, epochs: int = 5, lr: float = 1e-3, temperature: float = 0.05
) -> tuple[float, float]:
    """Contrastive training (InfoNCE, as SimCSE) on the train split: each sentence against a
    fresh perturbed copy, the other sentences of its batch of 64 as negatives; saves the
    state_dict; returns the test pairs' recall at 1 of the seeded random and of the trained
    model."""
    torch.use_deterministic_algorithms(True)
    model = SentenceEncoder(seed=seed).eval()
    before = pair_recall(model)
    rows = split_sentences("train")
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)

    def batch(items: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.zeros(len(items), LENGTH, dtype=torch.int64)
        for i, row in enumerate(items):
            ids[i, : len(row)] = torch.tensor(row)
        return ids, (ids != PAD).to(torch.int64)

    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(rows), generator=gen).split(64):
            if len(idx) < 2:
                continue
            a = model(*batch([rows[i] for i in idx]))
            b = model(*batch([perturb(rows[i], rng) for i in idx]))
            logits = a @ b.T / temperature
            target = torch.arange(len(idx))
            loss = (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2
            opt.zero_grad()
            loss.backward()
            opt.step()
        sched.step()
    model.eval()
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out)
    return before, pair_recall(model)


def train_classifier(
    kind: str, out: Path, seed: int = 0, epochs: int = 30, lr: float = 1e-3
) -> float:
    """Train ViTTiny on the digits ('vit') or KeywordAttention on the keyword spotter's log mel
    frames ('keywords') on the 'train' split (Adam, cosine schedule), save the state_dict,
    return top-1 accuracy on the 'test' split."""
    from edgeflow.zoo.digits import fit

    torch.use_deterministic_algorithms(True)
    model: nn.Module
    if kind == "vit":
        from edgeflow.datasets import sklearn_digits

        train_set, test_set = sklearn_digits("train"), sklearn_digits("test")
        name, model = "image", ViTTiny(seed=seed)
    else:
        from edgeflow.zoo.devmodels import keyword_log_mel

        train_set, test_set = keyword_log_mel("train"), keyword_log_mel("test")
        name, model = "log_mel", KeywordAttention(seed=seed)
    x, y = torch.from_numpy(train_set[name]), torch.from_numpy(train_set["label"])
    fit(model, x, y, epochs, lr, seed, cosine=True)
    model.eval()
    with torch.no_grad():
        pred = model(torch.from_numpy(test_set[name])).argmax(1).numpy()
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out)
    return float(np.mean(pred == test_set["label"]))


# model -> (epochs, Adam's learning rate): measured to train to the figures in the docs
TRAINING = {"sentence": (5, 1e-3), "vit": (30, 1e-3), "keywords": (30, 2e-3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=sorted(TRAINING))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, help="training epochs (default: by model)")
    args = parser.parse_args(argv)
    epochs, lr = TRAINING[args.model]
    epochs = epochs if args.epochs is None else args.epochs
    start = time.perf_counter()
    torch.set_num_threads(1)  # bit-for-bit reproducible weights on any core count
    if args.model == "sentence":
        before, after = train_sentence(args.out, args.seed, epochs, lr)
        found = f"test pairs' recall at 1 {after:.4f} (seeded random weights {before:.4f})"
    else:
        accuracy = train_classifier(args.model, args.out, args.seed, epochs, lr)
        found = f"test top-1 {accuracy:.4f}"
    print(f"trained {args.out} in {time.perf_counter() - start:.1f} s: {found}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
