"""Every class of recipe error is reported at its file:line:col with a hint, all at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeflow.cli import main
from edgeflow.errors import RecipeError
from edgeflow.recipe import load_recipe
from tests.conftest import DEMO_WEIGHTS

GOOD = f"""
name: demo
source:
  kind: pytorch
  model: edgeflow.zoo.digits:DigitsCNN
  weights: {DEMO_WEIGHTS}
  inputs:
    - {{name: image, shape: [1, 1, 8, 8]}}
calibration: {{dataset: "edgeflow.datasets:sklearn_digits", split: calibration}}
evaluation: {{dataset: "edgeflow.datasets:sklearn_digits", split: test}}
quantization:
  mode: int8
target: onnxruntime_micro
"""


def problems(path: Path, **overrides: object) -> list[str]:
    with pytest.raises(RecipeError) as info:
        load_recipe(path, overrides)
    return [p.render() for p in info.value.problems]


def test_good_recipe_loads(write_recipe) -> None:
    loaded = load_recipe(write_recipe(GOOD))
    assert loaded.build_name == "onnxruntime_micro-int8"
    assert loaded.recipe.source.weights == DEMO_WEIGHTS


def test_bad_enum_value_names_choices_and_suggests(write_recipe) -> None:
    path = write_recipe(GOOD.replace("mode: int8", "mode: int4"))
    assert problems(path) == [
        f"{path}:11:9: quantization.mode: must be one of none, fp16, int8 (got int4)\n"
        "  hint: did you mean 'int8'? (valid: none, fp16, int8)"
    ]


def test_unknown_key_suggests_the_closest(write_recipe) -> None:
    path = write_recipe(GOOD.replace("  mode: int8", "  mode: int8\n  per_chanel: true"))
    assert problems(path) == [
        f"{path}:12:3: quantization.per_chanel: unknown key 'per_chanel'\n"
        "  hint: did you mean 'per_channel'?"
    ]


def test_unknown_key_inside_a_list_item(write_recipe) -> None:
    path = write_recipe(GOOD.replace("shape: [1, 1, 8, 8]}", "shape: [1, 1, 8, 8], dtyp: int8}"))
    [problem] = problems(path)
    assert problem.startswith(f"{path}:7:42: source.inputs[0].dtyp: unknown key 'dtyp'")
    assert "did you mean 'dtype'?" in problem


def test_missing_field_is_reported_at_its_parent(write_recipe) -> None:
    path = write_recipe(
        GOOD.replace("  kind: pytorch\n", "")
        .replace("source:", "source:\n  kind: pytorch")
        .replace("    - {name: image, shape: [1, 1, 8, 8]}\n", "")
        .replace("  inputs:\n", "")
    )
    assert problems(path) == [
        f"{path}:2:1: source.inputs: missing required key\n  hint: add 'inputs:' under source"
    ]


def test_wrong_type(write_recipe) -> None:
    path = write_recipe(GOOD.replace("shape: [1, 1, 8, 8]", "shape: [1, one, 8, 8]"))
    [problem] = problems(path)
    assert problem.startswith(f"{path}:7:32: source.inputs[0].shape[1]: must be a valid integer")
    assert problem.endswith("(got one)")


def test_broken_yaml_syntax(write_recipe) -> None:
    path = write_recipe(GOOD.replace("  mode: int8", "  mode: [int8"))
    [problem] = problems(path)
    assert problem.startswith(f"{path}:12:7: invalid YAML: expected ',' or ']'")
    assert "hint:" in problem


def test_duplicate_key_is_a_yaml_error(write_recipe) -> None:
    path = write_recipe(GOOD + "target: tflite\n")
    [problem] = problems(path)
    assert f"{path}:13:1: invalid YAML:" in problem and "duplicate key" in problem


def test_missing_weights_file(write_recipe) -> None:
    path = write_recipe(GOOD.replace(str(DEMO_WEIGHTS), "models/nope.pt"))
    [problem] = problems(path)
    assert problem.startswith(f"{path}:5:12: source.weights: file not found: models/nope.pt")
    assert "hint: paths are relative to the recipe's folder" in problem


def test_every_problem_is_reported_at_once(write_recipe) -> None:
    text = GOOD.replace("mode: int8", "mode: int4").replace(
        "target: onnxruntime_micro", "target: onnxruntime_mirco\nverfy: {}"
    )
    found = problems(write_recipe(text))
    assert [p.split(": ")[1] for p in found] == ["quantization.mode", "target", "verfy"]
    assert "did you mean 'onnxruntime_micro'?" in found[1]
    assert "did you mean 'verify'?" in found[2]


def test_bad_model_reference_suggests_a_defined_name(write_recipe) -> None:
    path = write_recipe(GOOD.replace("DigitsCNN", "DigitCNN"))
    [problem] = problems(path)
    assert problem.startswith(f"{path}:4:10: source.model: 'DigitCNN' is not defined in digits.py")
    assert "did you mean 'DigitsCNN'?" in problem


def test_int8_without_calibration(write_recipe) -> None:
    path = write_recipe(
        GOOD.replace(
            'calibration: {dataset: "edgeflow.datasets:sklearn_digits", split: calibration}\n', ""
        )
    )
    [problem] = problems(path)
    assert problem.startswith(
        f"{path}:10:9: quantization.mode: int8 quantization needs a calibration"
    )


def test_unknown_rewrite_rule_fails_at_load(write_recipe) -> None:
    path = write_recipe(GOOD + "rewrites:\n  - fx.fuse_conv_bnn\n")
    [problem] = problems(path)
    assert problem.startswith(f"{path}:14:5: rewrites[0]: unknown rule 'fx.fuse_conv_bnn'")


def test_command_line_override_errors_name_the_override(write_recipe) -> None:
    path = write_recipe(GOOD)
    [problem] = problems(path, **{"quantization.mode": "int4"})
    assert problem.startswith(
        "<command line> (quantization.mode=int4): quantization.mode: must be one of"
    )


def test_validate_command_exits_2_without_traceback(write_recipe, capsys) -> None:
    path = write_recipe(GOOD.replace("mode: int8", "mode: int4"))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"{path}:11:9: quantization.mode" in err and "1 problem found." in err


def test_validate_command_accepts_the_builtin_demo(capsys) -> None:
    assert main(["validate", "digits_cnn"]) == 0
    assert "ok (digits_cnn -> onnxruntime_micro-int8)" in capsys.readouterr().out


def test_inline_target_profile(write_recipe) -> None:
    inline = "target:\n  name: tiny\n  backend: onnxruntime_micro\n  quantization: [none]\n"
    path = write_recipe(GOOD.replace("target: onnxruntime_micro\n", inline))
    [problem] = problems(path)
    assert problem.startswith(
        f"{path}:11:9: quantization.mode: target 'tiny' does not support mode 'int8'"
    )
    assert "hint: choose one of none" in problem
    loaded = load_recipe(path, {"quantization.mode": "none"})
    assert loaded.profile.name == "tiny" and loaded.build_name == "tiny-none"


def test_inline_target_profile_errors_are_located(write_recipe) -> None:
    inline = "target:\n  name: tiny\n  backend: onnxruntime_micro\n  opset: {min: 7, mx: 9}\n"
    [problem] = problems(write_recipe(GOOD.replace("target: onnxruntime_micro\n", inline)))
    assert ":15:19: target.opset.mx: unknown key 'mx'" in problem
    assert "did you mean 'max'?" in problem
