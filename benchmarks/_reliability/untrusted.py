"""The untrusted part: hostile or broken weights, datasets and ONNX files given to recipes."""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import shutil
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .common import (
    Ran,
    Row,
    Settings,
    below_acceptance,
    error_line,
    first_lines,
    run_args,
    run_edgeflow,
    say,
)
from .inputs import tiny_onnx, write_npz, write_onnx


class Payload:
    """An object whose unpickling calls `call(*args)`: what a hostile pickle file does."""

    def __init__(self, call: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.call, self.args = call, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.call, self.args


def payloads(marker: Path) -> dict[str, Payload]:
    """Payloads that create `marker` when unpickled (through os.system, open, eval)."""
    return {
        "os_system": Payload(os.system, (f"touch {marker}",)),
        "open": Payload(open, (str(marker), "w")),
        "eval": Payload(eval, (f"__import__('pathlib').Path({str(marker)!r}).touch()",)),
    }


Writer = Callable[[Path, Path, "Good"], None]  # (path, marker, valid files)


@dataclass(frozen=True)
class Good:
    """The valid files of the untrusted part's recipes (each case replaces one of them)."""

    weights: Path
    data: Path
    onnx: Path
    onnx_data: Path


@dataclass(frozen=True)
class Hostile:
    """An untrusted-input case: which recipe file it replaces, and how to write it."""

    name: str
    slot: str  # weights | evaluation | calibration | onnx
    suffix: str
    write: Writer


def _torch_save(obj: Callable[[Path], Any], **kw: Any) -> Writer:
    """A writer that torch.save()s the object made for the marker."""

    def write(path: Path, marker: Path, good: Good) -> None:
        import torch

        torch.save(obj(marker), path, **kw)

    return write


def _pickle(obj: Callable[[Path], Any]) -> Writer:
    """A writer that pickles the object made for the marker (a plain pickle, not torch)."""

    def write(path: Path, marker: Path, good: Good) -> None:
        path.write_bytes(pickle.dumps(obj(marker), protocol=2))

    return write


def _bytes(make: Callable[[Good], bytes]) -> Writer:
    """A writer of fixed bytes (made from the valid files)."""

    def write(path: Path, marker: Path, good: Good) -> None:
        path.write_bytes(make(good))

    return write


def _random(n: int) -> Callable[[Good], bytes]:
    """`n` reproducible random bytes."""
    return lambda good: random.Random(n).randbytes(n)


def _zip(members: dict[str, bytes]) -> Callable[[Good], bytes]:
    """A zip archive of the given members (a zip that is not what the reader expects)."""

    def make(good: Good) -> bytes:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as z:
            for name, data in members.items():
                z.writestr(name, data)
        return buffer.getvalue()

    return make


def _tensor(*shape: int) -> Any:
    """A zero tensor (torch imported only when a case is written)."""
    import torch

    return torch.zeros(*shape)


def _payload(kind: str) -> Callable[[Path], Payload]:
    """The payload of that kind for a marker."""
    return lambda marker: payloads(marker)[kind]


def _state(value: Callable[[Path], Any]) -> Callable[[Path], dict[str, Any]]:
    """A state dict whose one entry is the given value."""
    return lambda marker: {"conv1.weight": value(marker)}


def weights_cases() -> list[Hostile]:
    """Hostile or broken .pt weights for the digits CNN (weights_only=True must hold)."""
    legacy = {"_use_new_zipfile_serialization": False}
    table: dict[str, Writer] = {
        "pickle_os_system": _pickle(_payload("os_system")),
        "pickle_open": _pickle(_payload("open")),
        "pickle_eval": _pickle(_payload("eval")),
        "torch_save_payload": _torch_save(_payload("os_system")),
        "legacy_format_payload": _torch_save(_payload("open"), **legacy),
        "payload_in_state_dict": _torch_save(_state(_payload("eval"))),
        "payload_wrapped": _torch_save(lambda m: {"state_dict": payloads(m)["open"]}),
        "tensor_not_state_dict": _torch_save(lambda m: _tensor(3, 3)),
        "list_not_state_dict": _torch_save(lambda m: [_tensor(3)]),
        "none": _torch_save(lambda m: None),
        "int": _torch_save(lambda m: 42),
        "strings_in_state_dict": _torch_save(_state(lambda m: "abc")),
        "int_keys": _torch_save(lambda m: {1: _tensor(3)}),
        "wrong_shapes": _torch_save(_state(lambda m: _tensor(2))),
        "truncated_half": _bytes(lambda g: _half(g.weights)),
        "truncated_header": _bytes(lambda g: g.weights.read_bytes()[:30]),
        "random_bytes": _bytes(_random(4096)),
        "empty": _bytes(lambda g: b""),
        "zip_not_torch": _bytes(_zip({"hello.txt": b"hello"})),
        "numpy_npy": _bytes(lambda g: _npy_bytes()),
        "onnx_model": _bytes(lambda g: g.onnx.read_bytes()),
    }
    return [Hostile(f"pt_{name}", "weights", ".pt", write) for name, write in table.items()]


def _half(path: Path) -> bytes:
    """The first half of a file (a truncated copy)."""
    data = path.read_bytes()
    return data[: len(data) // 2]


def _npy_bytes(obj: Any = None, allow_pickle: bool = False) -> bytes:
    """An .npy file of `obj` (default: 4 valid images) as bytes."""
    import numpy as np

    buffer = io.BytesIO()
    value = np.zeros((4, 1, 8, 8), dtype=np.float32) if obj is None else obj
    np.save(buffer, value, allow_pickle=allow_pickle)
    return buffer.getvalue()


def _objects(marker: Path | None = None) -> Any:
    """An object array of 16 images (or of payloads, when `marker` is given)."""
    import numpy as np

    arr = np.empty((16, 1, 8, 8), dtype=object)
    arr[...] = 0.5
    if marker is not None:
        arr[0, 0, 0, 0] = payloads(marker)["os_system"]
    return arr


def _npz(arrays: Callable[[Path], dict[str, Any]]) -> Writer:
    """A writer of an .npz of the arrays made for the marker."""

    def write(path: Path, marker: Path, good: Good) -> None:
        import numpy as np

        with path.open("wb") as f:
            np.savez(f, **arrays(marker))

    return write


def _npy(obj: Callable[[Path], Any]) -> Writer:
    """A writer of a pickled .npy of the object made for the marker."""

    def write(path: Path, marker: Path, good: Good) -> None:
        path.write_bytes(_npy_bytes(obj(marker), allow_pickle=True))

    return write


def _huge_header() -> bytes:
    """An .npy whose header claims 10^12 samples and holds 64 bytes."""
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000, 1, 8, 8), }"
    header = header.ljust(118) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + bytes(64)


