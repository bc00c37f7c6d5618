"""Fixed seeds for the fx rule tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def seed() -> None:
    """Every test starts from the same random state (weights of the tiny models)."""
    import torch

    torch.manual_seed(0)
