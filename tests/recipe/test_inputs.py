"""Untrusted inputs end in a located exit-2 error that says what the file or value is, never
in a traceback: constants and states outside their dtype, duplicate outputs, ONNX files that
do not parse or whose initializers lack data, dataset and weights files of the wrong kind,
a folder or a dot-file as the recipe, non-finite calibration data."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeflow.cli import main
from edgeflow.core.errors import EdgeflowError, RecipeError
from edgeflow.data import load_samples
from edgeflow.recipe import load_recipe
from edgeflow.schema.sections import DatasetSpec, TensorSpec
from tests.recipe.test_errors import GOOD, problems

ONNX_RECIPE = """
source:
  kind: onnx
  model: m.onnx
  inputs:
    - {name: x, shape: [1, 4]}
calibration: {dataset: x.npz}
evaluation: {dataset: x.npz, metric: agreement}
quantization: {mode: int8}
target: onnxruntime_micro
"""


def add_model(inits: list[TensorProto], second: str = "w") -> onnx.ModelProto:
    """y = x + w (w a [1, 4] initializer), with `inits` beside it."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = numpy_helper.from_array(np.ones((1, 4), np.float32), "w")
    node = helper.make_node("Add", ["x", second], ["y"])
    graph = helper.make_graph([node], "g", [x], [y], [w, *inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def no_data(name: str, dims: list[int]) -> TensorProto:
    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT)
    tensor.dims.extend(dims)
    return tensor


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    onnx.save(add_model([]), str(tmp_path / "m.onnx"))
    np.savez(tmp_path / "x.npz", x=np.ones((4, 4), np.float32))
    return tmp_path


def dataset(path: Path) -> DatasetSpec:
    return DatasetSpec.model_construct(dataset=path, split=None, samples=None, options={})


def validate(path: Path, capsys) -> str:
    """`edgeflow validate` exits 2 without a traceback; its stderr."""
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    return err


# --- constants and states that their dtype cannot hold (validate refused none of them) ---


@pytest.mark.parametrize(
    ("entry", "says", "hint"),
    [
        ("value: 70000.0, dtype: float16", "70000 is beyond float16's largest (65504)",
         "declare dtype: float32"),
        ("value: 1.0e39, dtype: float32", "1e+39 is beyond float32's largest", "dtype: float64"),
        ("value: 1.0e39", "1e+39 is beyond float32's largest", "declare dtype: float64"),
        ("value: 70000, dtype: float16", "70000 is beyond float16's largest", "float32"),
        ("value: 9223372036854775808",
         "9223372036854775808 is outside int64's range (-9223372036854775808 to "
         "9223372036854775807)", "declare dtype: float64"),
        ("value: 18446744073709551616, dtype: int64", "outside int64's range", "float64"),
        ("value: 300, dtype: uint8", "300 is outside uint8's range (0 to 255)", "dtype: int32"),
        ("value: [1, -129], dtype: int8", "-129 is outside int8's range (-128 to 127)", "int32"),
        ("value: [1.0, .nan]", "holds NaN or infinity", "finite numbers"),
    ],
)  # fmt: skip
def test_a_constant_its_dtype_cannot_hold_is_located(
    entry: str, says: str, hint: str, write_recipe
) -> None:
    shape = "[2]" if "[" in entry.split(",")[0] or "[1.0" in entry else "[]"
    text = GOOD.replace(
        "    - {name: image, shape: [1, 1, 8, 8]}\n",
        f"    - {{name: image, shape: [1, 1, 8, 8]}}\n    - {{name: k, shape: {shape}, {entry}}}\n",
    )
    [problem] = problems(write_recipe(text))
    assert ": source.inputs[1].value: the value " in problem and says in problem, problem
    assert hint in problem.split("hint:")[1]


def test_constants_that_fit_still_load(write_recipe) -> None:
    text = GOOD.replace(
        "    - {name: image, shape: [1, 1, 8, 8]}\n",
        "    - {name: image, shape: [1, 1, 8, 8]}\n"
        "    - {name: a, shape: [], value: 65504, dtype: float16}\n"
        "    - {name: b, shape: [], value: 9223372036854775807}\n"
        "    - {name: c, shape: [], value: 9223372036854775808, dtype: float32}\n"
        "    - {name: d, shape: [], value: 255, dtype: uint8}\n",
    )
    inputs = load_recipe(write_recipe(text)).recipe.source.inputs
    assert [s.dtype for s in inputs[1:]] == ["float16", "int64", "float32", "uint8"]
    specs = [
        TensorSpec(name="a", shape=[], value=65504, dtype="float16"),
        TensorSpec(name="b", shape=[], value=2**63 - 1),
        TensorSpec(name="d", shape=[], value=255, dtype="uint8"),
    ]
    assert [s.constant().item() for s in specs] == [65504.0, 2**63 - 1, 255]
    assert [s.dtype for s in specs] == ["float16", "int64", "uint8"]


STATEFUL = """
source:
  kind: onnx
  model: m.onnx
  inputs:
    - {name: x, shape: [1, 4]}
    - {name: state, shape: [1, 4]}
  outputs: [y, new_state]
  state: [{input: state, output: new_state, INITIAL}]
evaluation: {dataset: seq.npz, metric: agreement}
target: onnxruntime_micro
"""


@pytest.mark.parametrize(
    ("initial", "says"),
    [
        ("initial: [[true, false, true, true]]", "holds booleans"),
        ("initial: [[1.0, .nan, 0.0, 0.0]]", "holds NaN or infinity"),
        ("initial: [[.inf, 0.0, 0.0, 0.0]]", "holds NaN or infinity"),
        ("initial: 1.0e39", "1e+39 is beyond float32's largest"),
        ("initial: complex.npy", "complex.npy (complex64) does not hold real numbers"),
        ("initial: flags.npy", "flags.npy (bool) does not hold real numbers"),
        ("initial: nan.npy", "nan.npy (float32) holds 2 NaN or infinite value(s) of 4"),
    ],
)
def test_a_state_initial_that_is_not_finite_real_numbers_is_located(
    initial: str, says: str, folder: Path, write_recipe
) -> None:
    np.save(folder / "complex.npy", np.zeros((1, 4), np.complex64))
    np.save(folder / "flags.npy", np.zeros((1, 4), bool))
    np.save(folder / "nan.npy", np.array([[np.nan, 0, np.inf, 0]], np.float32))
    with pytest.raises(RecipeError) as info:
        load_recipe(write_recipe(STATEFUL.replace("INITIAL", initial)))
    found = [p for p in info.value.problems if p.key == "source.state[0].initial"]
    assert len(found) == 1 and says in found[0].message, info.value.problems
    assert found[0].line == 8 and "finite float32" in (found[0].hint or "")


def test_duplicate_output_names_are_located(folder: Path, write_recipe) -> None:
    text = ONNX_RECIPE.replace("  inputs:", "  outputs: [y, z, y]\n  inputs:")
    with pytest.raises(RecipeError) as info:
        load_recipe(write_recipe(text))
    [problem] = [p for p in info.value.problems if p.key.startswith("source.outputs")]
    assert problem.key == "source.outputs[2]" and (problem.line, problem.col) == (4, 19)
    assert problem.message == "two outputs are named 'y' (outputs[0] and outputs[2])"


# --- ONNX files: parsed at validate, their initializers' data checked ---


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: p.write_bytes(os.urandom(4096)), "does not parse as an ONNX protobuf"),
        (lambda p: p.write_bytes(add_model([]).SerializeToString()[:60]),
         "does not parse as an ONNX protobuf"),
        (lambda p: p.write_bytes(b""), "holds no ONNX model (no ir_version or no graph)"),
        (lambda p: onnx.save(add_model([no_data("big", [2**31])]), str(p)),
         "initializer 'big' holds no data (its shape [2147483648]: 2,147,483,648 elements)"),
        (lambda p: onnx.save(add_model([no_data("e", [4])]), str(p)),
         "initializer 'e' holds no data (its shape [4]: 4 elements)"),
    ],
)  # fmt: skip
def test_an_onnx_file_that_cannot_be_read_is_refused_at_validate(
    make, says: str, folder: Path, write_recipe, capsys
) -> None:
    make(folder / "m.onnx")
    err = validate(write_recipe(ONNX_RECIPE), capsys)
    assert ":3:10: source.model: m.onnx is not a readable ONNX model: " in err
    assert says in err and "hint: export the model again" in err
    assert "1 problem found" in err