def dataset_cases(slot: str) -> list[Hostile]:
    """Hostile or broken .npz/.npy datasets, used as the recipe's `slot` dataset."""
    import numpy as np

    images = lambda *shape: {"image": np.zeros(shape, dtype=np.float32)}  # noqa: E731
    table: dict[str, Writer] = {
        "npz_object_array": _npz(lambda m: {"image": _objects()}),
        "npz_object_payload": _npz(lambda m: {"image": _objects(m)}),
        "npy_pickled_objects": _npy(lambda m: _objects()),
        "npy_pickled_payload": _npy(lambda m: _objects(m)),
        "npz_truncated": _bytes(lambda g: _half(g.data)),
        "npz_random_bytes": _bytes(_random(2048)),
        "npy_random_bytes": _bytes(_random(2048)),
        "npz_empty": _bytes(lambda g: b""),
        "npy_empty": _bytes(lambda g: b""),
        "npy_truncated": _bytes(lambda g: _npy_bytes()[:200]),
        "npy_huge_header": _bytes(lambda g: _huge_header()),
        "npz_missing_input": _npz(lambda m: {"other": images(16, 1, 8, 8)["image"]}),
        "npz_wrong_shape": _npz(lambda m: images(16, 1, 4, 4)),
        "npz_string_dtype": _npz(lambda m: {"image": np.full((16, 1, 8, 8), "a")}),
        "npz_zero_samples": _npz(lambda m: images(0, 1, 8, 8)),
        "npz_scalar": _npz(lambda m: {"image": np.float32(3.0)}),
        "npz_member_not_npy": _bytes(_zip({"image.npy": b"not an array"})),
    }
    return [
        Hostile(f"{slot[:4]}_{name}", slot, f".{name[:3]}", write) for name, write in table.items()
    ]


