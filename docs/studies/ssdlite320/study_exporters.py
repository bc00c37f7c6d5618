"""(a)/(b): try each capture/export path on ssdlite320_mobilenet_v3_large(weights=None,
weights_backbone=None).eval() with a [1, 3, 320, 320] input; record the first error and the
torchvision source line behind it. One subprocess per attempt:
    python study_exporters.py            # all attempts -> out/exporters.json, out/<name>.log
    python study_exporters.py NAME FORM  # one attempt (FORM: tensor | list)
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

OUT = Path(__file__).parent / "out"
METHODS = ["fx_symbolic_trace", "export_strict", "export_nonstrict", "onnx_dynamo", "onnx_torchscript"]
TV_LINE = re.compile(r'File "([^"]*torchvision/[^"]+)", line (\d+)(?:, in (\w+))?')


def torchvision_frames(exc: BaseException) -> list[str]:
    """torchvision file:line (function) of the traceback and of any user stack in messages."""
    frames = []
    for e in _chain(exc):
        for fs in traceback.extract_tb(e.__traceback__):
            if "/torchvision/" in fs.filename:
                frames.append(f"{_short(fs.filename)}:{fs.lineno} ({fs.name}): {fs.line}")
        for m in TV_LINE.finditer(str(e)):
            frames.append(f"{_short(m.group(1))}:{m.group(2)} ({m.group(3)}) [from message]")
    return frames


def _chain(exc):
    seen = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def _short(path: str) -> str:
    return path[path.index("torchvision/"):]


def one(method: str, form: str) -> dict:
    import onnx
    import torch

    from common import VERSIONS, build_model, inputs

    model = build_model()
    x = inputs(0)
    args = (x,) if form == "tensor" else ([x[0]],)
    result: dict = {"method": method, "form": form, "versions": VERSIONS}
    onnx_path = OUT / f"{method}_{form}.onnx"
    t0 = time.time()
    try:
        if method == "fx_symbolic_trace":
            gm = torch.fx.symbolic_trace(model)
            result["nodes"] = len(gm.graph.nodes)
        elif method.startswith("export_"):
            ep = torch.export.export(model, args, strict=(method == "export_strict"))
            result["nodes"] = len(ep.graph.nodes)
            result["aten_ops"] = dict(Counter(str(n.target) for n in ep.graph.nodes if n.op == "call_function").most_common())
        elif method == "onnx_dynamo":
            torch.onnx.export(model, args, str(onnx_path), dynamo=True, external_data=False, verbose=False)
        elif method == "onnx_torchscript":
            torch.onnx.export(model, args, str(onnx_path), dynamo=False, opset_version=17)
        result["ok"] = True
    except Exception as exc:  # noqa: BLE001 - the study records every failure
        result["ok"] = False
        result["error_type"] = type(exc).__name__
        text = str(exc).strip()
        result["first_error_line"] = text.splitlines()[0] if text else type(exc).__name__
        result["error_head"] = "\n".join(text.splitlines()[:25])
        result["torchvision_frames"] = torchvision_frames(exc)
        traceback.print_exc()
    result["seconds"] = round(time.time() - t0, 1)
    if result.get("ok") and method.startswith("onnx_"):
        model_proto = onnx.load(str(onnx_path))
        ops = Counter(n.op_type for n in model_proto.graph.node)
        sub = Counter()
        for n in model_proto.graph.node:
            for a in n.attribute:
                for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else []) + list(a.graphs):
                    sub.update(nn.op_type for nn in g.node)
        result["onnx_ops"] = dict(ops.most_common())
        result["onnx_subgraph_ops"] = dict(sub.most_common())
        result["onnx_nodes"] = sum(ops.values())
        result["onnx_bytes"] = onnx_path.stat().st_size
        try:
            import onnxruntime as ort
            sess = ort.InferenceSession(str(onnx_path))
            feed = {sess.get_inputs()[0].name: x.numpy() if form == "tensor" else x[0].numpy()}
            outs = sess.run(None, feed)
            with torch.no_grad():
                eager = model(x)[0]
            result["ort_output_shapes"] = [list(o.shape) for o in outs]
            result["eager_shapes"] = {k: list(v.shape) for k, v in eager.items()}
            import numpy as np
            if outs[0].shape == tuple(eager["boxes"].shape):
                result["ort_boxes_max_abs_diff"] = float(np.abs(outs[0] - eager["boxes"].numpy()).max())
        except Exception as exc:  # noqa: BLE001
            result["ort_error"] = str(exc).splitlines()[0]
    return result


def main() -> None:
    OUT.mkdir(exist_ok=True)
    if len(sys.argv) == 3:
        print("RESULT " + json.dumps(one(sys.argv[1], sys.argv[2])))
        return
    results = []
    for method in METHODS:
        for form in (["tensor"] if method == "fx_symbolic_trace" else ["tensor", "list"]):
            log = OUT / f"{method}_{form}.log"
            t0 = time.time()
            try:
                proc = subprocess.run([sys.executable, __file__, method, form], capture_output=True,
                                      text=True, timeout=1500, cwd=Path(__file__).parent)
                log.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
                line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
                res = json.loads(line[-1][7:]) if line else {"method": method, "form": form, "ok": False,
                                                            "error_type": f"process exit {proc.returncode}"}
            except subprocess.TimeoutExpired:
                res = {"method": method, "form": form, "ok": False, "error_type": "timeout 1500 s"}
            res["wall_seconds"] = round(time.time() - t0, 1)
            results.append(res)
            print(method, form, res.get("ok"), res.get("first_error_line", ""), res.get("seconds"), flush=True)
            (OUT / "exporters.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
