"""(d) ssdlite320_mobilenet_v3_large as a static-shape model, with the code edgeflow ships.

The prototype written here became edgeflow/rules/ast/replacements/torchvision_detection.py,
the replacement for SSD.forward that `ast.replace_method` installs (recipes/ssdlite320.yaml);
this script now runs that code instead of a copy. check_ssd and prepare_ssd fit a copy of
the model to the declared [1, 3, 320, 320] input (normalisation constants and the anchors as
buffers); ssd_forward keeps torchvision's backbone and head (the same modules, the same
weights), replaces GeneralizedRCNNTransform with a fixed normalize, and SSD.postprocess_detections
plus transform.postprocess with ssd_postprocess, static shapes built on edgeflow.ops.static
(batched_nms_fixed). Exports to ONNX, checks the graph for NonZero/Loop/If/NonMaxSuppression,
runs it in onnxruntime and compares with the eager torchvision model.

    python static_ssd.py [torchscript|dynamo_noopt|dynamo ...]  -> out/static_ssd_<exporters>.json
"""
from __future__ import annotations

import copy
import json
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import Tensor, nn

from common import VERSIONS, build_model, inputs
from edgeflow.schema.sections import TensorSpec
from edgeflow.rules.ast.replacements.torchvision_detection import (
    check_ssd,
    prepare_ssd,
    ssd_forward,
    ssd_postprocess,
)
from edgeflow.rules.base import RewriteContext

OUT = Path(__file__).parent / "out"
FORBIDDEN = {"NonZero", "Loop", "If", "Scan", "NonMaxSuppression"}
SIZE = (320, 320)


class StaticPostprocess(nn.Module):
    """ssd_postprocess alone: head outputs [B, A, 4], [B, A, C] -> boxes [B, D, 4], scores
    [B, D], labels [B, D] (int64), valid [B, D] (bool); rows with valid=False are padding.
    Holds the attributes of the prepared SSD that ssd_postprocess reads, not its backbone
    and head, so that an export of it is the post-processing only."""

    READS = (
        "box_coder",
        "score_thresh",
        "nms_thresh",
        "detections_per_img",
        "topk_candidates",
        "_edgeflow_image_size",
        "_edgeflow_batch",
        "_edgeflow_anchors_count",
        "_edgeflow_classes",
    )

    def __init__(self, ssd: nn.Module) -> None:
        super().__init__()
        for name in self.READS:
            setattr(self, name, getattr(ssd, name))
        self.register_buffer("_edgeflow_anchors", ssd._edgeflow_anchors)

    def forward(self, bbox_regression: Tensor, cls_logits: Tensor) -> tuple[Tensor, ...]:
        return ssd_postprocess(self, bbox_regression, cls_logits)