ONNX_VARIANTS = (
    "external_missing",
    "external_outside",
    "unknown_op",
    "custom_domain",
    "input_name",
    "input_shape",
    "input_dtype",
    "opset_99",
    "ir_99",
    "dangling",
    "no_outputs",
)


def _onnx_variant(name: str) -> Writer:
    """A writer of a broken variant of the tiny ONNX model."""
    return lambda path, marker, good: write_onnx(path, name)


def onnx_cases() -> list[Hostile]:
    """Broken or odd ONNX source files for the ONNX recipe."""
    import onnx

    other = onnx.helper.make_tensor("t", onnx.TensorProto.FLOAT, [2], [1.0, 2.0])
    graph = onnx.helper.make_graph([], "g", [], [])
    table: dict[str, Writer] = {
        "truncated": _bytes(lambda g: _half(g.onnx)),
        "random_bytes": _bytes(_random(4096)),
        "empty": _bytes(lambda g: b""),
        "tensor_proto": _bytes(lambda g: other.SerializeToString()),
        "graph_proto": _bytes(lambda g: graph.SerializeToString()),
        "text_not_protobuf": _bytes(lambda g: b"<ir_version: 8>\n"),
        "torch_file": _bytes(lambda g: g.weights.read_bytes()),
        **{name: _onnx_variant(name) for name in ONNX_VARIANTS},
    }
    return [Hostile(f"onnx_{name}", "onnx", ".onnx", write) for name, write in table.items()]


def untrusted_cases() -> list[Hostile]:
    """Every case builder of the untrusted part, in a fixed order."""
    return [
        *weights_cases(),
        *dataset_cases("evaluation"),
        *dataset_cases("calibration"),
        *onnx_cases(),
    ]


def make_good(folder: Path, repo: Path) -> Good:
    """Valid weights, dataset, ONNX model and ONNX dataset for the untrusted recipes."""
    folder.mkdir(parents=True, exist_ok=True)
    weights = folder / "digits_cnn.pt"
    shutil.copyfile(repo / "models" / "digits_cnn.pt", weights)
    data = folder / "digits.npz"
    write_npz(data, {"image": (32, 1, 8, 8)}, labels=True)
    return Good(weights, data, *tiny_onnx(folder))


def untrusted_recipe(slot: str, files: dict[str, Path]) -> str:
    """A valid recipe (PyTorch or ONNX source) naming the given files."""
    verify = "verify: {latency_runs: 5, warmup_runs: 1}\n"
    if slot == "onnx":
        return (
            "source:\n  kind: onnx\n"
            f"  model: {json.dumps(str(files['onnx']))}\n"
            "  inputs: [{name: x, shape: [1, 64], dtype: float32}]\n"
            f"evaluation: {{dataset: {json.dumps(str(files['onnx_data']))}, metric: agreement}}\n"
            "quantization: {mode: none}\ntarget: onnxruntime_micro\n" + verify
        )
    return (
        "source:\n  kind: pytorch\n  model: edgeflow.zoo.digits:DigitsCNN\n"
        "  init: {num_classes: 10}\n"
        f"  weights: {json.dumps(str(files['weights']))}\n"
        "  inputs: [{name: image, shape: [1, 1, 8, 8], dtype: float32}]\n"
        f"calibration: {{dataset: {json.dumps(str(files['calibration']))}, samples: 16}}\n"
        f"evaluation: {{dataset: {json.dumps(str(files['evaluation']))}, metric: agreement}}\n"
        "quantization: {mode: int8, per_channel: true, reduce_range: true}\n"
        "target: onnxruntime_micro\n" + verify
    )


def good_files(good: Good) -> dict[str, Path]:
    """The recipe slots filled with the valid files."""
    return {
        "weights": good.weights,
        "calibration": good.data,
        "evaluation": good.data,
        "onnx": good.onnx,
        "onnx_data": good.onnx_data,
    }


@dataclass
class UntrustedResult:
    """One untrusted case: exit status, whether code ran, whether the file was named."""

    name: str
    code: int | None
    code_ran: bool
    named: bool
    message: str

    @property
    def holds(self) -> bool:
        """The requirement: exit 2, no code ran, the file named."""
        return self.code == 2 and not self.code_ran and self.named


