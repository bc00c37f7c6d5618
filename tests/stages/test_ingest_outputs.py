"""source.outputs against internal tensor names, and graph outputs declared without a type
or shape: ONNX files and a PyTorch module made here, built for onnxruntime_micro."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeflow.core.errors import EdgeflowError
from edgeflow.core.onnxgraph import name_outputs
from edgeflow.engine.cache import Cache
from edgeflow.engine.runner import run_build
from edgeflow.recipe import load_recipe

RNG = np.random.default_rng(0)
W = RNG.standard_normal((8, 4)).astype(np.float32)


def _model(out: onnx.ValueInfoProto, with_if: bool = False) -> onnx.ModelProto:
    """x -> MatMul -> `embedding` -> Relu -> `out`; with_if: an If whose branches read
    `embedding` from the outer scope feeds a second output."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["embedding"]),
        helper.make_node("Relu", ["embedding"], [out.name]),
    ]
    outputs = [out]
    inits = [numpy_helper.from_array(W, "W")]
    if with_if:
        branch = helper.make_graph(
            [helper.make_node("Neg", ["embedding"], ["neg"])],
            "branch",
            [],
            [helper.make_tensor_value_info("neg", TensorProto.FLOAT, [1, 4])],
        )
        # the condition is computed from x: not a constant ingest would fold the If away on
        inits.append(numpy_helper.from_array(np.array(0.0, np.float32), "zero"))
        nodes += [
            helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
            helper.make_node("Greater", ["total", "zero"], ["flag"]),
            helper.make_node("If", ["flag"], ["side"], then_branch=branch, else_branch=branch),
        ]
        outputs.append(helper.make_tensor_value_info("side", TensorProto.FLOAT, [1, 4]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        outputs,
        inits,
        value_info=[helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _build(tmp_path: Path, write_recipe, model: onnx.ModelProto, outputs: str = ""):
    onnx.save(model, str(tmp_path / "m.onnx"))
    data = RNG.standard_normal((6, 8)).astype(np.float32)
    np.savez(tmp_path / "data.npz", x=data)
    recipe = write_recipe(
        f"""
        source:
          kind: onnx
          model: m.onnx
          inputs: [{{name: x, shape: [1, 8]}}]
          {outputs}
        evaluation: {{dataset: data.npz, metric: agreement}}
        quantization: {{mode: none}}
        target: onnxruntime_micro
        verify: {{max_abs_diff: 1.0e-6}}
        """
    )
    result = run_build(load_recipe(recipe), Cache(tmp_path / "cache"), tmp_path / "build", print)
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    expected = [session.run(None, {"x": row[None]}) for row in data]
    return result, expected


def _ingested(tmp_path: Path) -> onnx.ModelProto:
    (path,) = (tmp_path / "cache").glob("ingest/*/*/model.onnx")
    return onnx.load(str(path))


def _reference(tmp_path: Path) -> tuple[list[str], list[np.ndarray]]:
    (path,) = (tmp_path / "cache").glob("ingest/*/*/reference.npz")
    with np.load(path) as ref:
        return [str(n) for n in ref["names"]], [ref[f"arr_{i}"] for i in range(len(ref["names"]))]


@pytest.mark.slow
def test_output_named_as_an_internal_tensor(tmp_path: Path, write_recipe) -> None:
    model = _model(helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4]), with_if=True)
    result, expected = _build(tmp_path, write_recipe, model, "outputs: [embedding, side]")
    assert result.failed_checks == []
    assert result.metrics["agreement"]["max_abs_diff"] <= 1e-6
    ingested = _ingested(tmp_path)
    assert [o.name for o in ingested.graph.output] == ["embedding", "side"]
    producers = [o for n in ingested.graph.node for o in n.output]
    assert producers.count("embedding") == 1 and "embedding_1" in producers
    assert [v.name for v in ingested.graph.value_info] == ["embedding_1"]  # value_info follows
    branch = next(n for n in ingested.graph.node if n.op_type == "If").attribute[0].g
    assert list(branch.node[0].input) == ["embedding_1"]  # the subgraph's outer reference too
    names, arrays = _reference(tmp_path)
    assert names == ["embedding", "side"]
    for k in range(2):
        np.testing.assert_array_equal(arrays[k], np.concatenate([e[k] for e in expected]))
    out = ort.InferenceSession(ingested.SerializeToString(), providers=["CPUExecutionProvider"])
    x = RNG.standard_normal((1, 8)).astype(np.float32)
    np.testing.assert_array_equal(out.run(["embedding"], {"x": x})[0], np.maximum(x @ W, 0))
    info = json.loads(next((tmp_path / "cache").glob("ingest/*/*/source.json")).read_text())
    assert info["renamed"] == {"embedding": "embedding_1"}


@pytest.mark.slow
@pytest.mark.parametrize("declared", ["elem_type only", "no type"])
def test_output_declared_without_shape(tmp_path: Path, write_recipe, declared: str) -> None:
    if declared == "no type":
        out = onnx.ValueInfoProto(name="out")
    else:
        out = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
    model = _model(out)
    assert not model.graph.output[0].type.tensor_type.HasField("shape")
    result, expected = _build(tmp_path, write_recipe, model)
    assert result.failed_checks == []
    typed = _ingested(tmp_path).graph.output[0].type.tensor_type
    assert typed.elem_type == TensorProto.FLOAT and [d.dim_value for d in typed.shape.dim] == [1, 4]
    _, arrays = _reference(tmp_path)
    np.testing.assert_array_equal(arrays[0], np.concatenate([e[0] for e in expected]))


def test_uninferable_output_is_a_named_error() -> None:
    from edgeflow.core.onnxoutputs import type_outputs

    node = helper.make_node("Mystery", ["x"], ["out"], domain="custom.domain")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom.domain", 1)]
    )
    with pytest.raises(EdgeflowError, match=r"m\.onnx: graph output\(s\) 'out' declare no shape"):
        type_outputs(model, "m.onnx")
    model.graph.output[0].ClearField("type")
    with pytest.raises(EdgeflowError, match="declare no type"):
        type_outputs(model, "m.onnx")


