"""The precheck: every finding at once, with a suggested rule; as a command and as a stage."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from edgeflow.cli import main
from tests.conftest import DEMO_RECIPE, DEMO_WEIGHTS


class Wobbly(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x.double()).float() * 2


@pytest.fixture
def wobbly(tmp_path: Path) -> Path:
    path = tmp_path / "wobbly.onnx"
    torch.onnx.export(
        Wobbly(),
        (torch.rand(1, 4),),
        str(path),
        dynamo=False,
        opset_version=17,
        input_names=["x"],
        dynamic_axes={"x": {0: "batch"}},
    )
    return path


def test_precheck_command_lists_every_finding_with_a_rule(wobbly: Path, capsys) -> None:
    assert main(["precheck", str(wobbly), "--target", "tflite_micro", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    by_op = {f["operator"]: f for f in report["findings"]}
    assert report["passed"] is False
    assert by_op["(inputs)"]["nodes"] == ["x"] and by_op["(inputs)"]["rule"] == "onnx.fix_shapes"
    assert by_op["(float64)"]["rule"] == "onnx.cast_float64_to_float32"
    assert by_op["(float64)"]["count"] >= 3
    # onnxruntime takes float64 and dynamic shapes, but has no float64 Erf kernel, as it says:
    assert main(["precheck", str(wobbly), "--target", "onnxruntime_micro", "--json"]) == 1
    findings = json.loads(capsys.readouterr().out)["findings"]
    [erf] = [f for f in findings if f["severity"] == "error"]  # and (memory): a dynamic batch
    assert erf["reason"] == "no kernel for double inputs (takes float)"
    assert erf["rule"] == "onnx.cast_float64_to_float32"
    import onnxruntime

    with pytest.raises(Exception, match="Erf"):
        onnxruntime.InferenceSession(str(wobbly), providers=["CPUExecutionProvider"])


def test_operator_list_and_the_suggested_rule_removes_the_finding(
    wobbly: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "no_erf.yaml").write_text(
        "name: no_erf\nbackend: onnxruntime_micro\n"
        "operators: [Cast, Mul, Div, Add, Constant, Sqrt, Clip]\n"
    )
    monkeypatch.chdir(tmp_path)
    assert main(["precheck", str(wobbly), "--target", "no_erf"]) == 1
    out = capsys.readouterr().out
    assert "| Erf | 1 | not supported by no_erf | /Erf | `onnx.decompose` |" in out

    from edgeflow.rules.base import RewriteContext
    from edgeflow.rules.onnx.decompose import Decompose

    fixed = Decompose().apply(onnx.load(str(wobbly)), Decompose.Options(), RewriteContext([]))
    onnx.save(fixed.model, str(tmp_path / "fixed.onnx"))
    assert main(["precheck", str(tmp_path / "fixed.onnx"), "--target", "no_erf"]) == 0


@pytest.mark.slow
def test_failed_precheck_stops_the_run_unless_the_recipe_continues(
    tmp_path: Path, write_recipe, capsys
) -> None:
    text = DEMO_RECIPE.read_text().replace("../models/digits_cnn.pt", str(DEMO_WEIGHTS))
    text = text.replace("exporter: dynamo", "exporter: torchscript").replace(
        "opset: 18", "opset: 17"
    )
    inline = (
        "target:\n  name: no_gemm\n  backend: onnxruntime_micro\n"
        "  operators: [Conv, Relu, MaxPool, GlobalAveragePool, ReduceMean, Flatten, Reshape]\n"
    )
    path = write_recipe(text.replace("target: onnxruntime_micro\n", inline))
    args = ["run", f"recipe={path}", f"cache_dir={tmp_path}/c", f"build_dir={tmp_path}/b"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "stage 'precheck' failed: the model does not pass the no_gemm precheck" in err
    assert "| Gemm | 1 | not supported by no_gemm |" in err
    assert not (tmp_path / "b").exists()

    path.write_text(path.read_text() + "precheck: {continue_on_failure: true}\n")
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "warning: the model does not pass the no_gemm precheck" in out
    assert "continuing because the recipe sets precheck.continue_on_failure" in out
    report = (tmp_path / "b" / "recipe" / "no_gemm-int8" / "report.md").read_text()
    assert "precheck: FAILED against `no_gemm`" in report and "| Gemm | 1 |" in report


def _if_model(path: Path) -> Path:
    """y = If(x.sum() > 0, then: Erf(x), else: Neg(x)): the branches' ops are converted too."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    then = helper.make_graph(
        [helper.make_node("Erf", ["x"], ["t"], name="erf")],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 4])],
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"], name="neg")],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, 4])],
    )
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="sum"),
        helper.make_node("Greater", ["s", "zero"], ["c"], name="positive"),
        helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="branch"),
    ]
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])
    graph = helper.make_graph(nodes, "g", [x], [y], [zero])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def test_the_precheck_judges_the_nodes_inside_if_branches(tmp_path: Path, capsys) -> None:
    """Before, only the top-level graph was checked: the If's Erf went unseen on Arm NN,
    whose parser has no ERF (and takes no control flow)."""
    path = _if_model(tmp_path / "if.onnx")
    assert main(["precheck", str(path), "--target", "armnn", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    by_op = {f["operator"]: f for f in report["findings"]}
    assert by_op["Erf"]["nodes"] == ["branch/then_branch/erf"]
    assert by_op["Erf"]["rule"] == "onnx.decompose"
    assert by_op["If"]["nodes"] == ["branch"]
    # onnx.fold_if keeps an If on a computed condition: no longer suggested for it (it was).
    # The source rule that computes both branches is, for a pytorch source; an ONNX file's
    # recipe cannot take it (an ast rule on an onnx source is refused at load)
    assert by_op["If"]["rule"] == "" and by_op["If"]["tried"] == ["onnx.fold_if"]
    from edgeflow.targets import load_profile
    from edgeflow.targets.precheck import check

    found = check(onnx.load(str(path)), load_profile("armnn"), source="pytorch")
    [branch] = [f for f in found if f.operator == "If"]
    assert branch.rule == "ast.tensor_if_to_where" and branch.tried == ["onnx.fold_if"]
    from edgeflow.targets.precheck import op_counts

    assert op_counts(onnx.load(str(path))) == {
        "ReduceSum": 1, "Greater": 1, "If": 1, "Erf": 1, "Neg": 1
    }  # fmt: skip


def test_the_memory_estimate_counts_branch_weights_and_activations(tmp_path: Path) -> None:
    """Before: weights 4 B (the top level's one scalar) and the branches' tensors unseen."""
    from edgeflow.targets.memory import estimate

    est = estimate(onnx.load(str(_if_model(tmp_path / "if.onnx"))))
    assert est.weights_bytes == 4
    assert est.activations_bytes == 48 + 16  # x, s, c, y planned; the larger branch's 16 B
    assert est.unknown == []


def test_unknown_sizes_make_the_arena_a_lower_bound_not_zero(wobbly: Path, capsys) -> None:
    """A dynamic batch: every activation's size is unknown. Before, the precheck said
    "arena 0 B" and judged the board's RAM with it."""
    assert main(["precheck", str(wobbly), "--target", "onnxruntime_micro", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    [memory] = [f for f in report["findings"] if f["operator"] == "(memory)"]
    assert memory["severity"] == "warning" and memory["rule"] == "onnx.fix_shapes"
    assert "the arena is not known" in memory["reason"] and "x" in memory["nodes"]
    from edgeflow.targets.memory import memory_line

    assert "arena at least" in memory_line(report["memory"])


def test_a_board_too_small_names_the_boards_the_model_fits(tmp_path: Path, capsys) -> None:
    model = tmp_path / "big.onnx"
    torch.onnx.export(
        torch.nn.Conv2d(3, 16, 3, padding=1), (torch.rand(1, 3, 64, 64),), str(model),
        dynamo=False, input_names=["x"],
    )  # fmt: skip
    code = main(["precheck", str(model), "--target", "tflite_micro", "--json"])
    report = json.loads(capsys.readouterr().out)
    [ram] = [f for f in report["findings"] if f["operator"] == "(ram)"]
    assert code == 1 and "; it fits " in ram["reason"]
    board = ram["reason"].split("precheck.board: ")[1].rstrip(")")
    assert board == "cortex_m7_512k"  # 311,296 B: x and y alive together; 256 KiB too few
    assert main(["precheck", str(model), "--target", "tflite_micro", "--board", board]) == 0
    capsys.readouterr()
    # a model no board of the target holds says so, naming the largest
    torch.onnx.export(
        torch.nn.Conv2d(3, 64, 3, padding=1), (torch.rand(1, 3, 128, 128),), str(model),
        dynamo=False, input_names=["x"],
    )  # fmt: skip
    assert main(["precheck", str(model), "--target", "tflite_micro", "--json"]) == 1
    [ram] = [f for f in json.loads(capsys.readouterr().out)["findings"] if f["operator"] == "(ram)"]
    assert "no board of tflite_micro has room (the largest, cortex_m7_1m" in ram["reason"]


def test_an_operator_no_probe_has_is_not_measured_rather_than_unsupported(
    tmp_path: Path, capsys
) -> None:
    from onnx import TensorProto, helper

    from edgeflow.targets.precheck import probed_ops

    assert "Shape" not in probed_ops() and "Erf" in probed_ops()
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Erf", ["x"], ["y"], name="erf"),
    ]
    outputs = [
        helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4]),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], outputs), opset_imports=[helper.make_opsetid("", 17)]
    )
    onnx.save(model, str(tmp_path / "m.onnx"))
    assert main(["precheck", str(tmp_path / "m.onnx"), "--target", "armnn", "--json"]) == 1
    by_op = {f["operator"]: f for f in json.loads(capsys.readouterr().out)["findings"]}
    assert by_op["Shape"]["reason"].startswith("not measured for armnn: no probe graph has it")
    assert by_op["Erf"]["reason"] == "not supported by armnn"  # probed, and it failed


