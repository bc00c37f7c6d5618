"""Static-shape replacements for torchvision's detection models (for ast.replace_method).

`SSD_FORWARD` replaces `torchvision.models.detection.ssd.SSD.forward` (torchvision 0.29.1;
ssd300_vgg16 and ssdlite320_mobilenet_v3_large) for inference on the recipe's declared input
`[B, 3, H, W]`. It computes what the eager model computes, with every shape fixed:

- `GeneralizedRCNNTransform` becomes `(images - mean) / std`: with `fixed_size` equal to the
  input size the bilinear resize is the identity and batching pads nothing (`check` refuses
  any other configuration);
- the anchors are a constant buffer, computed once by the model's own `DefaultBoxGenerator`;
- `postprocess_detections` keeps all anchors per class with `-inf` scores below
  `score_thresh` (instead of boolean-mask indexing, which exports as NonZero), takes a static
  `topk(topk_candidates)` per class, and runs `edgeflow.ops.static.batched_nms_fixed` with
  `strategy="per_class"` (what `batched_nms` does on CPU above 1,000 boxes; the coordinate
  trick loses IoU precision in float32 at 90 classes x 320 px);
- `transform.postprocess` is a multiplication by 1.0 for an unresized image: dropped.

Output: `boxes [B, D, 4]`, `scores [B, D]`, `labels [B, D]` (int64), `valid [B, D]` (bool),
D = `detections_per_img`; invalid rows are zeros. The valid rows equal the eager model's
detections in the same order (tested bit for bit in PyTorch, docs/studies/ssdlite320).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgeflow.rules.ast.methods import Replacement
from edgeflow.rules.base import RewriteContext

if TYPE_CHECKING:
    from torch import Tensor


def ssd_forward(self: Any, images: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """SSD inference with static shapes: images [B, 3, H, W] in [0, 1] -> (boxes [B, D, 4],
    scores [B, D], labels [B, D], valid [B, D]). Written by edgeflow for export."""
    x = (images - self._edgeflow_image_mean) / self._edgeflow_image_std
    features = self.backbone(x)
    features = list(features.values()) if isinstance(features, dict) else [features]
    head = self.head(features)
    return ssd_postprocess(self, head["bbox_regression"], head["cls_logits"])


def ssd_postprocess(
    ssd: Any, bbox_regression: Tensor, cls_logits: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`SSD.postprocess_detections` + `transform.postprocess` with static shapes."""
    import torch

    per_image = [
        _one_image(ssd, bbox_regression[b], cls_logits[b])
        for b in range(ssd._edgeflow_batch)  # the declared batch size: unrolled
    ]
    boxes, scores, labels, valid = (torch.stack(parts) for parts in zip(*per_image, strict=True))
    return boxes, scores, labels, valid


def _one_image(ssd: Any, regression: Tensor, logits: Tensor) -> tuple[Tensor, ...]:
    import torch
    import torch.nn.functional as F
    from torchvision.ops import boxes as box_ops

    from edgeflow.ops.static import batched_nms_fixed

    boxes = ssd.box_coder.decode_single(regression, ssd._edgeflow_anchors)
    boxes = box_ops.clip_boxes_to_image(boxes, ssd._edgeflow_image_size)
    scores = F.softmax(logits, dim=-1)
    # Python ints from prepare_ssd, not from traced shapes: tracers record no branch on them.
    num_anchors, num_classes = ssd._edgeflow_anchors_count, ssd._edgeflow_classes
    threshold = float(ssd.score_thresh)
    # Per class, eager does `score[score > thresh]` then topk(min(k, count)): the same top
    # candidates come out of a static topk over scores masked to -inf, plus a validity mask.
    class_scores = scores[:, 1:].t()  # [C - 1, A]
    masked = torch.where(class_scores > threshold, class_scores, float("-inf"))
    k = min(int(ssd.topk_candidates), num_anchors)
    top_scores, top_idx = masked.topk(k, dim=1)  # [C - 1, k], per class in score order
    cand_scores = top_scores.reshape(-1)
    cand_valid = cand_scores > threshold
    cand_boxes = boxes.index_select(0, top_idx.reshape(-1))
    cand_labels = torch.arange(1, num_classes, device=boxes.device).repeat_interleave(k)
    keep, keep_valid = batched_nms_fixed(
        cand_boxes,
        cand_scores,
        cand_labels,
        float(ssd.nms_thresh),
        int(ssd.detections_per_img),
        strategy="per_class",
    )
    # Invalid candidates score -inf, so NMS picks them only after every valid one: dropping
    # them afterwards leaves the valid detections exactly as eager computes them.
    safe = keep.clamp(min=0)
    valid = keep_valid & cand_valid.index_select(0, safe)
    out_boxes = torch.where(valid[:, None], cand_boxes.index_select(0, safe), 0.0)
    out_scores = torch.where(valid, cand_scores.index_select(0, safe), 0.0)
    out_labels = torch.where(valid, cand_labels.index_select(0, safe), 0)
    return out_boxes, out_scores, out_labels, valid


