"""The fuzz class of the recipe keys added since the last round: source.inputs batch_axis,
value and shape [], source.state, convert.via, quantization.fallback and reduce_range,
evaluation.outputs, duplicate source.outputs, and tensorflow / jax sources given wrong files.
Each variant is labelled must-refuse (True) or may-accept (False)."""

from __future__ import annotations

import copy
import math
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .mutations import Base, Mutant, Mutator

Tree = dict[str, Any]
Variant = tuple[str, Callable[[Tree, Path], Any], bool]  # (what, edit of the tree, must refuse)


def _first(tree: Tree) -> Tree:
    return tree["source"]["inputs"][0]


def _set(path: str, value: Any) -> Callable[[Tree, Path], None]:
    """An edit setting a dotted key (`source.inputs.0.batch_axis`)."""

    def edit(tree: Tree, folder: Path) -> None:
        keys: list[Any] = [int(k) if k.isdigit() else k for k in path.split(".")]
        node = tree
        for key in keys[:-1]:
            node = node.setdefault(key, {}) if isinstance(node, dict) else node[key]
        node[keys[-1]] = value

    return edit


def _constant(
    value: Any, shape: list[int], dtype: str | None = None, **extra: Any
) -> Callable[[Tree, Path], None]:
    """An edit adding a constant input `c` (the models take no such input: may be refused
    for that, so only a constant that is itself wrong is must-refuse)."""

    def edit(tree: Tree, folder: Path) -> None:
        spec: Tree = {"name": "c", "shape": shape, "value": value, **extra}
        if dtype is not None:
            spec["dtype"] = dtype
        tree["source"]["inputs"].append(spec)

    return edit


def _state(
    links: Callable[[Tree], list[Tree]], extra_input: bool = True
) -> Callable[[Tree, Path], None]:
    """An edit adding state links (and a fed state input `h` [1, 4] where asked)."""

    def edit(tree: Tree, folder: Path) -> None:
        if extra_input:
            tree["source"]["inputs"].append({"name": "h", "shape": [1, 4], "dtype": "float32"})
        tree["source"]["state"] = links(tree)

    return edit


def _out(tree: Tree) -> str:
    outputs = tree["source"].get("outputs") or ["output"]
    return outputs[0]


def _source(kind: str, model: Callable[[Path], str], **extra: Any) -> Callable[[Tree, Path], None]:
    """An edit making the source a `kind` source naming the file `model(folder)` makes."""

    def edit(tree: Tree, folder: Path) -> None:
        old = tree["source"]
        tree["source"] = {"kind": kind, "model": model(folder), "inputs": old["inputs"], **extra}
        if "outputs" in old:
            tree["source"]["outputs"] = old["outputs"]
        tree.pop("rewrites", None)

    return edit


def _file(name: str, data: bytes | None = None) -> Callable[[Path], str]:
    """A file in the case's folder (None: absent), by absolute path."""

    def make(folder: Path) -> str:
        path = folder / name
        if data is not None:
            path.write_bytes(data)
        return str(path)

    return make


def _folder(name: str) -> Callable[[Path], str]:
    def make(folder: Path) -> str:
        (folder / name).mkdir()
        return str(folder / name)

    return make


def _loop(name: str) -> Callable[[Path], str]:
    def make(folder: Path) -> str:
        (folder / name).symlink_to(name)
        return str(folder / name)

    return make


def _npy(name: str, value: Any) -> Callable[[Path], str]:
    """An .npy file of `value` in the case's folder."""

    def make(folder: Path) -> str:
        import numpy as np

        np.save(folder / name, np.asarray(value))
        return str(folder / name)

    return make


def _npy_constant(name: str, value: Any, shape: list[int]) -> Callable[[Tree, Path], None]:
    def edit(tree: Tree, folder: Path) -> None:
        _constant(_npy(name, value)(folder), shape)(tree, folder)

    return edit