def test_external_data_outside_the_folder_or_too_short_is_refused(
    folder: Path, write_recipe, capsys
) -> None:
    outside = folder.parent / "outside.bin"
    outside.write_bytes(b"\0" * 16)
    (folder / "short.bin").write_bytes(b"\0" * 8)
    for location, says in (
        ("../outside.bin", "is outside the model's folder"),
        ("/etc/passwd", "is not a path relative to the model's folder"),
        ("short.bin", "is 8 bytes; the tensor reads 16 from offset 0"),
        ("absent.bin", "is not a file in"),
    ):
        tensor = no_data("ext", [4])
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", location), ("length", "16")):
            tensor.external_data.add(key=key, value=value)
        onnx.save(add_model([tensor]), str(folder / "m.onnx"))
        err = validate(write_recipe(ONNX_RECIPE), capsys)
        assert f"initializer 'ext': external data '{location}' {says}" in err, err


def test_precheck_refuses_an_initializer_without_data(folder: Path, capsys) -> None:
    """It ended in a ValueError in numpy's reshape (a 2^31-element initializer)."""
    onnx.save(add_model([no_data("big", [2**31])], second="big"), str(folder / "m.onnx"))
    assert main(["precheck", str(folder / "m.onnx"), "--target", "onnxruntime_micro"]) == 2
    err = capsys.readouterr().err
    assert (
        f"{folder / 'm.onnx'} is not a readable ONNX model: initializer 'big' holds no data" in err
    )
    assert "Traceback" not in err


