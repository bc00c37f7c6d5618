"""recipes/ssdlite320.yaml: torchvision's SSDlite to a static ONNX graph that matches eager.

torchvision is not part of edgeflow's install (it needs torch 2.14.1 on this machine; see
docs/detection.md), so these tests skip where it is missing, CI included: .ci/run does not
install it, so it is no dependency of tests/needs.py. Run them in the environment
docs/detection.md describes: `venv-tv/bin/python -m pytest tests/test_ssdlite320.py`.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from edgeflow.core.errors import EdgeflowError
from edgeflow.datasets import sample_image_crops
from edgeflow.engine.cache import Cache
from edgeflow.engine.runner import run_build
from edgeflow.recipe import find_recipe, load_recipe
from edgeflow.source import build_module
from edgeflow.stages._rewritten import rewritten_module
from edgeflow.verify.detections import padded
from tests import needs

pytest.importorskip(
    "torchvision", reason="torchvision is not installed (not by CI either; see docs/detection.md)"
)
needs.require("pillow")  # the evaluation photographs

FORBIDDEN = {"NonZero", "Loop", "If", "Scan", "NonMaxSuppression"}


def loaded(**overrides: object):  # type: ignore[no-untyped-def]
    return load_recipe(find_recipe("ssdlite320"), overrides)


def test_the_rewritten_model_equals_eager_torchvision_bit_for_bit() -> None:
    recipe = loaded()
    rewritten, records, _ = rewritten_module(recipe.recipe, recipe.path.parent)
    assert records[0]["changed"] and records[0]["matches"] == 1
    eager = build_module(recipe.recipe.source)
    images = torch.from_numpy(sample_image_crops("test", count=2)["images"])
    with torch.inference_mode():
        for i in range(2):
            expected = padded(eager(images[i : i + 1]), 300)
            actual = padded(rewritten(images[i : i + 1]), 300)
            assert expected[3].sum() == 300  # re-randomised weights: 300 distinct detections
            for e, a in zip(expected, actual, strict=True):
                np.testing.assert_array_equal(a, e)


def test_other_input_sizes_are_refused_with_the_reason() -> None:
    recipe = loaded(**{"source.inputs": [{"name": "images", "shape": [1, 3, 300, 300]}]})
    with pytest.raises(EdgeflowError, match=r"resizes images to \(height, width\) \(320, 320\)"):
        rewritten_module(recipe.recipe, recipe.path.parent)


@pytest.mark.slow
def test_recipe_builds_a_static_graph_whose_detections_match_eager(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache")
    result = run_build(loaded(), cache, tmp_path / "build", echo=lambda _: None)
    metrics = result.metrics
    assert metrics["verified"], result.failed_checks
    agreement = metrics["agreement"]
    assert agreement["reference_detections"] == agreement["artifact_detections"] == 8 * 300
    assert agreement["matched"] == 8 * 300
    assert agreement["max_box_diff_relative"] <= 1e-3  # measured: 4.3e-5 (0.014 px)
    verify = json.loads((result.build_dir / "verify.json").read_text())
    for image in verify["agreement"]["per_image"]:
        assert image["reference"] == image["artifact"] == image["matched"] == 300
    export = next(o for o in result.outcomes if o.stage == "export")
    graph = onnx.load(str(cache.entry("export", export.key) / "model.onnx")).graph
    ops = Counter(node.op_type for node in graph.node)
    assert not FORBIDDEN & set(ops), ops
    assert ops["TopK"] == 1 and ops["Conv"] > 50
    shapes = {
        o.name: [
            d.dim_value if d.HasField("dim_value") else d.dim_param
            for d in o.type.tensor_type.shape.dim
        ]
        for o in graph.output
    }
    assert shapes == {
        "boxes": [1, 300, 4],
        "scores": [1, 300],
        "labels": [1, 300],
        "valid": [1, 300],
    }


@pytest.mark.slow
def test_tflite_recipe_ships_the_post_processing_beside_the_artifact(tmp_path: Path) -> None:
    """recipes/ssdlite320_tflite.yaml: model.tflite ends at the head; postprocess.onnx + the
    generated postprocess.py compute the detections; verified together against eager."""
    needs.require("tflite")
    recipe = load_recipe(find_recipe("ssdlite320_tflite"), {})
    result = run_build(recipe, Cache(tmp_path / "cache"), tmp_path / "build", echo=lambda _: None)
    metrics = result.metrics
    assert metrics["verified"], result.failed_checks
    agreement = metrics["agreement"]
    assert agreement["reference_detections"] == agreement["matched"] == 8 * 300
    assert agreement["max_box_diff_relative"] <= 1e-3  # measured: 6.2e-5 (0.020 px)
    for name in ("model.tflite", "postprocess.onnx", "postprocess.py"):
        assert (result.build_dir / name).is_file(), name
    assert (result.build_dir / "postprocess.onnx").stat().st_size < 2_000_000  # shared constants
    precheck = json.loads((result.build_dir / "precheck.json").read_text())
    assert not FORBIDDEN & set(precheck["ops"]) and "TopK" not in precheck["ops"]