def variants(base: Base) -> list[Variant]:
    """Every variant of the new keys for a base recipe."""
    rank = len(_first(base.tree)["shape"])
    v: list[Variant] = [
        # source.inputs[].batch_axis
        ("batch_axis: 0", _set("source.inputs.0.batch_axis", 0), False),
        ("batch_axis: null on the only input", _set("source.inputs.0.batch_axis", None), True),
        (f"batch_axis: {rank} (beyond the rank)", _set("source.inputs.0.batch_axis", rank), True),
        ("batch_axis: -1", _set("source.inputs.0.batch_axis", -1), True),
        ("batch_axis: 8", _set("source.inputs.0.batch_axis", 8), True),
        ("batch_axis: 1.5", _set("source.inputs.0.batch_axis", 1.5), True),
        ("batch_axis: true", _set("source.inputs.0.batch_axis", True), True),
        ("batch_axis: [0]", _set("source.inputs.0.batch_axis", [0]), True),
        ("batch_axis: 10**30", _set("source.inputs.0.batch_axis", 10**30), True),
        # shape: []
        ("shape: [] on the only input", _set("source.inputs.0.shape", []), True),
        (
            "shape: [] with batch_axis: 0",
            lambda t, f: _first(t).update(shape=[], batch_axis=0),
            True,
        ),
        ("a 0-D constant", _constant(3, []), False),
        ("a 0-D constant with batch_axis: 0", _constant(3, [], batch_axis=0), True),
        # source.inputs[].value
        ("value: 70000.0 as float16", _constant(70000.0, [], "float16"), True),
        ("value: 1e39 as float32", _constant(1e39, [], "float32"), True),
        ("value: -1e39 as float32", _constant(-1e39, [], "float32"), True),
        ("value: 2**63 without dtype", _constant(2**63, []), True),
        ("value: -2**63 - 1 without dtype", _constant(-(2**63) - 1, []), True),
        ("value: 10**30 as int64", _constant(10**30, [], "int64"), True),
        ("value: 300 as uint8", _constant(300, [], "uint8"), True),
        ("value: -1 as uint8", _constant(-1, [], "uint8"), True),
        ("value: 128 as int8", _constant(128, [], "int8"), True),
        ("value: 2.5 as int32", _constant(2.5, [], "int32"), True),
        ("value: true as float32", _constant(True, [], "float32"), True),
        ("value: 1 as bool", _constant(1, [], "bool"), True),
        ("value: 'abc'", _constant("abc", []), True),
        ("value: {a: 1}", _constant({"a": 1}, []), True),
        ("value: ragged [[1, 2], [3]]", _constant([[1, 2], [3]], [2, 2]), True),
        ("value: [1, 2, 3] for shape [2]", _constant([1, 2, 3], [2]), True),
        ("value: [[1, 2]] for shape [2]", _constant([[1, 2]], [2]), True),
        ("value: ['a', 'b']", _constant(["a", "b"], [2]), True),
        ("value: a missing .npy", _constant(os.path.join("/nonexistent", "c.npy"), []), True),
        ("value: nested 10,000 deep", _constant(_deep(200), [1] * 8), True),
        ("value: [1.5, 2.5] as float16", _constant([1.5, 2.5], [2], "float16"), False),
        ("value: 3 as int8", _constant(3, [], "int8"), False),
        ("value: an .npy of shape [3]", _npy_constant("c.npy", [1.0, 2.0, 3.0], [3]), False),
        ("value: an .npy of the wrong shape", _npy_constant("c.npy", [1.0, 2.0, 3.0], [2]), True),
        ("value: an .npy of complex", _npy_constant("c.npy", [1j], [1]), True),
        # source.state
        (
            "state on the only input",
            _state(lambda t: [{"input": _first(t)["name"], "output": _out(t)}], False),
            True,
        ),
        (
            "state input not declared",
            _state(lambda t: [{"input": "nope", "output": _out(t)}]),
            True,
        ),
        (
            "state input bound to a constant",
            lambda t, f: (
                _constant(1.0, [1, 4])(t, f),
                t["source"].update(state=[{"input": "c", "output": _out(t)}]),
            ),
            True,
        ),
        ("state duplicated", _state(lambda t: [{"input": "h", "output": _out(t)}] * 2), True),
        ("17 state links", _state(lambda t: [{"input": "h", "output": _out(t)}] * 17), True),
        (
            "state initial: .nan",
            _state(lambda t: [{"input": "h", "output": _out(t), "initial": math.nan}]),
            True,
        ),
        (
            "state initial: .inf",
            _state(lambda t: [{"input": "h", "output": _out(t), "initial": math.inf}]),
            True,
        ),
        (
            "state initial: -.inf",
            _state(lambda t: [{"input": "h", "output": _out(t), "initial": -math.inf}]),
            True,
        ),
        (
            "state initial: true",
            _state(lambda t: [{"input": "h", "output": _out(t), "initial": True}]),
            True,
        ),
        (
            "state initial: '1+2j'",
            _state(lambda t: [{"input": "h", "output": _out(t), "initial": "1+2j"}]),
            True,
        ),
        (
            "state initial: [[nan, 0, 0, 0]]",
            _state(lambda t: [{"input": "h", "output": _out(t), "initial": [[math.nan, 0, 0, 0]]}]),
            True,
        ),
        (
            "state initial: 1e39",
            _state(lambda t: [{"input": "h", "output": _out(t), "initial": 1e39}]),
            True,
        ),
        (
            "state initial: wrong shape",
            _state(lambda t: [{"input": "h", "output": _out(t), "initial": [1, 2, 3]}]),
            True,
        ),
        (
            "state initial: {a: 1}",
            _state(lambda t: [{"input": "h", "output": _out(t), "initial": {"a": 1}}]),
            True,
        ),
        (
            "state initial: 0.5",
            _state(lambda t: [{"input": "h", "output": _out(t), "initial": 0.5}]),
            False,
        ),
        ("state without output", _state(lambda t: [{"input": "h"}]), True),
        ("state: {input: h}", lambda t, f: t["source"].update(state={"input": "h"}), True),
        # source.outputs
        ("outputs duplicated", lambda t, f: t["source"].update(outputs=[_out(t), _out(t)]), True),
        ("outputs: []", _set("source.outputs", []), False),
        ("outputs: ['']", _set("source.outputs", [""]), False),
        # convert.via
        ("convert.via: native (not tensorflow)", _set("convert.via", "native"), True),
        ("convert.via: onnx (not tensorflow)", _set("convert.via", "onnx"), True),
        ("convert.via: tflite", _set("convert.via", "tflite"), True),
        ("convert.via: 5", _set("convert.via", 5), True),
        ("convert.via: null", _set("convert.via", None), False),
        ("convert: {}", _set("convert", {}), False),
        ("convert.path: native", _set("convert.path", "native"), True),
        # quantization.fallback / reduce_range
        (
            "fallback: auto, mode none",
            lambda t, f: t.update(quantization={"mode": "none", "fallback": "auto"}),
            True,
        ),
        (
            "fallback: auto, mode fp16",
            lambda t, f: t.update(quantization={"mode": "fp16", "fallback": "auto"}),
            True,
        ),
        (
            "fallback: auto, method qat",
            lambda t, f: t.update(
                quantization={"mode": "int8", "method": "qat", "fallback": "auto"}
            ),
            True,
        ),
        (
            "fallback: auto, activations int16",
            lambda t, f: t.update(
                quantization={"mode": "int8", "activations": "int16", "fallback": "auto"}
            ),
            True,
        ),
        ("fallback: always", _set("quantization.fallback", "always"), True),
        ("fallback: true", _set("quantization.fallback", True), True),
        ("fallback: none", _set("quantization.fallback", "none"), False),
        ("reduce_range: yes-string", _set("quantization.reduce_range", "sometimes"), True),
        ("reduce_range: 2", _set("quantization.reduce_range", 2), True),
        ("reduce_range: null", _set("quantization.reduce_range", None), False),
        ("reduce_range: [true]", _set("quantization.reduce_range", [True]), True),
        ("reduce_range: auto", _set("quantization.reduce_range", "auto"), False),
        ("reduce_range: false", _set("quantization.reduce_range", False), False),
        # evaluation.outputs
        ("outputs kind bogus", lambda t, f: _eval_out(t, {"kind": "bogus"}), True),
        ("outputs as a string", lambda t, f: _eval_out(t, "classes"), True),
        ("outputs without kind", lambda t, f: _eval_out(t, {"axis": 1}), True),
        ("detections axis 0", lambda t, f: _eval_out(t, {"kind": "detections", "axis": 0}), True),
        (
            "detections boxes overlap scores",
            lambda t, f: _eval_out(t, {"kind": "detections", "boxes": 2}),
            True,
        ),
        (
            "detections negative threshold",
            lambda t, f: _eval_out(t, {"kind": "detections", "score_threshold": -1}),
            True,
        ),
        (
            "detections scores [9, 3]",
            lambda t, f: _eval_out(t, {"kind": "detections", "scores": [9, 3]}),
            False,
        ),
        (
            "probability threshold 'x'",
            lambda t, f: _eval_out(t, {"kind": "probability", "threshold": "x"}),
            True,
        ),
        ("classes unknown key", lambda t, f: _eval_out(t, {"kind": "classes", "colour": 1}), True),
        ("values", lambda t, f: _eval_out(t, {"kind": "values"}), False),
        ("outputs: a list", _set("evaluation.outputs", ["y"]), True),
        # tensorflow and jax sources with wrong files
        ("tensorflow: an .onnx file", _source("tensorflow", _file("m.onnx", b"x")), True),
        ("tensorflow: a folder without saved_model.pb", _source("tensorflow", _folder("sm")), True),
        ("tensorflow: a missing .keras", _source("tensorflow", _file("m.keras")), True),
        ("tensorflow: a .keras symlink loop", _source("tensorflow", _loop("m.keras")), True),
        (
            "tensorflow: a random-bytes .keras",
            _source("tensorflow", _file("m.keras", random.Random(1).randbytes(64))),
            False,
        ),
        (
            "tensorflow: a random-bytes .h5",
            _source("tensorflow", _file("m.h5", random.Random(1).randbytes(64))),
            False,
        ),
        ("tensorflow: a .txt", _source("tensorflow", _file("m.txt", b"hello")), True),
        (
            "tensorflow: a missing builder file",
            _source("tensorflow", lambda f: str(f / "nope.py") + ":build"),
            True,
        ),
        ("tensorflow: model: 5", _source("tensorflow", lambda f: 5), True),  # type: ignore[arg-type,return-value]
        (
            "tensorflow: init on a .keras",
            _source("tensorflow", _file("m.keras", b"x"), init={"a": 1}),
            True,
        ),
        ("tensorflow: weights on a SavedModel", lambda t, f: _saved_with_weights(t, f), True),
        (
            "tensorflow: dynamic_batch",
            _source("tensorflow", _file("m.keras", b"x"), dynamic_batch={"max": 4}),
            True,
        ),
        ("jax: an .onnx file", _source("jax", _file("m.onnx", b"x")), True),
        ("jax: a missing module", _source("jax", lambda f: "no_such_module_xyz:make"), True),
        (
            "jax: a missing weights file",
            _source(
                "jax",
                lambda f: "edgeflow.zoo.digits_flax:digits_cnn",
                weights="/nonexistent/w.msgpack",
            ),
            True,
        ),
        (
            "jax: weights a folder",
            _source("jax", lambda f: "edgeflow.zoo.digits_flax:digits_cnn", weights="/tmp"),
            True,
        ),
        (
            "jax: dynamic_batch",
            _source(
                "jax", lambda f: "edgeflow.zoo.digits_flax:digits_cnn", dynamic_batch={"max": 4}
            ),
            True,
        ),
    ]
    return v


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def _eval_out(tree: Tree, spec: Any) -> None:
    tree.setdefault("evaluation", {})["outputs"] = {_out(tree): spec}


