"""Outputs batched on another axis than 0 (evaluation.outputs.<name>.batch_axis): a
time-major CTC output [T, B, C] is scored per sample, B strings, not T x B; several batches
of it are joined on its batch axis; an axis its rank cannot have is a located error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from edgeflow.core.errors import AtRecipeKey, EdgeflowError
from edgeflow.core.loader import relocated
from edgeflow.data import Samples
from edgeflow.schema.sections import (
    ClassesOutput,
    DetectionChecks,
    DetectionsOutput,
    ValuesOutput,
)
from edgeflow.verify.compare import compare_outputs
from edgeflow.verify.kinds import BoxMatching
from edgeflow.verify.runners import BatchAxes, run_all

BLANK = 0
CTC = ClassesOutput(kind="classes", ctc_blank=BLANK, batch_axis=1)


def time_major(paths: np.ndarray, classes: int = 4) -> np.ndarray:
    """[B, T] best paths as one-hot scores [T, B, C], as a time-major recogniser outputs them."""
    return np.moveaxis(np.eye(classes, dtype=np.float32)[paths] * 5, 0, 1)


def test_a_time_major_ctc_output_counts_its_strings_not_its_time_steps() -> None:
    """T = 6 steps, B = 3 strings: one string decodes differently, so 2 of 3 agree."""
    ref_paths = np.array([[1, 1, 0, 2, 2, 0], [3, 0, 3, 3, 0, 0], [2, 0, 1, 1, 0, 3]])
    out_paths = ref_paths.copy()
    out_paths[1, 2] = 1  # string 1: "33" -> "31"
    out_paths[0, 1] = 0  # string 0: "1-" for "11": the same decode, "12"
    ref, out = time_major(ref_paths), time_major(out_paths)  # [6, 3, 4]
    axes = BatchAxes.of({"ctc": CTC}, ["ctc"])
    [ref_first], [out_first] = axes.first([ref]), axes.first([out])
    assert ref_first.shape == (3, 6, 4)
    [o] = compare_outputs([ref_first], [out_first], ["ctc"], {"ctc": CTC})["outputs"]
    assert o["shape"] == [6, 4] and o["batch_axis"] == 1 and o["positions"] == 6
    assert o["sequences"] == 3 and o["sequences_matched"] == 2
    assert o["sequence"] == pytest.approx(2 / 3)
    assert o["top1"] == pytest.approx(16 / 18)  # 2 of 18 positions differ
    # taken as it is (batch on axis 0), the same arrays are 6 "strings" of 3 steps
    undeclared = ClassesOutput(kind="classes", ctc_blank=BLANK)
    [wrong] = compare_outputs([ref], [out], ["ctc"], {"ctc": undeclared})["outputs"]
    assert wrong["sequences"] == 6


def test_the_class_axis_is_counted_in_the_model_layout() -> None:
    """[C, B] scores with batch_axis: 1 and the classes on axis 0 (legal once the batch is
    elsewhere): one decision per sample, 4 samples, 1 of them flipped."""
    ref = np.array([[5, 0, 0, 5], [0, 5, 5, 0]], np.float32)  # [C=2, B=4]
    out = ref.copy()
    out[:, 2] = [5, 0]
    spec = ClassesOutput(kind="classes", axis=0, batch_axis=1)
    [ref_first], [out_first] = (BatchAxes.of({"p": spec}, ["p"]).first([a]) for a in (ref, out))
    [o] = compare_outputs([ref_first], [out_first], ["p"], {"p": spec})["outputs"]
    assert o["positions"] == 1 and o["classes"] == 2 and o["top1"] == pytest.approx(3 / 4)


def test_several_padded_batches_are_joined_on_the_batch_axis() -> None:
    """7 samples in fixed batches of 3 (the last padded with 2 copies): the runner answers
    [T, 3, C]; the joined output is the 7 samples' own [T, C], in order."""
    x = np.arange(7 * 2, dtype=np.float32).reshape(7, 2)

    class TimeMajor:
        def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            b = feeds["x"]  # [3, 2]
            steps = np.stack([b * (t + 1) for t in range(4)])  # [T=4, 3, 2]
            return [steps, b.sum(1)]  # a second output, batched on axis 0

    axes = BatchAxes.of({"seq": ValuesOutput(kind="values", batch_axis=1)}, ["seq", "total"])
    seq, total = run_all(TimeMajor(), Samples({"x": x}, None), 3, True, axes=axes)
    want = np.stack([x * (t + 1) for t in range(4)], axis=1)  # [7, 4, 2]
    assert seq.shape == (7, 4, 2) and np.array_equal(seq, want)
    assert np.array_equal(total, x.sum(1))
    # without the declaration the batches are stacked on the time axis, and the padded
    # batch loses 3 of its 4 time steps instead of its 2 padding samples: [4 + 4 + 1, 3, 2]
    assert run_all(TimeMajor(), Samples({"x": x}, None), 3, True)[0].shape == (9, 3, 2)