def test_name_outputs_swaps_and_shared_tensors() -> None:
    """Outputs renamed to each other's names, and an output that is an input too."""
    graph = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Abs", ["x"], ["b"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("a", "b", "x")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    renamed = name_outputs(model, ["b", "a", "same"])
    assert renamed == {"a": "a_1", "b": "b_1"}
    onnx.checker.check_model(model, full_check=True)
    x = np.array([-1.5, 2.0], dtype=np.float32)
    got = ort.InferenceSession(model.SerializeToString()).run(["b", "a", "same"], {"x": x})
    np.testing.assert_array_equal(got[0], -x)
    np.testing.assert_array_equal(got[1], np.abs(x))
    np.testing.assert_array_equal(got[2], x)
    assert name_outputs(model, ["b", "a", "same"]) == {}  # idempotent


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_pytorch_output_named_embedding(tmp_path: Path, write_recipe, exporter: str) -> None:
    """The dynamo exporter names an nn.Embedding's output `embedding` itself."""
    (tmp_path / "emb.py").write_text(
        "import torch\n\n\nclass Tiny(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        self.emb = torch.nn.Embedding(10, 4)\n        self.fc = torch.nn.Linear(4, 3)\n\n"
        "    def forward(self, ids):\n        return self.fc(self.emb(ids)).mean(1)\n"
    )
    np.savez(tmp_path / "ids.npz", ids=RNG.integers(0, 10, (6, 5)).astype(np.int64))
    recipe = write_recipe(
        f"""
        source:
          kind: pytorch
          model: emb.py:Tiny
          inputs: [{{name: ids, shape: [1, 5], dtype: int64}}]
          outputs: [embedding]
        export: {{exporter: {exporter}}}
        evaluation: {{dataset: ids.npz, metric: agreement}}
        quantization: {{mode: none}}
        target: onnxruntime_micro
        verify: {{max_abs_diff: 1.0e-5}}
        """
    )
    result = run_build(load_recipe(recipe), Cache(tmp_path / "cache"), tmp_path / "build", print)
    assert result.failed_checks == []
    assert result.metrics["agreement"]["max_abs_diff"] <= 1e-5
    (path,) = (tmp_path / "cache").glob("export/*/*/model.onnx")
    exported = onnx.load(str(path))
    onnx.checker.check_model(exported, full_check=True)
    assert [o.name for o in exported.graph.output] == ["embedding"]
    info = json.loads(next((tmp_path / "cache").glob("export/*/*/export.json")).read_text())
    if exporter == "dynamo":
        assert info["renamed"] == {"embedding": "embedding_1"}


def test_an_output_named_as_an_input_is_refused_at_its_key(tmp_path: Path, write_recipe) -> None:
    from edgeflow.core.errors import RecipeError

    onnx.save(
        _model(helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4])),
        str(tmp_path / "m.onnx"),
    )
    np.savez(tmp_path / "data.npz", x=np.zeros((2, 8), np.float32))
    recipe = write_recipe(
        """
        source:
          kind: onnx
          model: m.onnx
          inputs: [{name: x, shape: [1, 8]}]
          outputs: [x]
        evaluation: {dataset: data.npz, metric: agreement}
        target: onnxruntime_micro
        """
    )
    with pytest.raises(
        RecipeError,
        match=r"recipe\.yaml:\d+:\d+: source\.outputs\[0\]: output 'x' has the name of an input",
    ):
        load_recipe(recipe)


def test_onnxruntime_failing_on_the_samples_is_the_models_error_not_edgeflows() -> None:
    """An error onnxruntime raises on the evaluation samples is reported as the model
    failing on the data, naming the file; an error in edgeflow's code around the runs (here
    joining the outputs of batches that returned different numbers of them) is not dressed
    as onnxruntime's: it stays a bug, with its own type and traceback."""
    from edgeflow.data import Samples
    from edgeflow.stages.ingest import _OnSamples
    from edgeflow.verify.runners import OnnxRunner, run_all

    reshape = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([3, 3], np.int64), "shape")],  # 8 values in 9
    )
    model = helper.make_model(reshape, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(EdgeflowError, match=r"^onnxruntime cannot run m\.onnx on the evaluation"):
        _OnSamples(OnnxRunner(session), "m.onnx").run({"x": np.ones((1, 8), np.float32)})

    class Shrinking:  # two outputs, then one
        calls = 0

        def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            self.calls += 1
            return [feeds["x"]] * (2 if self.calls == 1 else 1)

    samples = Samples({"x": np.ones((4, 8), np.float32)}, None)
    with pytest.raises(IndexError):
        run_all(_OnSamples(Shrinking(), "m.onnx"), samples, 2, True)
