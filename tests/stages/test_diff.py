"""The per-layer diff of an int8 .tflite whose operators differ from the float32 conversion
it is paired through: an LSTM that int8 runs as a WHILE loop (LiteRT's int8 sequence operator
gets stacked layers wrong) where float32 has one UNIDIRECTIONAL_SEQUENCE_LSTM. Its tensors
pair by the operators both files share and by value up to int8 rounding, and a divergence
inside the loop is still found and named."""

from __future__ import annotations

import csv
import io
import json
import shutil
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.targets.conftest import needs_tflite
from tests.targets.test_armnn import needs_armnn
from tests.targets.test_recurrent import MODEL, RECIPE


def _build(folder: Path, cache_root: Path, target: str = "tflite") -> tuple[Any, dict[str, Path]]:
    """The digit-row LSTM built for `target` in int8; the diff stage's inputs."""
    from edgeflow.engine.cache import Cache
    from edgeflow.engine.runner import run_build
    from edgeflow.recipe import load_recipe

    (folder / "lstm.py").write_text(MODEL)
    recipe = folder / "recipe.yaml"
    text = textwrap.dedent(RECIPE).replace("TARGET", target).replace("MODE", "int8")
    recipe.write_text(text.replace("TOLERANCE", "0.1") + "diff: {samples: 8}\n")
    loaded = load_recipe(recipe)
    cache = Cache(cache_root)
    result = run_build(loaded, cache, folder / "build", print)
    assert not result.failed_checks  # the artifact as built is right
    entry = {o.stage: cache.entry(o.stage, o.key) for o in result.outcomes}
    shutil.copytree(entry["convert"] / "artifact", folder / "artifact")
    return loaded, {
        "artifact": folder / "artifact",
        "convert": entry["convert"] / "convert.json",
        "onnx": entry["quantize"] / "model.onnx",
        "float_onnx": entry["optimize"] / "model.onnx",
        "source_onnx": entry["rewrite_target"] / "model.onnx",
    }


def _diff(loaded: Any, inputs: dict[str, Path], out: Path) -> tuple[dict, str]:
    from edgeflow.engine.runner import execute
    from edgeflow.stages import STAGES

    out.mkdir()
    execute(STAGES["diff"], loaded, inputs, out)
    return json.loads((out / "diff.json").read_text()), (out / "layers_diff.csv").read_text()


def _negate_first(path: Path, builtin: str) -> None:
    """A test-only fault in the artifact: the weights of its first `builtin` operator (of the
    main subgraph) negated."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    from edgeflow.targets import emitted

    tree = schema.ModelT.InitFromPackedBuf(bytearray(path.read_bytes()), 0)
    names = emitted.operators_by_code(schema.Model.GetRootAs(path.read_bytes(), 0), schema)
    op = next(op for op in tree.subgraphs[0].operators if names[op.opcodeIndex] == builtin)
    tensor = tree.subgraphs[0].tensors[op.inputs[1]]
    assert tensor.type == schema.TensorType.INT8
    buffer = tree.buffers[tensor.buffer]
    value = np.frombuffer(bytes(bytearray(buffer.data)), np.int8).astype(np.int32)
    buffer.data = np.frombuffer(np.clip(-value, -127, 127).astype(np.int8).tobytes(), np.uint8)
    builder = flatbuffers.Builder(1024)
    builder.Finish(tree.Pack(builder), file_identifier=b"TFL3")
    path.write_bytes(bytes(builder.Output()))


@needs_tflite
def test_an_int8_loop_against_a_float32_sequence_operator_is_paired_and_its_fault_named(
    tmp_path: Path, shared_cache: Path
) -> None:
    """Measured: the built artifact pairs 4 tensors (the input by its layout, the transposed
    rows and the LSTM's last state by value at 57 and 45 dB, the head by the operator runs
    both files share), no divergence; with the LSTM's input projection (the FULLY_CONNECTED
    before the WHILE) negated, the first divergence is the head's output, with the LSTM and
    the Reshape after it among the nodes before it, at 4 dB after 57 dB."""
    loaded, inputs = _build(tmp_path, shared_cache)
    found, rows = _diff(loaded, inputs, tmp_path / "healthy")
    assert "whose operators differ from the artifact's" in found["pairing"]
    assert found["first_divergence"] is None and found["bisect"] is None, found["line"]
    assert found["paired_by"] == {"io": 1, "value": 2, "sequence": 1}
    state = next(r for r in csv.DictReader(io.StringIO(rows)) if r["tensor"] == "view_1")
    assert state["artifact_op"] == "WHILE" and state["paired_by"] == "value"  # its last state
    assert 30 < float(state["sqnr_db"]) < 60

    _negate_first(inputs["artifact"] / "model.tflite", "FULLY_CONNECTED")
    found, _ = _diff(loaded, inputs, tmp_path / "faulty")
    divergence = found["first_divergence"]
    assert divergence is not None, found["line"]
    assert divergence["tensor"] == "output" and divergence["paired_by"] == "sequence"
    lstm = next(n for n in divergence["fused_nodes"] if "lstm" in n)
    assert f"with LSTM node {lstm}" in found["line"]
    assert divergence["sqnr_db"] < 6  # negated weights: an error as large as the signal
    assert divergence["inputs_sqnr_db"] > 40  # the rows the LSTM reads are right
    assert found["bisect"] is None  # the rows inside the model pair: located, no bisection


@needs_tflite
@needs_armnn
def test_an_lstm_unrolled_in_the_file_is_read_in_arm_nn_and_paired(
    tmp_path: Path, shared_cache: Path
) -> None:
    """armnn's int8 file has the loop unrolled (100 operators against the float32 file's 4),
    each step's tensors under the loop body's names: Arm NN binds outputs by name, so the
    capture names every tensor apart ("No tensor supplied for output 4096" before). Measured:
    the last step's state pairs by value at 44 dB, no divergence."""
    loaded, inputs = _build(tmp_path, shared_cache, "armnn")
    found, rows = _diff(loaded, inputs, tmp_path / "diff")
    assert "(100 against 4)" in found["pairing"]
    assert found["first_divergence"] is None and found["bisect"] is None, found["line"]
    state = next(r for r in csv.DictReader(io.StringIO(rows)) if r["tensor"] == "view_1")
    assert state["artifact_op"] == "MUL" and state["paired_by"] == "value"
    assert 30 < float(state["sqnr_db"]) < 60


