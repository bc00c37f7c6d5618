"""The coverage benchmark's development set: third-party architectures with random weights.

`build(name)` makes one model of torchvision or timm with weights=None and then re-randomises
every parameter and buffer that its initialiser leaves constant (BatchNorm statistics and
affine terms, timm's layer-scale gammas at 1e-6, zero-initialised last norms), so that no
branch of the network is numerically dead and the comparison with the artifact means
something. Seeded: the same name gives the same weights in every process.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

TORCHVISION = ("mobilenet_v3_small", "resnet18", "shufflenet_v2_x0_5", "regnet_y_400mf")
SEGMENTATION = ("lraspp_mobilenet_v3_large",)
TIMM = ("convnext_atto", "levit_128s", "mobilevit_xxs")
MODELS = (*TORCHVISION, *SEGMENTATION, *TIMM)


class _Out(nn.Module):
    """torchvision's segmentation models return {"out": tensor}; export the tensor."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)["out"]


def build(name: str, seed: int = 0, image_size: int = 128) -> nn.Module:
    torch.manual_seed(seed)
    model: nn.Module
    if name in TORCHVISION:
        import torchvision.models as tvm

        model = getattr(tvm, name)(weights=None)
    elif name in SEGMENTATION:
        import torchvision.models.segmentation as seg

        model = _Out(getattr(seg, name)(weights=None, weights_backbone=None))
    elif name in TIMM:
        import timm

        kwargs: dict[str, Any] = {"pretrained": False}
        if name.startswith(("levit", "mobilevit")):
            kwargs["img_size"] = image_size
        model = timm.create_model(name, **kwargs)
    else:
        raise ValueError(f"unknown model '{name}' (have: {', '.join(MODELS)})")
    rerandomise(model, seed)
    return model.eval()


@torch.no_grad()
def rerandomise(model: nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed + 1)
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if not tensor.is_floating_point() or tensor.numel() == 0:
            continue
        noise = torch.randn(tensor.shape, generator=generator)
        if name.endswith("running_var"):
            tensor.copy_(0.5 + torch.rand(tensor.shape, generator=generator))
        elif name.endswith("running_mean"):
            tensor.copy_(0.1 * noise)
        elif tensor.numel() == 1 or float(tensor.std()) == 0.0:  # a constant initialisation
            if float(tensor.flatten()[0]) == 0.0:  # biases
                tensor.copy_(0.1 * noise)
            else:  # norm weights (1), layer scales (timm: 1e-6)
                tensor.copy_(0.5 + torch.rand(tensor.shape, generator=generator))
