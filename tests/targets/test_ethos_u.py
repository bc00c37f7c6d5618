"""The ethos_u target: the digits demo compiled by Arm's Vela for Ethos-U NPUs, verified on
TFLite Micro's reference kernels, with Vela's placement, memory and estimated time."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgeflow.cli import main
from edgeflow.core.errors import EdgeflowError
from edgeflow.recipe import load_recipe
from edgeflow.report.npu import BASIS
from tests import needs
from tests.conftest import DEMO_RECIPE
from tests.targets.conftest import needs_tflite

pytestmark = [pytest.mark.slow, needs_tflite, needs.mark("vela")]


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> Path:
    """The demo for the default Ethos-U55-128 and, by `target.accelerator`, an Ethos-U85-256."""
    root = tmp_path_factory.mktemp("ethos_u")
    common = ["recipe=digits_cnn", "target=ethos_u", f"cache_dir={shared_cache}"]
    common.append(f"build_dir={root}")
    assert main(["run", *common]) == 0
    assert main(["run", *common, "target.accelerator=ethos-u85-256"]) == 0
    return root / "digits_cnn"


def _metrics(folder: Path) -> dict:
    return json.loads((folder / "metrics.json").read_text())


def test_the_demo_compiles_for_the_npu_and_verifies_on_tflite_micro(builds: Path) -> None:
    folder = builds / "ethos_u-int8"
    metrics = _metrics(folder)
    assert metrics["verified"] is True and metrics["accuracy"]["drop"] <= 0.01
    deployed = (folder / "model_vela.tflite").read_bytes()
    assert deployed[4:8] == b"TFL3" and b"ethos-u" in deployed  # the NPU's custom operator
    assert b"ethos-u" not in (folder / "model.tflite").read_bytes()  # what TFLite Micro ran
    assert metrics["size_bytes"] == len(deployed)
    npu = metrics["npu"]
    assert npu["accelerator"] == "ethos-u55-128" and npu["compiler"] == "ethos-u-vela 5.2.0"
    # measured 2026-12-07: every operator on the NPU; 454,464 MACs (the CNN's own count)
    assert (npu["operators_npu"], npu["operators_cpu"]) == (7, 0)
    assert npu["macs"] == 454_464
    assert 1_000 < npu["sram_bytes"] < 64 * 1024 and npu["flash_bytes"] > 14_000
    assert npu["estimated"] == ["cycles", "latency_ms", "inferences_per_second"]
    assert npu["basis"] == BASIS
    assert npu["clock_from"] == "board sram_2mib_flash_32mib_500mhz"
    assert npu["latency_ms"] == pytest.approx(npu["cycles"] / 500e6 * 1000)
    checks = {c["metric"]: c for c in json.loads((folder / "checks.json").read_text())}
    assert checks["npu.sram_bytes"]["passed"] and checks["npu.sram_bytes"]["threshold"] == 2**21
    report = (folder / "report.md").read_text()
    assert BASIS in report and "## NPU: placement, memory, estimated time" in report
    assert "| 0 | Conv2D | Conv2D | NPU |" in report
    page = (folder / "report.html").read_text()
    assert 'id="plot-npu"' in page and 'id="plot-npu-memory"' in page
    rows = (folder / "vela_per_layer.csv").read_text().splitlines()
    assert rows[0].startswith("Original Operator,NNG Operator,Target")
    # the precheck's placement, before converting, and what Vela did, in the same table
    predicted = "NPU placement predicted for ethos-u55-128 (Vela on the probe graphs): 10 of 10"
    assert predicted in report
    assert (
        "| (NPU placement, Vela) | 0 | (passed) Vela placed 7 operators on the NPU and 0 on the "
        "CPU (builtins left: none); predicted on the CPU: none |"
    ) in report
    assert (
        "| (SRAM, Vela) | 1 | (passed) Vela allocates 3,072 B, which fits in board "
        "sram_2mib_flash_32mib_500mhz's 2,097,152 B"
    ) in report


def test_another_accelerator_builds_in_a_folder_of_its_own(builds: Path) -> None:
    u55, u85 = _metrics(builds / "ethos_u-int8"), _metrics(builds / "ethos_u.ethos-u85-256-int8")
    assert u85["target"] == "ethos_u.ethos-u85-256" and u85["verified"] is True
    npu = u85["npu"]
    assert npu["accelerator"] == "ethos-u85-256"
    assert (npu["system_config"], npu["memory_mode"]) == (
        "Ethos_U85_SYS_DRAM_Mid",
        "Dedicated_Sram_384KB",
    )
    # the U55 profile's boards are not the U85's: Vela's system clock times it
    assert npu["clock_from"] == "Vela's Ethos_U85_SYS_DRAM_Mid" and npu["clock_hz"] == 10**9
    assert npu["cycles"] < u55["npu"]["cycles"]
    # the same pre-Vela model: the numerics are TFLite Micro's, whatever the NPU
    assert u85["agreement"]["max_abs_diff"] == u55["agreement"]["max_abs_diff"]


def test_a_board_too_small_fails_the_build_with_its_numbers(
    tmp_path: Path, shared_cache: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "tiny_npu.yaml").write_text(
        textwrap.dedent(
            """\
            extends: ethos_u
            replaces: [boards]
            boards:
              sram_2kib:
                description: an NPU system with 2 KiB of SRAM
                ram_bytes: 2048
                clock_hz: 100000000
            default_board: sram_2kib
            """
        )
    )
    args = ["run", f"recipe={DEMO_RECIPE}", "target=tiny_npu", f"cache_dir={shared_cache}"]
    assert main(args) == 2  # the precheck's estimate (TFLite Micro's arena, 6,252 B) says so
    assert "board sram_2kib has 2,048 bytes of RAM" in capsys.readouterr().err
    assert main([*args, "precheck.continue_on_failure=true"]) == 1  # and Vela's SRAM too
    err = capsys.readouterr().err
    assert "does not fit in board sram_2kib's 2,048" in err
    folder = tmp_path / "build" / "digits_cnn" / "tiny_npu-int8"
    metrics = _metrics(folder)
    assert metrics["npu"]["clock_from"] == "board sram_2kib" and metrics["verified"] is False
    # the precheck's table in report.md: its estimate, then what Vela allocated, one verdict each
    report = (folder / "report.md").read_text()
    assert "| (ram) | 1 | needs a 6," in report
    assert (
        "| (SRAM, Vela) | 1 | Vela allocates 3,072 B, which does not fit in board sram_2kib's "
        "2,048 B; the precheck estimated activations of 3,072 B in a 6,"
    ) in report


@pytest.mark.parametrize(
    ("overrides", "message", "hint"),
    [
        (
            {"quantization.mode": "none"},
            "does not support mode 'none': the Ethos-U NPU has no float path",
            "quantization.mode=int8",
        ),
        (
            {"target": "tflite_micro", "accelerator": "ethos-u85-256"},
            "target 'tflite_micro' compiles for no NPU",
            "target=ethos_u",
        ),
        ({"accelerator": "ethos-u99"}, "accelerator: must be one of ethos-u55-32", "ethos-u"),
    ],
)
def test_what_an_npu_build_refuses(overrides: dict, message: str, hint: str) -> None:
    from edgeflow.core.errors import RecipeError

    with pytest.raises(RecipeError) as found:
        load_recipe(DEMO_RECIPE, {"target": "ethos_u", **overrides})
    text = str(found.value.render())
    assert message in text and hint in text


def test_a_system_configuration_of_another_generation_is_refused(tmp_path: Path) -> None:
    """Vela compiles an Ethos-U55 against an Ethos-U85 system without a word (measured with
    5.2.0); the profile does not let it."""
    from edgeflow.core.errors import RecipeError
    from edgeflow.targets import load_profile

    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "mixed.yaml").write_text(
        "extends: ethos_u\n"
        "npu: {accelerator: ethos-u55-128, system_config: Ethos_U85_SYS_DRAM_Mid}\n"
    )
    with pytest.raises(RecipeError, match="is not one of the ethos-u55-128's"):
        load_profile("mixed", tmp_path)


def test_what_vela_leaves_on_the_cpu_is_named_with_its_reason(tmp_path: Path, builds: Path) -> None:
    """A tiny int8 model with a GATHER (TensorFlow's converter): Vela keeps it on the CPU of an
    Ethos-U55 ("Unsupported opType", measured with 5.2.0) and says why; the record names it."""
    import tensorflow as tf

    from edgeflow.targets import load_profile
    from edgeflow.targets.ethos_u import _vela

    path = _int8_tflite(lambda x: tf.gather(x, [3, 1, 7, 0], axis=1), tmp_path / "model.tflite")
    npu = load_profile("ethos_u").npu
    assert npu is not None
    found = _vela.compile_for(path, npu, tmp_path)
    cpu = [layer for layer in found["layers"] if layer["target"] == "CPU"]
    assert found["operators_cpu"] == len(cpu) >= 1
    assert [layer["reason"] for layer in cpu if layer["op"].startswith("Gather")] == [
        "Unsupported opType"
    ]
    assert all(layer["reason"] != "(Vela printed no reason)" for layer in cpu)
    assert (tmp_path / "model_vela.tflite").is_file() and not (tmp_path / "vela").exists()

    # What Vela left on the CPU must be what TFLite Micro was seen to run: the verified model
    # has these builtins; a verified model without them, and TFLM's probes without GATHER in
    # int8 (measured), stop the build.
    from types import SimpleNamespace

    from edgeflow.schema.sections import Quantization
    from edgeflow.targets.ethos_u.backend import _left_to_the_cpu

    job = SimpleNamespace(
        out_dir=tmp_path, profile=load_profile("ethos_u"), quantization=Quantization(mode="int8")
    )
    left = _left_to_the_cpu(job, "model.tflite", "model_vela.tflite")  # type: ignore[arg-type]
    assert "GATHER" in left and "CUSTOM:ethos-u" not in left
    (tmp_path / "other.tflite").write_bytes((builds / "ethos_u-int8" / "model.tflite").read_bytes())
    with pytest.raises(EdgeflowError, match="Vela left GATHER on the CPU"):
        _left_to_the_cpu(job, "other.tflite", "model_vela.tflite")  # type: ignore[arg-type]


def _int8_tflite(function: Any, path: Path, shape: tuple[int, ...] = (1, 16, 8)) -> Path:
    """A full-integer int8 .tflite of a TensorFlow function by TensorFlow's converter."""
    import tensorflow as tf

    spec = tf.TensorSpec(shape, tf.float32)
    traced = tf.function(function, input_signature=[spec])
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [traced.get_concrete_function()], traced
    )
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    rng = np.random.default_rng(0)
    converter.representative_dataset = lambda: (
        [rng.normal(size=shape).astype(np.float32)] for _ in range(8)
    )
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.inference_input_type = converter.inference_output_type = tf.int8
    path.write_bytes(converter.convert())
    return path


