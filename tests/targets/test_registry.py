"""The Backend registry: every family declares every capability, and edgeflow asks the registry,
never a list of backend names (edgeflow/targets/registry.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pydantic import ValidationError

from edgeflow.targets import load_profile
from edgeflow.targets.registry import (
    Backend,
    TfliteRuntime,
    backends,
    like,
    measured_tflite,
    offering,
    reference_tflite,
)
from tests.conftest import REPO

PACKAGE = REPO / "edgeflow"
# Strings that equal a backend's name but name something else, with why.
NOT_BACKENDS = {
    ("edgeflow/targets/_tflite_deps.py", "tflite_micro"): "the tflite-micro package's module",
}


def test_every_capability_is_required() -> None:
    """A field with a default would let a new backend leave that capability undeclared."""
    for model in (Backend, TfliteRuntime):
        defaulted = [name for name, f in model.model_fields.items() if not f.is_required()]
        assert defaulted == [], f"{model.__name__} fields with defaults: {defaulted}"
    declared = backends()["tflite"].model_dump()
    del declared["fallback"]
    with pytest.raises(ValidationError, match="fallback"):
        Backend.model_validate(declared)
    with pytest.raises(ValidationError, match="fallbak"):  # a family declared by differences
        like(backends()["tflite"], fallbak=False)


def test_each_family_is_one_folder_with_its_module_and_profile() -> None:
    families = {"onnxruntime_micro", "tflite", "tflite_micro", "armnn", "tensorrt", "ethos_u"}
    assert set(backends()) == families
    for name, family in backends().items():
        assert (PACKAGE / "targets" / name / "backend.py").is_file()
        module = family.load()
        assert callable(module.convert) and callable(module.open_runner), name
        if family.tflite is not None:  # the per-layer diff and the probes open any .tflite
            assert callable(module.tflite_runner) and callable(module.runtime_version), name
        profile = load_profile(name)  # a built-in profile of the family's name
        assert profile.family is family
        assert set(profile.quantization) <= set(family.modes), name


def test_every_backend_a_hint_offers_is_a_target_a_recipe_takes() -> None:
    """Hints name backends as targets ("choose one of armnn, onnxruntime_micro, ...", "diff a
    build for ..."): each name works as printed, `target=NAME`."""
    from edgeflow.recipe import load_recipe
    from tests.conftest import DEMO_RECIPE

    for name in offering(lambda b: True):
        assert load_recipe(DEMO_RECIPE, {"target": name}).profile.backend == name


def test_capability_queries() -> None:
    assert reference_tflite() == "tflite"
    assert measured_tflite() == ["armnn", "tflite", "tflite_micro"]
    assert offering(lambda b: b.int16_activations) == ["tflite", "tflite_micro"]
    assert offering(lambda b: not b.bisect) == ["tensorrt"]
    assert offering(lambda b: b.npu) == ["ethos_u"]
    assert backends()["ethos_u"].modes == ("int8",)
    assert backends()["tflite_micro"].modes == ("none", "int8")


def test_a_profile_cannot_offer_a_mode_its_family_refuses(tmp_path: Path) -> None:
    data = load_profile("tflite_micro").model_dump()
    data["quantization"] = ["none", "int8", "int8_weights"]
    with pytest.raises(ValidationError, match="TFLite Micro has no hybrid kernels"):
        type(load_profile("tflite_micro")).model_validate(data)
    data["quantization"], data["backend"] = ["none"], "tflite_mikro"
    with pytest.raises(ValidationError, match="did you mean 'tflite_micro'"):
        type(load_profile("tflite_micro")).model_validate(data)


def named_backends(path: Path, source: str) -> list[tuple[int, str]]:
    """(line, name) of each backend name in a tuple, list, set, dict key or comparison."""
    names = set(backends())
    own = path.parent.name if path.parent.parent.name == "targets" else None
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            items: list[ast.expr | None] = list(node.elts)
        elif isinstance(node, ast.Dict):
            items = list(node.keys)
        elif isinstance(node, ast.Compare):
            items = [node.left, *node.comparators]
        else:
            continue
        for item in items:
            if isinstance(item, ast.Constant) and item.value in names and item.value != own:
                found.append((item.lineno, item.value))
    return found


def test_no_list_of_backend_names_in_the_code() -> None:
    """Which backend can X is the registry's to say: a tuple of names, a dict keyed by them or
    a comparison with one goes stale when a family is added. A family's own package may
    name itself (its declaration, its tool's distribution)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        for line, name in named_backends(path, path.read_text(encoding="utf-8")):
            if (rel, name) not in NOT_BACKENDS:
                found.append(f"{rel}:{line}: '{name}'")
    assert found == [], "ask edgeflow.targets.registry instead:\n" + "\n".join(found)


def test_the_scan_finds_what_it_forbids() -> None:
    code = 'A = ("tflite", "armnn")\nif x == "tensorrt": pass\nB = {"armnn": 1}\n'
    assert named_backends(PACKAGE / "x.py", code) == [
        (1, "tflite"),
        (1, "armnn"),
        (2, "tensorrt"),
        (3, "armnn"),
    ]
