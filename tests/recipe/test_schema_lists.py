"""The lists of recipe sections and keys are derived from the schema (edgeflow/schema/,
edgeflow/recipe/schema.py), not kept by hand: a new section or preset shows up in each."""

from __future__ import annotations

import pytest

from edgeflow.cli import run_help
from edgeflow.hydra_app import NOT_SET_AS_KEYS, keyed_sections, recipe_sections
from edgeflow.recipe import checks, find_recipe, load_recipe
from edgeflow.recipe.schema import Recipe
from edgeflow.schema.sections import QUANTIZATION_PRESETS


def test_the_sections_a_run_takes_are_the_schemas() -> None:
    assert set(recipe_sections()) == set(Recipe.model_fields) - set(NOT_SET_AS_KEYS)
    assert {"verify", "diff", "postprocess", "calibration"} <= set(keyed_sections())
    assert "rewrites" not in keyed_sections() and "name" not in keyed_sections()
    text = " ".join(run_help().split())  # as printed, unwrapped
    assert all(section in text for section in keyed_sections())
    presets = [p for p in QUANTIZATION_PRESETS if p != "recipe"]
    assert f"a preset ({', '.join(presets)})" in text


def test_the_checks_sections_are_what_each_check_declares() -> None:
    declared = {k for check in checks.CHECKS for k in check.reads}
    assert set(checks.SECTIONS) == declared | {"target"}
    assert set(checks.SECTIONS) <= set(Recipe.model_fields)


def test_a_check_that_reads_an_undeclared_section_is_caught() -> None:
    """Its section would be missing from SECTIONS, so not validated on its own: the check
    fails at once instead of reading what the loader never checked."""

    def peeks(s, profile):  # reads source, declares quantization only
        source = s.get("source")
        return [("source", f"{source}", "")]

    loaded = load_recipe(find_recipe("digits_cnn"))
    sections = {name: getattr(loaded.recipe, name) for name in checks.SECTIONS}
    with pytest.raises(AssertionError, match="peeks reads 'source' without declaring it"):
        checks.Check(peeks, ("quantization",))(sections, loaded.profile)
    for check in checks.CHECKS:  # every shipped check keeps to its declaration
        assert check(sections, loaded.profile) == []