def test_the_transposes_vela_runs_are_a_row_of_the_precheck_table(tmp_path: Path) -> None:
    """A TRANSPOSE before a fully connected layer: Vela runs it on the NPU; the report's
    precheck table counts it with its cycles and share of Vela's estimate."""
    import tensorflow as tf

    from edgeflow.report.npu import after_vela, figures
    from edgeflow.targets import load_profile
    from edgeflow.targets.ethos_u import _vela

    weights = tf.constant(np.linspace(-1, 1, 16 * 4).reshape(16, 4).astype(np.float32))
    model = _int8_tflite(
        lambda x: tf.matmul(tf.transpose(x, [0, 2, 1]), weights), tmp_path / "model.tflite"
    )
    npu = load_profile("ethos_u").npu
    assert npu is not None
    record = _vela.compile_for(model, npu, tmp_path)
    found, _ = figures(record, None)
    rows = {row["operator"]: row for row in after_vela(found, record, {}, [])}
    moved = [layer for layer in record["layers"] if layer["lowered"] == "Transpose"]
    assert moved and rows["(transposes, Vela)"]["count"] == len(moved)
    cycles = sum(layer["cycles"] for layer in moved)
    share = f"{cycles / found['cycles']:.1%}"
    assert (
        f"on the NPU: {cycles:,} cycles, {share} of the estimate"
        in rows["(transposes, Vela)"]["reason"]
    )
    assert 0 < cycles < found["cycles"]
    # no precheck memory and no board checks (a bare record): no board limit
    assert rows["(SRAM, Vela)"]["severity"] == "passed"
    assert "no board limit" in rows["(SRAM, Vela)"]["reason"]
    assert "no prediction" in rows["(NPU placement, Vela)"]["reason"]