class StaticSSDLite(nn.Module):
    """SSD with static shapes, as `ast.replace_method` makes it: [1, 3, 320, 320] images in
    [0, 1] -> boxes [1, D, 4], scores [1, D], labels [1, D] (int64), valid [1, D] (bool),
    D = detections_per_img. Rows with valid=False are padding (box 0, score 0, label 0)."""

    def __init__(self, ssd: nn.Module) -> None:
        super().__init__()
        self.ssd = copy.deepcopy(ssd)  # prepare_ssd adds buffers: keep the eager model as it was
        ctx = RewriteContext([TensorSpec(name="images", shape=[1, 3, *SIZE])])
        problems = check_ssd(self.ssd, ctx)
        assert not problems, problems
        prepare_ssd(self.ssd, ctx)
        self.postprocess = StaticPostprocess(self.ssd)

    def head_outputs(self, images: Tensor) -> tuple[Tensor, Tensor]:
        # ssd_forward up to the head: the normalize that replaces GeneralizedRCNNTransform for
        # a [1, 3, 320, 320] input (the resize to fixed_size is the identity, batching pads
        # nothing), backbone, head.
        x = (images - self.ssd._edgeflow_image_mean) / self.ssd._edgeflow_image_std
        head = self.ssd.head(list(self.ssd.backbone(x).values()))
        return head["bbox_regression"], head["cls_logits"]

    def forward(self, images: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return ssd_forward(self.ssd, images)


class BackboneHead(nn.Module):
    """Only what is kept from torchvision (normalize, backbone, head): to measure how far
    ONNX Runtime's convolutions drift from PyTorch's before any post-processing."""

    def __init__(self, static: StaticSSDLite) -> None:
        super().__init__()
        self.static = static

    def forward(self, images: Tensor) -> tuple[Tensor, Tensor]:
        return self.static.head_outputs(images)


def valid_detections(boxes, scores, labels, valid) -> list[tuple[int, float, np.ndarray]]:
    return [(int(labels[i]), float(scores[i]), np.asarray(boxes[i])) for i in range(len(valid)) if valid[i]]


def compare(eager: dict, got: list[tuple[int, float, np.ndarray]], box_tol=1e-3, score_tol=1e-4) -> dict:
    """Pair every eager detection with the unused detection of the same label whose box is
    closest (a set comparison: order among near-equal scores is free); count the pairs within
    box_tol / score_tol."""
    e_boxes, e_scores, e_labels = (eager[k].numpy() for k in ("boxes", "scores", "labels"))
    unused = set(range(len(got)))
    box_diffs, score_diffs, no_partner = [], [], 0
    for i in range(len(e_labels)):
        cands = [(float(np.abs(got[j][2] - e_boxes[i]).max()), j) for j in unused if got[j][0] == e_labels[i]]
        if not cands or min(cands)[0] > 0.1:
            no_partner += 1
            continue
        d, j = min(cands)
        unused.discard(j)
        box_diffs.append(d)
        score_diffs.append(abs(got[j][1] - float(e_scores[i])))
    within = sum(1 for d, sd in zip(box_diffs, score_diffs) if d <= box_tol and sd <= score_tol)
    same_position = sum(
        1 for i in range(min(len(e_labels), len(got)))
        if got[i][0] == e_labels[i] and float(np.abs(got[i][2] - e_boxes[i]).max()) <= box_tol
    )
    return {
        "eager_detections": int(len(e_labels)),
        "detections": len(got),
        "no_same_label_partner_within_0.1px": no_partner,
        "within_tol": within,
        "max_box_diff": max(box_diffs, default=0.0),
        "max_score_diff": max(score_diffs, default=0.0),
        "same_position": same_position,
        "eager_distinct_scores": int(np.unique(e_scores).size),
    }


def onnx_ops(path: Path) -> Counter:
    model = onnx.load(str(path))
    ops = Counter(n.op_type for n in model.graph.node)
    for n in model.graph.node:
        for a in n.attribute:
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else []) + list(a.graphs):
                ops.update(f"(sub){m.op_type}" for m in g.node)
    for f in model.functions:
        ops.update(f"(fn){m.op_type}" for m in f.node)
    return ops


def export(module: nn.Module, example: tuple, path: Path, exporter: str, names: tuple[list, list]) -> float:
    t0 = time.time()
    if exporter == "torchscript":
        torch.onnx.export(module, example, str(path), dynamo=False, opset_version=17,
                          input_names=names[0], output_names=names[1])
    else:
        torch.onnx.export(module, example, str(path), dynamo=True, external_data=False,
                          optimize=(exporter == "dynamo"), verbose=False,
                          input_names=names[0], output_names=names[1])
    return round(time.time() - t0, 1)


def describe(path: Path) -> dict:
    ops = onnx_ops(path)
    model_proto = onnx.load(str(path))
    return {
        "onnx_bytes": path.stat().st_size,
        "onnx_nodes": sum(ops.values()),
        "forbidden_ops": sorted(set(ops) & FORBIDDEN | {o for o in ops if o.startswith("(")}),
        "outputs": {o.name: [d.dim_value or d.dim_param for d in o.type.tensor_type.shape.dim]
                    for o in model_proto.graph.output},
        "ops": dict(ops.most_common()),
    }


OUTPUT_NAMES = ["boxes", "scores", "labels", "valid"]


