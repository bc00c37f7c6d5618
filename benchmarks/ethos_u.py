"""Print, for each trained demo and two Ethos-U configurations, what Vela made of it.

    python benchmarks/ethos_u.py [--recipes digits_cnn,digits_mobilenet,keyword_spotter]
        [--targets ethos_u,ethos_u85_256] [--cache .edgeflow/cache]

Each build is a real `edgeflow run recipe=R target=T` (the keyword spotter needs espeak-ng for
its data, README). Per build: the NPU's share of the operators and of the MACs, the SRAM and
flash Vela allocates, its estimated inferences per second at the profile's board clock, and
the int8 accuracy drop measured on TFLite Micro's reference kernels. Vela counts the MACs of
the operators it places only; those of an operator left on the CPU are counted here from
model.tflite (convolutions, depthwise convolutions, fully-connected layers and batched
matrix products; any other operator has none that matter). Estimated figures are Vela's
performance model, not a device's.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
MAC_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "BATCH_MATMUL")


def build(recipe: str, target: str, cache: Path, out: Path) -> Path:
    args = [f"recipe={recipe}", f"target={target}", f"cache_dir={cache}", f"build_dir={out}"]
    done = subprocess.run(
        [sys.executable, "-m", "edgeflow", "run", *args, "--quiet"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode not in (0, 1):  # 1: a threshold missed; its figures still count
        print(done.stdout[-2000:], done.stderr[-3000:], sep="\n")
        raise SystemExit(f"{recipe} on {target} failed ({done.returncode})")
    (folder,) = [p for p in (out / recipe).iterdir() if p.is_dir() and not p.name.startswith(".")]
    return folder


def cpu_macs(model: Path, names: set[str]) -> int:
    """MACs of the operators whose output tensor is named in `names` (Vela's CPU layers)."""
    if not names:
        return 0
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=str(model))
    tensors = {t["index"]: t for t in interp.get_tensor_details()}
    total = 0
    for op in interp._get_ops_details():
        out = [tensors[i] for i in op["outputs"] if i >= 0]
        if op["op_name"] not in MAC_OPS or not out or out[0]["name"] not in names:
            continue
        shape, weights = out[0]["shape"], tensors[op["inputs"][1]]["shape"]
        if op["op_name"] in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            total += int(np.prod(shape[1:3])) * int(np.prod(weights))
        elif op["op_name"] == "FULLY_CONNECTED":
            total += int(np.prod(shape[:-1])) * int(np.prod(weights))
        else:  # BATCH_MATMUL: every output element sums over the shared axis
            total += int(np.prod(shape)) * int(tensors[op["inputs"][0]]["shape"][-1])
    return total


def figures(folder: Path) -> dict:
    metrics = json.loads((folder / "metrics.json").read_text())
    npu = metrics["npu"]
    with (folder / "vela_per_layer.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    on_cpu = {r["Name"] for r in rows if r["Target"] != "NPU"}
    cpu = cpu_macs(folder / "model.tflite", on_cpu)
    total_ops = npu["operators_npu"] + npu["operators_cpu"]
    return {
        "accelerator": npu["accelerator"],
        "ops": f"{npu['operators_npu']}/{total_ops}",
        "ops_share": npu["operators_npu"] / total_ops if total_ops else 1.0,
        "macs_share": npu["macs"] / (npu["macs"] + cpu) if npu["macs"] + cpu else 1.0,
        "sram": npu["sram_bytes"],
        "flash": npu["flash_bytes"],
        "ips": npu["inferences_per_second"],
        "clock": npu["clock_hz"],
        "drop": (metrics["accuracy"] or {}).get("drop"),
        "verified": metrics["verified"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipes", default="digits_cnn,digits_mobilenet,keyword_spotter")
    parser.add_argument("--targets", default="ethos_u,ethos_u85_256")
    parser.add_argument("--cache", type=Path, default=REPO / ".edgeflow" / "cache")
    args = parser.parse_args()
    print(
        "| model | accelerator | NPU ops | NPU share of MACs | SRAM (B) | flash (B) "
        "| est. inferences/s (clock) | int8 accuracy drop | verified |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="edgeflow-ethos-u-") as tmp:
        for recipe in args.recipes.split(","):
            for target in args.targets.split(","):
                out = Path(tmp) / target
                f = figures(build(recipe, target, args.cache, out))
                drop = "n/a" if f["drop"] is None else f"{f['drop'] * 100:+.2f} points"
                print(
                    f"| {recipe} | {f['accelerator']} | {f['ops']} ({f['ops_share']:.0%}) "
                    f"| {f['macs_share']:.1%} | {f['sram']:,} | {f['flash']:,} "
                    f"| {f['ips']:,.0f} ({f['clock'] / 1e6:g} MHz) | {drop} | {f['verified']} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