def _bare_lstm(folder: Path) -> Path:
    """x [8 steps, 1, 4] -> LSTM (8 units) -> its last state -> Reshape -> Gemm -> y [1, 3],
    fixed random weights; the data are integers from -128 to 127, which int8 holds exactly,
    so the input is exact and every error starts inside the model."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = {
        "W": rng.normal(0, 0.02, (1, 32, 4)),
        "R": rng.normal(0, 0.3, (1, 32, 8)),
        "B": rng.normal(0, 0.1, (1, 64)),
        "head_w": rng.normal(0, 1, (3, 8)),
        "head_b": rng.normal(0, 0.1, (3,)),
    }
    initializers = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in weights.items()]
    initializers.append(numpy_helper.from_array(np.array([1, 8], np.int64), "shape"))
    nodes = [
        helper.make_node("LSTM", ["x", "W", "R", "B"], ["", "h"], hidden_size=8, name="lstm"),
        helper.make_node("Reshape", ["h", "shape"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "head_w", "head_b"], ["y"], transB=1, name="head"),
    ]
    graph = helper.make_graph(
        nodes,
        "bare",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(folder / "lstm.onnx"))
    x = rng.integers(-128, 128, (8, 32, 4)).astype(np.float32)
    x[0, 0, :2] = [-128, 127]  # the calibration range: one int8 step per integer
    np.savez(folder / "data.npz", x=x)
    recipe = folder / "lstm.yaml"
    recipe.write_text(
        "source:\n"
        "  kind: onnx\n"
        "  model: lstm.onnx\n"
        "  inputs: [{name: x, shape: [8, 1, 4], batch_axis: 1}]\n"
        "calibration: {dataset: data.npz}\n"
        "evaluation: {dataset: data.npz, metric: agreement, outputs: {y: {kind: values}}}\n"
        "quantization: {mode: int8}\n"
        "target: tflite\n"
        "verify: {max_relative_diff: 0.5}\n"
        "diff: {samples: 8}\n"
    )
    return recipe


@pytest.mark.slow
@needs_tflite
def test_where_nothing_inside_the_model_pairs_the_diff_bisects(
    tmp_path: Path, shared_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With a threshold no int8 tensor meets (200 dB), the last state of the int8 loop does
    not pair by value, and the only tensors compared are the exact input and the output: the
    diff's divergence at the output cannot say which of the LSTM, Reshape and Gemm before it
    is wrong, so `edgeflow diff` bisects. Measured: the output at 34 dB, the exact input;
    the bisection ends at the LSTM (31 dB), in about 30 s."""
    from edgeflow.cli import main

    recipe = _bare_lstm(tmp_path)
    common = [f"cache_dir={shared_cache}", f"build_dir={tmp_path}/b", "diff.min_sqnr_db=200"]
    assert main(["diff", str(recipe), *common]) == 0
    build = tmp_path / "b" / "lstm" / "tflite-int8"
    found = json.loads((build / "diff.json").read_text())
    assert found["paired_by"] == {"io": 1, "sequence": 1}  # the input, the head's output
    divergence = found["first_divergence"]
    assert divergence["node"] == "head" and divergence["fused_nodes"] == ["lstm", "flatten"]
    assert divergence["inputs_sqnr_db"] == "inf" and 20 < divergence["sqnr_db"] < 60
    assert found["bisect"] == (
        "the diff pairs no tensor inside the model, so it cannot tell which of the 3 nodes "
        "up to y diverges"
    )
    printed = capsys.readouterr().out
    assert f"{found['bisect']}: bisecting" in printed
    bisected = json.loads((build / "bisect.json").read_text())
    first = bisected["first_failing"]
    assert first["op"] == "LSTM" and first["verdict"] == "diverges" and first["sqnr_db"] < 60
    assert bisected["line"] in printed
