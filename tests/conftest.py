"""Shared fixtures: the repository's demo recipe, a shared stage cache, recipe writers."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEMO_RECIPE = REPO / "recipes" / "digits_cnn.yaml"
DEMO_WEIGHTS = REPO / "models" / "digits_cnn.pt"


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One stage cache for the whole session, so the demo's export runs once."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def write_recipe(tmp_path: Path):
    """Write a recipe (dedented) into tmp_path and return its path."""

    def write(text: str, name: str = "recipe.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
        return path

    return write
