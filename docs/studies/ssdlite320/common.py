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
    """Random init gives near-tied scores (all 300 scores of the default-init model are 0.0110).
    Re-randomise with a fixed seed: conv weights He-normal, BN affine weight in [0.5, 1.5] and
    bias ~ N(0, 0.1), BN running statistics set from a calibration batch (so activations stay
    in range), then scale the class and box head outputs to std 3 and 1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Conv2d):
                fan_in = module.weight[0].numel()
                module.weight.copy_(torch.randn(module.weight.shape, generator=g) * (2.0 / fan_in) ** 0.5)
                if module.bias is not None:
                    module.bias.copy_(torch.randn(module.bias.shape, generator=g) * 0.1)
            elif isinstance(module, torch.nn.BatchNorm2d):
                module.weight.copy_(0.5 + torch.rand(module.weight.shape, generator=g))
                module.bias.copy_(torch.randn(module.bias.shape, generator=g) * 0.1)

        def calibrate(module, args):
            x = args[0]
            module.running_mean.copy_(x.mean(dim=(0, 2, 3)))
            module.running_var.copy_(x.var(dim=(0, 2, 3)) + 1e-3)

        handles = [m.register_forward_pre_hook(calibrate) for m in model.modules()
                   if isinstance(m, torch.nn.BatchNorm2d)]
        calib = (torch.rand(4, 3, 320, 320, generator=g) - 0.5) / 0.5  # as model.transform does
        model.eval()
        model.backbone(calib)  # BN statistics of the backbone and extra layers
        features = list(model.backbone(calib).values())
        model.head(features)  # head BNs
        for h in handles:
            h.remove()
        features = list(model.backbone(calib).values())
        for head, target in ((model.head.classification_head, 1.0), (model.head.regression_head, 1.0)):
            for module, f in zip(head.module_list, features):
                last = module[-1] if isinstance(module, torch.nn.Sequential) else module
                out = module(f)
                scale = target / out.std().clamp(min=1e-6)
                last.weight.mul_(scale)
                last.bias.mul_(scale)


def inputs(seed: int, batch: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.rand(batch, 3, 320, 320, generator=g)


VERSIONS = f"torch {torch.__version__}, torchvision {torchvision.__version__}"