def _saved_with_weights(tree: Tree, folder: Path) -> None:
    sm = folder / "sm"
    sm.mkdir()
    (sm / "saved_model.pb").write_bytes(b"")
    (folder / "w.weights.h5").write_bytes(b"x")
    _source("tensorflow", lambda f: str(sm), weights=str(folder / "w.weights.h5"))(tree, folder)


def mutate_new_keys(rng: random.Random, base: Base, folder: Path) -> Mutant | None:
    """One variant of the new keys on the base, sometimes two at once (then must-refuse if
    either is)."""
    table = variants(base)
    picks = [rng.choice(table)] + ([rng.choice(table)] if rng.random() < 0.3 else [])
    tree = copy.deepcopy(base.tree)
    picks[0][1](tree, folder)
    if len(picks) == 2:
        first = copy.deepcopy(tree)
        if not _combine(tree, base, picks, folder):
            picks, tree = picks[:1], first  # they clash, or one undoes the other: the first
    what = "; ".join(p[0] for p in picks)
    must = any(p[2] for p in picks)
    return Mutant(what, must, tree)


def _combine(tree: Tree, base: Base, picks: list[Any], folder: Path) -> bool:
    """Apply the second edit to `tree` (the first applied) if the two commute: applied in the
    other order they give the same recipe. Otherwise (both set `batch_axis`, say) the second
    would undo the first, and the case's label would not describe it."""
    other = copy.deepcopy(base.tree)
    try:
        picks[1][1](tree, folder)
        picks[1][1](other, folder)
        picks[0][1](other, folder)
    except (OSError, KeyError, TypeError, AttributeError, IndexError):
        return False
    return tree == other


NEW_KEY_CLASSES: dict[str, Mutator] = {"new keys": mutate_new_keys}