def test_the_per_layer_diff_names_the_operator_vela_made_of_the_tensor(
    builds: Path, shared_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The diff reads the pre-Vela model's tensors in TFLite Micro (as for tflite_micro) and
    says where Vela put the first divergent one; 45 dB makes the first ReLU diverge (its SQNR
    measured 43 dB)."""
    args = ["diff", "digits_cnn", "target=ethos_u", f"cache_dir={shared_cache}"]
    assert main([*args, f"build_dir={builds.parent}", "diff.min_sqnr_db=45"]) == 0
    assert "Vela placed it on the NPU as Conv2D+Relu" in capsys.readouterr().out
    found = json.loads((builds / "ethos_u-int8" / "diff.json").read_text())["first_divergence"]
    assert found["npu_layer"] == {
        "op": "Conv2D",
        "lowered": ["Conv2D", "Relu"],
        "target": "NPU",
        "cycles": 1504,
    }


def test_the_precheck_takes_the_mode_the_npu_builds_and_its_hint_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`edgeflow precheck --target ethos_u` checks int8 by default; `--quantization none` is
    refused with the flag that works, which then passes."""
    from tests.conftest import demo_onnx

    model = str(demo_onnx(tmp_path))
    assert main(["precheck", model, "--target", "ethos_u", "--quantization", "none"]) == 2
    err = capsys.readouterr().err
    assert "target ethos_u does not build none: the Ethos-U NPU has no float path" in err
    hint = err.split("hint: ", 1)[1].strip()
    assert hint == "--quantization int8"
    assert main(["precheck", model, "--target", "ethos_u", *hint.split()]) == 0
    assert main(["precheck", model, "--target", "ethos_u"]) == 0
    assert "memory at int8" in capsys.readouterr().out
