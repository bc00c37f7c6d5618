"""A printed `rewrites:` entry reads back as the same values in a recipe file (YAML) and inside
a command line's `rewrites=[...]` (Hydra's override grammar)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf
from ruamel.yaml import YAML

from edgeflow.core.loader import plain
from edgeflow.rules import builtin_rules
from edgeflow.rules.entries import entry, options_for, template
from edgeflow.rules.fixes import Fix

VALUES: list[Any] = [
    11, -3, 0.5, -2.5, 1e-3, 1e-5, 1e20, True, False, None,
    "relu6", "HardSigmoid", "x.1", "_x", "pkg.module:fn", "file.py:fn", "a/b", "x:0",
    "onnx::Gemm_3", "/model/conv/Conv_output_0",
    "a b", "a, b", "a #b", "a: b", "#c", "[x]", "{x}", "x=1", "${x}", "~", "*", "?x", "@x",
    "%x", "!x", "&x", "|", ">", "-3", "11", "1e-3", "1abc", "", "é", "a\\b", "tab\tx",
    "it's", 'say "hi"', "'q'", "both ' and \"",
    "yes", "no", "on", "off", "y", "n", "null", "None", "true", "False", "inf", "nan",
    [1, 2], ["a:0", "b/c", "it's"], [], {"x": [1, 3, 8, 8], "y/z": [2]}, {},
]  # fmt: skip


def from_yaml(text: str) -> Any:
    """As edgeflow's loader reads a recipe's list item (ruamel, YAML 1.2)."""
    return plain(YAML(typ="rt").load(f"rewrites:\n  - {text}\n")["rewrites"][0])


def from_command_line(text: str) -> Any:
    """As `edgeflow run rewrites=[TEXT]` hands it to the loader (Hydra, then OmegaConf)."""
    value = OverridesParser.create().parse_override(f"rewrites=[{text}]").value()
    return OmegaConf.to_container(OmegaConf.create({"v": value}))["v"][0]  # type: ignore[index]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_an_option_value_reads_back_as_it_is(value: Any) -> None:
    printed = entry("onnx.some_rule", {"option": value})
    expected = {"rule": "onnx.some_rule", "option": value}
    assert from_yaml(printed) == expected
    assert from_command_line(printed) == expected
    assert yaml.safe_load(printed) == expected  # YAML 1.1 (benchmarks' foreign-files reader)


def test_a_value_no_form_reads_back_as_is_refused_not_misprinted() -> None:
    """Hydra's keys take neither quotes nor ':'; no form of inf reads as inf in both."""
    for options in ({"shapes": {"input:0": [1]}}, {"shapes": {"in put": [1]}}, {"t": 1e999}):
        with pytest.raises(ValueError, match=r"no .* both YAML and Hydra read as"):
            entry("onnx.some_rule", options)


def test_a_rule_without_options_is_its_name() -> None:
    assert entry("onnx.fix_shapes", {}) == "onnx.fix_shapes"
    assert entry("onnx.convert_opset", {"opset": 11}) == "{rule: onnx.convert_opset, opset: 11}"


def test_declared_fix_options_load_and_name_fixes_the_rule_declares() -> None:
    for rule in builtin_rules().values():
        assert set(rule.fix_options) <= set(rule.fixes), rule.name
        for fix, options in rule.fix_options.items():
            rule.Options.model_validate(options)  # as a recipe entry gives them
            assert options_for(rule, fix) == options


def test_options_only_the_user_knows_make_a_template() -> None:
    rules = builtin_rules()
    assert options_for(rules["fx.wrap_leaf"], Fix.capture("unsupported")) is None
    assert template(rules["fx.wrap_leaf"]) == "{rule: fx.wrap_leaf, functions: <list>}"
    activation = rules["fx.replace_activation"]
    assert template(activation) == (
        "{rule: fx.replace_activation, from: <silu|gelu|relu|hardswish|hardsigmoid>, to: <str>}"
    )
    assert options_for(activation, Fix.op("HardSigmoid")) == {"from": "hardsigmoid", "to": "relu6"}
    assert options_for(rules["onnx.decompose"], Fix.op("HardSigmoid")) == {}
    convert = rules["onnx.convert_opset"]
    assert options_for(convert, Fix.finding("opset")) is None  # the finding computes it
    assert options_for(convert, Fix.finding("opset"), {"opset": 11}) == {"opset": 11}
