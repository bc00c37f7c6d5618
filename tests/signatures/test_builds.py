"""Input signatures end to end: constants bound at export and at ingest, a fed 0-D input,
an ONNX model's -1 batch pinned, a state with its batch on axis 1; real exporter, real
onnxruntime, numbers compared with the source."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from edgeflow.engine.cache import Cache
from edgeflow.engine.runner import BuildResult, run_build
from edgeflow.recipe import load_recipe
from tests.signatures.models import MODELS, reshape_model

pytestmark = pytest.mark.slow
SAMPLES = 16


def build(path: Path, tmp_path: Path) -> tuple[BuildResult, Cache]:
    cache = Cache(tmp_path / "cache")
    return run_build(load_recipe(path), cache, tmp_path / "build", print), cache


def entry(result: BuildResult, cache: Cache, stage: str) -> Path:
    [outcome] = [o for o in result.outcomes if o.stage == stage]
    return cache.entry(stage, outcome.key)


def graph_of(result: BuildResult, cache: Cache, stage: str) -> onnx.GraphProto:
    return onnx.load(str(entry(result, cache, stage) / "model.onnx")).graph


def ops(graph: onnx.GraphProto) -> set[str]:
    return {n.op_type for n in graph.node}


def source_outputs(model: object, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def model_class(folder: Path, name: str) -> type:
    from edgeflow.core.refs import ImportRef

    return ImportRef.parse(f"sig_models.py:{name}", folder).load()


@pytest.fixture
def models(tmp_path: Path) -> Path:
    (tmp_path / "sig_models.py").write_text(MODELS)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((SAMPLES, 16)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    np.savez(tmp_path / "gain.npz", x=x, gain=np.float32(2.5))
    state = rng.standard_normal((2, SAMPLES, 16)).astype(np.float32)
    np.savez(tmp_path / "state.npz", x=x, state=state)
    return tmp_path


RATE = """
source:
  kind: pytorch
  model: sig_models.py:RateNet
  inputs:
    - {name: x, shape: [1, 16]}
    - {name: sample_rate, shape: [], dtype: int64, value: 16000}
evaluation: {dataset: x.npz, metric: agreement}
target: onnxruntime_micro
verify: {max_abs_diff: 1.0e-5}
"""


def test_pytorch_constant_is_traced_as_a_constant(models: Path, write_recipe) -> None:
    result, cache = build(write_recipe(RATE), models)
    assert result.failed_checks == []
    assert result.metrics["agreement"]["max_abs_diff"] <= 1e-5
    graph = graph_of(result, cache, "export")
    assert [i.name for i in graph.input] == ["x"]  # sample_rate bound, not fed
    assert "If" not in ops(graph) and "Equal" not in ops(graph)  # the branch is static


def test_onnx_constant_is_folded_into_the_graph(models: Path, write_recipe) -> None:
    import torch

    module = model_class(models, "RateNet")().eval()
    args = (torch.zeros(1, 16), torch.tensor(16000))
    path = models / "rate.onnx"
    torch.onnx.export(
        module, args, str(path), dynamo=True, external_data=False, input_names=["x", "sample_rate"]
    )
    source = onnx.load(str(path))
    assert "If" in ops(source.graph)
    recipe = write_recipe(
        RATE.replace("kind: pytorch", "kind: onnx").replace(
            "model: sig_models.py:RateNet", "model: rate.onnx"
        )
        + "rewrites: [onnx.fold_if]\n"
    )
    result, cache = build(recipe, models)
    assert result.failed_checks == []
    assert result.metrics["agreement"]["max_abs_diff"] <= 1e-5
    ingested = graph_of(result, cache, "ingest")
    assert [i.name for i in ingested.input] == ["x"]
    # the constant is an initializer, and the If it decides became its branch at ingest
    assert "If" not in ops(ingested)
    assert "If" not in ops(graph_of(result, cache, "rewrite_onnx"))  # onnx.fold_if: nothing left
    # the reference is the source model fed the constant, which takes the 16000 branch
    x = np.load(models / "x.npz")["x"]
    rate = np.array(16000, np.int64)
    want = np.concatenate(
        [
            source_outputs(source, {"x": x[i : i + 1], "sample_rate": rate})[0]
            for i in range(SAMPLES)
        ]
    )
    reference = np.load(entry(result, cache, "ingest") / "reference.npz")["arr_0"]
    assert np.abs(reference - want).max() <= 1e-6
    with torch.inference_mode():
        other = module(torch.from_numpy(x), torch.tensor(8000)).numpy()
    assert np.abs(reference - other).max() > 0.1  # the other branch is told apart


def test_fed_0d_input(models: Path, write_recipe) -> None:
    import torch

    np.save(models / "window.npy", np.hanning(16).astype(np.float32))
    fed = "{name: gain, shape: []}\n    - {name: window, shape: [16], value: window.npy}"
    recipe = write_recipe(
        RATE.replace("RateNet", "Gain")
        .replace("{name: sample_rate, shape: [], dtype: int64, value: 16000}", fed)
        .replace("x.npz", "gain.npz")
    )
    result, cache = build(recipe, models)
    assert result.failed_checks == []
    assert result.metrics["agreement"]["max_abs_diff"] <= 1e-5
    torch.manual_seed(0)  # as edgeflow builds a module without weights
    module = model_class(models, "Gain")().eval()
    x = np.load(models / "gain.npz")["x"]
    with torch.inference_mode():
        window = torch.from_numpy(np.hanning(16).astype(np.float32))
        want = module(torch.from_numpy(x), torch.tensor(2.5), window).numpy()  # the data's gain
    reference = np.load(entry(result, cache, "load") / "reference.npz")["arr_0"]
    assert np.abs(reference - want).max() <= 1e-6
    graph = graph_of(result, cache, "export")
    assert [i.name for i in graph.input] == ["x", "gain"]  # the window is bound
    assert len(graph.input[1].type.tensor_type.shape.dim) == 0


RESHAPE = """
source:
  kind: onnx
  model: reshape.onnx
  inputs: [{name: x, shape: [1, 3, 4]}]
