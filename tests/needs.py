"""What tests need that edgeflow's core install lacks: a test skips where it is missing, but
fails where CI is set, because .ci/run installs every dependency named here (the [dev] extra,
which holds every other extra, and its apt-get line) and a missing runtime must not pass as
a green run.

CI counts as set when the environment variable CI has any value but "", "0", "false", "no" or
"off" (any case); .ci/run sets CI=true. mark, require and installed take the names of
DEPENDENCIES; module and command a module or command of one of them. Under CI a marked test
errors at setup; a module-level require or module() stops the collection:

    pytestmark = needs.mark("espeak-ng")           # every test of a module, at setup
    @needs.mark("tflite", "armnn")                 # one test
    needs.require("jax2onnx")                      # inside a test, or at module level
    keras = needs.module("keras")                  # imported, at module level
    targets += ["armnn"] if needs.installed("armnn") else []   # with it where present

What CI does not install stays a plain skip (torchvision, a GPU, root for a bind mount): it
is not registered here, and the skip says so.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

from edgeflow.targets.armnn import backend as armnn

NOT_SET = ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class Dependency:
    """One thing tests need, how to tell it is there, and how .ci/run installs it."""

    what: str  # as messages name it: "<what> is not installed (no module flax)"
    extra: str = ""  # the pyproject extra that installs it; .ci/run installs [dev]
    _: KW_ONLY
    apt: str = ""  # or the Debian packages, on .ci/run's apt-get line
    modules: tuple[str, ...] = ()  # importable by this interpreter
    commands: tuple[str, ...] = ()  # on PATH or beside this interpreter
    probe: Callable[[], str | None] | None = None  # a check of its own: why it is missing

    @property
    def install(self) -> str:
        if self.apt:
            return f"sudo apt-get install -y {self.apt}"
        return f"pip install -c constraints.txt -e '.[{self.extra}]'"

    @property
    def by_ci(self) -> str:
        if self.apt:
            return f"its apt-get line installs {self.apt}"
        if self.extra == "dev":
            return "pip install -c constraints.txt -e '.[dev]'"
        return f"pip install -c constraints.txt -e '.[dev]', which holds [{self.extra}]"


def _pyarmnn() -> str | None:
    return _pyarmnn_under(armnn.python())


@functools.cache
def _pyarmnn_under(python: str) -> str | None:
    """Debian's pyarmnn, imported with numpy by the system Python that runs
    targets/armnn/_armnn_worker.py, as the worker imports them."""
    if not Path(python).is_file():
        return f"no Python at {python}"
    done = subprocess.run(
        [python, "-c", "import numpy, pyarmnn"], capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no error message)"])[-1]
        return f"{python} cannot import pyarmnn and numpy: {last}"
    return None


TFLITE_STACK = ("onnx2tf", "tensorflow", "tf_keras", "ai_edge_litert", "tflite_micro")
DEPENDENCIES = {
    "tflite": Dependency("the TFLite stack", "tflite", modules=TFLITE_STACK),
    "tensorflow": Dependency("TensorFlow", "tflite", modules=("tensorflow", "keras")),
    "tf2onnx": Dependency("tf2onnx", "tflite", modules=("tf2onnx",)),
    "vela": Dependency("Arm's Vela", "tflite", modules=("ethosu.vela",)),
    "jax": Dependency("JAX", "jax", modules=("jax", "flax", "optax")),
    "jax2onnx": Dependency("jax2onnx", "jax", modules=("jax2onnx",)),
    "dvc": Dependency("DVC", "dvc", commands=("dvc",)),
    "ray": Dependency(
        "Ray", "cluster", modules=("hydra_plugins.hydra_ray_launcher",), commands=("ray",)
    ),
    "pillow": Dependency("Pillow", "dev", modules=("PIL",)),
    "playwright": Dependency("playwright", "dev", modules=("playwright.sync_api",)),
    "chromium": Dependency("Chromium", apt="chromium", commands=("chromium",)),
    "espeak-ng": Dependency("espeak-ng", apt="espeak-ng", commands=("espeak-ng",)),
    "armnn": Dependency("Arm NN", apt=armnn.PACKAGES, probe=_pyarmnn),
}


def ci() -> bool:
    """Whether CI is set: then a missing dependency fails the test."""
    return os.environ.get("CI", "").strip().lower() not in NOT_SET


def _which(command: str) -> str | None:
    """A command on PATH, or beside this interpreter (a virtual environment's bin/)."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return shutil.which(command, path=path)


def _module_missing(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except ModuleNotFoundError:  # its parent package is missing
        return True


def missing(name: str) -> str | None:
    """Why the dependency is missing here, or None when it is installed. Checks only."""
    dep = DEPENDENCIES[name]
    lacking = [f"no module {m}" for m in dep.modules if _module_missing(m)]
    lacking += [f"no command {c}" for c in dep.commands if _which(c) is None]
    if not lacking and dep.probe is not None and (why := dep.probe()) is not None:
        lacking.append(why)
    return "; ".join(lacking) or None


def unavailable(name: str, why: str) -> NoReturn:
    """Skip the test for a missing dependency, or fail it where CI is set."""
    __tracebackhide__ = True  # a skip or failure located at the caller
    dep = DEPENDENCIES[name]
    message = f"{dep.what} is not installed ({why}): install {dep.what} with {dep.install}"
    if ci():
        message += f". CI is set and .ci/run installs it ({dep.by_ci}): a failure, not a skip"
        pytest.fail(message, pytrace=False)
    pytest.skip(message, allow_module_level=True)


def require(*names: str) -> None:
    """Go on only where every named dependency is installed."""
    __tracebackhide__ = True  # a skip or failure located at the caller
    for name in names:
        if (why := missing(name)) is not None:
            unavailable(name, why)


def installed(name: str) -> bool:
    """True where the dependency is installed; False where not, but a failure under CI."""
    __tracebackhide__ = True  # a skip or failure located at the caller
    if (why := missing(name)) is None:
        return True
    if ci():
        unavailable(name, why)
    return False


def module(name: str) -> ModuleType:
    """Import a module of a registered dependency, once that dependency is required."""
    __tracebackhide__ = True  # a skip or failure located at the caller
    dep = next((k for k, d in DEPENDENCIES.items() if name in d.modules), None)
    assert dep is not None, f"{name} is no module of a dependency in tests/needs.py"
    require(dep)
    return importlib.import_module(name)


def command(name: str) -> str:
    """The path of a registered dependency's command, once that dependency is required."""
    __tracebackhide__ = True  # a skip or failure located at the caller
    dep = next((k for k, d in DEPENDENCIES.items() if name in d.commands), None)
    assert dep is not None, f"{name} is no command of a dependency in tests/needs.py"
    require(dep)
    path = _which(name)
    assert path is not None
    return path


def mark(*names: str) -> pytest.MarkDecorator:
    """A marker: the test goes on only where every named dependency is installed (checked at
    setup by tests/conftest.py, before any fixture is made)."""
    unknown = [n for n in names if n not in DEPENDENCIES]
    assert not unknown, f"no dependency {unknown} in tests/needs.py"
    return pytest.mark.needs(*names)