def run_hostile(s: Settings, case: Hostile, good: Good, cache: Path) -> UntrustedResult:
    """Write the hostile file, run `edgeflow run` on a recipe naming it, judge the result."""
    folder = s.work / "untrusted" / case.name
    folder.mkdir(parents=True)
    marker = folder / "CODE_RAN"
    path = folder / f"{case.name}{case.suffix}"
    case.write(path, marker, good)
    files = good_files(good) | {case.slot: path}
    text = untrusted_recipe(case.slot, files)
    ran = run_recipe(s, folder, text, cache, s.args.untrusted_timeout)
    code_ran = marker.exists()
    return UntrustedResult(case.name, ran.code, code_ran, path.name in ran.text, error_line(ran))


def run_control(s: Settings, slot: str, good: Good, cache: Path) -> Ran:
    """The valid recipe (PyTorch or ONNX source) with the valid files: must build."""
    folder = s.work / "untrusted" / f"control-{slot}"
    folder.mkdir(parents=True)
    return run_recipe(s, folder, untrusted_recipe(slot, good_files(good)), cache, s.args.timeout)


def run_recipe(s: Settings, folder: Path, text: str, cache: Path, timeout: float) -> Ran:
    """Write `text` as folder/recipe.yaml and `edgeflow run` it (its build in folder/build)."""
    recipe = folder / "recipe.yaml"
    recipe.write_text(text, encoding="utf-8")
    return run_edgeflow(s, run_args(recipe, cache, folder / "build"), folder / "run", timeout)


def pick(cases: list[Hostile], count: int) -> list[Hostile]:
    """`count` cases spread over the list (all when count is 0 or more than there are)."""
    if count <= 0 or count >= len(cases):
        return cases
    return [cases[round(i * (len(cases) - 1) / max(1, count - 1))] for i in range(count)]


def part_untrusted(s: Settings) -> list[Row]:
    """Hostile weights, datasets and ONNX files: no code runs, exit 2, the file is named."""
    good = make_good(s.work / "untrusted" / "good", s.repo)
    cache = s.work / "untrusted" / "cache"
    controls = {slot: run_control(s, slot, good, cache) for slot in ("weights", "onnx")}
    for slot, ran in controls.items():
        say(f"untrusted: control ({slot} recipe): exit {ran.code}, {ran.seconds:.1f} s")
    chosen = pick(untrusted_cases(), s.args.untrusted)
    results = []
    for i, case in enumerate(chosen):
        results.append(run_hostile(s, case, good, cache))
        r = results[-1]
        verdict = "holds" if r.holds else "FAILS"
        say(f"untrusted {i + 1}/{len(chosen)} {case.name}: exit {r.code}, {verdict}")
    return [untrusted_row(s, results, controls)]


def untrusted_row(s: Settings, results: list[UntrustedResult], controls: dict[str, Ran]) -> Row:
    """The untrusted line: how many hold; the ones that do not, with their first line."""
    failing = [r for r in results if not r.holds]
    if failing:
        say(f"\nuntrusted: {len(failing)} cases do not hold (all shown)")
    for r in failing:
        why = ["code ran"] * r.code_ran + ["file not named"] * (not r.named)
        why += [f"exit {r.code}"] * (r.code != 2)
        say(f"  {r.name}: {', '.join(why)}: {r.message or '(timed out)'}")
    controls_ok = sum(ran.code == 0 for ran in controls.values())
    for slot, ran in controls.items():
        if ran.code != 0:
            say(f"  control {slot} failed (exit {ran.code}): {first_lines(ran.text, 6)}")
    figures = {
        "hold": f"{len(results) - len(failing)}/{len(results)}",
        "code ran": sum(r.code_ran for r in results),
        "exit not 2": sum(r.code != 2 for r in results),
        "file not named": sum(not r.named for r in results),
        "controls built": f"{controls_ok}/{len(controls)}",
    }
    passed = not failing and controls_ok == len(controls)
    details = {"cases": [r.__dict__ | {"holds": r.holds} for r in results]}
    note = below_acceptance("untrusted", len(results))
    return Row("untrusted", f"{len(results)} files", figures, passed, note, details)
