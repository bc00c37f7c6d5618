"""docs/rules.md is generated from the registry and must not drift from it."""

from __future__ import annotations

from edgeflow.cli import main
from edgeflow.rules import builtin_rules
from edgeflow.rules.catalogue import DOC, render_markdown


def test_docs_rule_catalogue_is_up_to_date() -> None:
    assert DOC.read_text(encoding="utf-8") == render_markdown(), (
        "docs/rules.md is stale: run `python -m edgeflow.rules.catalogue --write`"
    )


def test_every_rule_is_documented_and_well_formed() -> None:
    text = DOC.read_text(encoding="utf-8")
    for name, rule in builtin_rules().items():
        assert f"### `{name}`" in text
        assert name.split(".")[0] == rule.level
        assert rule.description and not rule.description.endswith(" ")
        assert rule.example is not None, f"{name} has no before/after example"


def test_rules_command_lists_rules(capsys) -> None:
    assert main(["rules"]) == 0
    out = capsys.readouterr().out
    for name in builtin_rules():
        assert name in out
