"""Do the profiles tell the truth? The precheck's verdict on every case of the operator zoo
against the real runtime's. `python -m pytest tests/targets/test_agreement.py -s` prints the
tables that docs/targets.md quotes.

onnxruntime_micro: the zoo's graphs in onnxruntime. tflite, tflite_micro, armnn: each graph
converted with onnx2tf (float32, and int8 for float graphs) and run in LiteRT, the TFLite
Micro interpreter and Arm NN (edgeflow.targets.trial); a graph that converts and runs but
gives wrong numbers counts as not supported.
"""

from __future__ import annotations

from typing import Any

import pytest

from edgeflow.targets import load_profile
from edgeflow.targets.precheck import check
from tests import needs
from tests.targets.conftest import needs_tflite
from tests.targets.opzoo import Case, cases

CASES = cases()


def onnxruntime_verdict(case: Case) -> tuple[bool, str]:
    """Whether onnxruntime's CPU provider loads and runs the graph, and its error if not."""
    import onnxruntime as ort

    try:
        options = ort.SessionOptions()
        options.log_severity_level = 4
        session = ort.InferenceSession(
            case.model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        session.run(None, case.feeds)
    except Exception as exc:  # every ORT failure is a "does not run" verdict
        return False, str(exc).splitlines()[0][:150]
    return True, ""


def test_the_zoo_covers_what_the_issue_asks_for() -> None:
    assert len(CASES) >= 40
    ops = {node.op_type for case in CASES for node in case.model.graph.node}
    wanted = {
        "Conv",
        "MaxPool",
        "Gelu",
        "Erf",
        "HardSwish",
        "HardSigmoid",
        "Mish",
        "LayerNormalization",
        "BatchNormalization",
        "Reshape",
        "Transpose",
        "ReduceMean",
        "MatMul",
        "Softmax",
        "Resize",
        "Pad",
        "Slice",
        "NonZero",
        "If",
        "QuantizeLinear",
    }
    assert wanted <= ops, wanted - ops


def test_onnxruntime_micro_precheck_agrees_with_onnxruntime(capsys: pytest.CaptureFixture) -> None:
    profile = load_profile("onnxruntime_micro")
    rows, agree = [], 0
    for case in CASES:
        findings = check(case.model, profile)
        predicted = not findings
        actual, error = onnxruntime_verdict(case)
        agree += predicted == actual
        reason = findings[0].reason if findings else ""
        rows.append((case.name, predicted, actual, reason or error))
    rate = agree / len(CASES)
    with capsys.disabled():
        print(f"\nonnxruntime_micro: precheck agrees with onnxruntime on {agree}/{len(CASES)}")
        for name, predicted, actual, why in rows:
            mark = "" if predicted == actual else "  <-- DISAGREE"
            print(
                f"  {name:28} precheck {'pass' if predicted else 'FAIL'}  "
                f"runtime {'runs' if actual else 'FAILS'}  {why[:90]}{mark}"
            )
    assert rate >= 0.95, [r for r in rows if r[1] != r[2]]
    # Not a list that agrees by saying yes: the zoo has cases the runtime rejects.
    assert sum(not r[2] for r in rows) >= 8


@pytest.fixture(scope="module")
def family_verdicts() -> dict[str, Any]:
    """The zoo through onnx2tf and the TFLite-family runtimes, once for all three tests."""
    from edgeflow.targets.trial import Trial, run_trials

    armnn = [] if needs.missing("armnn") else ["armnn"]  # its test: needs.mark("armnn")
    targets = ["tflite", "tflite_micro", *armnn]
    trials = [Trial(c.name, c.model.SerializeToString(), c.feeds) for c in CASES]
    return run_trials(trials, targets, ["none", "int8"])


@needs_tflite
@pytest.mark.slow
@pytest.mark.parametrize(
    "target", ["tflite", "tflite_micro", pytest.param("armnn", marks=needs.mark("armnn"))]
)
def test_tflite_family_precheck_agrees_with_the_runtime(
    target: str, family_verdicts: dict[str, Any], capsys: pytest.CaptureFixture
) -> None:
    profile = load_profile(target)
    rows = []
    for case in CASES:
        for key, verdict in family_verdicts[case.name].items():
            if not key.startswith(f"{target}/"):
                continue
            mode = key.split("/")[1]
            findings = [f for f in check(case.model, profile, mode) if f.severity == "error"]
            why = findings[0].reason if findings else f"{verdict.stage}: {verdict.reason}"
            rows.append((f"{case.name} [{mode}]", not findings, verdict.runs, why))
    agree = sum(r[1] == r[2] for r in rows)
    with capsys.disabled():
        print(f"\n{target}: precheck agrees with the runtime on {agree}/{len(rows)}")
        for name, predicted, actual, why in rows:
            if predicted != actual:
                print(
                    f"  DISAGREE {name:34} precheck {'pass' if predicted else 'FAIL'}  "
                    f"runtime {'runs' if actual else 'FAILS'}  {why[:150]}"
                )
    assert agree / len(rows) >= 0.95, [r for r in rows if r[1] != r[2]]
    assert sum(not r[2] for r in rows) >= 8  # the zoo has graphs this runtime rejects
    assert sum(r[2] for r in rows) >= 40  # and graphs it runs
