"""A recipe's code references name code of the user's files or of installed packages, never the
standard library: `edgeflow validate` refuses them in every slot, located, and nothing runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from edgeflow.cli import main

# Each calls, with the arguments a recipe gives it, what must never run.
STDLIB = ["shutil:rmtree", "os:remove", "subprocess:run", "builtins:exec", "os:system"]

PYTORCH = """
name: refs
source:
  kind: pytorch
  model: {model}
  init: {init}
  inputs:
    - {{name: image, shape: [1, 1, 8, 8]}}
calibration: {{dataset: "{calibration}", split: calibration, options: {options}}}
evaluation: {{dataset: "{evaluation}", split: test, options: {options}}}
quantization: {{mode: int8}}
target: onnxruntime_micro
"""

OTHER = """
name: refs
source:
  kind: {kind}
  model: {model}
  init: {init}
  inputs:
    - {{name: image, shape: [1, 8, 8, 1], dtype: float32}}
calibration: {{dataset: "edgeflow.zoo.digits_keras:digits_nhwc", split: calibration}}
evaluation: {{dataset: "edgeflow.zoo.digits_keras:digits_nhwc", split: test}}
quantization: {{mode: int8}}
target: {target}
"""

GOOD_MODEL = "edgeflow.zoo.digits:DigitsCNN"
GOOD_DATA = "edgeflow.datasets:sklearn_digits"


def _slots(ref: str, victim: Path, marker: Path) -> dict[str, tuple[str, str]]:
    """Recipe text with `ref` in one slot (the others sound), and the dotted key refused."""
    init = f"{{path: {victim}, args: [touch, {marker}]}}"
    options = f"{{path: {victim}, args: [touch, {marker}], shell: false}}"
    plain = {"model": GOOD_MODEL, "init": "{}", "options": "{}"}
    data = {"calibration": GOOD_DATA, "evaluation": GOOD_DATA}
    pattern = "{rule: fx.replace_pattern, pattern: %s, replacement: %s}"
    rules = {
        "rewrites[0]": f"rewrites:\n  - {ref}\n",
        "rewrites[0].pattern": f"rewrites:\n  - {pattern % (ref, 'patterns.py:good')}\n",
        "rewrites[0].replacement": f"rewrites:\n  - {pattern % ('patterns.py:good', ref)}\n",
        "rewrites[0].functions[1]": (
            f"rewrites:\n  - {{rule: fx.wrap_leaf, functions: [patterns.py:good, {ref}]}}\n"
        ),
        "rewrites[0].to": (
            f"rewrites:\n  - {{rule: ast.replace_call, from: torch.relu, to: {ref}}}\n"
        ),
        "rewrites[0].with": (
            "rewrites:\n  - {rule: ast.replace_method, method: "
            f"edgeflow.zoo.digits.DigitsCNN.forward, with: {ref}}}\n"
        ),
        "rewrites[0].functions[0]": (
            f"rewrites:\n  - {{rule: fx.wrap_leaf, functions: [{ref.replace(':', '.')}]}}\n"
        ),
    }
    found = {
        "source.model": (PYTORCH.format(**{**plain, "model": ref, "init": init}, **data), ""),
        "calibration.dataset": (
            PYTORCH.format(**{**plain, "options": options}, **{**data, "calibration": ref}),
            "",
        ),
        "evaluation.dataset": (
            PYTORCH.format(**{**plain, "options": options}, **{**data, "evaluation": ref}),
            "",
        ),
        "tensorflow source.model": (
            OTHER.format(kind="tensorflow", model=ref, init=init, target="tflite_micro"),
            "",
        ),
        "jax source.model": (
            OTHER.format(kind="jax", model=ref, init=init, target="onnxruntime_micro"),
            "",
        ),
    }
    for key, rewrites in rules.items():
        found[key] = (PYTORCH.format(**plain, **data) + rewrites, "")
    return {key: (text, key.split()[-1]) for key, (text, _) in found.items()}


SLOTS = list(_slots("x:y", Path("v"), Path("m")))


@pytest.mark.parametrize("slot", SLOTS)
@pytest.mark.parametrize("ref", STDLIB)
def test_validate_refuses_the_standard_library_in_every_slot(
    slot: str, ref: str, tmp_path: Path, capsys
) -> None:
    victim = tmp_path / "victim"
    (victim / "keep").mkdir(parents=True)
    marker = tmp_path / "marker"
    good = "import torch\n\ndef good(x):\n    return torch.relu(x)\n"
    (tmp_path / "patterns.py").write_text(good)
    text, key = _slots(ref, victim, marker)[slot]
    path = tmp_path / "recipe.yaml"
    path.write_text(text.lstrip("\n"), encoding="utf-8")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    written = ref if not key.endswith("functions[0]") else ref.replace(":", ".")
    line = next(i for i, row in enumerate(text.lstrip("\n").splitlines(), 1) if written in row)
    [problem] = [row for row in err.splitlines() if f": {key}: " in row]
    assert problem.startswith(f"{path}:{line}:"), err
    assert "names the standard library" in problem and "Traceback" not in err
    assert "hint: a recipe names code of your own files" in err or "hint: a user rule" in err
    assert (victim / "keep").is_dir() and not marker.exists()


def test_a_user_file_that_only_re_exports_the_standard_library_is_refused(
    write_recipe, tmp_path: Path, capsys
) -> None:
    """`from shutil import rmtree` in a file of the user's does not make rmtree theirs."""
    (tmp_path / "mine.py").write_text(
        "import shutil\nfrom subprocess import *\nfrom os import system as go\n"
        "wipe = shutil.rmtree\n"
    )
    for attr, origin in [
        ("wipe", "shutil"),
        ("go", "os.system"),
        ("run", "from subprocess import *"),
        ("shutil", "shutil"),
    ]:
        text = PYTORCH.format(
            model=f"mine.py:{attr}",
            init="{}",
            options="{}",
            calibration=GOOD_DATA,
            evaluation=GOOD_DATA,
        )
        path = write_recipe(text)
        assert main(["validate", str(path)]) == 2
        err = capsys.readouterr().err
        assert f"{path}:4:10: source.model: " in err and "names the standard library" in err
        assert origin in err


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("class Plain:\n    pass\n", "is a class that does not subclass torch.nn.Module"),
        ("class Mapping(dict):\n    pass\n", "is a class that does not subclass torch.nn.Module"),
        ("Model = 3\n", "is a constant, not a class or function"),
        ("import torch as Model\n", "is a module (torch), not a class or function"),
    ],
)
def test_a_pytorch_model_must_be_a_module_class_or_a_function(
    source: str, message: str, write_recipe, tmp_path: Path, capsys
) -> None:
    name = source.split()[1].split("(")[0].rstrip(":") if source.startswith("class") else "Model"
    (tmp_path / "net.py").write_text(source)
    text = PYTORCH.format(
        model=f"net.py:{name}",
        init="{}",
        options="{}",
        calibration=GOOD_DATA,
        evaluation=GOOD_DATA,
    )
    assert main(["validate", str(write_recipe(text))]) == 2
    assert message in capsys.readouterr().err