def test_a_scalar_output_of_one_sample_batches_is_one_value_per_sample() -> None:
    """A batch-1 regressor that squeezes its batch away (speechmos' PLCMOS: one score, a 0-D
    output) gives one value per sample, where joining 0-D arrays failed."""
    x = np.arange(5 * 2, dtype=np.float32).reshape(5, 2)

    class Scalar:
        def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            return [np.asarray(feeds["x"].sum(), np.float32)]  # shape ()

    (score,) = run_all(Scalar(), Samples({"x": x}, None), 1, True)
    assert score.shape == (5,) and np.array_equal(score, x.sum(1))
    # from a batch of several samples, a 0-D output says nothing of each: an error
    with pytest.raises(EdgeflowError, match="an output is 0-D: one value for a batch of 2"):
        run_all(Scalar(), Samples({"x": x[:4]}, None), 2, True)


def test_the_class_axis_cannot_be_the_batch_axis() -> None:
    with pytest.raises(ValidationError, match=r"axis 1 is the batch axis \(batch_axis: 1\)"):
        ClassesOutput(kind="classes", axis=1, batch_axis=1)
    with pytest.raises(ValidationError, match=r"less than or equal to 7"):
        ValuesOutput(kind="values", batch_axis=8)
    ClassesOutput(kind="classes", axis=0, batch_axis=2)  # classes first, batch last: fine
    # a negative axis meets the batch axis only at a rank: there, a located error
    spec = ClassesOutput(kind="classes", axis=-2, batch_axis=1)
    ref = np.zeros((3, 4, 5), np.float32)
    with pytest.raises(EdgeflowError, match=r"outputs\.t\.axis: classes over axis -2, the batch"):
        compare_outputs([ref], [ref], ["t"], {"t": spec})


def test_a_batch_axis_beyond_the_output_rank_is_a_located_error(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "evaluation:\n  dataset: data.npz\n  outputs:\n"
        "    ctc: {kind: classes, ctc_blank: 0, batch_axis: 3}\n"
    )
    declared = {"ctc": ClassesOutput(kind="classes", ctc_blank=0, batch_axis=3)}
    axes = BatchAxes.of(declared, ["ctc"])
    with pytest.raises(AtRecipeKey) as caught:
        axes.first([np.zeros((6, 3, 4), np.float32)])
    exc = relocated(caught.value, recipe)
    assert exc.message == (
        f"{recipe}:4:52: evaluation.outputs.ctc.batch_axis: output 'ctc' has shape [6, 3, 4], "
        "no axis 3 (got 3)"
    )  # line 4, column 52: the `3` of `batch_axis: 3`
    assert exc.hint == "set batch_axis to the axis of [6, 3, 4] that holds the samples"


def test_a_detector_head_batched_on_axis_1_matches_as_the_batch_first_one() -> None:
    """[N, B, 4 + 2] with batch_axis: 1 gives the figures of the same head as [B, N, 6]."""
    rng = np.random.default_rng(0)
    head = rng.uniform(0, 1, (2, 5, 6)).astype(np.float32)  # [B=2, N=5, F]
    head[..., 2:4] += head[..., :2]  # x2 >= x1, y2 >= y1
    moved = head.copy()
    moved[1, 0, 4:] = [0.9, 0.0]  # one candidate's class changes in the artifact
    boxes = BoxMatching((32, 32), DetectionChecks())
    first = DetectionsOutput(kind="detections")
    want = compare_outputs([head], [moved], ["d"], {"d": first}, boxes)["outputs"][0]
    late = DetectionsOutput(kind="detections", batch_axis=1)
    axes = BatchAxes.of({"d": late}, ["d"])
    [h], [m] = axes.first([np.moveaxis(head, 0, 1)]), axes.first([np.moveaxis(moved, 0, 1)])
    got = compare_outputs([h], [m], ["d"], {"d": late}, boxes)["outputs"][0]
    assert got["detections"] == want["detections"] and got["batch_axis"] == 1
    with pytest.raises(ValidationError, match=r"the layout axis 1 is the batch axis"):
        DetectionsOutput(kind="detections", axis=1, batch_axis=1)
