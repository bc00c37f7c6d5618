"""Non-finite numbers never hide in a figure: counted per output, failing the build; a source
model that is non-finite on the user's data is the user's error, said as such."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper

from edgeflow.cli import main
from edgeflow.schema.sections import Verify
from edgeflow.verify.compare import compare_outputs
from edgeflow.verify.judge import build_checks, thresholds


def test_nan_outputs_are_counted_per_output_and_left_out_of_the_differences() -> None:
    reference = [np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32)]
    artifact = [reference[0].copy(), reference[1] + 0.5]
    artifact[0][1, 2] = np.nan
    artifact[0][3, 0] = np.inf
    found = compare_outputs(reference, artifact)
    first, second = found["outputs"]
    assert first["non_finite_samples"] == 2 and first["max_abs_diff"] == 0.0
    assert second["non_finite_samples"] == 0 and second["max_abs_diff"] == 0.5
    assert found["non_finite_samples"] == 2 and found["max_abs_diff"] == 0.5
    artifact[1][:] = np.nan
    assert compare_outputs(reference, artifact)["max_abs_diff"] is None


def test_a_non_finite_artifact_fails_verification_saying_where() -> None:
    outputs = [
        {"index": 0, "non_finite_samples": 12, "max_rel_to_range": None},
        {"index": 1, "non_finite_samples": 0, "max_rel_to_range": 0.0},
    ]
    agreement = {"max_abs_diff": None, "top1": 0.5, "outputs": outputs}
    checks = build_checks(thresholds(Verify(max_abs_diff=1e-4), "none"), agreement, None, 1.0, 10)
    assert [c["passed"] for c in checks] == [False, False]
    assert checks[0]["message"] == (
        "the artifact outputs NaN or Inf where the source model does not: output 0 on 12 samples"
    )
    assert "verify.max_abs_diff: cannot be measured" in checks[1]["message"]


def test_a_source_that_is_non_finite_on_the_users_data_is_a_user_error(
    tmp_path: Path, capsys
) -> None:
    graph = helper.make_graph(
        [helper.make_node("Log", ["x"], ["y"])],
        "log",
        [helper.make_tensor_value_info("x", T.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", T.FLOAT, [1, 4])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]),
              str(tmp_path / "log.onnx"))  # fmt: skip
    data = np.abs(np.random.default_rng(0).standard_normal((10, 4))).astype(np.float32)
    data[[3, 7], 1] = -1.0  # Log of a negative number: NaN
    np.savez(tmp_path / "data.npz", x=data)
    (tmp_path / "r.yaml").write_text(
        "source: {kind: onnx, model: log.onnx, inputs: [{name: x, shape: [1, 4]}]}\n"
        "evaluation: {dataset: data.npz, metric: agreement}\n"
        "target: onnxruntime_micro\n"
    )
    args = [f"cache_dir={tmp_path / 'c'}", f"build_dir={tmp_path / 'b'}"]
    assert main(["run", f"recipe={tmp_path / 'r.yaml'}", *args]) == 2
    err = capsys.readouterr().err
    assert "the source model log.onnx outputs NaN or Inf on 2 of 10 evaluation samples" in err
    assert "(output 0 'y'; first at sample 3)" in err