def test_module_classes_functions_and_undecidable_bases_pass_validate(
    write_recipe, tmp_path: Path, capsys
) -> None:
    """Bases followed through the user's files and torch (nn.Module, Module, torch.nn.Module,
    another user class); a base computed at run time is checked after import instead."""
    base = "from torch.nn import Module\n\nclass Base(Module):\n    pass\n"
    (tmp_path / "base.py").write_text(base)
    (tmp_path / "net.py").write_text(
        "import torch\nfrom torch import nn\nimport base\n\n"
        "class A(nn.Module):\n    pass\n\nclass B(torch.nn.Module):\n    pass\n\n"
        "class C(base.Base):\n    pass\n\nclass D(torch.nn.Sequential):\n    pass\n\n"
        "class E(type('X', (torch.nn.Module,), {})):\n    pass\n\n"
        "def build():\n    return A()\n"
    )
    for name in "ABCDE":
        text = PYTORCH.format(
            model=f"net.py:{name}",
            init="{}",
            options="{}",
            calibration=GOOD_DATA,
            evaluation=GOOD_DATA,
        )
        assert main(["validate", str(write_recipe(text))]) == 0, capsys.readouterr().err
    text = PYTORCH.format(
        model="net.py:build", init="{}", options="{}", calibration=GOOD_DATA, evaluation=GOOD_DATA
    )
    assert main(["validate", str(write_recipe(text))]) == 0