rewrites: [onnx.fix_shapes]
evaluation: {dataset: x.npz, metric: agreement}
target: onnxruntime_micro
verify: {max_abs_diff: 0.0}
"""


def test_onnx_minus_one_batch_takes_the_recipes_shape(tmp_path: Path, write_recipe) -> None:
    model = reshape_model(-1)
    onnx.save(model, str(tmp_path / "reshape.onnx"))
    x = np.random.default_rng(0).standard_normal((SAMPLES, 3, 4)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    result, cache = build(write_recipe(RESHAPE), tmp_path)
    assert result.failed_checks == []
    assert result.metrics["agreement"]["max_abs_diff"] == 0.0
    [x_in] = graph_of(result, cache, "ingest").input
    assert [d.dim_value for d in x_in.type.tensor_type.shape.dim] == [1, 3, 4]
    fixed = graph_of(result, cache, "rewrite_onnx")
    assert "Shape" not in ops(fixed) and "Gather" not in ops(fixed)
    reference = source_outputs(model, {"x": x})[0]  # the -1 model runs any batch at once
    assert reference.shape == (SAMPLES, 12)
    assert np.array_equal(reference, np.maximum(x.reshape(SAMPLES, 12), 0))


STATE = """
source:
  kind: pytorch
  model: sig_models.py:Stateful
  inputs:
    - {name: x, shape: [1, 16]}
    - {name: state, shape: [2, 1, 16], batch_axis: 1}
  outputs: [y, new_state]
evaluation:
  dataset: state.npz
  metric: agreement
  outputs: {y: {kind: values}, new_state: {kind: values}}
target: onnxruntime_micro
verify: {max_abs_diff: 1.0e-5}
"""


def test_state_with_its_batch_on_axis_1(models: Path, write_recipe) -> None:
    import torch

    result, cache = build(write_recipe(STATE), models)
    assert result.failed_checks == []
    assert result.metrics["agreement"]["max_abs_diff"] <= 1e-5
    torch.manual_seed(0)  # as edgeflow builds a module without weights
    module = model_class(models, "Stateful")().eval()
    data = np.load(models / "state.npz")
    with torch.inference_mode():  # the whole set at once: batching on axis 1 is the same
        y, new_state = module(torch.from_numpy(data["x"]), torch.from_numpy(data["state"]))
    reference = np.load(entry(result, cache, "load") / "reference.npz")
    assert np.abs(reference["arr_0"] - y.numpy()).max() <= 1e-5
    # batch 1 at a time: the state outputs [2, 1, 16] are stacked on axis 0
    stacked = new_state.numpy().transpose(1, 0, 2).reshape(-1, 1, 16)
    assert np.abs(reference["arr_1"] - stacked).max() <= 1e-5


def test_state_under_a_dynamic_batch(models: Path, write_recipe) -> None:
    """Batches of 4, 4, 2: the state's batch axis (1) is the exported graph's dynamic one, and
    the state outputs are joined on it (batches of unequal size cannot stack on axis 0)."""
    import torch

    text = STATE.replace(
        "  outputs: [y, new_state]", "  outputs: [y, new_state]\n  dynamic_batch: {min: 1, max: 4}"
    ).replace("  dataset: state.npz", "  dataset: state.npz\n  samples: 10")
    result, cache = build(write_recipe(text), models)
    assert result.failed_checks == []
    assert result.metrics["agreement"]["max_abs_diff"] <= 1e-5
    state = next(i for i in graph_of(result, cache, "export").input if i.name == "state")
    dims = state.type.tensor_type.shape.dim
    assert [d.dim_value for d in dims] == [2, 0, 16] and dims[1].dim_param  # dynamic on axis 1
    torch.manual_seed(0)
    module = model_class(models, "Stateful")().eval()
    data = np.load(models / "state.npz")
    with torch.inference_mode():
        x, state = torch.from_numpy(data["x"][:10]), torch.from_numpy(data["state"][:, :10])
        y, new_state = module(x, state)
    reference = np.load(entry(result, cache, "load") / "reference.npz")
    assert np.abs(reference["arr_0"] - y.numpy()).max() <= 1e-5
    assert reference["arr_1"].shape == (2, 10, 16)  # batches joined on the state's axis
    assert np.abs(reference["arr_1"] - new_state.numpy()).max() <= 1e-5
