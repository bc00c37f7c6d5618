"""Detections: the padded form, the set comparison, the sample-photo dataset, recipe checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from edgeflow.datasets import sample_image_crops
from edgeflow.recipe import load_recipe
from edgeflow.verify.detections import compare, from_arrays, padded
from tests import needs

SIZE = (320, 320)


def eager_like(n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A torchvision-style detection dict with n distinct detections, scores descending."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * 200
    boxes = torch.cat([xy, xy + 10 + torch.rand(n, 2, generator=g) * 100], dim=1)
    scores = torch.linspace(0.9, 0.1, n)
    labels = torch.randint(1, 5, (n,), generator=g)
    return {"boxes": boxes, "scores": scores, "labels": labels}


def test_list_of_dicts_and_padded_tuples_give_the_same_form() -> None:
    dets = [eager_like(7), eager_like(3, seed=1)]
    boxes, scores, labels, valid = padded(dets, 10)
    assert boxes.shape == (2, 10, 4) and scores.shape == labels.shape == valid.shape == (2, 10)
    assert valid.sum(1).tolist() == [7, 3]
    assert labels.dtype == np.int64 and valid.dtype == bool
    np.testing.assert_array_equal(boxes[1, :3], dets[1]["boxes"].numpy())
    again = padded(tuple(torch.from_numpy(a) for a in (boxes, scores, labels, valid)), 10)
    for a, b in zip(again, (boxes, scores, labels, valid), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match=r"7 detections, more than .*max_detections = 5"):
        padded(dets, 5)
    with pytest.raises(ValueError, match="a detection model must return"):
        padded(torch.zeros(2, 3), 10)


def test_identical_detections_in_another_order_all_match() -> None:
    ref = padded([eager_like(50)], 60)
    order = np.random.default_rng(0).permutation(60)
    shuffled = [a[:, order] for a in ref]
    result = compare(ref, shuffled, SIZE, 1e-3, "pixels", 1e-4)
    assert result["matched"] == result["reference_detections"] == 50
    assert result["match_rate"] == 1.0 and result["max_box_diff_px"] == 0.0


def test_box_tolerance_in_pixels_and_relative_units() -> None:
    ref = padded([eager_like(20)], 20)
    moved = [a.copy() for a in ref]
    moved[0][0, 4, 2] += 0.01  # one coordinate of one box moves by 0.01 px
    pixels = compare(ref, moved, SIZE, 1e-3, "pixels", 1e-4)
    assert pixels["matched"] == 19 and pixels["match_rate"] == pytest.approx(19 / 20)
    assert pixels["max_box_diff_px"] == pytest.approx(0.01, rel=1e-3)
    relative = compare(ref, moved, SIZE, 1e-3, "relative", 1e-4)  # 1e-3 of 320 px = 0.32 px
    assert relative["matched"] == 20
    assert relative["max_box_diff_relative"] == pytest.approx(0.01 / 320, rel=1e-3)


def test_wrong_labels_missing_and_extra_detections_lower_the_rate() -> None:
    ref = padded([eager_like(10)], 12)
    other = [a.copy() for a in ref]
    other[2][0, 0] += 10  # a label no reference detection has at that box: a miss
    other[3][0, 10] = True  # an extra detection (zeros box, label 0)
    result = compare(ref, other, SIZE, 1e-3, "pixels", 1e-4)
    assert result["matched"] == 9
    assert result["artifact_detections"] == 11 and result["count_mismatch_images"] == 1
    assert result["match_rate"] == pytest.approx(9 / 11)
    assert result["missed"] == 1


def test_from_arrays_checks_the_layout() -> None:
    with pytest.raises(ValueError, match="expected 4 outputs"):
        from_arrays([np.zeros((1, 3, 4))], 3)
    with pytest.raises(ValueError, match=r"expected boxes \[B, D, 4\]"):
        from_arrays([np.zeros((1, 3)), np.zeros((1, 3)), np.zeros((1, 3)), np.zeros((1, 3))], 3)


def test_sample_image_crops_are_real_distinct_photographs() -> None:
    needs.require("pillow")  # scikit-learn reads its sample photographs with it
    test = sample_image_crops("test", size=(320, 320), count=8)["images"]
    calibration = sample_image_crops("calibration", size=(320, 320), count=8)["images"]
    assert test.shape == (8, 3, 320, 320) and test.dtype == np.float32
    assert test.flags.c_contiguous and test.min() >= 0.0 and test.max() <= 1.0
    flat = np.concatenate([test, calibration]).reshape(16, -1)
    distinct = {row.tobytes() for row in flat}
    assert len(distinct) == 16  # no crop repeats within or across the splits
    assert 0.05 < float(test.std()) < 0.5  # photographs, not noise or a constant
    with pytest.raises(ValueError, match="do not fit"):
        sample_image_crops(size=(500, 320))


def test_detection_recipes_refuse_classifier_thresholds(tmp_path: Path) -> None:
    from edgeflow.core.errors import EdgeflowError

    recipe = tmp_path / "det.yaml"
    recipe.write_text(
        "source:\n"
        "  kind: pytorch\n"
        "  model: torch.nn:Identity\n"
        "  inputs: [{name: images, shape: [1, 3, 32, 32]}]\n"
        "evaluation: {dataset: 'edgeflow.datasets:sample_image_crops', metric: detections}\n"
        "target: onnxruntime_micro\n"
        "verify:\n"
        "  max_accuracy_drop: 0.01\n"
    )
    with pytest.raises(
        EdgeflowError, match=r"det\.yaml:8:\d+: verify\.max_accuracy_drop: does not apply"
    ):
        load_recipe(recipe)


def needs_a_missing_package() -> torch.nn.Module:
    import edgeflow_no_such_package  # type: ignore[import-not-found]  # noqa: F401

    return torch.nn.Identity()


def test_a_model_whose_package_is_missing_is_a_user_error() -> None:
    from edgeflow.core.errors import EdgeflowError
    from edgeflow.schema.source import PyTorchSource
    from edgeflow.source import build_module

    def source(model: str) -> PyTorchSource:
        inputs = [{"name": "images", "shape": [1, 3, 320, 320]}]
        return PyTorchSource.model_validate({"kind": "pytorch", "model": model, "inputs": inputs})

    with pytest.raises(EdgeflowError, match="imports 'edgeflow_no_such_package'"):
        build_module(source("tests.test_detections:needs_a_missing_package"))
    try:
        import torchvision  # noqa: F401
    except ImportError:
        with pytest.raises(EdgeflowError, match="needs torchvision") as info:
            build_module(source("edgeflow.zoo.torchvision_detection:ssdlite320"))
        assert "docs/detection.md" in (info.value.hint or "")
