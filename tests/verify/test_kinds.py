"""Agreement that means something for every output kind: outputs built in code for each kind,
compared and checked as the verify and report stages do."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from edgeflow.core.errors import EdgeflowError
from edgeflow.report.markdown import one_line
from edgeflow.schema.sections import (
    ClassesOutput,
    DetectionChecks,
    DetectionsOutput,
    ProbabilityOutput,
    Span,
    Verify,
)
from edgeflow.stages.report import _agreement
from edgeflow.verify.compare import compare_outputs
from edgeflow.verify.judge import build_checks, thresholds
from edgeflow.verify.kinds import BoxMatching, sqnr_db

RNG = np.random.default_rng(0)


def checked(found: dict[str, Any], verify: Verify, mode: str = "int8") -> list[dict[str, Any]]:
    """The report stage's checks on compare_outputs' figures."""
    return build_checks(thresholds(verify, mode), found, None, 1.0, 1)


def failed(checks: list[dict[str, Any]]) -> list[str]:
    return [c["message"] for c in checks if not c["passed"]]


def test_sqnr_is_signal_over_error_energy_in_db_and_inf_when_exact() -> None:
    ref = np.array([[3.0, 4.0]], np.float32)
    assert sqnr_db(ref, np.array([[3.0, 4.5]], np.float32)) == pytest.approx(20.0)  # 25 / 0.25
    assert sqnr_db(ref, ref.copy()) == math.inf
    assert sqnr_db(np.zeros((1, 2)), np.full((1, 2), 1e-3)) == -math.inf
    [o] = compare_outputs([ref], [np.array([[3.0, 4.5]], np.float32)])["outputs"]
    assert o["sqnr_db"] == pytest.approx(20.0) and o["max_rel_to_range"] == pytest.approx(0.125)


def test_a_one_element_probability_off_by_089_fails() -> None:
    """A voice-activity score [batch, 1]: top-1 over one element would read 1.000; the
    decision at 0.5 flips on every sample the artifact moves by 0.89, and SQNR fails."""
    ref = np.where(np.arange(40) % 2 == 0, 0.95, 0.03).astype(np.float32)[:, None]
    out = ref.copy()
    out[:20] = np.where(ref[:20] > 0.5, ref[:20] - 0.89, ref[:20] + 0.89)  # 20 of 40 flip
    found = compare_outputs([ref], [out], ["speech"])
    [o] = found["outputs"]
    assert o["kind"] == "probability" and o["kind_from"] == "shape"
    assert "top1" not in o and "top1" not in found
    assert o["decision"] == 0.5 and o["decision_flips"] == 20 and o["threshold"] == 0.5
    assert o["max_abs_diff"] == pytest.approx(0.89, abs=1e-6)
    assert o["sqnr_db"] == pytest.approx(0.571, abs=1e-3)  # 10*log10(18.07 / 15.84)
    messages = failed(checked(found, Verify(min_decision_agreement=0.99, min_top1_agreement=0.98)))
    assert messages[0] == (
        "verify.min_sqnr_db: output 'speech': 0.571001 is below the threshold 15 (the int8 "
        "default; set verify.by_mode.int8.min_sqnr_db to change it)"
    )
    assert messages[1] == (
        "verify.min_top1_agreement: no output is a class vector, so there is nothing it can "
        "measure ('speech' [1] is probability by its shape); declare "
        "evaluation.outputs.<name>.kind: classes for a class output, or use verify.min_sqnr_db"
    )
    assert messages[2] == (
        "verify.min_decision_agreement: output 'speech': 0.5 is below the threshold 0.99 (from "
        "verify.min_decision_agreement, which holds for every mode; set "
        "verify.by_mode.int8.min_decision_agreement for int8 builds)"
    )
    assert len(messages) == 3


def test_a_segmentation_map_within_1e4_passes_and_gets_no_top1() -> None:
    """[B, C, H, W] within 1e-4: the old argmax over W read 0.21; now it is values, SQNR high,
    and per-pixel classes where declared (axis 1)."""
    ref = RNG.standard_normal((6, 4, 16, 16)).astype(np.float32)
    out = ref + RNG.uniform(-7e-5, 7e-5, ref.shape).astype(np.float32)
    found = compare_outputs([ref], [out], ["mask"])
    [o] = found["outputs"]
    assert o["kind"] == "values" and "top1" not in o and "top1" not in found
    assert o["max_abs_diff"] < 1e-4 and o["sqnr_db"] > 80
    strict = Verify(max_relative_diff=1e-4, min_sqnr_db=60.0)
    assert failed(checked(found, strict, mode="none")) == []
    assert failed(checked(found, Verify())) == []  # the int8 default floor holds too
    pixels = compare_outputs(
        [ref], [out], ["mask"], {"mask": ClassesOutput(kind="classes", axis=1)}
    )
    [p] = pixels["outputs"]
    assert p["positions"] == 256 and p["classes"] == 4 and p["top1"] > 0.999
    assert pixels["top1"] == p["top1"]


def test_a_sequence_recogniser_reports_per_position_and_whole_sequence_agreement() -> None:
    """24 strings of 10 positions, 6 classes: 20 of them lose one position to int8."""
    paths = RNG.integers(1, 6, (24, 10))
    ref = np.eye(6, dtype=np.float32)[paths] * 5  # [24, 10, 6], well separated
    out = ref.copy()
    for i in range(20):  # position i % 10 of sample i now picks another class
        c = paths[i, i % 10]
        out[i, i % 10, c] = 0.0
        out[i, i % 10, c % 5 + 1] = 5.0
    declared = {"chars": ClassesOutput(kind="classes")}
    found = compare_outputs([ref], [out], ["chars"], declared)
    [o] = found["outputs"]
    assert o["positions"] == 10 and o["top1"] == pytest.approx(220 / 240)
    assert o["sequence"] == pytest.approx(4 / 24) and o["sequences_matched"] == 4
    messages = failed(checked(found, Verify(min_sequence_agreement=0.9, min_sqnr_db=None)))
    [message] = messages
    assert message.startswith(
        "verify.min_sequence_agreement: output 'chars': 0.166667 is below the threshold 0.9 ("
    )


def test_ctc_sequence_agreement_compares_decoded_strings() -> None:
    """'aab-' and 'ab--' decode to the same string: the argmax paths differ, CTC does not."""
    blank = 0
    ref_path, out_path = np.array([[1, 1, 2, 0]]), np.array([[1, 2, 0, 0]])
    ref, out = np.eye(3, dtype=np.float32)[ref_path], np.eye(3, dtype=np.float32)[out_path]
    raw = compare_outputs([ref], [out], ["t"], {"t": ClassesOutput(kind="classes")})
    assert raw["outputs"][0]["sequence"] == 0.0 and raw["outputs"][0]["top1"] == 0.5
    ctc = ClassesOutput(kind="classes", ctc_blank=blank)
    assert compare_outputs([ref], [out], ["t"], {"t": ctc})["outputs"][0]["sequence"] == 1.0
    with pytest.raises(EdgeflowError, match=r"ctc_blank: class 7 does not exist .*3 classes"):
        compare_outputs([ref], [out], ["t"], {"t": ClassesOutput(kind="classes", ctc_blank=7)})


def test_classes_declared_on_a_one_value_output_is_a_clear_error() -> None:
    ref = RNG.random((5, 1)).astype(np.float32)
    with pytest.raises(EdgeflowError) as info:
        compare_outputs([ref], [ref], ["p"], {"p": ClassesOutput(kind="classes")})
    assert info.value.message == (
        "evaluation.outputs.p.kind: classes over axis -1, but output 'p' has shape [1] per "
        "sample (1 value on that axis: no class to pick)"
    )
    assert "kind: probability" in (info.value.hint or "")


def test_probability_threshold_is_the_declared_one() -> None:
    ref = np.array([[-2.0], [0.5], [-0.1], [3.0]], np.float32)  # logits: decided at 0
    out = np.array([[-1.0], [0.4], [0.1], [2.0]], np.float32)
    declared = {"logit": ProbabilityOutput(kind="probability", threshold=0.0)}
    [o] = compare_outputs([ref], [out], ["logit"], declared)["outputs"]
    assert o["kind_from"] == "declared" and o["decision"] == 0.75 and o["decision_flips"] == 1
    [auto] = compare_outputs([ref], [out], ["logit"])["outputs"]
    assert auto["kind"] == "values"  # outside [0, 1]: not a probability by its values


def head(boxes: np.ndarray, scores: np.ndarray, axis: int = -1) -> np.ndarray:
    rows = np.concatenate([boxes, scores], axis=-1).astype(np.float32)  # [B, N, 4 + C]
    return np.moveaxis(rows, -1, 1) if axis == 1 else rows


def test_a_raw_detector_head_is_matched_as_detections() -> None:
    """[B, 4 + C, N] (YOLOv8's layout) in cxcywh: candidates over the score threshold matched
    as sets; one per-tensor int8 scale that erases the scores loses the detections."""
    n, classes = 50, 3
    centre = RNG.uniform(40, 280, (2, n, 2))
    boxes = np.concatenate([centre, RNG.uniform(10, 60, (2, n, 2))], -1)
    scores = RNG.uniform(0.0, 0.2, (2, n, classes))
    scores[:, :8, 1] = 0.6  # 8 detections of class 1 per image
    ref = head(boxes, scores, axis=1)
    spec = DetectionsOutput(kind="detections", axis=1, box_format="cxcywh", scores=Span(start=4))
    matching = BoxMatching((320, 320), DetectionChecks(box_atol=0.5, box_units="pixels",
                                                       score_atol=0.01))  # fmt: skip
    close = head(boxes + RNG.uniform(-0.1, 0.1, boxes.shape), scores, axis=1)
    found = compare_outputs([ref], [close], ["head"], {"head": spec}, matching)
    [o] = found["outputs"]
    assert o["detections"]["reference_detections"] == 16 and o["detections"]["match_rate"] == 1.0
    assert o["parts"]["scores"]["sqnr_db"] == math.inf and o["parts"]["boxes"]["sqnr_db"] > 50
    assert failed(checked(found, Verify(min_sqnr_db=None))) == []
    step = 320 / 255  # one int8 scale for boxes (0..320) and scores (0..1): scores round to 0
    erased = np.round(ref / step) * step
    lost = compare_outputs([ref], [erased], ["head"], {"head": spec}, matching)
    [e] = lost["outputs"]
    assert e["detections"]["artifact_detections"] == 0 and e["detections"]["match_rate"] == 0.0
    assert e["parts"]["scores"]["sqnr_db"] < 1 and e["parts"]["boxes"]["sqnr_db"] > 40
    assert e["sqnr_db"] > 40  # the whole tensor's SQNR hides it: the parts and matching do not
    assert failed(checked(lost, Verify(min_sqnr_db=None))) == [
        "verify.detections.min_match_rate: output 'head': 0 is below the threshold 1"
    ]


def test_a_detector_head_layout_that_does_not_fit_is_a_clear_error() -> None:
    ref = np.zeros((1, 10, 5), np.float32)  # 5 features: no room for scores from 6 on
    spec = DetectionsOutput(kind="detections", scores=Span(start=6))
    matching = BoxMatching((8, 8), DetectionChecks())
    with pytest.raises(EdgeflowError, match=r"at least 7 features on axis -1; output 'h' has "):
        compare_outputs([ref], [ref], ["h"], {"h": spec}, matching)


def test_int8_builds_get_the_sqnr_floor_by_default_and_a_recipe_can_turn_it_off() -> None:
    ref = RNG.standard_normal((8, 10)).astype(np.float32)
    found = compare_outputs([ref], [ref * 1.5], ["logits"])  # SQNR 6.0 dB, top-1 exact
    assert found["outputs"][0]["sqnr_db"] == pytest.approx(20 * math.log10(2))
    assert found["top1"] == 1.0
    assert len(failed(checked(found, Verify(), mode="int8"))) == 1
    assert checked(found, Verify(), mode="none") == []  # float builds: their own thresholds
    assert checked(found, Verify.model_validate({"min_sqnr_db": None}), mode="int8") == []
    [row] = checked(found, Verify(min_sqnr_db=5.0), mode="int8")
    assert row["passed"] and row["output"] == "logits" and "default" not in row["message"]


def test_every_output_gets_its_figures_in_metrics_and_the_summary_line() -> None:
    logits = RNG.standard_normal((20, 10)).astype(np.float32)
    speech = RNG.random((20, 1)).astype(np.float32)
    found = compare_outputs([logits, speech], [logits + 0.01, speech], ["logits", "speech"])
    metrics = _agreement({"metric": "agreement", "agreement": found})
    assert set(metrics["outputs"]) == {"logits", "speech"}
    assert metrics["outputs"]["speech"] == {
        "kind": "probability",
        "relative_error": 0.0,
        "sqnr_db": math.inf,
        "max_abs_diff": 0.0,
        "decision": 1.0,
    }
    assert (
        metrics["top1"] == 1.0 and metrics["min_sqnr_db"] == metrics["outputs"]["logits"]["sqnr_db"]
    )
    line = one_line(
        {"accuracy": None, "agreement": metrics, "latency_ms": {"p50": 1.0}, "size_bytes": 9}
    )
    sqnr = metrics["outputs"]["logits"]["sqnr_db"]
    assert line.startswith(
        f"'logits' SQNR {sqnr:.1f} dB, top-1 agreement 1.0000; 'speech' SQNR inf dB (exact), "
        "decision agreement 1.0000, max abs diff 0.01"
    )
