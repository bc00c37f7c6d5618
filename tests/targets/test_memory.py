"""The memory estimate: the greedy arena plan, weights at each quantization, board budgets,
and the prediction against the arena the real TFLite Micro interpreter needs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from edgeflow.cli import main
from edgeflow.core.errors import EdgeflowError
from edgeflow.engine.cache import Cache
from edgeflow.engine.runner import run_build
from edgeflow.recipe import load_recipe
from edgeflow.targets import load_profile
from edgeflow.targets.memory import estimate, greedy_plan, layers
from edgeflow.targets.precheck import check_memory
from edgeflow.targets.profile import TargetProfile
from tests.targets.conftest import needs_tflite


def test_greedy_plan_reuses_memory_of_buffers_that_are_dead() -> None:
    sizes = {"a": 100, "b": 50, "c": 100}  # aligned to 112, 64, 112
    first = {"a": 0, "b": 1, "c": 2}
    last = {"a": 1, "b": 2, "c": 3}
    # a and c never live together: both at offset 0; b overlaps both: above them.
    assert greedy_plan(sizes, first, last) == 112 + 64
    assert greedy_plan(sizes, first, {"a": 3, "b": 3, "c": 3}) == 112 + 112 + 64
    assert greedy_plan({}, {}, {}) == 0


def conv_relu_reshape(path: Path | None = None) -> onnx.ModelProto:
    """x[1,1,8,8] -> Conv(1->4, 3x3, pad 1) -> Relu -> Reshape -> y[1,256]."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(size=(4, 1, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.normal(size=(4,)).astype(np.float32), "b"),
        numpy_helper.from_array(np.array([1, 256], np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "shape"], ["y"], name="reshape"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if path is not None:
        onnx.save(model, str(path))
    return model


def test_estimate_by_hand() -> None:
    model = conv_relu_reshape()
    # float32: the conv output (the Relu fused into it) 1,024 B at 0, alive from the conv to
    # the reshape; y 1,024 B above it (both alive at the reshape); x 256 B above the conv
    # output too, where y will be (x is dead by then): 2,048 B.
    fp32 = estimate(model, "none")
    assert (fp32.activations_bytes, fp32.overhead_bytes) == (2048, 0)
    assert fp32.weights_bytes == 36 * 4 + 4 * 4 + 2 * 8
    assert fp32.peak_node == "reshape"  # conv output + y: 2,048 B; at the conv 1,280 B
    int8 = estimate(model, "int8")
    assert int8.activations_bytes == 256 + 256
    assert int8.weights_bytes == 36 + 4 * 4 + 2 * 8  # int32 bias, int64 shape as is
    assert estimate(model, "fp16").weights_bytes == 36 * 2 + 4 * 2 + 2 * 8
    weight_only = estimate(model, "int8_weights")  # int8 conv weight; float bias, activations
    assert weight_only.weights_bytes == 36 + 4 * 4 + 2 * 8
    assert weight_only.activations_bytes == fp32.activations_bytes
    micro = estimate(model, "int8", arena=True)
    assert micro.overhead_bytes > 0
    assert micro.arena_bytes == micro.activations_bytes + micro.overhead_bytes


def test_layers_by_hand() -> None:
    """The per-layer table (layers.csv, a DVC plot) adds up to the estimate."""
    model = conv_relu_reshape()
    rows = layers(model, "none")
    assert [(r["node"], r["op"]) for r in rows] == [
        ("conv", "Conv"),
        ("relu", "Relu"),
        ("reshape", "Reshape"),
    ]
    # alive: x + conv output at the conv; the fused conv/relu buffer at the relu; + y after
    assert [r["alive_bytes"] for r in rows] == [256 + 1024, 1024, 2048]
    assert [r["output_bytes"] for r in rows] == [1024, 1024, 1024]
    assert max(rows, key=lambda r: r["alive_bytes"])["node"] == estimate(model).peak_node
    assert sum(r["weight_bytes"] for r in rows) == estimate(model).weights_bytes
    int8 = layers(model, "int8")
    assert int8[0]["weight_bytes"] == 36 + 4 * 4  # int8 weights, int32 bias
    assert sum(r["weight_bytes"] for r in int8) == estimate(model, "int8").weights_bytes
    weight_only = layers(model, "int8_weights")
    assert weight_only[0]["weight_bytes"] == 36 + 4 * 4  # int8 weights, float32 bias
    assert [r["alive_bytes"] for r in weight_only] == [r["alive_bytes"] for r in rows]


def test_board_budgets_are_findings_with_the_mode_that_shrinks_them() -> None:
    boards = {
        "tiny": {"ram_bytes": 1000, "flash_bytes": 100},
        "roomy": {"ram_bytes": 1 << 20, "flash_bytes": 1 << 20},
    }
    base = load_profile("tflite_micro").model_dump()
    profile = TargetProfile.model_validate(base | {"boards": boards, "default_board": "tiny"})
    memory, findings = check_memory(conv_relu_reshape(), profile, "none")
    assert memory["board"] == "tiny" and memory["ram_bytes"] == 1000
    by_op = {f.operator: f for f in findings}
    assert set(by_op) == {"(ram)", "(flash)"}
    assert "board tiny has 1,000 bytes of RAM" in by_op["(ram)"].reason
    assert by_op["(flash)"].rule == "quantization.mode: int8"
    _, int8 = check_memory(conv_relu_reshape(), profile, "int8")
    assert all(f.rule == "" for f in int8)
    assert check_memory(conv_relu_reshape(), profile, "none", "roomy")[1] == []
    with pytest.raises(EdgeflowError, match="has no board 'tny'") as info:
        check_memory(conv_relu_reshape(), profile, "none", "tny")
    assert "did you mean 'tiny'" in (info.value.hint or "")


def test_precheck_command_prints_the_estimate_and_checks_the_board(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "m.onnx"
    conv_relu_reshape(path)
    args = ["precheck", str(path), "--target", "tflite_micro"]
    assert main([*args, "--quantization", "int8", "--json"]) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    assert memory["board"] == "cortex_m4_256k" and memory["activations_bytes"] == 512
    assert main([*args, "--board", "cortex_m7_512k"]) == 0
    assert "board cortex_m7_512k: RAM 524,288 B" in capsys.readouterr().out
    assert main([*args, "--board", "cortex_m9"]) == 2
    assert "has no board 'cortex_m9'" in capsys.readouterr().err


def test_an_unknown_board_in_a_recipe_is_located(write_recipe) -> None:  # type: ignore[no-untyped-def]
    recipe = write_recipe(
        """
        source: {kind: onnx, model: m.onnx, inputs: [{name: x, shape: [1, 1, 8, 8]}]}
        evaluation: {dataset: data.npz}
        target: tflite_micro
        precheck:
          board: cortex_m4
        """
    )
    conv_relu_reshape(recipe.parent / "m.onnx")
    np.savez(recipe.parent / "data.npz", x=np.zeros((1, 1, 8, 8), np.float32))
    with pytest.raises(EdgeflowError, match=r"recipe\.yaml:5:\d+: precheck\.board") as info:
        load_recipe(recipe)
    assert "did you mean 'cortex_m4_256k'" in info.value.render()


class TinyMobile(torch.nn.Module):
    """Activation-heavy like the real thing: stem, depthwise-separable blocks, a residual."""

    def __init__(self) -> None:
        super().__init__()

        def block(cin: int, cout: int, stride: int) -> torch.nn.Sequential:
            return torch.nn.Sequential(
                torch.nn.Conv2d(cin, cin, 3, stride, 1, groups=cin),
                torch.nn.ReLU(),
                torch.nn.Conv2d(cin, cout, 1),
                torch.nn.ReLU(),
            )

        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, 2, 1), torch.nn.ReLU())
        self.b1 = block(16, 16, 1)
        self.b2 = block(16, 32, 2)
        self.b3 = block(32, 32, 1)
        self.head = torch.nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = x + self.b1(x)
        x = self.b2(x)
        x = x + self.b3(x)
        return self.head(x.mean((2, 3)))


