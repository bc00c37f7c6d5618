"""onnx2tf conversion in this process on tiny models: offline, layouts, int8 I/O, TFLM errors."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from edgeflow.core.errors import EdgeflowError
from edgeflow.data import Samples
from edgeflow.schema.sections import Quantization, TensorSpec
from edgeflow.targets import _onnx2tf, _onnx2tf_copy, load_profile
from edgeflow.targets.base import ConvertJob
from edgeflow.targets.tflite import backend as tflite
from edgeflow.targets.tflite_micro import backend as tflite_micro
from tests.targets.conftest import needs_tflite, tiny_conv_onnx

pytestmark = [
    pytest.mark.slow,
    needs_tflite,
    # TensorFlow's int8 calibrator uses its own deprecated tf.lite.Interpreter
    pytest.mark.filterwarnings("ignore:.*tf.lite.Interpreter is deprecated:UserWarning"),
]


def job(
    onnx: Path,
    out: Path,
    target: str,
    inputs: list[TensorSpec] | None = None,
    **quantization: object,
) -> ConvertJob:
    """A convert job for x [1, 3, 4, 4] (or `inputs`; int8 calibrates on x only)."""
    out.mkdir()
    calibration = None
    if quantization.get("mode") == "int8":
        rng = np.random.default_rng(1)
        calibration = Samples({"x": rng.normal(size=(32, 3, 4, 4)).astype(np.float32)}, None)
    return ConvertJob(
        onnx=onnx,
        out_dir=out,
        profile=load_profile(target),
        quantization=Quantization(**quantization),  # type: ignore[arg-type]
        inputs=inputs or [TensorSpec(name="x", shape=[1, 3, 4, 4])],
        calibration=calibration,
    )


def reference(onnx: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    return ort.InferenceSession(str(onnx), providers=["CPUExecutionProvider"]).run(None, {"x": x})[
        0
    ]


def test_three_channel_float_converts_offline_in_nchw(tmp_path: Path, no_network: list) -> None:
    onnx = tiny_conv_onnx(tmp_path / "tiny.onnx")
    before = onnx.read_bytes()
    state = (sys.getrecursionlimit(), list(warnings.filters), dict(os.environ), Path.cwd())
    info = tflite.convert(job(onnx, tmp_path / "out", "tflite", mode="none"))
    assert no_network == []  # onnx2tf never tried to fetch its sample file
    assert onnx.read_bytes() == before  # onnx2tf worked on a copy
    # onnx2tf's process-wide changes (recursion limit 2**31-1, warnings off, env) are undone
    assert (sys.getrecursionlimit(), warnings.filters, dict(os.environ), Path.cwd()) == state
    assert info["io"]["inputs"] == [{"name": "x", "index": 0, "perm": [0, 2, 3, 1]}]
    # 1x4x4x4 fits both layouts: the probe found the NHWC -> NCHW transpose
    assert info["io"]["outputs"] == [{"name": "y", "index": 0, "perm": [0, 3, 1, 2]}]
    assert info["operators"] == ["CONV_2D"]
    x = np.random.default_rng(2).normal(size=(1, 3, 4, 4)).astype(np.float32)
    got = tflite.open_runner(tmp_path / "out", info).run({"x": x})
    np.testing.assert_allclose(got[0], reference(onnx, x), atol=1e-4)


def test_an_input_onnx2tf_keeps_as_declared_is_found_by_the_probe(tmp_path: Path) -> None:
    """A channel Split and a Squeeze/Unsqueeze of the channel axis make onnx2tf keep the
    input as declared (NCHW), and a 1x4x4x4 input fits that and channel-last alike: fed
    channel-last, as edgeflow assumed, the output was off by 0.995 of its range."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    sizes = numpy_helper.from_array(np.array([1, 3], np.int64), "sizes")
    nodes = [
        helper.make_node("Split", ["x", "sizes"], ["a", "b"], axis=1),
        helper.make_node("ReduceSum", ["b", "axes"], ["s"]),
        helper.make_node("Add", ["a", "s"], ["t"]),
        helper.make_node("Squeeze", ["t", "axes"], ["q"]),
        helper.make_node("Unsqueeze", ["q", "axes"], ["u"]),
        helper.make_node("Softmax", ["u"], ["y"], axis=3),
    ]
    graph = helper.make_graph(
        nodes,
        "kept",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4])],
        [axes, sizes],
    )
    path = tmp_path / "kept.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    inputs = [TensorSpec(name="x", shape=[1, 4, 4, 4])]
    info = tflite.convert(job(path, tmp_path / "out", "tflite", inputs, mode="none"))
    assert info["io"]["inputs"] == [{"name": "x", "index": 0, "perm": [0, 1, 2, 3]}]
    assert info["io"]["ambiguous_layout"] == "float32 probe against onnxruntime"
    x = np.random.default_rng(2).normal(size=(1, 4, 4, 4)).astype(np.float32)
    got = tflite.open_runner(tmp_path / "out", info).run({"x": x})
    np.testing.assert_allclose(got[0], reference(path, x), atol=1e-6)