def test_a_rule_that_breaks_int8_builds_is_not_suggested_for_them() -> None:
    """onnx.sqrt_newton removes Sqrt for armnn, but its Heron DIV stops int8 runtimes
    (tests/targets/test_onnx2tf.py measures it): suggested for float builds only."""
    from onnx import TensorProto

    from edgeflow.rules.onnx.linear import SqrtNewton
    from edgeflow.targets import load_profile
    from edgeflow.targets.precheck import check, render_table, to_json
    from edgeflow.targets.probes import single

    assert "int8" in SqrtNewton.breaks
    sqrt = single("s", "Sqrt", [("x", TensorProto.FLOAT, [1, 6, 10, 10])], positive=True).model
    armnn = load_profile("armnn")
    [float_build] = check(sqrt, armnn, "none")
    assert float_build.rule == "onnx.sqrt_newton" and float_build.tried == []
    [int8_build] = check(sqrt, armnn, "int8")
    assert int8_build.operator == "Sqrt" and int8_build.rule == ""
    assert int8_build.tried == ["onnx.sqrt_newton (breaks int8 builds)"]
    assert "onnx.sqrt_newton (breaks int8 builds) tried" in render_table(to_json([int8_build]))


def test_conv_transpose_passes_the_tflite_family_precheck_measured() -> None:
    """Re-measured (derive tflite_family): onnx2tf writes TRANSPOSE_CONV once its weight's
    rank is known (targets/_onnx2tf.py sets kernel_shape); Arm NN's parser takes it without
    a bias only."""
    import numpy as np
    from onnx import TensorProto

    from edgeflow.targets import load_profile
    from edgeflow.targets.precheck import check
    from edgeflow.targets.probes import single

    x = [("x", TensorProto.FLOAT, [1, 6, 10, 10])]
    w = np.ones((6, 4, 2, 2), np.float32)
    plain = single("t", "ConvTranspose", x, {"w": w}, {"strides": [2, 2]}).model
    biased = single("t", "ConvTranspose", x, {"w": w, "b": np.ones(4)}, {"strides": [2, 2]}).model
    for target in ("tflite", "tflite_micro"):
        for mode in ("none", "int8"):
            assert check(plain, load_profile(target), mode) == []
            assert check(biased, load_profile(target), mode) == []
    assert check(plain, load_profile("armnn"), "none") == []
    [finding] = check(biased, load_profile("armnn"), "none")
    assert finding.reason == "no_bias: a bias input (B)"


