"""Shared set-up for the ssdlite320 study: the model with random weights (nothing downloaded),
re-randomised so detections are distinct, and deterministic inputs."""
from __future__ import annotations



import torch
import torchvision
from torchvision.models.detection import ssdlite320_mobilenet_v3_large


def build_model(rerandomise: bool = False, seed: int = 0, **kwargs) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, **kwargs)
    if rerandomise:
        rerandomise_(model, seed)
    return model.eval()


def rerandomise_(model: torch.nn.Module, seed: int) -> None:
    """Random init gives near-tied scores (all 300 scores of the default-init model are 0.0110);
    the study's re-randomisation now lives in edgeflow (used by recipes/ssdlite320.yaml)."""
    from edgeflow.zoo.torchvision_detection import rerandomise_ssd

    rerandomise_ssd(model, seed)


def inputs(seed: int, batch: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.rand(batch, 3, 320, 320, generator=g)


VERSIONS = f"torch {torch.__version__}, torchvision {torchvision.__version__}"
