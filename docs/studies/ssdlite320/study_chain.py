"""(c)/(e): the chain of blockers torch.export meets, found by removing them one at a time
(monkeypatches of torchvision functions; torchvision's files are not edited).
    python study_chain.py            -> out/chain.json
    python study_chain.py STAGE      # one stage in this process
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

OUT = Path(__file__).parent / "out"
STAGES = ["original", "no_size_branch", "no_size_branch+no_empty_check", "onnx_dynamo_after_patches"]


def patch(stage: str) -> None:
    import torch
    from torchvision.ops import boxes as box_ops

    if stage == "original":
        return

    # boxes.py:86: `if boxes.numel() > 4000 ... : vanilla else coordinate trick` -> always the trick
    def batched_nms(boxes, scores, idxs, iou_threshold):
        return box_ops._batched_nms_coordinate_trick(boxes, scores, idxs, iou_threshold)

    box_ops.batched_nms = batched_nms
    if "no_empty_check" in stage or stage.startswith("onnx"):
        # boxes.py:103: `if boxes.numel() == 0: return empty` -> dropped
        def trick(boxes, scores, idxs, iou_threshold):
            max_coordinate = boxes.max()
            offsets = idxs.to(boxes) * (max_coordinate + torch.tensor(1).to(boxes))
            return box_ops.nms(boxes + offsets[:, None], scores, iou_threshold)

        box_ops._batched_nms_coordinate_trick = trick


def one(stage: str) -> dict:
    import onnx
    import torch

    from common import build_model, inputs
    from study_exporters import torchvision_frames

    patch(stage)
    model = build_model()
    x = inputs(0)
    res: dict = {"stage": stage}
    t0 = time.time()
    try:
        if stage.startswith("onnx"):
            path = OUT / "chain_dynamo.onnx"
            torch.onnx.export(model, (x,), str(path), dynamo=True, external_data=False, verbose=False)
            m = onnx.load(str(path))
            res["onnx_ops"] = dict(Counter(n.op_type for n in m.graph.node).most_common())
            res["onnx_outputs"] = {o.name: [d.dim_value or d.dim_param for d in o.type.tensor_type.shape.dim]
                                   for o in m.graph.output}
        else:
            ep = torch.export.export(model, (x,), strict=False)
            ops = Counter(str(n.target) for n in ep.graph.nodes if n.op == "call_function")
            res["data_dependent_ops"] = {k: v for k, v in ops.items() if any(
                s in k for s in ("nonzero", "nms", "item", "_local_scalar", "unique", "masked", "index.Tensor", "topk", "sym_constrain", "_assert"))}
            res["nodes"] = len(ep.graph.nodes)
            res["outputs"] = [str(n.meta.get("val").shape) for n in ep.graph.output_node().args[0]
                              if hasattr(n, "meta") and hasattr(n.meta.get("val"), "shape")][:6]
        res["ok"] = True
    except Exception as exc:  # noqa: BLE001
        res["ok"] = False
        res["error_type"] = type(exc).__name__
        res["first_error_line"] = str(exc).strip().splitlines()[0][:400]
        res["torchvision_frames"] = torchvision_frames(exc)[-4:]
        traceback.print_exc()
    res["seconds"] = round(time.time() - t0, 1)
    return res


def main() -> None:
    if len(sys.argv) == 2:
        print("RESULT " + json.dumps(one(sys.argv[1])))
        return
    results = []
    for stage in STAGES:
        proc = subprocess.run([sys.executable, __file__, stage], capture_output=True, text=True,
                              timeout=1800, cwd=Path(__file__).parent)
        (OUT / f"chain_{stage}.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
        line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
        res = json.loads(line[-1][7:]) if line else {"stage": stage, "ok": False, "error_type": f"exit {proc.returncode}"}
        results.append(res)
        print(json.dumps(res)[:1500], flush=True)
        (OUT / "chain.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
