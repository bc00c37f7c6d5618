"""The static ops export to static-shape graphs: torch.export has no data-dependent op or
symbolic size, the ONNX graphs have no NonZero, Loop, If, Scan or NonMaxSuppression, and
onnxruntime computes what eager PyTorch does, ties included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from edgeflow.ops.static import batched_nms_fixed, masked_select_padded, nms_fixed, nonzero_fixed
from tests.ops.test_static import random_detections

FORBIDDEN_ONNX = {"NonZero", "Loop", "If", "Scan", "NonMaxSuppression", "SequenceConstruct"}
FORBIDDEN_ATEN = {
    "aten.nonzero.default",
    "aten.nonzero_static.default",
    "aten.masked_select.default",
    "aten._local_scalar_dense.default",
    "aten.item.default",
    "aten.unique_dim.default",
    "aten._unique2.default",
}
N, STEPS, SIZE = 24, 4, 10


def quiet_torchscript(test: Any) -> Any:
    """The TorchScript tracer warns about every shape check it turns into a constant (with
    static shapes that is the point) and announces its own deprecation."""
    test = pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")(test)
    return pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript")(test)


class AllOps(torch.nn.Module):
    """Every static op at once, so one export covers them all."""

    def forward(
        self, boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        keep, valid = nms_fixed(boxes, scores, 0.5, STEPS)
        offset, offset_valid = batched_nms_fixed(boxes, scores, labels, 0.55, STEPS)
        per_class, per_class_valid = batched_nms_fixed(
            boxes, scores, labels, 0.55, STEPS, strategy="per_class"
        )
        nz, nz_valid = nonzero_fixed(boxes > 5, SIZE)
        sel, sel_valid = masked_select_padded(scores, scores > 0.4, SIZE, fill=-1.0)
        nms_outputs = (keep, valid, offset, offset_valid, per_class, per_class_valid)
        return (*nms_outputs, nz, nz_valid, sel, sel_valid)


def inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return random_detections(seed, N, grid=True, tied_scores=True)


def all_onnx_ops(model: onnx.ModelProto) -> set[str]:
    """Op types in the graph, its subgraphs and its local functions."""
    ops: set[str] = set()

    def walk(nodes: Any) -> None:
        for node in nodes:
            ops.add(node.op_type)
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g.node)
                for g in attr.graphs:
                    walk(g.node)

    walk(model.graph.node)
    for function in model.functions:
        walk(function.node)
    return ops


def run_onnx(path: Path, args: tuple[torch.Tensor, ...]) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args, strict=True)}
    return [np.asarray(o) for o in session.run(None, feed)]


def assert_same_as_eager(path: Path) -> None:
    model = AllOps().eval()
    for seed in range(6):
        args = inputs(seed)
        got = run_onnx(path, args)
        want = model(*args)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g.shape == tuple(w.shape) and g.dtype == w.numpy().dtype
            np.testing.assert_array_equal(g, w.numpy())


@pytest.fixture(scope="module")
def exported() -> torch.export.ExportedProgram:
    return torch.export.export(AllOps().eval(), inputs(0))


@pytest.fixture(scope="module")
def dynamo_onnx(
    exported: torch.export.ExportedProgram, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    path = tmp_path_factory.mktemp("dynamo") / "ops.onnx"
    # The dynamo exporter takes the ExportedProgram as it is, without tracing again.
    torch.onnx.export(exported, (), str(path), dynamo=True, external_data=False, verbose=False)
    return path


def test_torch_export_graph_is_static(exported: torch.export.ExportedProgram) -> None:
    targets = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert not targets & FORBIDDEN_ATEN
    assert not any("higher_order" in t for t in targets)  # cond, while_loop, scan
    for node in exported.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            assert all(isinstance(d, int) for d in val.shape), (node.name, val.shape)
    out = exported.module()(*inputs(1))
    for got, want in zip(out, AllOps()(*inputs(1)), strict=True):
        assert torch.equal(got, want)


def test_dynamo_onnx_graph_has_no_dynamic_ops(dynamo_onnx: Path) -> None:
    model = onnx.load(str(dynamo_onnx))
    assert not all_onnx_ops(model) & FORBIDDEN_ONNX
    for output in model.graph.output:
        dims = output.type.tensor_type.shape.dim
        assert all(d.HasField("dim_value") for d in dims), output.name


def test_dynamo_onnx_runs_like_eager(dynamo_onnx: Path) -> None:
    assert_same_as_eager(dynamo_onnx)


@quiet_torchscript
def test_torchscript_onnx_runs_like_eager(tmp_path: Path) -> None:
    path = tmp_path / "ops.onnx"
    torch.onnx.export(AllOps().eval(), inputs(0), str(path), dynamo=False, opset_version=17)
    assert not all_onnx_ops(onnx.load(str(path))) & FORBIDDEN_ONNX
    assert_same_as_eager(path)


@quiet_torchscript
def test_unrolled_steps_share_their_constants(tmp_path: Path) -> None:
    # A constant arange used in every step was copied into the TorchScript-exported graph
    # once per step (65 MB for 300 steps over 27,000 boxes): the size must not grow with steps.
    boxes, scores, labels = random_detections(0, 200, grid=False, tied_scores=False)

    def size(steps: int) -> int:
        class Nms(torch.nn.Module):
            def forward(self, b: torch.Tensor, s: torch.Tensor, lab: torch.Tensor) -> torch.Tensor:
                return batched_nms_fixed(b, s, lab, 0.5, steps, strategy="per_class")[0]

        path = tmp_path / f"nms{steps}.onnx"
        torch.onnx.export(Nms(), (boxes, scores, labels), str(path), dynamo=False, opset_version=17)
        model = onnx.load(str(path))
        constants = [a.t for n in model.graph.node if n.op_type == "Constant" for a in n.attribute]
        return sum(len(t.raw_data) for t in [*model.graph.initializer, *constants])

    growth = size(8) - size(2)
    assert growth < 200 * 8, growth  # less than one int64 constant of size N in 6 more steps