def test_without_the_stand_in_file_onnx2tf_reaches_for_the_network(
    tmp_path: Path, no_network: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The negative control: the trap is real, and the guard above would have seen it."""
    monkeypatch.setattr(_onnx2tf, "_write_sample_file", lambda path: None)
    onnx = tiny_conv_onnx(tmp_path / "tiny.onnx")
    with pytest.raises(EdgeflowError, match="onnx2tf failed"):
        tflite.convert(job(onnx, tmp_path / "out", "tflite", mode="none"))
    assert no_network


def test_int8_per_tensor_quantizes_inputs_and_dequantizes_outputs(
    tmp_path: Path, no_network: list
) -> None:
    onnx = tiny_conv_onnx(tmp_path / "tiny.onnx")
    spec = job(onnx, tmp_path / "out", "tflite", mode="int8", per_channel=False)
    info = tflite.convert(spec)
    assert no_network == []
    assert info["int8"]["per_channel"] is False
    runner = tflite.open_runner(tmp_path / "out", info)
    assert [q.dtype for q in runner.inputs] == [np.int8]
    x = spec.calibration.inputs["x"][:4] if spec.calibration else None
    assert x is not None
    for sample in x:
        want = reference(onnx, sample[None])
        got = runner.run({"x": sample[None]})[0]
        assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()


def test_tflm_rejection_quotes_the_interpreter(tmp_path: Path) -> None:
    """onnx2tf turns HardSigmoid into RELU_0_TO_1, which LiteRT runs and TFLM lacks."""
    onnx = tiny_conv_onnx(tmp_path / "tiny.onnx", activation="HardSigmoid")
    with pytest.raises(EdgeflowError) as failure:
        tflite_micro.convert(job(onnx, tmp_path / "out", "tflite_micro", mode="none"))
    assert "TFLite Micro rejects the model" in failure.value.message
    assert "Didn't find op for builtin opcode 'RELU_0_TO_1'" in failure.value.message


def test_flex_ops_are_reported_by_litert(tmp_path: Path) -> None:
    """Erf has no TFLite builtin: onnx2tf emits the Select-TF op FlexErf, LiteRT refuses it."""
    onnx = tiny_conv_onnx(tmp_path / "tiny.onnx", activation="Erf")
    info = tflite.convert(job(onnx, tmp_path / "out", "tflite", mode="none"))
    assert info["operators"] == ["CONV_2D", "CUSTOM:FlexErf"]
    assert info["io"]["ambiguous_layout"].startswith("assumed channel-last")
    with pytest.raises(EdgeflowError, match=r"LiteRT cannot load model.tflite: Select TensorFlow"):
        tflite.open_runner(tmp_path / "out", info)


@pytest.mark.parametrize("mode", ["none", "int8"])
def test_paddle_names_build_and_verify_on_tflite(mode: str, tmp_path: Path) -> None:
    """Node, tensor and input names with '@', ':' and spaces (as Paddle2ONNX writes them):
    onnx2tf failed on them ("... is not a valid scope name"); the recipe declares the input
    by its own name '@x:0', and the build verifies against onnxruntime. Measured: float32
    max relative diff 2.0e-7; int8 0.018 (SQNR 36.4 dB), top-1 agreement 1.0 in both."""
    import json

    from edgeflow.cli import main
    from tests.targets.conftest import paddle_named_onnx

    paddle_named_onnx(tmp_path / "m.onnx")
    data = np.random.default_rng(1).standard_normal((16, 3, 4, 4)).astype(np.float32)
    np.savez(tmp_path / "data.npz", **{"@x:0": data})
    verify = "max_relative_diff: 1.0e-5" if mode == "none" else "max_relative_diff: 0.05"
    (tmp_path / "r.yaml").write_text(
        "source: {kind: onnx, model: m.onnx, inputs: [{name: '@x:0', shape: [1, 3, 4, 4]}]}\n"
        "calibration: {dataset: data.npz}\n"
        "evaluation: {dataset: data.npz, metric: agreement}\n"
        f"quantization: {{mode: {mode}}}\n"
        "target: tflite\n"
        f"verify: {{latency_runs: 2, warmup_runs: 0, {verify}}}\n"
    )
    args = [f"cache_dir={tmp_path / 'c'}", f"build_dir={tmp_path / 'b'}"]
    assert main(["run", f"recipe={tmp_path / 'r.yaml'}", *args]) == 0
    metrics = json.loads((tmp_path / "b" / "r" / f"tflite-{mode}" / "metrics.json").read_text())
    assert metrics["verified"] is True and metrics["agreement"]["top1"] == 1.0
    if mode == "none":
        assert metrics["agreement"]["max_relative_diff"] <= 1e-6


def test_without_renaming_onnx2tf_refuses_paddle_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The negative control: the names themselves make onnx2tf fail."""
    from tests.targets.conftest import paddle_named_onnx

    monkeypatch.setattr(_onnx2tf_copy, "_scope_safe_names", lambda model: 0)
    onnx = paddle_named_onnx(tmp_path / "m.onnx")
    inputs = [TensorSpec(name="@x:0", shape=[1, 3, 4, 4])]
    with pytest.raises(EdgeflowError, match="is not a valid scope name"):
        tflite.convert(job(onnx, tmp_path / "out", "tflite", inputs, mode="none"))


def _positional_layernorm(path: Path) -> Path:
    """LayerNorm after a sinusoidal position encoding computed in the graph (TorchScript,
    constants not folded): onnx2tf 1.28.8 fails on it and writes its replacement JSON."""
    import math

    import torch

    class Positional(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            t, d = x.shape[1], x.shape[2]
            pos = torch.arange(t, dtype=torch.float32).unsqueeze(1)
            scale = -math.log(10000.0) / d
            div = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * scale)
            pe = torch.stack([torch.sin(pos * div), torch.cos(pos * div)], dim=-1)
            return torch.layer_norm(x + pe.reshape(t, d), (d,))

    torch.onnx.export(
        Positional(),
        (torch.randn(1, 16, 32),),
        str(path),
        dynamo=False,
        opset_version=17,
        do_constant_folding=False,
        input_names=["x"],
    )
    return path


def test_a_failure_with_a_replacement_json_is_retried_once_with_it(tmp_path: Path) -> None:
    """onnx2tf's own behaviour: it fails, writes <stem>_auto.json and says to rerun with
    -prf; edgeflow does, once. Here the JSON onnx2tf generates (a transpose of one Mul
    input) does not help, and the error says both attempts and shows the JSON. (In a build,
    onnx.fold_constants folds this position encoding first and the model converts.)"""
    onnx = _positional_layernorm(tmp_path / "pe.onnx")
    spec = job(onnx, tmp_path / "out", "tflite", mode="none")
    spec.inputs[:] = [TensorSpec(name="x", shape=[1, 16, 32])]
    with pytest.raises(EdgeflowError) as caught:
        tflite.convert(spec)
    text = str(caught.value)
    assert text.startswith("onnx2tf failed to convert the model (AttributeError: ")
    assert "wrote a parameter replacement JSON (operations on: /Mul_2)" in text
    assert "and failed again when retried with it (AttributeError: " in text
    assert '"format_version": 1' in text and '"pre_process_transpose_perm"' in text


def test_a_retry_that_converts_keeps_the_json_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first attempt that fails as onnx2tf does when it writes its JSON (its message, its
    file name), then the real onnx2tf with that file as -prf (param_replacement_file): the
    artifact, the kept JSON, the record for convert.json and the report."""
    import json

    import onnx as onnx_lib

    from edgeflow.report.markdown import retry_lines

    real, calls = _onnx2tf._run_onnx2tf, []
    replacement = {
        "format_version": 1,
        "operations": [
            {"op_name": "conv", "param_target": "attributes", "param_name": "dilations",
             "values": [1, 1]}
        ],
    }  # fmt: skip

    def first_fails(
        source: Path, out: Path, options: dict, target: str, files: object
    ) -> tuple[float, str]:
        calls.append(dict(options))
        if len(calls) > 1:
            return real(source, out, options, target, files)
        out.mkdir(parents=True)
        (out / "model_auto.json").write_text(json.dumps(replacement))
        log = (
            "\x1b[33mWARNING:\x1b[0m Conversion failed. An automatic replacement JSON has been "
            f"generated: {out / 'model_auto.json'}\nPlease try running the conversion again "
            f"with: -prf {out / 'model_auto.json'}\n"
        )
        raise _onnx2tf._Failed("onnx2tf failed (...)", "hint", "ValueError: made up", log, 0.5)

    monkeypatch.setattr(_onnx2tf, "_run_onnx2tf", first_fails)
    onnx = tiny_conv_onnx(tmp_path / "tiny.onnx")
    model = onnx_lib.load(str(onnx))
    model.graph.node[0].name = "conv"  # the node the JSON names
    onnx_lib.save(model, str(onnx))
    info = tflite.convert(job(onnx, tmp_path / "out", "tflite", mode="none"))
    assert "param_replacement_file" not in calls[0]
    assert calls[1]["param_replacement_file"].endswith(_onnx2tf.AUTO_JSON)
    assert info["retry"] == {
        "reason": "ValueError: made up",
        "param_replacement_file": "onnx2tf_auto.json",
        "operations": ["conv"],
        "converted": True,
    }
    assert info["files"] == ["model.tflite", "onnx2tf_auto.json"]
    assert json.loads((tmp_path / "out" / "onnx2tf_auto.json").read_text()) == replacement
    assert info["operators"] == ["CONV_2D"]
    [line] = retry_lines(info["retry"])
    assert "onnx2tf failed (ValueError: made up)" in line and "-prf onnx2tf_auto.json" in line


@pytest.mark.parametrize("shape", [[1, 3, 4, 4], [1, 6, 10, 10]])
def test_sqrt_newton_output_breaks_int8_builds(shape: list[int]) -> None:
    """Why onnx.sqrt_newton declares `breaks: int8` (the precheck then does not suggest it
    for int8 builds): the TFLite converter aborts the process quantizing its Heron chain, or,
    where it converts, LiteRT's int8 DIV stops on a divisor at its zero point. float32 runs.
    In worker processes (edgeflow.targets.trial), as a crash must be."""
    from onnx import TensorProto

    from edgeflow.rules.base import RewriteContext
    from edgeflow.rules.onnx.linear import SqrtNewton
    from edgeflow.targets.probes import single
    from edgeflow.targets.trial import Trial, run_trials

    case = single("s", "Sqrt", [("x", TensorProto.FLOAT, shape)], positive=True)
    specs = [TensorSpec(name="x", shape=shape)]
    rewritten = SqrtNewton().apply(case.model, SqrtNewton.Options(), RewriteContext(specs))
    trial = Trial("newton", rewritten.model.SerializeToString(), case.feeds)
    verdicts = run_trials([trial], ["tflite"], ["none", "int8"])["newton"]
    int8 = verdicts["tflite/int8"]
    assert not int8.runs
    assert int8.stage == "crash" or "zero_point" in int8.reason, int8
    if int8.stage != "crash":  # LiteRT's own run of the int8 file failed, float32 with it
        return
    assert verdicts["tflite/none"].runs, verdicts["tflite/none"]


@pytest.mark.parametrize(("t", "d", "heads"), [(17, 16, 4), (32, 16, 4), (8, 8, 8)])
def test_lowered_attention_converts_as_onnxruntime_computes_it(t: int, d: int, heads: int) -> None:
    """onnx.lower_matmul's Mul + ReduceMean for attention's scores, through onnx2tf, in
    LiteRT. With keepdims=0 its [P, M, N] mean came out with M and N swapped in every shape
    tried (the softmax of the scores off by 0.6 to 1.0: the survey's encoder body off by 0.05
    on Arm NN and LiteRT alike); the [P, M, 1, N] mean then a Reshape converts right."""
    from onnx import TensorProto, helper, numpy_helper

    from edgeflow.rules.base import RewriteContext
    from edgeflow.rules.onnx.linear import LowerMatMul
    from edgeflow.targets.trial import Trial, run_trials

    rng = np.random.default_rng(0)
    width = d * heads
    weights = [rng.normal(size=(width, width)).astype(np.float32) * 0.2 for _ in range(2)]
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q0"]),
        helper.make_node("MatMul", ["x", "wk"], ["k0"]),
        helper.make_node("Reshape", ["q0", "heads"], ["q1"]),
        helper.make_node("Reshape", ["k0", "heads"], ["k1"]),
        helper.make_node("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, t, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, heads, t, t])],
        [
            numpy_helper.from_array(weights[0], "wq"),
            numpy_helper.from_array(weights[1], "wk"),
            numpy_helper.from_array(np.array([1, t, heads, d], np.int64), "heads"),
        ],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    specs = [TensorSpec(name="x", shape=[1, t, width])]
    lowered = LowerMatMul().apply(m, LowerMatMul.Options(), RewriteContext(specs)).model
    assert "MatMul" not in {n.op_type for n in lowered.graph.node if n.output[0] == "scores"}
    feeds = {"x": rng.normal(size=(1, t, width)).astype(np.float32)}
    verdict = run_trials(
        [Trial("lowered", lowered.SerializeToString(), feeds)], ["tflite"], ["none"]
    )
    got = verdict["lowered"]["tflite/none"]
    assert got.runs and got.error is not None and got.error < 1e-5, got  # measured <= 1.4e-6


def test_an_island_that_starts_at_a_graph_input_is_found_in_the_tflite_file(
    tmp_path: Path,
) -> None:
    """quantization.keep_float on the TFLite family: a softmax that reads the model's input
    and a GELU behind a weight (its Erf decomposed, as tflite's rewrites do), paired with
    onnx2tf's float32 .tflite by value. The input is 2-D, so onnx2tf moves nothing before the
    softmax: the input itself bounds that island (before, only operator outputs could pair
    with an entry, and the island was lost; checked)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from edgeflow.core import islands
    from edgeflow.data import Samples
    from edgeflow.rules.base import RewriteContext
    from edgeflow.rules.onnx.decompose import Decompose
    from edgeflow.targets import _onnx2tf, _tflite_islands
    from edgeflow.targets._tflite_layout import io_layout
    from edgeflow.targets.base import ConvertJob

    rng = np.random.default_rng(0)
    consts = {"w": rng.normal(size=(8, 8)).astype(np.float32), "root2": np.float32(2**0.5)}
    consts |= {"one": np.float32(1.0), "half": np.float32(0.5)}
    nodes = [
        helper.make_node("Softmax", ["x"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "w"], ["h"]),
        helper.make_node("Div", ["h", "root2"], ["scaled"]),
        helper.make_node("Erf", ["scaled"], ["erf"]),
        helper.make_node("Add", ["erf", "one"], ["plus1"]),
        helper.make_node("Mul", ["h", "plus1"], ["hx"]),
        helper.make_node("Mul", ["hx", "half"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    found = islands.find(model)  # before the target's rewrites, as rewrite_target finds them
    assert [i.kind for i in found] == ["softmax", "gelu"]
    specs = [TensorSpec(name="x", shape=[4, 8])]
    options = Decompose.Options(ops=["Erf"])  # LiteRT has no Erf: tflite's default rewrite
    path = tmp_path / "model.onnx"
    onnx.save(Decompose().apply(model, options, RewriteContext(specs)).model, path)
    samples = Samples({"x": rng.normal(size=(32, 8)).astype(np.float32)}, None)
    job = ConvertJob(
        onnx=path,
        out_dir=tmp_path,
        profile=None,  # type: ignore[arg-type]
        quantization=None,  # type: ignore[arg-type]
        inputs=specs,
        calibration=samples,
        keep_float=("softmax", "gelu"),
        float_islands=tuple(found),
    )
    out = tmp_path / "out"
    _onnx2tf._run_onnx2tf(path, out, {}, "tflite")
    float32 = out / "model_float32.tflite"
    layout = io_layout(path, float32, float32, "tflite")
    names, record = _tflite_islands.locate(job, out, layout)
    assert record["lost"] == [] and set(record["kept"]) == {"softmax", "gelu"}
    assert len(record["kept"]["softmax"][0]) >= 1 and len(names) >= 5
