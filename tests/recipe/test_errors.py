"""Every class of recipe error is reported at its file:line:col with a hint, all at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeflow.cli import main
from edgeflow.core.errors import RecipeError
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
        f"{path}:11:9: quantization.mode: must be one of none, fp16, int8, int8_weights "
        "(got int4)\n"
        "  hint: did you mean 'int8'? (valid: none, fp16, int8, int8_weights)"
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


def test_a_rule_named_without_the_options_it_needs_is_located_at_its_entry(
    write_recipe,
) -> None:
    """`- onnx.convert_opset` was "opset: missing required key / hint: add 'opset:' under
    the top level": the entry is what is wrong, and the hint shows the form that works."""
    path = write_recipe(GOOD + "rewrites:\n  - onnx.convert_opset\n")
    [problem] = problems(path)
    assert problem.startswith(
        f"{path}:14:5: rewrites[0]: rule 'onnx.convert_opset' needs opset\n"
        "  hint: write the entry as {rule: onnx.convert_opset, opset: <int>}"
    )
    loaded = load_recipe(
        write_recipe(GOOD + "rewrites:\n  - {rule: onnx.convert_opset, opset: 13}\n")
    )
    [spec] = loaded.recipe.rewrites
    assert spec.name == "onnx.convert_opset" and spec.options.opset == 13


def test_rewrites_must_be_a_list_and_resolve_to_rule_specs(write_recipe) -> None:
    from edgeflow.rules.base import RuleSpec

    path = write_recipe(GOOD + "rewrites: fx.fuse_conv_bn\n")
    [problem] = problems(path)
    assert problem.startswith(f"{path}:13:11: rewrites: expected a list of rules (got 'fx.")
    loaded = load_recipe(write_recipe(GOOD + "rewrites:\n  - fx.fuse_conv_bn\n"))
    [spec] = loaded.recipe.rewrites
    assert isinstance(spec, RuleSpec) and spec.name == "fx.fuse_conv_bn"


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
    assert "hint: choose one: quantization.mode=none" in problem
    loaded = load_recipe(path, {"quantization.mode": "none"})
    assert loaded.profile.name == "tiny" and loaded.build_name == "tiny-none"


def test_inline_target_profile_errors_are_located(write_recipe) -> None:
    inline = "target:\n  name: tiny\n  backend: onnxruntime_micro\n  opset: {min: 7, mx: 9}\n"
    [problem] = problems(write_recipe(GOOD.replace("target: onnxruntime_micro\n", inline)))
    assert ":15:19: target.opset.mx: unknown key 'mx'" in problem
    assert "did you mean 'max'?" in problem


def test_problems_of_every_phase_come_in_one_run(write_recipe) -> None:
    """A schema problem, an unknown rule and an unknown board: three phases, one report."""
    text = GOOD.replace("target: onnxruntime_micro", "target: tflite_micro\nexport: {opst: 18}")
    text += "precheck: {board: cortex_m9}\nrewrites:\n  - fx.fuse_conv_bnn\n"
    found = problems(write_recipe(text))
    keys = [p.split(": ")[1] for p in found]
    assert keys == ["export.opst", "precheck.board", "rewrites[0]"], found
    assert "did you mean 'opset'?" in found[0]
    assert "target 'tflite_micro' has no board 'cortex_m9'" in found[1]
    assert "unknown rule 'fx.fuse_conv_bnn'" in found[2]


def test_a_missing_calibration_does_not_hide_a_bad_metric(write_recipe) -> None:
    text = GOOD.replace(
        'calibration: {dataset: "edgeflow.datasets:sklearn_digits", split: calibration}\n', ""
    ).replace("split: test}", "split: test, metric: top5}")
    found = problems(write_recipe(text))
    assert [p.split(": ")[1] for p in found] == ["evaluation.metric", "quantization.mode"]
    assert "int8 quantization needs a calibration dataset" in found[1]


