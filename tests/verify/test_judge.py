"""Thresholds per quantization mode (verify.by_mode), where each came from, and the recipe's
own task metric: what the report stage and the fallback search both judge a build by."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgeflow.core.errors import EdgeflowError, RecipeError
from edgeflow.recipe import load_recipe
from edgeflow.schema.sections import Verify
from edgeflow.verify import judge
from edgeflow.verify.judge import Comparison, build_checks, quality_checks, thresholds

RNG = np.random.default_rng(0)
REFERENCE = [RNG.standard_normal((16, 10)).astype(np.float32)]
NOISY = [REFERENCE[0] + 0.05 * RNG.standard_normal((16, 10)).astype(np.float32)]


def _failed(verify: Verify, mode: str) -> list[str]:
    agreement = Comparison(["logits"], {}).agreement(REFERENCE, NOISY)
    checks = build_checks(thresholds(verify, mode), agreement, None, 1.0, 10)
    return [c["message"] for c in checks if not c["passed"]]


def test_a_float32_threshold_failing_an_int8_build_says_whose_it_is() -> None:
    verify = Verify(max_relative_diff=1e-3)
    [message] = _failed(verify, "int8")
    assert message.startswith("verify.max_relative_diff: ")
    assert message.endswith(
        "is above the threshold 0.001 (from verify.max_relative_diff, which holds for every "
        "mode; set verify.by_mode.int8.max_relative_diff for int8 builds)"
    )


def test_by_mode_wins_for_its_mode_and_null_turns_a_key_off() -> None:
    verify = Verify.model_validate(
        {
            "max_relative_diff": 1e-3,
            "by_mode": {"int8": {"max_relative_diff": None, "min_sqnr_db": 40}},
        }
    )
    int8 = thresholds(verify, "int8").limits
    assert "max_relative_diff" not in int8
    assert (int8["min_sqnr_db"].value, int8["min_sqnr_db"].origin) == (
        40.0,
        "verify.by_mode.int8.min_sqnr_db",
    )
    none = thresholds(verify, "none").limits
    assert none["max_relative_diff"].value == 1e-3 and "min_sqnr_db" not in none
    [message] = _failed(verify, "int8")  # 26 dB of noise
    assert message.endswith("is below the threshold 40 (from verify.by_mode.int8.min_sqnr_db)")
    assert thresholds(Verify(), "int8").limits["min_sqnr_db"].origin == "default"


def test_by_mode_is_validated_and_located(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "source: {kind: pytorch, model: 'edgeflow.zoo.digits:DigitsCNN', "
        "inputs: [{name: image, shape: [1, 1, 8, 8]}]}\n"
        "calibration: {dataset: 'edgeflow.datasets:sklearn_digits', split: calibration}\n"
        "evaluation: {dataset: 'edgeflow.datasets:sklearn_digits', split: test}\n"
        "target: onnxruntime_micro\n"
        "verify:\n"
        "  by_mode:\n"
        "    int8: {max_abs_diff: -1, min_sqnr_db: auto}\n"
        "    int4: {}\n"
    )
    with pytest.raises(RecipeError) as info:
        load_recipe(recipe)
    problems = [p.render() for p in info.value.problems]
    assert (
        problems[0]
        == f"{recipe}:7:26: verify.by_mode.int8.max_abs_diff: must be at least 0 (got -1)"
    )
    assert problems[1].startswith(
        f"{recipe}:7:43: verify.by_mode.int8.min_sqnr_db: auto is verify.min_sqnr_db's default"
    )
    assert problems[2].startswith(f"{recipe}:8:5: verify.by_mode.int4.[key]: must be one of none")
    recipe.write_text(recipe.read_text().rsplit("verify:", 1)[0])
    loaded = load_recipe(recipe, {"verify.by_mode.int8.min_sqnr_db": 25})  # as printed
    assert thresholds(loaded.recipe.verify, "int8").limits["min_sqnr_db"].value == 25.0


def test_the_task_metric_is_the_users_function_held_to_its_bound(tmp_path: Path) -> None:
    (tmp_path / "metrics.py").write_text(
        "import numpy as np\n\n"
        "def agree(reference, outputs):\n"
        "    same = reference['logits'].argmax(-1) == outputs['logits'].argmax(-1)\n"
        "    return float(np.mean(same))\n\n"
        "def broken(reference, outputs):\n"
        "    return 'high'\n"
    )
    verify = Verify.model_validate(
        {"task_metric": {"function": "metrics.py:agree", "min": 0.999}},
        context={"base_dir": tmp_path},
    )
    comparison = Comparison(["logits"], {}, task=verify.task_metric)
    agreement = comparison.agreement(REFERENCE, NOISY)
    score = float(np.mean(REFERENCE[0].argmax(-1) == NOISY[0].argmax(-1)))
    assert agreement["task_metric"] == {"name": "agree", "value": score}
    [check] = [c for c in quality_checks(thresholds(verify, "none"), agreement, None)]
    assert check["metric"] == "verify.task_metric" and check["passed"] == (score >= 0.999)
    broken = Verify.model_validate(
        {"task_metric": {"function": "metrics.py:broken", "max": 1}},
        context={"base_dir": tmp_path},
    )
    with pytest.raises(EdgeflowError, match="returned 'high', not a finite number"):
        Comparison(["logits"], {}, task=broken.task_metric).agreement(REFERENCE, NOISY)
    with pytest.raises(Exception, match="one bound"):
        Verify.model_validate(
            {"task_metric": {"function": "metrics.py:agree"}}, context={"base_dir": tmp_path}
        )


def test_a_missed_search_with_int8_io_says_what_is_left() -> None:
    """The TFLite family's mixes read and write int8: where every layer went float and the
    budget still missed, the message says the I/O is what is left, and how to make it float
    (measured 2026-12 on BeatNet on tflite: 17 of 17 layers float, 0.989; with float32 I/O,
    9 layers float, 0.990)."""
    chosen = {"float_layers": [{"layer": f"l{k}"} for k in range(17)], "missed": ["m"]}
    record = {
        "met": False,
        "chosen": chosen,
        "trials": [chosen] * 7,
        "measured_on": "calibration samples (16)",
        "int8_io": True,
        "candidates": 17,
    }
    (check,) = judge.fallback_checks(record)
    assert (
        "with every layer float (17 of 17) what is left is the int8 input and output"
        in (check["message"])
    )
    assert check["message"].endswith(
        "set quantization.float_outputs: true for float32 I/O, which the search can then keep float"
    )
    (plain,) = judge.fallback_checks({**record, "int8_io": False})
    assert "float_outputs" not in plain["message"]
