"""`edgeflow dvc init` in a model repository: the generated pipeline, `dvc repro` after a
quantization edit, `dvc metrics diff`, and DVC experiments (-S, queued sweeps, exp show)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TypeVar

import pytest
import yaml

from edgeflow.cli import main
from edgeflow.core.errors import EdgeflowError
from edgeflow.engine import dvcfile
from tests import needs
from tests.conftest import REPO

T = TypeVar("T")

SHARED = ("load", "rewrite", "export", "rewrite_onnx")
PER_BUILD = (
    "rewrite_target",
    "optimize",
    "precheck",
    "quantize",
    "convert",
    "verify",
    "report",
    "html",
)
ENV = {
    **os.environ,
    # the stages' `edgeflow` command and dvc from this interpreter's environment
    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    "GIT_AUTHOR_NAME": "edgeflow tests",
    "GIT_AUTHOR_EMAIL": "tests@edgeflow.invalid",
    "GIT_COMMITTER_NAME": "edgeflow tests",
    "GIT_COMMITTER_EMAIL": "tests@edgeflow.invalid",
}


def needs_dvc(test: T) -> T:
    """DVC, which .ci/run installs; git, which it does not (every checkout has it): a skip."""
    git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git (not installed by CI)")
    return git(needs.mark("dvc")(test))


def model_repo(root: Path, git: bool = False) -> Path:
    """A model repository as a user has it: recipes/, the weights, maybe a training stage."""
    (root / "recipes").mkdir(parents=True)
    (root / "models").mkdir()
    shutil.copy(REPO / "recipes" / "digits_cnn.yaml", root / "recipes")
    shutil.copy(REPO / "models" / "digits_cnn.pt", root / "models")
    if git:
        sh(root, "git", "init", "-q")
        sh(root, "dvc", "init", "-q")
    return root


def sh(cwd: Path, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")
    return done


def init(root: Path, *args: str) -> int:
    cwd = Path.cwd()
    os.chdir(root)
    try:
        return main(["dvc", "init", *args])
    finally:
        os.chdir(cwd)


def test_init_writes_shared_and_per_build_stages(tmp_path: Path) -> None:
    root = model_repo(tmp_path / "repo")
    assert init(root, "--target", "onnxruntime_micro,tflite", "--quantization", "int8,none") == 0
    pipeline = yaml.safe_load((root / "dvc.yaml").read_text())
    stages = pipeline["stages"]
    builds = [f"{t}-{q}" for t in ("onnxruntime_micro", "tflite") for q in ("int8", "none")]
    expected = {f"digits_cnn.{s}" for s in SHARED}
    expected |= {f"digits_cnn.{b}.{s}" for b in builds for s in PER_BUILD}
    assert set(stages) == expected  # 4 shared stages once, 8 per build: 36, not 48

    export = stages["digits_cnn.export"]
    assert export["cmd"] == "edgeflow dvc stage recipes/digits_cnn.yaml export"
    assert "models/digits_cnn.pt" in export["deps"]  # the weights
    assert ".edgeflow/dvc/digits_cnn/rewrite" in export["deps"]  # the upstream stage
    assert export["params"][-1] == {"recipes/digits_cnn.yaml": ["export", "source"]}
    assert export["outs"] == [".edgeflow/dvc/digits_cnn/export"]
    quantize = stages["digits_cnn.tflite-int8.quantize"]
    assert quantize["cmd"].endswith("quantize --build tflite-int8")
    # the model the precheck checked (rewritten there under `rewrites: auto`)
    assert ".edgeflow/dvc/digits_cnn/tflite-int8/precheck" in quantize["deps"]
    assert "quantization" in quantize["params"][-1]["recipes/digits_cnn.yaml"]
    assert quantize["params"][:4] == [
        "edgeflow.version",
        "target",
        "quantization",
        "builds.tflite-int8",
    ]
    report = stages["digits_cnn.tflite-int8.report"]
    assert report["outs"] == [".edgeflow/dvc/digits_cnn/tflite-int8/report"]
    last = stages["digits_cnn.tflite-int8.html"]  # the page: the build folder's last stage
    assert last["outs"] == [{"build/digits_cnn/tflite-int8": {"cache": False}}]
    assert ".edgeflow/dvc/digits_cnn/tflite-int8/convert" in last["deps"]  # the artifact
    assert ".edgeflow/dvc/digits_cnn/tflite-int8/report" in last["deps"]
    assert pipeline["metrics"] == [f"build/digits_cnn/{b}/metrics.json" for b in builds]
    assert len(pipeline["plots"]) == 3 * len(builds)  # latency, layers, outputs
    assert pipeline["artifacts"]["digits_cnn-tflite-int8-report"] == {
        "path": "build/digits_cnn/tflite-int8/report.html",
        "type": "report",
        "desc": "edgeflow's report of digits_cnn tflite-int8: figures, thresholds and plots "
        "in one self-contained page",
    }
    assert len(pipeline["artifacts"]) == len(builds)

    params = yaml.safe_load((root / "params.yaml").read_text())
    assert params["builds"]["tflite-none"] == {"target": "tflite", "quantization": "none"}
    assert params["target"] is None and params["quantization"]["mode"] is None


def test_init_is_deterministic_and_keeps_the_users_stages(tmp_path: Path) -> None:
    root = model_repo(tmp_path / "repo")
    (root / "dvc.yaml").write_text(
        "stages:\n"
        "  train:  # the user's own training stage\n"
        "    cmd: python train.py --seed ${train.seed}\n"
        "    outs:\n"
        "      - models/digits_cnn.pt:\n"
        "          cache: false\n"
        "artifacts:\n"
        "  digits-model:  # the user's own artifact\n"
        "    path: models/digits_cnn.pt\n"
        "    type: model\n"
    )
    (root / "params.yaml").write_text("train:\n  seed: 3  # my seed\n")
    assert init(root, "--quantization", "int8,none") == 0
    first = {n: (root / n).read_text() for n in ("dvc.yaml", "params.yaml")}
    assert "  train:  # the user's own training stage" in first["dvc.yaml"]
    assert "seed: 3  # my seed" in first["params.yaml"]
    assert init(root) == 0  # again, from its own output: byte-identical
    assert {n: (root / n).read_text() for n in first} == first
    assert init(root, "--check") == 0

    recipe = root / "recipes" / "digits_cnn.yaml"
    recipe.write_text(recipe.read_text() + "optimize: {onnxscript: false}\n")
    assert init(root, "--check") == 1  # stale: the optimize stage now reads a recipe key
    assert (root / "dvc.yaml").read_text() == first["dvc.yaml"]  # --check writes nothing
    assert init(root) == 0
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    optimize = stages["digits_cnn.recipe-int8.optimize"]
    assert optimize["params"][-1] == {"recipes/digits_cnn.yaml": ["optimize", "source.inputs"]}
    assert "train" in stages

    assert init(root, "--quantization", "int8") == 0  # a build that is gone loses its stages
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    assert not [s for s in stages if ".recipe-none." in s]
    assert "digits_cnn.recipe-int8.report" in stages
    artifacts = yaml.safe_load((root / "dvc.yaml").read_text())["artifacts"]
    assert sorted(artifacts) == ["digits-model", "digits_cnn-recipe-int8-report"]


def test_init_errors_name_the_problem(tmp_path: Path) -> None:
    root = model_repo(tmp_path / "repo")
    with pytest.raises(EdgeflowError, match="unknown preset 'int9'") as err:
        dvcfile.init(root, quantizations=["int9"])
    assert "did you mean 'int8'?" in str(err.value.hint)
    with pytest.raises(EdgeflowError, match="no recipe 'digits'"):
        dvcfile.init(root, recipes=["digits"])
    (root / "params.yaml").write_text("builds:\n  qat:\n    target: tflite\n")
    (root / "recipes" / "digits_cnn.yaml").write_text(
        (REPO / "recipes" / "digits_cnn_qat.yaml").read_text()
    )
    shutil.copy(REPO / "models" / "digits_cnn_qat.pt", root / "models")
    with pytest.raises(EdgeflowError, match=r"quantization\.method") as bad:
        dvcfile.init(root)  # a build its target cannot make fails here, before any stage runs
    assert "digits_cnn.yaml" in bad.value.render()
    (root / "params.yaml").write_text("builds:\n  a.b: {}\n")
    with pytest.raises(EdgeflowError, match=r"params.yaml:1:1: builds: build name .a.b.") as named:
        dvcfile.init(root)
    assert "letters, digits" in named.value.render()
    assert not (root / "dvc.yaml").exists()  # nothing half-written


@pytest.mark.slow
@needs_dvc
def test_repro_after_a_quantization_edit_reruns_only_downstream(tmp_path: Path) -> None:
    root = model_repo(tmp_path / "repo", git=True)
    assert init(root, "--target", "onnxruntime_micro", "--quantization", "int8,none") == 0
    first = sh(root, "dvc", "repro")
    assert first.stdout.count("Running stage") == 4 + 2 * len(PER_BUILD)
    for build in ("onnxruntime_micro-int8", "onnxruntime_micro-none"):
        metrics = json.loads((root / "build/digits_cnn" / build / "metrics.json").read_text())
        assert metrics["verified"] is True
        assert (root / "build/digits_cnn" / build / "model.ort").is_file()
        assert (root / "build/digits_cnn" / build / "latency.csv").read_text().count("\n") == 101
        layers = (root / "build/digits_cnn" / build / "layers.csv").read_text().splitlines()
        assert layers[0] == "layer,node,op,output_bytes,alive_bytes,weight_bytes"
        assert len(layers) > 5
        assert "<svg" in (root / "build/digits_cnn" / build / "report.html").read_text()
    sh(root, "git", "add", "-A")
    sh(root, "git", "commit", "-qm", "builds")

    recipe = root / "recipes" / "digits_cnn.yaml"
    text = recipe.read_text()
    recipe.write_text(text.replace("per_channel: true", "per_channel: false"))
    again = sh(root, "dvc", "repro")
    for stage in SHARED:
        assert f"Stage 'digits_cnn.{stage}' didn't change, skipping" in again.stdout
    assert "Running stage 'digits_cnn.onnxruntime_micro-int8.quantize'" in again.stdout
    assert "Running stage 'digits_cnn.onnxruntime_micro-int8.convert'" in again.stdout

    diff = json.loads(sh(root, "dvc", "metrics", "diff", "HEAD", "--json").stdout)
    changed = diff["build/digits_cnn/onnxruntime_micro-int8/metrics.json"]
    assert changed["size_bytes"]["old"] != changed["size_bytes"]["new"]  # per-tensor scales
    assert "agreement.max_abs_diff" in changed
    table = sh(root, "dvc", "metrics", "diff", "HEAD", "--md").stdout  # what a PR comment shows
    assert re.search(r"onnxruntime_micro-int8/metrics.json\s*\|\s*size_bytes", table), table
    params = json.loads(sh(root, "dvc", "params", "diff", "HEAD", "--json").stdout)
    per_channel = params["recipes/digits_cnn.yaml"]["quantization.per_channel"]
    assert (per_channel["old"], per_channel["new"]) == (True, False)


def test_init_for_hydra_composition(tmp_path: Path) -> None:
    """--hydra: builds in conf/config.yaml, target and quantization as config groups, and
    params.yaml as Hydra composes them (what DVC writes on `dvc exp run`)."""
    root = model_repo(tmp_path / "repo")
    (root / "params.yaml").write_text("train:\n  seed: 1\n")
    assert init(root, "--hydra", "--quantization", "int8,none") == 0
    config = yaml.safe_load((root / "conf/config.yaml").read_text())
    assert config["defaults"] == [{"target": "recipe"}, {"quantization": "recipe"}, "_self_"]
    assert config["train"] == {"seed": 1}  # the user's params carried over
    assert set(config["builds"]) == {"recipe-int8", "recipe-none"}
    group = (root / "conf/quantization/int8_per_tensor.yaml").read_text()
    assert group.startswith("# @package _global_\n")
    assert yaml.safe_load(group)["quantization"]["per_channel"] is False
    assert yaml.safe_load((root / "conf/target/armnn.yaml").read_text()) == {"target": "armnn"}
    params = yaml.safe_load((root / "params.yaml").read_text())
    assert params["target"] is None and params["quantization"]["mode"] is None
    assert params["train"] == {"seed": 1} and params["builds"] == config["builds"]
    assert init(root, "--check") == 0  # conf/config.yaml now marks Hydra mode by itself

    config_path = root / "conf/config.yaml"
    config_path.write_text(config_path.read_text().replace("- target: recipe", "- target: armnn"))
    assert init(root, "--check") == 1  # params.yaml no longer what Hydra composes
    assert init(root) == 0
    assert yaml.safe_load((root / "params.yaml").read_text())["target"] == "armnn"


@pytest.mark.slow
@needs_dvc
def test_dvc_experiments_with_hydra_composition_and_a_queue(tmp_path: Path) -> None:
    root = model_repo(tmp_path / "repo", git=True)
    assert init(root, "--hydra") == 0  # one build per recipe, as the recipe says
    assert "enabled = true" in (root / ".dvc/config").read_text()  # DVC composes conf/
    sh(root, "dvc", "repro")
    sh(root, "git", "add", "-A")
    sh(root, "git", "commit", "-qm", "default build")

    sh(root, "dvc", "exp", "run", "-n", "float", "-S", "quantization.mode=none")
    sh(
        root,
        "dvc", "exp", "run", "--queue",
        "-S", "target=onnxruntime_micro,tflite", "-S", "quantization=int8_per_tensor",
    )  # fmt: skip
    sh(root, "dvc", "queue", "start")
    deadline = time.monotonic() + 900
    while "Queued" in (status := sh(root, "dvc", "queue", "status").stdout) or "Running" in status:
        assert time.monotonic() < deadline, status
        time.sleep(3)
    assert status.count("Success") == 2, status

    shown = json.loads(sh(root, "dvc", "exp", "show", "--json").stdout)
    runs = {}
    for commit in shown:
        for exp in commit.get("experiments") or []:
            for rev in exp["revs"]:
                data = rev["data"]["metrics"]["build/digits_cnn/default/metrics.json"]["data"]
                per_channel = rev["data"]["params"]["params.yaml"]["data"]["quantization"]
                runs[rev["name"]] = (
                    data["target"],
                    data["quantization"],
                    per_channel["per_channel"],
                    data["verified"],
                )
    assert runs.pop("float") == ("onnxruntime_micro", "none", None, True)
    assert sorted(runs.values()) == [
        ("onnxruntime_micro", "int8", False, True),
        ("tflite", "int8", False, True),
    ]


@pytest.mark.slow
@needs_dvc
def test_a_dvc_remote_shares_stage_results_between_machines(tmp_path: Path) -> None:
    """Machine A builds a variant and pushes DVC's run-cache; machine B, a fresh clone, asks
    for the same variant and gets the stages' results from the remote instead of running them."""
    a = model_repo(tmp_path / "a", git=True)
    sh(a, "dvc", "remote", "add", "-d", "shared", str(tmp_path / "remote"))
    assert init(a) == 0
    sh(a, "dvc", "repro")
    sh(a, "git", "add", "-A")
    sh(a, "git", "commit", "-qm", "default build")
    sh(a, "dvc", "push")
    variant = "quantization.mode=none"
    sh(a, "dvc", "exp", "run", "-S", variant)  # not committed: only its stage results travel
    sh(a, "dvc", "push", "--run-cache")

    b = tmp_path / "b"
    sh(tmp_path, "git", "clone", "-q", str(a), str(b))
    sh(b, "dvc", "pull", "--run-cache")
    params = b / "params.yaml"
    params.write_text(params.read_text().replace("  mode:\n", "  mode: none\n", 1))
    repro = sh(b, "dvc", "repro", "--pull")  # --pull: fetch what a run-cache hit names
    for stage in ("precheck", "quantize", "convert", "verify"):
        restored = f"Stage 'digits_cnn.default.{stage}' is cached - skipping run"
        assert restored in repro.stdout, repro.stdout
    # the last stage's folder is kept in git, not in DVC's cache, so it is written again
    assert "Running stage 'digits_cnn.default.html'" in repro.stdout
    assert (b / "build/digits_cnn/default/report.html").is_file()
    metrics = json.loads((b / "build/digits_cnn/default/metrics.json").read_text())
    assert (metrics["quantization"], metrics["verified"]) == ("none", True)


def test_params_take_every_quantization_key_of_the_recipe() -> None:
    """A build in params.yaml can set any key a recipe's quantization section has."""
    from edgeflow.engine.dvcparams import QuantizationKeys
    from edgeflow.schema.sections import QUANTIZATION_KEYS

    assert tuple(QuantizationKeys.model_fields) == QUANTIZATION_KEYS