def main() -> None:
    exporters = sys.argv[1:] or ["torchscript"]
    OUT.mkdir(exist_ok=True)
    result_path = OUT / f"static_ssd_{'_'.join(exporters)}.json"
    report: dict = {"versions": VERSIONS, "exporters": {}}
    t0 = time.time()
    eager_model = build_model(rerandomise=True, seed=0)
    static = StaticSSDLite(eager_model).eval()
    report["build_seconds"] = round(time.time() - t0, 1)
    seeds = list(range(8))
    with torch.no_grad():
        eager = [eager_model(inputs(s))[0] for s in seeds]
        heads = [static.head_outputs(inputs(s)) for s in seeds]
        t0 = time.time()
        static_out = [static(inputs(s)) for s in seeds]
        report["static_eager_seconds_per_image"] = round((time.time() - t0) / len(seeds), 3)
    # The static model in PyTorch against torchvision's eager model: exact (tolerance 0).
    report["static_pytorch_vs_torchvision"] = [
        compare(e, valid_detections(*(t[0] for t in out)), box_tol=0.0, score_tol=0.0)
        for e, out in zip(eager, static_out)
    ]
    print("static (PyTorch) vs torchvision:", json.dumps(report["static_pytorch_vs_torchvision"][0]), flush=True)

    # How far ONNX Runtime's backbone + head drift from PyTorch's (no post-processing).
    path = OUT / "backbone_head.onnx"
    export(BackboneHead(static).eval(), (inputs(0),), path, "torchscript", (["images"], ["regression", "logits"]))
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    drift = {"regression": 0.0, "logits": 0.0}
    for s, (reg, logit) in zip(seeds, heads):
        r, lg = sess.run(None, {"images": inputs(s).numpy()})
        drift["regression"] = max(drift["regression"], float(np.abs(r - reg.numpy()).max()))
        drift["logits"] = max(drift["logits"], float(np.abs(lg - logit.numpy()).max()))
    report["backbone_head_ort_max_abs_diff"] = drift
    print("backbone+head drift", drift, flush=True)

    for exporter in exporters:
        entry: dict = {}
        report["exporters"][exporter] = entry
        # 1. The static post-processing alone, fed PyTorch's head outputs: must equal
        #    torchvision's eager detections exactly.
        post_path = OUT / f"static_post_{exporter}.onnx"
        try:
            entry["post_export_seconds"] = export(static.postprocess.eval(), heads[0], post_path, exporter,
                                                  (["bbox_regression", "cls_logits"], OUTPUT_NAMES))
        except Exception as exc:  # noqa: BLE001 - record it
            entry["post_error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
            print(exporter, entry, flush=True)
            continue
        entry["post"] = {k: v for k, v in describe(post_path).items()}
        sess = ort.InferenceSession(str(post_path), providers=["CPUExecutionProvider"])
        comps, times = [], []
        for e, (reg, logit) in zip(eager, heads):
            t0 = time.time()
            outs = sess.run(None, {"bbox_regression": reg.numpy(), "cls_logits": logit.numpy()})
            times.append(time.time() - t0)
            comps.append(compare(e, valid_detections(*(o[0] for o in outs)), box_tol=0.0, score_tol=0.0))
        entry["post_ort_seconds_p50"] = round(float(np.median(times)), 4)
        entry["post_vs_torchvision_exact"] = comps
        print(exporter, "post-only:", json.dumps({k: v for k, v in entry.items() if k != "post"})[:1500], flush=True)
        result_path.write_text(json.dumps(report, indent=1))

        # 2. The whole static model.
        path = OUT / f"static_ssd_{exporter}.onnx"
        entry["full_export_seconds"] = export(static, (inputs(0),), path, exporter, (["images"], OUTPUT_NAMES))
        entry["full"] = describe(path)
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        comps, times = [], []
        for s, e in zip(seeds, eager):
            t0 = time.time()
            outs = sess.run(None, {"images": inputs(s).numpy()})
            times.append(time.time() - t0)
            comps.append(compare(e, valid_detections(*(o[0] for o in outs))))
        entry["full_ort_seconds_p50"] = round(float(np.median(times)), 4)
        entry["full_vs_torchvision"] = comps
        print(exporter, "full:", json.dumps({k: v for k, v in entry.items() if k not in ("post", "full")})[:3000], flush=True)
        result_path.write_text(json.dumps(report, indent=1))
    result_path.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