def test_a_token_models_int_tensors_and_l2_norm_are_judged_as_measured() -> None:
    """Re-measured (derive tflite_family) with the int probes of the ops a token model applies
    to its ids and mask, the embedding lookup and a 2-D ReduceL2: the precheck says what
    onnx2tf and each runtime do, and the targets' default rewrites clear what they can."""
    from onnx import TensorProto as T

    from edgeflow.targets import load_profile
    from edgeflow.targets.precheck import check
    from edgeflow.targets.probes import const, single

    mask = [("m", T.INT64, [1, 32])]
    unsqueeze = single("u", "Unsqueeze", mask, {"a": const("a", [1], np.int64)}).model
    lookup = single("g", "Gather", [("table", T.FLOAT, [20, 8]), ("ids", T.INT64, [1, 5])])
    ids32 = single("g", "Gather", [("table", T.FLOAT, [20, 8]), ("ids", T.INT32, [1, 5])])
    axes = {"axes": const("axes", [1], np.int64)}
    norm2d = single("n", "ReduceL2", [("x", T.FLOAT, [1, 64])], axes, opset=18).model
    norm3d = single("n", "ReduceL2", [("x", T.FLOAT, [1, 8, 64])], axes, opset=18).model
    tflite, micro, armnn = (load_profile(t) for t in ("tflite", "tflite_micro", "armnn"))
    # int64 ids and masks reshape on LiteRT and TFLite Micro; Arm NN has no int64 tensors
    assert check(unsqueeze, tflite, "none") == check(unsqueeze, micro, "none") == []
    [no_int64] = check(unsqueeze, armnn, "none")
    assert no_int64.reason == "no kernel for int64 inputs (takes float, int32)"
    # TFLite Micro's GATHER takes int32 positions: narrowing the ids removes the finding
    assert check(lookup.model, tflite, "none") == check(ids32.model, micro, "none") == []
    [positions] = check(lookup.model, micro, "none")
    assert positions.reason.startswith("computed_int32_indices: int64 indices")
    assert (positions.rule, positions.options) == ("onnx.int64_to_int32", {"io": "int32"})
    assert {"rule": "onnx.int64_to_int32", "io": "int32"} in micro.rewrites
    # onnx2tf fails on a 2-D ReduceL2, which tflite's and tflite_micro's defaults decompose
    for profile in (tflite, micro):
        [l2] = check(norm2d, profile, "none")
        assert l2.reason == "rank_at_least_3: a 2-D input" and l2.rule == "onnx.decompose"
        assert check(norm3d, profile, "none") == []
        [decompose] = [e for e in profile.rewrites if e["rule"] == "onnx.decompose"]
        assert "ReduceL2" in decompose["ops"]
