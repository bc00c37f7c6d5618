"""Loading target profiles fast: the built-ins parsed with libyaml, dtypes checked without onnx."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from edgeflow.core import resources
from edgeflow.core.errors import RecipeError
from edgeflow.core.loader import plain, read_yaml
from edgeflow.targets import builtin_data, load_profile
from edgeflow.targets.profile import ONNX_DTYPES

BUILTINS = sorted(resources.builtin_dir("targets").glob("*.yaml"))


@pytest.mark.parametrize("path", BUILTINS, ids=[p.stem for p in BUILTINS])
def test_a_builtin_profile_gives_the_same_data_from_both_parsers(path: Path) -> None:
    """libyaml reads YAML 1.1 (`on`, `1e-5`, `0755` mean other things there than in 1.2):
    a built-in profile may only use what both read alike."""
    assert builtin_data(path) == plain(read_yaml(path))


def test_the_dtype_names_are_the_installed_onnx_ones() -> None:
    names = [n.lower() for n, _ in onnx.TensorProto.DataType.items() if n != "UNDEFINED"]
    assert list(ONNX_DTYPES) == names


def test_a_user_profile_is_parsed_with_positions(tmp_path: Path) -> None:
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "mine.yaml").write_text(
        "extends: onnxruntime_micro\noperators:\n  Conv: {dtypes: [flaot]}\n"
    )
    assert builtin_data(tmp_path / "targets" / "mine.yaml") is None
    with pytest.raises(RecipeError) as info:
        load_profile("mine", tmp_path)
    assert "targets/mine.yaml:3:" in info.value.render() and "unknown dtype 'flaot'" in str(
        info.value
    )


def test_a_builtin_profile_loads_with_the_fast_parser() -> None:
    profile = load_profile("onnxruntime_micro")
    assert profile.name == "onnxruntime_micro" and "Conv" in profile.operators