@pytest.mark.slow
@needs_tflite
@pytest.mark.usefixtures("offline_env")
@pytest.mark.parametrize("mode", ["int8", "none"])
def test_prediction_is_within_25_percent_of_the_real_tflm_arena(
    mode: str,
    tmp_path: Path,
    shared_cache: Path,
    write_recipe,  # type: ignore[no-untyped-def]
) -> None:
    rng = np.random.default_rng(0)
    images = rng.random((16, 3, 64, 64), dtype=np.float32)
    np.savez(tmp_path / "data.npz", x=images, label=np.zeros(16, np.int64))
    recipe = write_recipe(
        f"""
        source:
          kind: pytorch
          model: tests.targets.test_memory:TinyMobile
          inputs: [{{name: x, shape: [1, 3, 64, 64]}}]
        calibration: {{dataset: data.npz}}
        evaluation: {{dataset: data.npz}}
        quantization: {{mode: {mode}}}
        target: tflite_micro
        verify: {{max_accuracy_drop: null, latency_runs: 2, warmup_runs: 0}}
        """
    )
    result = run_build(load_recipe(recipe), Cache(shared_cache), tmp_path / "build", print)
    metrics = result.metrics
    measured, predicted = metrics["arena_bytes"], metrics["arena_predicted_bytes"]
    assert measured > 20_000  # activations dominate: 16x32x32 int8 = 16 KiB per map
    print(f"{mode}: arena predicted {predicted:,} B, measured {measured:,} B")
    assert abs(predicted - measured) / measured <= 0.25, (predicted, measured)


def test_profiles_name_only_boards_they_define_and_limit_rank() -> None:
    from pydantic import ValidationError

    from edgeflow.targets.precheck import check

    base = load_profile("tflite_micro").model_dump()
    with pytest.raises(ValidationError, match="default_board 'nrf' is not in boards"):
        TargetProfile.model_validate(base | {"default_board": "nrf"})
    ranked = TargetProfile.model_validate(base | {"max_rank": 3})
    findings = {f.operator: f for f in check(conv_relu_reshape(), ranked)}
    assert findings["(rank)"].nodes == ["c", "r", "w", "x"]  # 4-D; y is [1, 256]
    assert "rank above 3" in findings["(rank)"].reason
