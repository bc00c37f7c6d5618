"""postprocess.cut: the graph's tail runs on the host (ONNX Runtime), beside the artifact,
and the two are verified together against the source model."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from edgeflow import postprocess
from edgeflow.cli import main
from edgeflow.core.errors import EdgeflowError
from tests.targets.conftest import needs_tflite


def graph_model(bypass: bool = False) -> onnx.ModelProto:
    """x -> Conv -> feat -> Relu -> Mul(c) -> Add(c) -> TopK(k) -> (values, indices): the
    same constant c twice, as the TorchScript exporter writes one per use. bypass: the tail
    also adds x's mean (the cut at feat does not separate it)."""
    rng = np.random.default_rng(0)
    c = np.full((1, 4, 1, 1), 0.5, np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["feat"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["feat"], ["r"]),
        helper.make_node("Constant", [], ["c1"], value=numpy_helper.from_array(c)),
        helper.make_node("Constant", [], ["c2"], value=numpy_helper.from_array(c)),
        helper.make_node("Mul", ["r", "c1"], ["m"]),
        helper.make_node("Add", ["m", "c2"], ["a"]),
        helper.make_node("Reshape", ["a", "flat"], ["f"]),
        helper.make_node("TopK", ["f", "k"], ["values", "indices"]),
    ]
    if bypass:
        nodes[6:6] = [
            helper.make_node("ReduceMean", ["x"], ["xm"], keepdims=1),
            helper.make_node("Add", ["a", "xm"], ["a2"]),
        ]
        nodes[-1].input[0] = "f"
        nodes[-2].input[0] = "a2"
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 6, 6])],
        [
            helper.make_tensor_value_info("values", T.FLOAT, [1, 5]),
            helper.make_tensor_value_info("indices", T.INT64, [1, 5]),
        ],
        [
            numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
            numpy_helper.from_array(np.array([1, -1], np.int64), "flat"),
            numpy_helper.from_array(np.array([5], np.int64), "k"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


FEEDS = {"x": np.random.default_rng(1).standard_normal((1, 3, 6, 6)).astype(np.float32)}


def test_split_puts_the_tail_after_the_cut_and_composes_exactly() -> None:
    model = graph_model()
    head, tail = postprocess.split(model, ["feat"])
    assert [n.op_type for n in head.graph.node] == ["Conv"]
    assert [o.name for o in head.graph.output] == ["feat"]
    assert [i.name for i in tail.graph.input] == ["feat"]
    assert [o.name for o in tail.graph.output] == ["values", "indices"]
    assert [n.op_type for n in tail.graph.node] == ["Relu", "Mul", "Add", "Reshape", "TopK"]
    # the two equal Constant nodes became one initializer, read by both nodes
    shared = [t.name for t in tail.graph.initializer if list(t.dims) == [1, 4, 1, 1]]
    assert shared == ["c1"]
    assert {n.input[1] for n in tail.graph.node if n.op_type in ("Mul", "Add")} == {"c1"}
    postprocess.check_split(model, head, tail, FEEDS)
    whole = run(model, FEEDS)
    chained = run(tail, {"feat": run(head, FEEDS)[0]})
    for a, b in zip(whole, chained, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_cut_the_tail_goes_around_is_refused() -> None:
    with pytest.raises(EdgeflowError, match=r"also reads the model's input\(s\) \['x'\]") as err:
        postprocess.split(graph_model(bypass=True), ["feat"])
    assert "every path from the inputs to the outputs" in (err.value.hint or "")


def test_an_unknown_tensor_is_named_with_the_close_ones() -> None:
    message = r"postprocess\.cut: the model has no tensor 'fet'"
    with pytest.raises(EdgeflowError, match=message) as e:
        postprocess.split(graph_model(), ["fet"])
    assert "feat" in (e.value.hint or "")


def test_the_generated_function_computes_the_model_outputs(tmp_path: Path) -> None:
    model = graph_model()
    head, tail = postprocess.split(model, ["feat"])
    onnx.save(tail, str(tmp_path / "tail.onnx"))
    out = tmp_path / "artifact"
    out.mkdir()
    info = postprocess.write_host(tmp_path / "tail.onnx", out, "model.tflite")
    assert info["files"] == ["postprocess.onnx", "postprocess.py"]
    assert info["inputs"] == ["feat"] and info["nodes"] == 5
    code = (out / "postprocess.py").read_text()
    assert "values, indices = postprocess(*outputs)" in code
    fn = postprocess.load_host(out)
    got = fn(*run(head, FEEDS))
    for a, b in zip(run(model, FEEDS), got, strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match=r"expected 1 artifact outputs \['feat'\], got 2"):
        fn(got[0], got[0])
    nhwc = run(head, FEEDS)[0].transpose(0, 2, 3, 1)  # a channel-last runtime's layout
    message = r"feat: expected shape \[1, 4, 6, 6\], got \[1, 6, 6, 4\]"
    with pytest.raises(ValueError, match=message):
        fn(nhwc)


DETECTOR = '''
import torch
from torch import nn

from edgeflow.ops.static import nms_fixed


class Tiny(nn.Module):
    """A one-class detector: a conv body, box and score heads, decoding and a static NMS."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, 2, 1), nn.ReLU()
        )
        self.boxes = nn.Conv2d(8, 4, 1)
        self.scores = nn.Conv2d(8, 1, 1)
        ys, xs = torch.meshgrid(torch.arange(8.0), torch.arange(8.0), indexing="ij")
        self.register_buffer("centers", torch.stack([xs, ys], -1).reshape(64, 2) * 4 + 2)

    def forward(self, x):
        f = self.body(x)
        deltas = self.boxes(f).flatten(2).transpose(1, 2)  # [B, 64, 4]
        scores = torch.sigmoid(self.scores(f).flatten(1))  # [B, 64]
        per_image = [self.detect(deltas[b], scores[b]) for b in range(x.shape[0])]
        return tuple(torch.stack(parts) for parts in zip(*per_image))

    def detect(self, deltas, scores):
        center = self.centers + deltas[:, :2] * 4
        size = torch.exp(deltas[:, 2:].clamp(max=2.0)) * 6
        boxes = torch.cat([center - size / 2, center + size / 2], 1)
        keep, valid = nms_fixed(boxes, scores, 0.3, 10)
        safe = keep.clamp(min=0)
        out_boxes = torch.where(valid[:, None], boxes.index_select(0, safe), 0.0)
        out_scores = torch.where(valid, scores.index_select(0, safe), 0.0)
        return out_boxes, out_scores, valid.to(torch.int64), valid
'''
RECIPE = """
    source:
      kind: pytorch
      model: tiny.py:Tiny
      inputs: [{name: image, shape: [1, 3, 16, 16], dtype: float32}]
      outputs: [boxes, scores, labels, valid]
    export: {exporter: torchscript}
    postprocess:
      cut: [/boxes/Conv_output_0, /scores/Conv_output_0]
    evaluation:
      dataset: edgeflow.datasets:sample_image_crops
      split: test
      options: {size: [16, 16], count: 8, input_name: image}
      metric: detections
    target: tflite
    verify:
      detections: {max_detections: 10, box_atol: 1.0e-3, box_units: relative,
                   score_atol: 1.0e-3, min_match_rate: 1.0}
"""


@pytest.mark.slow
@needs_tflite
def test_tflite_build_ships_and_verifies_the_host_post_processing(
    tmp_path: Path, shared_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "tiny.py").write_text(DETECTOR)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(textwrap.dedent(RECIPE))
    args = ["run", f"recipe={recipe}", f"cache_dir={shared_cache}", f"build_dir={tmp_path}/b"]
    assert main(args) == 0, capsys.readouterr().err
    out = tmp_path / "b" / "recipe" / "tflite-none"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["verified"] is True
    agreement = metrics["agreement"]
    assert agreement["reference_detections"] == agreement["matched"] == 8 * 10
    assert agreement["max_box_diff_relative"] <= 1e-3
    for name in ("model.tflite", "postprocess.onnx", "postprocess.py"):
        assert (out / name).is_file(), name
    # the artifact ends at the heads: no NMS in it, only convolutions and what feeds them
    precheck = json.loads((out / "precheck.json").read_text())
    assert set(precheck["ops"]) <= {"Conv", "Relu", "Constant"}, precheck["ops"]
    report = (out / "report.md").read_text()
    assert "post-processing on the host, not in the artifact" in report
    assert "/boxes/Conv_output_0, /scores/Conv_output_0" in report
    assert metrics["host_postprocess_ms_p50"] > 0
