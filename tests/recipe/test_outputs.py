"""evaluation.outputs (what each output is) and the per-output thresholds: every mistake
located at its key with a hint, before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeflow.recipe import load_recipe
from edgeflow.schema.sections import ClassesOutput, DetectionsOutput, ProbabilityOutput
from tests.recipe.test_errors import GOOD, problems

NAMED = GOOD.replace(
    "    - {name: image, shape: [1, 1, 8, 8]}\n",
    "    - {name: image, shape: [1, 1, 8, 8]}\n  outputs: [logits, speech]\n",
)


def with_outputs(declared: str, text: str = NAMED, metric: str = "") -> str:
    return text.replace("split: test}\n", f"split: test{metric}, outputs: {declared}}}\n")


def test_declared_kinds_load_with_their_options(write_recipe) -> None:
    text = with_outputs(
        "{logits: {kind: classes, axis: 1, ctc_blank: 0}, speech: {kind: probability, "
        "threshold: 0.3}}"
    )
    outputs = load_recipe(write_recipe(text)).recipe.evaluation.outputs
    assert outputs["logits"] == ClassesOutput(kind="classes", axis=1, ctc_blank=0)
    assert outputs["speech"] == ProbabilityOutput(kind="probability", threshold=0.3)
    head = with_outputs(
        "{logits: {kind: detections, axis: 1, box_format: cxcywh, scores: [5, 85], objectness: 4}}"
    )
    spec = load_recipe(write_recipe(head)).recipe.evaluation.outputs["logits"]
    assert isinstance(spec, DetectionsOutput)
    assert (spec.scores.start, spec.scores.stop, spec.objectness) == (5, 85, 4)


def test_an_unknown_kind_is_located_at_its_value(write_recipe) -> None:
    path = write_recipe(with_outputs("{logits: {kind: clases}}"))
    assert problems(path) == [
        f"{path}:10:97: evaluation.outputs.logits.kind: must be one of classes, probability, "
        "values, embedding, detections (got clases)\n"
        "  hint: did you mean 'classes'? (valid: classes, probability, values, embedding, "
        "detections)"
    ]


def test_a_missing_kind_and_an_option_of_another_kind(write_recipe) -> None:
    path = write_recipe(with_outputs("{logits: {threshold: 0.5}}"))
    assert problems(path) == [
        f"{path}:10:82: evaluation.outputs.logits.kind: missing required key\n"
        "  hint: add 'kind:' under evaluation.outputs.logits"
    ]
    path = write_recipe(with_outputs("{logits: {kind: classes, threshold: 0.5}}"))
    assert problems(path) == [
        f"{path}:10:106: evaluation.outputs.logits.threshold: unknown key 'threshold'\n"
        "  hint: allowed keys: axis, batch_axis, ctc_blank, kind"
    ]


def test_an_output_the_model_does_not_have(write_recipe) -> None:
    path = write_recipe(with_outputs("{logit: {kind: classes}}"))
    assert problems(path) == [
        f"{path}:10:82: evaluation.outputs.logit: source.outputs has no 'logit'\n"
        "  hint: did you mean 'logits'? (valid: logits, speech)"
    ]
    path = write_recipe(with_outputs("{logits: {kind: classes}}", text=GOOD))
    assert problems(path) == [
        f"{path}:9:82: evaluation.outputs.logits: the exported outputs are named output, "
        "output_0, output_1, ... (no source.outputs), not 'logits'\n"
        "  hint: name the model's outputs in source.outputs, or use the exported name"
    ]
    assert load_recipe(write_recipe(with_outputs("{output: {kind: values}}", text=GOOD)))


@pytest.mark.parametrize(
    ("declared", "key", "message"),
    [
        ("{logits: {kind: classes, axis: 0}}", "logits.axis", "axis 0 is the batch"),
        ("{logits: {kind: probability, threshold: high}}", "logits.threshold",
         "must be a valid number (got high)"),
        ("{logits: {kind: detections, scores: [2, 6]}}", "logits.boxes",
         "the box coordinates 0..3 overlap the scores or the objectness"),
        ("{logits: {kind: detections, scores: [6, 5]}}", "logits.scores",
         "stop (5) must be above start (6)"),
        ("{logits: {kind: detections, axis: 0}}", "logits.axis",
         "a detector head's layout axis is -1 (or 2) or 1, not 0"),
        ("{logits: {kind: classes, ctc_blank: -1}}", "logits.ctc_blank",
         "must be greater than or equal to 0 (got -1)"),
    ],
)  # fmt: skip
def test_bad_options_are_located(declared: str, key: str, message: str, write_recipe) -> None:
    [problem] = problems(write_recipe(with_outputs(declared)))
    assert f": evaluation.outputs.{key}: {message}" in problem


def test_a_threshold_no_declared_output_can_give_is_refused(write_recipe) -> None:
    text = with_outputs(
        "{logits: {kind: values}, speech: {kind: probability}}", metric=", metric: agreement"
    )
    text += "verify: {min_top1_agreement: 0.9, min_sequence_agreement: 0.5}\n"
    path = write_recipe(text)
    assert problems(path) == [
        f"{path}:14:30: verify.min_top1_agreement: measures classes outputs, and "
        "evaluation.outputs declares none (logits: values, speech: probability)\n"
        "  hint: remove verify.min_top1_agreement; verify.min_sqnr_db holds for every output",
        f"{path}:14:59: verify.min_sequence_agreement: measures classes outputs, and "
        "evaluation.outputs declares none (logits: values, speech: probability)\n"
        "  hint: remove verify.min_sequence_agreement; verify.min_sqnr_db holds for every output",
    ]
    # one output left to its shape: the verify stage decides, and the report says
    partly = text.replace(", speech: {kind: probability}", "")
    assert load_recipe(write_recipe(partly))


def test_outputs_and_sqnr_do_not_apply_to_the_padded_detections_form(
    write_recipe, tmp_path: Path
) -> None:
    text = with_outputs("{logits: {kind: values}}", metric=", metric: detections")
    text += "verify: {min_sqnr_db: 20, max_accuracy_drop: null}\n"
    found = problems(write_recipe(text))
    assert [p.split(": ")[1] for p in found] == ["evaluation.outputs", "verify.min_sqnr_db"]
    assert "does not apply to evaluation.metric: detections" in found[0]


def test_min_sqnr_db_from_the_command_line_and_null_turns_the_default_off(write_recipe) -> None:
    path = write_recipe(GOOD)
    assert load_recipe(path, {"verify.min_sqnr_db": 30}).recipe.verify.min_sqnr_db == 30
    off = load_recipe(path, {"verify.min_sqnr_db": None}).recipe.verify
    assert off.min_sqnr_db is None
    # the default is a value of its own, so the cache keys of the two differ
    assert load_recipe(path).recipe.verify.min_sqnr_db == "auto"
    found = problems(path, **{"verify.min_sqnr_db": True})
    assert found and all("verify.min_sqnr_db" in p for p in found)