def test_a_mode_the_target_lacks_and_a_bad_key_in_one_run(write_recipe) -> None:
    text = GOOD.replace("target: onnxruntime_micro", "target: tflite_micro\nverify: {runs: 3}")
    found = problems(write_recipe(text.replace("mode: int8", "mode: fp16")))
    assert [p.split(": ")[1] for p in found] == ["quantization.mode", "verify.runs"]
    assert "target 'tflite_micro' does not support mode 'fp16'" in found[0]


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ("shape: [1, 1, 8, 8]", "shape: [1, 1, true, 8]", "source.inputs[0].shape[2]"),
        ("target: onnxruntime_micro", "target: onnxruntime_micro\nverify: {latency_runs: true}",
         "verify.latency_runs"),
        ("target: onnxruntime_micro", "target: onnxruntime_micro\nverify: {max_abs_diff: false}",
         "verify.max_abs_diff"),
        ("split: calibration}", "split: calibration, samples: true}", "calibration.samples"),
        ("target: onnxruntime_micro", "target: onnxruntime_micro\nexport: {opset: 18.0}",
         "export.opset"),
        ("target: onnxruntime_micro", "target: onnxruntime_micro\nverify: {max_abs_diff: .nan}",
         "verify.max_abs_diff"),
        ("target: onnxruntime_micro", "target: onnxruntime_micro\nverify: {max_latency_ms: .inf}",
         "verify.max_latency_ms"),
    ],
)  # fmt: skip
def test_values_are_taken_as_written_no_boolean_is_a_number(
    old: str, new: str, key: str, write_recipe
) -> None:
    [problem] = problems(write_recipe(GOOD.replace(old, new)))
    assert f": {key}: " in problem


@pytest.mark.parametrize(
    ("added", "message"),
    [
        ("source: {dynamic_batch: {min: 8, max: 4}}", "min (8) is above max (4)"),
        ("export: {opset: 15}", "the dynamo exporter writes opsets 18 to 23, not 15"),
        ("export: {opset: 21, exporter: torchscript}",
         "the torchscript exporter writes opsets 13 to 20, not 21"),
        ("verify: {latency_runs: 1000000000000}", "less than or equal to 10000"),
        ("verify: {warmup_runs: 1000000000}", "less than or equal to 1000"),
        ("source: {shape: [1, 1, 65536, 65536]}", "elements per sample is more than"),
    ],
)  # fmt: skip
def test_combinations_that_would_fail_or_surprise_at_run_time_are_refused(
    added: str, message: str, write_recipe
) -> None:
    """dynamic_batch min > max ended in an export traceback; opset 15 with dynamo silently
    became 18; a trillion latency runs never finished."""
    text = GOOD
    if added.startswith("source: {dynamic_batch"):
        text = text.replace("source:\n", "source:\n  dynamic_batch: {min: 8, max: 4}\n")
    elif added.startswith("source: {shape"):
        text = text.replace("shape: [1, 1, 8, 8]", "shape: [1, 1, 65536, 65536]")
    else:
        text += added + "\n"
    [problem] = problems(write_recipe(text))
    assert message in problem


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("name: caf\xe9\n".encode("latin-1"), "not UTF-8 text: byte 0xe9"),
        ("name: x\n".encode("utf-16"), "the file is UTF-16 text"),
        (b"name: a\x00b\n", "NUL byte"),
        (b"a: " + b"[" * 10_000 + b"]" * 10_000 + b"\n", "nested more than 64 levels"),
        (
            b"a: &a [x, x, x, x, x, x, x, x, x, x]\n"
            + b"".join(
                f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n".encode()
                for i in range(8)
            ),
            "expands to more than 100,000 values",
        ),
        (b"x" * (2 << 20), "more than a recipe's limit"),
    ],
)
def test_malformed_files_are_located_errors_not_tracebacks_or_hangs(
    content: bytes, message: str, tmp_path: Path, capsys
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and str(path) in err


def test_a_recipe_file_name_that_cannot_name_a_build_folder(write_recipe) -> None:
    [problem] = problems(write_recipe(GOOD, "...yaml"))
    assert "the file name ...yaml cannot name a build folder" in problem


def test_validate_runs_none_of_the_users_code(write_recipe, tmp_path: Path, capsys) -> None:
    """A user rule's module is checked from its source: its top-level code does not run."""
    marker = tmp_path / "ran.txt"
    (tmp_path / "myrules.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from edgeflow.rules.base import OnnxRule\n\n"
        "class Mine(OnnxRule):\n    name = 'user.mine'\n    description = 'x'\n"
    )
    path = write_recipe(GOOD + "rewrites:\n  - myrules.py:Mine\n  - myrules.py:Other\n")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "rewrites[1]: cannot load rule 'myrules.py:Other': 'Other' is not defined" in err
    path = write_recipe(GOOD + "rewrites:\n  - myrules.py:Mine\n")
    assert main(["validate", str(path)]) == 0
    assert "myrules.py:Mine: found in its source" in capsys.readouterr().out
    assert not marker.exists()