def _image_size(ctx: RewriteContext) -> tuple[int, int] | None:
    if len(ctx.inputs) != 1 or len(ctx.inputs[0].shape) != 4 or ctx.inputs[0].shape[1] != 3:
        return None
    return int(ctx.inputs[0].shape[2]), int(ctx.inputs[0].shape[3])


def check_ssd(ssd: Any, ctx: RewriteContext) -> list[str]:
    """Why the static forward would not compute what this SSD computes, if it would not."""
    from torchvision.models.detection.transform import GeneralizedRCNNTransform

    problems: list[str] = []
    size = _image_size(ctx)
    if size is None:
        return [
            "it needs the SSD as the recipe's model, with one declared input of shape "
            "[B, 3, H, W] (got " + ", ".join(str(s.shape) for s in ctx.inputs) + ")"
        ]
    if ctx.dynamic_batch:
        problems.append("the batch is unrolled: remove source.dynamic_batch")
    if ssd.training:
        problems.append("the model is in training mode")
    t = ssd.transform
    if type(t) is not GeneralizedRCNNTransform:
        problems.append(f"transform is a {type(t).__name__}, not a GeneralizedRCNNTransform")
        return problems
    # _resize_image_and_masks resizes to [fixed_size[1], fixed_size[0]] (height, width).
    resized = None if t.fixed_size is None else (t.fixed_size[1], t.fixed_size[0])
    if resized is None:
        problems.append("the transform resizes by min_size/max_size (no fixed_size)")
    elif resized != size:
        problems.append(
            f"the transform resizes images to (height, width) {resized}, not the declared "
            f"{size}: declare source.inputs as [B, 3, {resized[0]}, {resized[1]}] and resize "
            "before the model"
        )
    if size[0] % t.size_divisible or size[1] % t.size_divisible:
        problems.append(f"the transform pads to a multiple of {t.size_divisible}")
    return problems


def prepare_ssd(ssd: Any, ctx: RewriteContext) -> None:
    """Buffers for the static forward: normalisation constants, anchors, the image size."""
    import torch
    from torchvision.models.detection.image_list import ImageList

    size = _image_size(ctx)
    assert size is not None  # check_ssd ran first
    t = ssd.transform
    mean = torch.as_tensor(t.image_mean, dtype=torch.float32)[:, None, None]
    std = torch.as_tensor(t.image_std, dtype=torch.float32)[:, None, None]
    ssd.register_buffer("_edgeflow_image_mean", mean, persistent=False)
    ssd.register_buffer("_edgeflow_image_std", std, persistent=False)
    with torch.no_grad():
        dummy = torch.zeros(1, 3, *size)
        features = ssd.backbone((dummy - mean) / std)
        features = list(features.values()) if isinstance(features, dict) else [features]
        anchors = ssd.anchor_generator(ImageList(dummy, [size]), features)[0]
        classes = int(ssd.head(features)["cls_logits"].shape[-1])
    ssd.register_buffer("_edgeflow_anchors", anchors, persistent=False)
    ssd._edgeflow_image_size = size
    ssd._edgeflow_batch = int(ctx.inputs[0].shape[0])
    ssd._edgeflow_anchors_count = int(anchors.shape[0])
    ssd._edgeflow_classes = classes


SSD_FORWARD = Replacement(
    ssd_forward,
    # of SSD.forward in torchvision 0.29.1 (edgeflow.rules.ast.methods.source_sha256)
    source_sha256="b11d5df7b42fa7b5ebc9b49b989870017f1a11027371c40fadf521916202472c",
    written_for="torchvision 0.29.1",
    check=check_ssd,
    prepare=prepare_ssd,
)
