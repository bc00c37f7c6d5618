"""Code references at run time: nothing of the standard library is called even where the
recipe's checks were bypassed; namespace packages are found, hashed and loaded."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from edgeflow.core.codehash import closure_files, find_spec
from edgeflow.core.errors import EdgeflowError
from edgeflow.core.refcheck import TORCH_MODULE, is_stdlib_file, is_stdlib_module, subclass_of
from edgeflow.core.refs import ImportRef
from edgeflow.schema.sections import DatasetSpec, TensorSpec
from edgeflow.schema.source import PyTorchSource


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    folder = tmp_path / "victim"
    (folder / "keep").mkdir(parents=True)
    return folder


def test_the_standard_library_is_told_by_name_and_by_place() -> None:
    assert all(is_stdlib_module(m) for m in ("os", "os.path", "shutil", "builtins", "posix"))
    assert not any(is_stdlib_module(m) for m in ("torch", "numpy", "edgeflow.zoo"))
    assert is_stdlib_file(Path(sys.modules["shutil"].__file__ or ""))
    assert not is_stdlib_file(Path(sys.modules["pytest"].__file__ or ""))


@pytest.mark.parametrize("text", ["shutil:rmtree", "os:remove", "subprocess:run", "os:system"])
def test_load_refuses_the_standard_library_before_importing(text: str) -> None:
    with pytest.raises(EdgeflowError, match="names the standard library"):
        ImportRef.parse(text, Path(".")).load()


def test_load_refuses_a_standard_library_callable_found_through_a_users_file(
    tmp_path: Path, victim: Path
) -> None:
    """What source cannot follow (a name computed at run time) is looked at after import."""
    (tmp_path / "sneaky.py").write_text(
        "import importlib\nwipe = getattr(importlib.import_module('shu' + 'til'), 'rmtree')\n"
        "import functools\nlater = functools.partial(getattr(importlib.import_module('os'), "
        "'system'), 'true')\n"
    )
    for attr in ("wipe", "later"):
        ref = ImportRef.parse(f"sneaky.py:{attr}", tmp_path)
        assert ref.check().kind == "value"  # source cannot tell
        with pytest.raises(EdgeflowError, match="standard-library object"):
            ref.load()
    assert (victim / "keep").is_dir()


def _pytorch(model: ImportRef, init: dict[str, object]) -> PyTorchSource:
    spec = TensorSpec(name="image", shape=[1, 1, 8, 8])
    return PyTorchSource.model_construct(kind="pytorch", model=model, init=init, inputs=[spec])


def test_build_module_calls_no_standard_library_even_unvalidated(victim: Path) -> None:
    from edgeflow.source import build_module

    source = _pytorch(ImportRef("shutil", "rmtree", False), {"path": str(victim)})
    with pytest.raises(EdgeflowError, match="names the standard library"):
        build_module(source)
    assert (victim / "keep").is_dir()


def test_build_module_checks_a_class_before_calling_it(tmp_path: Path) -> None:
    from edgeflow.source import build_module

    marker = tmp_path / "constructed"
    (tmp_path / "net.py").write_text(
        "def make_base():\n    return object\n\n"
        "class Net(make_base()):\n    def __init__(self, path):\n"
        "        open(path, 'w').write('ran')\n"
    )
    ref = ImportRef.parse("net.py:Net", tmp_path)
    assert subclass_of(ref.check(), TORCH_MODULE) is None  # undecidable from source
    with pytest.raises(EdgeflowError, match=r"does not subclass torch\.nn\.Module"):
        build_module(_pytorch(ref, {"path": str(marker)}))
    assert not marker.exists()


def test_a_dataset_callable_of_the_standard_library_is_not_called(tmp_path: Path) -> None:
    from edgeflow.data import load_samples

    marker = tmp_path / "marker"
    spec = DatasetSpec.model_construct(
        dataset=ImportRef("subprocess", "run", False),
        split=None,
        samples=None,
        options={"args": ["touch", str(marker)]},
    )
    with pytest.raises(EdgeflowError, match="names the standard library"):
        load_samples(spec, [TensorSpec(name="image", shape=[1, 1, 8, 8])], "calibration")
    assert not marker.exists()


@pytest.fixture
def namespace(tmp_path: Path, monkeypatch) -> Path:
    """vendorpkg (a regular package) / models (no __init__.py) / detector.py importing a
    neighbour relatively; and a package whose __init__.py writes a marker when imported."""
    models = tmp_path / "vendorpkg" / "models"
    models.mkdir(parents=True)
    (tmp_path / "vendorpkg" / "__init__.py").write_text("")
    (models / "layers.py").write_text("from torch import nn\n\nclass Block(nn.Module):\n    pass\n")
    (models / "detector.py").write_text(
        "from .layers import Block\n\nclass Net(Block):\n"
        "    def forward(self, image):\n        return image.flatten(1)\n"
    )
    (tmp_path / "sidefx").mkdir()
    (tmp_path / "sidefx" / "__init__.py").write_text(
        f"open({str(tmp_path / 'imported')!r}, 'w').write('ran')\n"
    )
    (tmp_path / "sidefx" / "models.py").write_text("from vendorpkg.models.detector import Net\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.split(".")[0] in ("vendorpkg", "sidefx")]:
        del sys.modules[name]


def test_a_namespace_subpackage_is_found_hashed_and_loaded(namespace: Path) -> None:
    spec = find_spec("vendorpkg.models.detector")
    assert spec is not None and spec.origin == str(namespace / "vendorpkg/models/detector.py")
    assert find_spec("vendorpkg.models").submodule_search_locations == [  # type: ignore[union-attr]
        str(namespace / "vendorpkg" / "models")
    ]
    ref = ImportRef.parse("vendorpkg.models.detector:Net", Path("."))
    assert subclass_of(ref.check(), TORCH_MODULE) == "torch.nn.modules.module.Module"
    found = {"vendorpkg", "vendorpkg.models.detector", "vendorpkg.models.layers"}
    assert set(ref.files()) == found  # vendorpkg/__init__.py runs at import: hashed too
    assert "vendorpkg" not in sys.modules  # found from source only
    before = ref.fingerprint()["source_sha256"]
    (namespace / "vendorpkg" / "models" / "layers.py").write_text(
        "from torch import nn\n\nclass Block(nn.Module):\n    pass  # edited\n"
    )
    assert ref.fingerprint()["source_sha256"] != before  # the relative import is followed
    import torch

    assert issubclass(ref.load(), torch.nn.Module)
    files = closure_files([namespace / "vendorpkg/models/detector.py"], names=["x.detector"])
    assert "x.detector" in files


def test_a_package_with_side_effects_is_checked_without_importing_it_and_runs_at_load(
    namespace: Path,
) -> None:
    from edgeflow.source import build_module

    ref = ImportRef.parse("sidefx.models:Net", Path("."))
    assert subclass_of(ref.check(), TORCH_MODULE) == "torch.nn.modules.module.Module"
    ref.fingerprint()
    assert not (namespace / "imported").exists()
    module = build_module(_pytorch(ref, {}))  # a run imports it: that is the user's package
    assert type(module).__name__ == "Net" and (namespace / "imported").exists()


@pytest.mark.parametrize("key", ["to", "with"])
def test_an_ast_replacement_of_the_standard_library_is_refused_when_loaded(key: str) -> None:
    """ast.replace_call's `to` and ast.replace_method's `with` are what the model will call."""
    from edgeflow.rules.ast.calls import load

    with pytest.raises(EdgeflowError, match="standard-library object"):
        load("os.system", key, must_call=key == "to")
    assert callable(load("os.system", "from"))  # matched, never called: any may be replaced
