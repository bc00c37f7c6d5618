"""Cache keys cover everything that can change a result: the user's code as far as its
imports reach, edgeflow's own code, tool versions; an unrelated edit reruns nothing."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from edgeflow.core.codehash import closure, is_third_party
from edgeflow.engine.cache import Cache
from edgeflow.engine.keys import package_digest, tool_versions
from edgeflow.engine.runner import run_build
from edgeflow.recipe import load_recipe


def write(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")


def test_closure_follows_every_kind_of_import_of_the_users_code(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/model.py": """
                import importlib
                import numpy
                from . import sibling
                from .blocks import Block
                from pkg.sub import deep

                def build():
                    import late
                    importlib.import_module("dynamic")
            """,
            "pkg/sibling.py": "",
            "pkg/blocks.py": "Block = 1\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/deep.py": "import os\n",
            "late.py": "",
            "dynamic.py": "",
            "unrelated.py": "",
            "broken.py": "def (:\n",
        },
    )
    found = closure([tmp_path / "pkg" / "model.py"], search=[str(tmp_path)])
    assert set(found) == {
        "pkg",
        "pkg.model",
        "pkg.sibling",
        "pkg.blocks",
        "pkg.sub",
        "pkg.sub.deep",
        "late",
        "dynamic",
    }  # not numpy, importlib or os (installed or the stdlib), not unrelated.py
    assert set(closure([tmp_path / "broken.py"])) == {"broken"}  # hashed, not followed


def test_installed_and_standard_modules_are_third_party() -> None:
    import textwrap as stdlib_module

    import numpy

    assert is_third_party(Path(numpy.__file__)) and is_third_party(Path(stdlib_module.__file__))
    assert not is_third_party(Path(__file__))


def test_edgeflows_code_digest_covers_every_module(tmp_path: Path) -> None:
    write(tmp_path, {"a.py": "x = 1\n", "sub/b.py": "y = 2\n"})
    before = package_digest(tmp_path)
    (tmp_path / "sub" / "b.py").write_text("y = 3\n")
    assert package_digest(tmp_path) != before


def test_arm_nn_enters_by_its_debian_package_version() -> None:
    versions = tool_versions(("debian:*armnn*",))
    assert "python" in versions and "edgeflow" in versions
    shown = versions["debian:*armnn*"]
    assert shown == "not installed" or "python3-pyarmnn=" in shown or "unknown" in shown


PROJECT = {
    "net.py": """
        import torch

        import helpers
        from blocks import Block


        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                torch.manual_seed(0)
                self.block = Block()
                self.fc = torch.nn.Linear(64, 10)

            def forward(self, image):
                return self.fc(self.block(image).flatten(1)) * helpers.GAIN
    """,
    "helpers.py": "GAIN = 1.0\n",
    "blocks.py": """
        import torch


        class Block(torch.nn.Module):
            def forward(self, x):
                return torch.relu(x)
    """,
    "data.py": """
        from datahelp import SCALE
        from edgeflow.datasets import sklearn_digits


        def digits(split="test"):
            found = sklearn_digits(split)
            found["image"] = found["image"] * SCALE
            return found
    """,
    "datahelp.py": "SCALE = 1.0\n",
    "rules.py": """
        from edgeflow.rules.base import FxRule, RuleResult

        import rulehelp


        class Note(FxRule):
            name = "user.note"
            description = "Change nothing; say so."

            def apply(self, model, opts, ctx):
                return RuleResult(model, False, 0, [rulehelp.NOTE])
    """,
    "rulehelp.py": "NOTE = 'first'\n",
    "patterns.py": """
        import torch

        from pathelp import FACTOR


        def pattern(x):
            return torch.sigmoid(x) * FACTOR


        def replacement(x):
            return torch.sigmoid(x) * FACTOR
    """,
    "pathelp.py": "FACTOR = 2.0\n",
    "notes.py": "# nothing imports this file\n",
    "recipe.yaml": """
        source:
          kind: pytorch
          model: net.py:Net
          inputs: [{name: image, shape: [1, 1, 8, 8]}]
        rewrites:
          - rules.py:Note
          - rule: fx.replace_pattern
            pattern: patterns.py:pattern
            replacement: patterns.py:replacement
        evaluation: {dataset: "data.py:digits", split: test, samples: 40, metric: agreement}
        target: onnxruntime_micro
        verify: {latency_runs: 5, warmup_runs: 1}
    """,
}
STAGES = [
    "load", "rewrite", "export", "rewrite_onnx", "rewrite_target", "precheck",
    "optimize", "quantize", "convert", "verify", "report", "html",
]  # fmt: skip


@pytest.mark.slow
def test_each_kind_of_user_file_reruns_exactly_the_stages_that_depend_on_it(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    write(project, PROJECT)
    cache, build = Cache(tmp_path / "cache"), tmp_path / "build"

    def ran(edit: tuple[str, str, str] | None = None) -> set[str]:
        if edit:
            name, old, new = edit
            path = project / name
            path.write_text(path.read_text().replace(old, new))
        result = run_build(load_recipe(project / "recipe.yaml"), cache, build, lambda _: None)
        assert result.metrics["agreement"]["max_abs_diff"] < 1e-4
        return {o.stage for o in result.outcomes if o.status == "ran"}

    assert ran() == set(STAGES)
    assert ran() == set()
    assert ran(("notes.py", "# nothing", "# still nothing")) == set()  # an unrelated comment
    # the model's helper: the model changes, so does everything built from it
    assert ran(("helpers.py", "1.0", "2.0")) == set(STAGES)
    # the evaluation dataset's helper: the reference outputs and the comparison
    assert ran(("datahelp.py", "1.0", "0.5")) == {"load", "verify", "report", "html"}
    # the user rule's helper: the rule's record changes, the exported model does not; the
    # onnx stages see only onnx rules, so nothing after the export reruns
    assert ran(("rulehelp.py", "first", "second")) == {"rewrite", "export", "report", "html"}
    # the pattern file's helper: the rule's code changes, its (empty) result does not
    assert ran(("pathelp.py", "2.0", "3.0")) == {"rewrite", "export"}


@pytest.mark.slow
def test_adding_an_onnx_rule_leaves_the_export_cached(tmp_path: Path) -> None:
    """Trying the rule the precheck suggests (`+rewrites=[onnx...]`) reruns only the stages
    from rewrite_onnx on."""
    from tests.conftest import DEMO_RECIPE

    cache, build = Cache(tmp_path / "cache"), tmp_path / "build"
    run_build(load_recipe(DEMO_RECIPE), cache, build, lambda _: None)
    added = load_recipe(DEMO_RECIPE, {"rewrites+": ["onnx.simplify"]})
    result = run_build(added, cache, build, lambda _: None)
    ran = [o.stage for o in result.outcomes if o.status == "ran"]
    assert ran[:2] == ["rewrite_onnx", "rewrite_target"] and "export" not in ran