@pytest.mark.parametrize(
    ("source", "valid"),
    [
        ("from edgeflow.rules.base import FxRule\n\nclass R(FxRule):\n    pass\n", True),
        (
            "from edgeflow.rules import base\n\nclass Mid(base.OnnxRule):\n    pass\n\n"
            "class R(Mid):\n    pass\n",
            True,
        ),
        ("import torch\n\nclass R(torch.nn.Module):\n    pass\n", False),
        ("class R(object):\n    pass\n", False),
        ("def R():\n    pass\n", False),
    ],
)
def test_a_user_rule_must_subclass_rule_at_validate(
    source: str, valid: bool, write_recipe, tmp_path: Path, capsys
) -> None:
    (tmp_path / "myrules.py").write_text(source)
    text = PYTORCH.format(
        model=GOOD_MODEL, init="{}", options="{}", calibration=GOOD_DATA, evaluation=GOOD_DATA
    )
    path = write_recipe(text + "rewrites:\n  - myrules.py:R\n")
    assert main(["validate", str(path)]) == (0 if valid else 2)
    err = capsys.readouterr().err
    assert valid or f"{path}:13:5: rewrites[0]: 'myrules.py:R' is not a Rule subclass" in err


@pytest.fixture
def vendor(tmp_path: Path, monkeypatch) -> Path:
    """An installed-like package whose `models` subpackage has no __init__.py (a namespace
    package), and one whose __init__.py has a side effect (writes a marker, or raises)."""
    root = tmp_path / "site"
    models = root / "vendorpkg" / "models"
    models.mkdir(parents=True)
    (root / "vendorpkg" / "__init__.py").write_text("")
    (models / "layers.py").write_text("from torch import nn\n\nclass Block(nn.Module):\n    pass\n")
    (models / "detector.py").write_text(
        "import torch\nfrom .layers import Block\n\nclass Net(Block):\n"
        "    def forward(self, image):\n        return image.flatten(1)[:, :10]\n"
    )
    (root / "nsonly" / "deep").mkdir(parents=True)  # a namespace package all the way down
    (root / "nsonly" / "deep" / "net.py").write_text("from vendorpkg.models.detector import Net\n")
    marker = tmp_path / "imported"
    (root / "sidefx").mkdir()
    (root / "sidefx" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (root / "sidefx" / "models.py").write_text("from vendorpkg.models.detector import Net\n")
    (root / "raises").mkdir()
    (root / "raises" / "__init__.py").write_text("raise RuntimeError('not importable')\n")
    (root / "raises" / "models.py").write_text("from vendorpkg.models.detector import Net\n")
    monkeypatch.syspath_prepend(str(root))
    yield tmp_path
    for name in [m for m in sys.modules if m.split(".")[0] in ("vendorpkg", "nsonly", "sidefx")]:
        del sys.modules[name]


@pytest.mark.parametrize(
    "model",
    [
        "vendorpkg.models.detector:Net",
        "nsonly.deep.net:Net",
        "sidefx.models:Net",
        "raises.models:Net",
    ],
)
def test_namespace_packages_and_packages_with_side_effects_validate_without_running(
    model: str, vendor: Path, write_recipe, capsys
) -> None:
    text = PYTORCH.format(
        model=model, init="{}", options="{}", calibration=GOOD_DATA, evaluation=GOOD_DATA
    )
    assert main(["validate", str(write_recipe(text))]) == 0, capsys.readouterr().err
    assert not (vendor / "imported").exists()
    assert not any(m.split(".")[0] in ("vendorpkg", "nsonly", "sidefx") for m in sys.modules)