def test_precheck_says_why_8_gib_of_external_data_cannot_load(tmp_path: Path) -> None:
    """The reason was empty (a MemoryError has no text). A sparse 8 GiB file, memory capped."""
    tensor = no_data("big", [2**31])
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "w.bin"), ("offset", "0"), ("length", str(2**33))):
        tensor.external_data.add(key=key, value=value)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y], [tensor])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "m.onnx"))
    with open(tmp_path / "w.bin", "wb") as f:
        f.truncate(2**33)
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))\n"
        "from edgeflow.cli import main\n"
        "sys.exit(main(['precheck', 'm.onnx', '--target', 'onnxruntime_micro']))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "m.onnx is not a readable ONNX model: its weights (8,589,934,7" in done.stderr
    assert "hint: run it on a machine with more memory" in done.stderr
    assert "do not fit in this process's address-space limit (ulimit -v)" in done.stderr
    assert "Traceback" not in done.stderr


# --- dataset files ---


def _patched_npz(path: Path, local: int, central: int, value: int) -> None:
    """x.npz with a byte of its local and central zip headers set (flags or method)."""
    data = bytearray(path.read_bytes())
    at = data.index(b"PK\x01\x02")
    data[local] = value
    data[at + central] = value
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("make", "name", "says"),
    [
        (lambda p: _patched_npz(p, 8, 10, 99), "x.npz",
         "stores its member 'x.npy' with zip compression method 99, which Python's zipfile "
         "cannot read"),
        (lambda p: _patched_npz(p, 6, 8, 1), "x.npz",
         "is an encrypted archive (its member 'x.npy' needs a password)"),
        (lambda p: p.write_bytes(os.urandom(3000).replace(b"PK", b"pk")), "x.npz",
         "is not a .npz file (a zip archive of .npy arrays): it starts with the bytes"),
        (lambda p: p.write_text("1 2 3 4\n5 6 7 8\n"), "x.npy",
         "is not a NumPy .npy file (those start with b'\\x93NUMPY'): it is a text file "
         "(starting '1 2 3 4\\n5 6 7 8\\n')"),
    ],
)  # fmt: skip
def test_a_dataset_file_of_the_wrong_kind_is_named_for_what_it_is(
    make, name: str, says: str, folder: Path, write_recipe, capsys
) -> None:
    """They were 'pickled data' or a NotImplementedError / RuntimeError traceback."""
    path = folder / name
    if name == "x.npz":
        np.savez(path, x=np.ones((4, 4), np.float32))
    make(path)
    text = ONNX_RECIPE.replace("dataset: x.npz}", f"dataset: {name}}}")
    err = validate(write_recipe(text), capsys)
    assert f":6:24: calibration.dataset: {name} {says}" in err, err
    assert "pickled" not in err
    with pytest.raises(EdgeflowError) as info:  # the run's loader says the same
        load_samples(dataset(path), [TensorSpec(name="x", shape=[1, 4])], "calibration")
    assert f"calibration dataset {path} {says}" in info.value.message


