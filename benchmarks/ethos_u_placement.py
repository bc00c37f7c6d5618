"""Does the ethos_u precheck's NPU placement hold on graphs it was not measured on?

    python benchmarks/ethos_u_placement.py [--targets ethos_u,ethos_u85_256] [--cases Conv,Gelu]

Each float32 graph of the operator zoo (tests/targets/opzoo.py; the placement in
targets/ethos_u.yaml was measured on the probe graphs of edgeflow/targets/probes.py, not
these) gets the precheck's prediction (edgeflow.targets.placement: all on the NPU, some of it
on the CPU, Vela fails, or an operator no probe placed) and then the real thing: the int8
model.tflite the tflite_micro build makes of it (trial.build_tflite, onnx2tf) compiled by
Vela as a build does. Prints one row per graph whose prediction and Vela disagree, and per
target how many agree, with the pairs (predicted -> Vela did); graphs that do not convert to
int8 are counted apart, and those the precheck refuses for another reason (an operator TFLite
Micro cannot run) are judged all the same and counted.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def predicted(model: Any, profile: Any) -> tuple[str, str]:
    """(npu | cpu | fails | unmeasured, the operators that decided it)."""
    import onnx

    from edgeflow.targets.findings import GraphFacts
    from edgeflow.targets.placement import findings, predict

    shaped = onnx.shape_inference.infer_shapes(model)
    said = predict(shaped, profile, "int8")
    assert said is not None
    found = findings(model, profile, GraphFacts.of(shaped))
    errors = [f.operator for f in found if f.severity == "error"]
    if errors:
        return "fails", ", ".join(errors)
    cpu = sorted({*said["cpu"], *said["partly"]})
    if cpu:
        return "cpu", ", ".join(cpu)
    if said["unmeasured"]:
        return "unmeasured", ", ".join(said["unmeasured"])
    return "npu", ""


def actual(source: Any, model_tflite: Path, profile: Any, out: Path) -> tuple[str, str]:
    """(npu | cpu | fails, Vela's words or the builtins it left on the CPU), as the placement
    derivation reads a compile (edgeflow/targets/ethos_u/derive.py)."""
    from edgeflow.targets.ethos_u.derive import place

    got = place(source, model_tflite, profile.npu, out)
    if got is None or got.placed == "npu":  # None: nothing was left to place
        return "npu", ""
    if got.placed == "fails":
        return "fails", got.why[:100]
    return "cpu", " ".join(got.cpu)


def main() -> int:
    import numpy as np

    from edgeflow.targets import load_profile
    from edgeflow.targets.precheck import check
    from edgeflow.targets.trial import Trial, build_tflite
    from tests.targets.opzoo import cases

    parser = argparse.ArgumentParser()
    parser.add_argument("--targets", default="ethos_u,ethos_u85_256")
    parser.add_argument("--cases", default="", help="comma-separated zoo case names")
    args = parser.parse_args()
    profiles = [load_profile(t) for t in args.targets.split(",")]
    chosen = set(args.cases.split(",")) - {""}
    zoo = [
        c
        for c in cases()
        if (not chosen or c.name in chosen) and all(v.dtype == np.float32 for v in c.feeds.values())
    ]
    agree = {p.name: 0 for p in profiles}
    pairs: dict[str, Counter[tuple[str, str]]] = {p.name: Counter() for p in profiles}
    judged = {p.name: 0 for p in profiles}
    unconverted, refused = [], {p.name: 0 for p in profiles}
    rows = []
    start = time.perf_counter()
    for case in zoo:
        with tempfile.TemporaryDirectory(prefix="edgeflow-zoo-vela-") as tmp:
            work = Path(tmp)
            trial = Trial(case.name, case.model.SerializeToString(), case.feeds)
            try:
                tflite = build_tflite(trial, work, "tflite_micro")
            except Exception as exc:  # any converter failure: the graph is counted apart
                unconverted.append(f"{case.name} ({type(exc).__name__})")
                continue
            for profile in profiles:
                if any(f.severity == "error" for f in check(case.model, profile, "int8")):
                    refused[profile.name] += 1  # judged all the same: Vela compiles the file
                said, because = predicted(case.model, profile)
                out = work / profile.name
                out.mkdir()
                did, words = actual(case.model, tflite, profile, out)
                judged[profile.name] += 1
                pairs[profile.name][said, did] += 1
                if said == did:
                    agree[profile.name] += 1
                else:
                    rows.append(
                        (case.name, profile.name, f"{said} ({because})", f"{did} ({words})")
                    )
    print(f"{len(zoo)} float32 zoo graphs, {time.perf_counter() - start:.0f} s\n")
    print("| graph | target | precheck predicted | Vela did |\n|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(
        "\n| target | agree | judged | predicted -> Vela | of them refused by the precheck "
        "(TFLite Micro) | not converted to int8 |"
    )
    print("|---|---|---|---|---|---|")
    for profile in profiles:
        name = profile.name
        seen = ", ".join(f"{a} -> {b}: {n}" for (a, b), n in sorted(pairs[name].items()))
        print(
            f"| {name} | {agree[name]} | {judged[name]} | {seen} | {refused[name]} | "
            f"{len(unconverted)} |"
        )
    if unconverted:
        print(f"\nnot converted: {', '.join(unconverted)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
