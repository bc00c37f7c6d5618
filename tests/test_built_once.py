"""A build's stages (load, rewrite, export) share one worker: the PyTorch module is built
there once and copied, and built again when its code, arguments or weights change."""

from __future__ import annotations

from pathlib import Path

import torch

from edgeflow import source as source_module
from edgeflow.recipe import find_recipe, load_recipe
from edgeflow.source import build_module


def test_the_module_is_built_once_and_copied(monkeypatch, tmp_path: Path) -> None:
    built = []
    real = source_module._build

    def counted(source, notes):
        built.append(source.init)
        return real(source, notes)

    monkeypatch.setattr(source_module, "_build", counted)
    monkeypatch.setattr(source_module, "_BUILT", {})
    demo = load_recipe(find_recipe("digits_cnn")).recipe.source
    first, second = build_module(demo), build_module(demo)
    assert len(built) == 1 and first is not second
    x = torch.randn(2, 1, 8, 8)
    assert torch.equal(first(x), second(x))
    second.classifier.weight.data.zero_()  # a rewrite changes its copy, never the next stage's
    assert torch.equal(build_module(demo)(x), first(x)) and len(built) == 1
    # other weights: built again
    state = {k: v + 1 for k, v in first.state_dict().items()}
    torch.save(state, tmp_path / "other.pt")
    other = demo.model_copy(update={"weights": tmp_path / "other.pt"})
    assert not torch.equal(build_module(other)(x), first(x)) and len(built) == 2
