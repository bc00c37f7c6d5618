"""Trying graphs on the TFLite-family runtimes (edgeflow.targets.trial) and the crash-safe
TFLite Micro arena search. Real onnx2tf, LiteRT, TFLite Micro and Arm NN throughout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto as T

from edgeflow.targets.probes import const, single
from edgeflow.targets.trial import Trial, run_trials, try_graph
from tests import needs
from tests.targets.conftest import needs_tflite
from tests.targets.opzoo import cases

pytestmark = [needs_tflite, pytest.mark.slow]
X = [("x", T.FLOAT, [1, 4, 6, 6])]


def trial(name: str, op: str, **kwargs: object) -> Trial:
    case = single(name, op, X, **kwargs)  # type: ignore[arg-type]
    return Trial(name, case.model.SerializeToString(), case.feeds)


def test_a_graph_every_runtime_runs_is_verified_everywhere() -> None:
    targets = ["tflite", "tflite_micro"] + (["armnn"] if needs.installed("armnn") else [])
    found = try_graph(trial("Relu", "Relu"), targets, ["none", "int8"])
    assert sorted(found) == sorted(f"{t}/{m}" for t in targets for m in ("none", "int8"))
    for key, verdict in found.items():
        assert verdict.runs, (key, verdict)
        assert verdict.builtins == ["RELU"]
        assert verdict.error is not None
        assert verdict.error <= (1e-6 if key.endswith("none") else 0.1)


def test_the_runtime_s_own_error_is_the_verdict() -> None:
    found = try_graph(trial("Gelu", "Gelu", opset=20), ["tflite", "tflite_micro"], ["none"])
    assert found["tflite/none"].runs  # LiteRT has a GELU kernel
    micro = found["tflite_micro/none"]
    assert not micro.runs and micro.stage == "load"
    assert "GELU" in micro.reason and micro.builtins == ["GELU"]


def test_top_k_with_a_constant_k_converts_and_runs() -> None:
    """onnx2tf 1.28.8 calls int() on the 1-element K, which NumPy 2.4 refuses; edgeflow hands
    its TopK the 0-D K (targets/_onnx2tf.py)."""
    [case] = [c for c in cases() if c.name == "TopK"]  # the operator zoo's: [2, 16], K = 3
    graph = Trial("TopK", case.model.SerializeToString(), case.feeds)
    verdict = try_graph(graph, ["tflite"], ["none"])["tflite/none"]
    assert verdict.runs, verdict
    assert "TOPK_V2" in verdict.builtins and verdict.error == 0.0


def test_a_float64_graph_becomes_a_flex_op_no_runtime_loads() -> None:
    case = single("Neg float64", "Neg", [("x", T.DOUBLE, [1, 4, 6, 6])])
    graph = Trial("Neg", case.model.SerializeToString(), case.feeds)
    found = try_graph(graph, ["tflite"], ["none"])
    assert found["tflite/none"].builtins == ["CUSTOM:FlexNeg"]
    assert found["tflite/none"].stage == "load"


def test_graphs_run_in_one_worker_and_int8_only_for_float_inputs() -> None:
    int_case = single("Neg int32", "Neg", [("x", T.INT32, [2, 8])])
    trials = [
        trial("Sigmoid", "Sigmoid"),
        Trial("Neg int32", int_case.model.SerializeToString(), int_case.feeds),
    ]
    seen: list[str] = []
    found = run_trials(trials, ["tflite"], ["none", "int8"], lambda name, _: seen.append(name))
    assert seen == ["Sigmoid", "Neg int32"]
    assert set(found["Sigmoid"]) == {"tflite/none", "tflite/int8"}
    assert set(found["Neg int32"]) == {"tflite/none"}
    assert found["Sigmoid"]["tflite/none"].runs


def test_arena_search_survives_sizes_that_crash_tflite_micro(tmp_path: Path) -> None:
    """A MEAN model: TFLM segfaults at some arena sizes below the one it needs, and its
    recorded total is too small for the int8 model (MEAN's Prepare takes temporary memory)."""
    from edgeflow.targets.tflite_micro.backend import measure_arena
    from edgeflow.targets.trial import _convert

    case = single("GlobalAveragePool", "GlobalAveragePool", X)
    source = tmp_path / "model.onnx"
    source.write_bytes(case.model.SerializeToString())
    built = _convert(
        Trial(case.name, source.read_bytes(), case.feeds),
        ["x"],
        source,
        tmp_path,
        "int8",
        True,
        "tflite_micro",
    )
    crashed = _crashing_size((built["none"] / "model.tflite"), 2048)
    assert crashed is not None, "no arena size crashes TFLM now: search in-process again?"
    for mode in ("none", "int8"):
        model = (built[mode] / "model.tflite").read_bytes()
        smallest, recorded = measure_arena(model)  # must not take this process down
        assert 500 < smallest < 10_000, (mode, smallest)
        assert _allocates(model, smallest) and not _allocates(model, smallest - 1, safe=True)
        if mode == "int8":
            assert smallest > recorded, "the int8 MEAN model needs more than the recorded total"


def _allocates(model: bytes, arena: int, safe: bool = False) -> bool:
    """Whether TFLM allocates the model in `arena` bytes; `safe`: in a child process."""
    code = (
        "import sys\nfrom tflite_micro import runtime\n"
        "m = open(sys.argv[1], 'rb').read()\n"
        "try:\n    runtime.Interpreter.from_bytes(m, arena_size=int(sys.argv[2]))\n"
        "except RuntimeError:\n    sys.exit(3)\n"
    )
    path = Path(__file__).parent / ".arena-probe.tflite"
    if not safe:
        from tflite_micro import runtime

        try:
            runtime.Interpreter.from_bytes(model, arena_size=arena)
        except RuntimeError:
            return False
        return True
    path.write_bytes(model)
    try:
        run = subprocess.run([sys.executable, "-P", "-c", code, str(path), str(arena)], check=False)
    finally:
        path.unlink()
    return run.returncode == 0


def _crashing_size(path: Path, up_to: int) -> int | None:
    """An arena size below `up_to` at which TFLM kills the process, if there is one."""
    code = (
        "import sys\nfrom tflite_micro import runtime\n"
        "m = open(sys.argv[1], 'rb').read()\n"
        "for a in range(0, int(sys.argv[2]), 48):\n"
        "    print(a, flush=True)\n"
        "    try:\n        runtime.Interpreter.from_bytes(m, arena_size=a)\n"
        "    except RuntimeError:\n        pass\n"
    )
    run = subprocess.run(
        [sys.executable, "-P", "-c", code, str(path), str(up_to)],
        capture_output=True,
        text=True,
        check=False,
    )
    if run.returncode >= 0:
        return None
    return int(run.stdout.split()[-1])


def test_calibration_uses_the_feeds_and_shuffled_copies() -> None:
    from edgeflow.targets.trial import CALIBRATION_SAMPLES, _calibration

    case = trial("Relu", "Relu")
    samples = _calibration(case)
    data = samples.inputs["x"]
    assert data.shape == (CALIBRATION_SAMPLES, 4, 6, 6) and data.dtype == np.float32
    np.testing.assert_array_equal(data[:1], case.feeds["x"])
    assert not np.array_equal(data[1], data[0])
    np.testing.assert_array_equal(np.sort(data[1].ravel()), np.sort(data[0].ravel()))


def test_a_runtime_crash_is_pinned_to_its_step_and_the_rest_is_measured() -> None:
    """TFLite Micro aborts the process running an int8 ReduceLogSumExp (its EXP/LOG chain):
    that step alone is a crash; the other steps of the graph are measured by a new worker."""
    case = single(
        "ReduceLogSumExp",
        "ReduceLogSumExp",
        [("x", T.FLOAT, [1, 6, 10, 10])],
        {"axes": const("axes", [1], np.int64)},
        opset=18,
    )
    graph = Trial(case.name, case.model.SerializeToString(), case.feeds)
    found = run_trials([graph, trial("Relu", "Relu")], ["tflite", "tflite_micro"])
    crash = found["ReduceLogSumExp"]["tflite_micro/int8"]
    assert crash.stage == "crash" and "(tflite_micro/int8)" in crash.reason
    assert "exit code -6" in crash.reason  # SIGABRT
    for key in ("tflite/none", "tflite/int8", "tflite_micro/none"):
        assert found["ReduceLogSumExp"][key].runs, key
    assert all(v.runs for v in found["Relu"].values())  # the worker after the crash goes on


def test_every_crashing_step_of_a_graph_is_remembered_across_workers() -> None:
    """ReduceL2 as Arm NN's defaults write it (ReduceMean x n, then onnx.sqrt_newton): its
    int8 .tflite aborts LiteRT and TFLite Micro alike. Each new worker skips every step that
    killed an earlier one (not only the last), so two crashing steps end, and float32 runs."""
    from edgeflow.rules.base import RewriteContext
    from edgeflow.rules.onnx.decompose import Decompose
    from edgeflow.rules.onnx.linear import SqrtNewton

    case = single(
        "ReduceL2",
        "ReduceL2",
        [("x", T.FLOAT, [1, 6, 10, 10])],
        {"axes": const("axes", [2, 3], np.int64)},
        opset=18,
    )
    model, ctx = case.model, RewriteContext([])
    model = Decompose().apply(model, Decompose.Options(reduce="mean"), ctx).model
    model = SqrtNewton().apply(model, SqrtNewton.Options(), ctx).model
    found = run_trials(
        [Trial("l2", model.SerializeToString(), case.feeds)], ["tflite", "tflite_micro"]
    )
    verdicts = found["l2"]
    for key in ("tflite/int8", "tflite_micro/int8"):
        assert verdicts[key].stage == "crash" and "exit code -6" in verdicts[key].reason, key
    for key in ("tflite/none", "tflite_micro/none"):
        error = verdicts[key].error
        assert verdicts[key].runs and error is not None and error < 1e-6, key  # 1.7e-7 seen


@needs_tflite
@needs.mark("armnn")
def test_a_gru_is_converted_for_each_target_it_is_tried_on() -> None:
    """A GRU converts by target (armnn's FULLY_CONNECTEDs keep a bias, Arm NN 22 rejects one
    without; the others leave a zero bias out): converted once as for tflite, it failed to
    load in Arm NN ("inputs[i] must be non-negative")."""
    from edgeflow.targets.probes import probes

    [gru] = [c for c in probes() if c.name == "GRU"]
    found = run_trials([Trial(gru.name, gru.model.SerializeToString(), gru.feeds)], ["armnn"])
    for key, verdict in found["GRU"].items():
        assert verdict.runs, (key, verdict)