def test_non_finite_calibration_samples_are_refused_with_their_count(tmp_path: Path) -> None:
    """All-NaN calibration data ended in onnxruntime's 'AssertionError: scale issue'."""
    x = np.ones((10, 4), np.float32)
    x[3, 1], x[7, 0] = np.nan, -np.inf
    np.savez(tmp_path / "c.npz", x=x)
    spec, inputs = dataset(tmp_path / "c.npz"), [TensorSpec(name="x", shape=[1, 4])]
    with pytest.raises(EdgeflowError) as info:
        load_samples(spec, inputs, "calibration")
    assert info.value.message == (
        f"calibration dataset {tmp_path / 'c.npz'}: 'x' holds NaN or infinity in 2 of its 10 "
        "samples (the first: sample 3)"
    )
    assert "numpy.isfinite" in (info.value.hint or "")
    assert len(load_samples(spec, inputs, "evaluation")) == 10  # evaluation data is the user's
    np.savez(tmp_path / "c.npz", x=np.full((10, 4), np.nan, np.float32))
    with pytest.raises(EdgeflowError, match="in 10 of its 10 samples"):
        load_samples(spec, inputs, "calibration")


# --- weights, the recipe file itself ---


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"root:x:0:0:root:/root:/bin/bash\n", "it is a text file (starting 'root:x:0:0"),
        (b"hello\nworld\n", "it is a text file (starting 'hello\\nworld\\n')"),
        (b"", "it is empty"),
        (b"\x93NUMPY\x01\x00", "it is a NumPy .npy array"),
    ],
)
def test_weights_that_are_no_checkpoint_say_what_they_are(
    content: bytes, says: str, write_recipe, tmp_path: Path, capsys
) -> None:
    """/etc/passwd gave 'list index out of range', a text .pt 'pop from empty list'."""
    from edgeflow.source import build_module

    (tmp_path / "w.pt").write_bytes(content)
    from tests.conftest import DEMO_WEIGHTS

    path = write_recipe(GOOD.replace(str(DEMO_WEIGHTS), "w.pt"))
    err = validate(path, capsys)
    assert (
        ":5:12: source.weights: w.pt is not a PyTorch checkpoint (torch.save writes a zip " in err
    )
    assert says in err and "hint: save a state_dict with torch.save" in err
    source = load_recipe(write_recipe(GOOD)).recipe.source
    source = source.model_copy(update={"weights": tmp_path / "w.pt"})
    with pytest.raises(EdgeflowError, match="is not a PyTorch checkpoint"):
        build_module(source)


def test_a_folder_as_the_recipe_is_called_a_folder(tmp_path: Path, capsys, monkeypatch) -> None:
    (tmp_path / "recipes_here").mkdir()
    (tmp_path / "recipes_here" / "a.yaml").write_text(GOOD)
    monkeypatch.chdir(tmp_path)
    for given in ("recipes_here", "recipes_here/"):
        assert main(["validate", given]) == 2
        err = capsys.readouterr().err
        assert "recipes_here is a folder, not a recipe file (its YAML files: a.yaml)" in err
        assert "hint: pass a recipe file: recipes_here/a.yaml" in err
    assert main(["run", "recipe=recipes_here"]) == 2
    assert "recipes_here is a folder, not a recipe file" in capsys.readouterr().err


def test_a_dot_file_recipe_is_refused_with_its_reason(write_recipe) -> None:
    [problem] = problems(write_recipe(GOOD, ".hidden.yaml"))
    assert "build/.hidden/ would be a hidden folder" in problem
    assert "hint: rename the file (e.g. hidden.yaml)" in problem


def test_a_keras_path_in_a_symlink_loop_is_located(tmp_path: Path, write_recipe) -> None:
    (tmp_path / "a.keras").symlink_to(tmp_path / "b.keras")
    (tmp_path / "b.keras").symlink_to(tmp_path / "a.keras")
    text = (
        "source:\n  kind: tensorflow\n  model: a.keras\n  inputs:\n    - {name: x, shape: [1, 4]}\n"
        "evaluation: {dataset: x.npz, metric: agreement}\ntarget: onnxruntime_micro\n"
    )
    [problem] = [p for p in problems(write_recipe(text)) if "source.model" in p]
    assert ":3:10: source.model: not a usable path: a.keras (" in problem
    assert "Symlink loop" in problem or "Too many levels of symbolic links" in problem
