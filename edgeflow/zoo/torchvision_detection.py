"""torchvision detectors with random weights (nothing downloaded), for recipes and tests.

torchvision is not part of edgeflow's install; see docs/studies/ssdlite320/README.md for the
environment. With torchvision's default initialisation every one of ssdlite320's 300
detections has the same score (0.0110), which makes any comparison meaningless; `rerandomise`
gives weights whose detections are distinct and spread over many classes.
"""

from __future__ import annotations

from typing import Any

from edgeflow.core.errors import EdgeflowError


def ssdlite320(seed: int = 0, rerandomise: bool = True, **kwargs: Any) -> Any:
    """torchvision's ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None)."""
    import torch

    try:
        from torchvision.models.detection import ssdlite320_mobilenet_v3_large
    except ImportError as exc:
        raise EdgeflowError(
            f"the ssdlite320 model needs torchvision, which is not installed ({exc})",
            "install torch 2.14.1 and torchvision 0.29.1 in their own environment, as "
            "docs/detection.md shows (a plain `pip install torchvision` pulls a CUDA torch)",
        ) from exc

    torch.manual_seed(seed)
    model = ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, **kwargs)
    if rerandomise:
        rerandomise_ssd(model, seed)
    return model.eval()


def rerandomise_ssd(model: Any, seed: int) -> None:
    """Conv weights He-normal, BN affine weight in [0.5, 1.5] and bias ~ N(0, 0.1), BN running
    statistics set from a random batch (so activations stay in range), then the last conv of
    every head column scaled to output std 1."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Conv2d):
                std = (2 / module.weight[0].numel()) ** 0.5  # He-normal
                module.weight.copy_(torch.randn(module.weight.shape, generator=g) * std)
                if module.bias is not None:
                    module.bias.copy_(torch.randn(module.bias.shape, generator=g) * 0.1)
            elif isinstance(module, torch.nn.BatchNorm2d):
                module.weight.copy_(0.5 + torch.rand(module.weight.shape, generator=g))
                module.bias.copy_(torch.randn(module.bias.shape, generator=g) * 0.1)

        def calibrate(module: Any, args: tuple[Any, ...]) -> None:
            x = args[0]
            module.running_mean.copy_(x.mean(dim=(0, 2, 3)))
            module.running_var.copy_(x.var(dim=(0, 2, 3)) + 1e-3)

        bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
        handles = [m.register_forward_pre_hook(calibrate) for m in bns]
        batch = (torch.rand(4, 3, 320, 320, generator=g) - 0.5) / 0.5  # as the transform does
        model.eval()
        model.head(list(model.backbone(batch).values()))
        for handle in handles:
            handle.remove()
        features = list(model.backbone(batch).values())
        for head in (model.head.classification_head, model.head.regression_head):
            for column, f in zip(head.module_list, features, strict=True):
                last: Any = column[-1] if isinstance(column, torch.nn.Sequential) else column
                scale = 1.0 / column(f).std().clamp(min=1e-6)
                last.weight.mul_(scale)
                last.bias.mul_(scale)
