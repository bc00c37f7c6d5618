"""The CLI: fast help, friendly errors for bad choices, Hydra sweeps that share stages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from edgeflow.cli import main
from edgeflow.engine.cache import Cache
from tests.conftest import DEMO_RECIPE, DEMO_WEIGHTS


def test_help_imports_no_heavy_library() -> None:
    code = (
        "import sys, contextlib, io\n"
        "from edgeflow.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main(['--help'])\n"
        "heavy = [m for m in ('torch', 'onnxruntime', 'onnx', 'hydra', 'tensorflow', 'sklearn')"
        " if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("arg", "message", "suggestion"),
    [
        ("recipe=digits_cn", "unknown recipe 'digits_cn'", "did you mean 'digits_cnn'?"),
        ("target=onnxruntime_mcu", "unknown target", "did you mean 'onnxruntime_micro'?"),
        ("quantization=int4", "unknown quantization 'int4'", "did you mean 'int8'?"),
    ],
)
def test_run_rejects_unknown_choices(arg: str, message: str, suggestion: str, capsys) -> None:
    args = ["run", "recipe=digits_cnn", arg] if not arg.startswith("recipe") else ["run", arg]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and suggestion in err


@pytest.mark.parametrize(
    ("arg", "expected"),
    [
        (
            "verify.max_accuracy_drop=2",
            "<command line> (verify.max_accuracy_drop=2): verify.max_accuracy_drop: must be "
            "less than or equal to 1 (got 2)",
        ),
        (
            "verify.max_acuracy_drop=0.1",
            "verify.max_acuracy_drop: unknown key 'max_acuracy_drop'\n"
            "  hint: did you mean 'max_accuracy_drop'?",
        ),
        (
            "precheck.board=cortex_m9",
            "<command line> (precheck.board=cortex_m9): precheck.board: target "
            "'onnxruntime_micro' has no board 'cortex_m9'",
        ),
    ],
)
def test_any_recipe_key_can_be_set_on_the_command_line(arg: str, expected: str, capsys) -> None:
    """Beyond target and quantization: recipe keys reach the recipe loader, which validates
    them like the file's own and names the command line when they are wrong."""
    assert main(["run", "recipe=digits_cnn", arg]) == 2
    assert expected in capsys.readouterr().err


def test_list_shows_builtins(capsys) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "digits_cnn" in out and "onnxruntime_micro" in out and "pytorch" in out


@pytest.mark.slow
def test_multirun_sweep_shares_upstream_stages(tmp_path: Path, capsys) -> None:
    args = ["run", "-m", "recipe=digits_cnn", "quantization=none,int8_per_tensor"]
    cache = tmp_path / "cache"
    assert main([*args, f"cache_dir={cache}", f"build_dir={tmp_path}/build"]) == 0
    out = capsys.readouterr().out
    events = Cache(cache).events()  # the cache's own count, over every job
    assert events["export", "ran"] == 1 and events["export", "hit"] == 1
    assert events["quantize", "ran"] == 2
    assert out.count("  export         ran") == 1 and out.count("  export         cached") == 1
    for mode in ("none", "int8-per_tensor"):
        metrics = tmp_path / "build" / "digits_cnn" / f"onnxruntime_micro-{mode}" / "metrics.json"
        assert json.loads(metrics.read_text())["verified"] is True
    assert len(list((cache / "export").glob("*/*"))) == 1
    # one summary for the sweep: the table, and sweep.json with the Pareto-optimal builds
    assert "sweep: 2 builds" in out
    jobs = json.loads((tmp_path / "build" / "sweep.json").read_text())["jobs"]
    assert sorted(j["build"] for j in jobs) == [
        "onnxruntime_micro-int8-per_tensor",
        "onnxruntime_micro-none",
    ]
    assert all(j["status"] == "verified" and j["size_bytes"] > 0 for j in jobs)
    assert any(j["pareto"] for j in jobs)
    page = (tmp_path / "build" / "sweep.html").read_text()  # each point links to its report
    for j in jobs:
        assert page.count(f'href="digits_cnn/{j["build"]}/report.html"') == 3  # 2 plots, row
        assert (tmp_path / "build" / "digits_cnn" / j["build"] / "report.html").is_file()


@pytest.mark.slow
def test_dynamic_batch_export_and_batched_verification(
    tmp_path: Path, write_recipe, shared_cache: Path
) -> None:
    text = DEMO_RECIPE.read_text().replace("../models/digits_cnn.pt", str(DEMO_WEIGHTS))
    text = text.replace("  outputs: [logits]", "  outputs: [logits]\n  dynamic_batch: {max: 32}")
    path = write_recipe(text, "dyn.yaml")
    build = tmp_path / "build"
    args = ["run", f"recipe={path}", "quantization=none", f"cache_dir={shared_cache}"]
    assert main([*args, f"build_dir={build}"]) == 0
    metrics = json.loads((build / "dyn" / "onnxruntime_micro-none" / "metrics.json").read_text())
    assert metrics["agreement"]["max_abs_diff"] <= 1e-4
    [exported] = [p for p in shared_cache.glob("export/*/*/model.onnx") if _batch_dim(p) == "batch"]
    assert exported.is_file()


def _batch_dim(path: Path) -> str:
    return onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim[0].dim_param


@pytest.mark.slow
def test_weights_that_do_not_fit_fail_the_load_stage(
    tmp_path: Path, write_recipe, shared_cache: Path, capsys
) -> None:
    text = DEMO_RECIPE.read_text().replace("../models/digits_cnn.pt", str(DEMO_WEIGHTS))
    path = write_recipe(text.replace("init: {num_classes: 10}", "init: {num_classes: 5}"))
    cache = tmp_path / "cache"
    assert main(["run", f"recipe={path}", f"cache_dir={cache}", f"build_dir={tmp_path}/b"]) == 2
    captured = capsys.readouterr()
    assert "  load           failed" in captured.out
    assert "stage 'load' failed: " in captured.err
    assert ": source.weights: weights digits_cnn.pt do not fit " in captured.err
    assert "another shape (classifier.weight: file [10, 32], model [5, 32]" in captured.err
    assert "hint: check source.init" in captured.err
    assert not (cache / "load").exists() or not list((cache / "load").glob("*/*"))
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
def test_parallel_sweep_with_joblib_shares_one_cache(tmp_path: Path) -> None:
    """hydra/launcher=joblib runs the jobs in two processes at once: the upstream stages are
    still made once (the second job waits on the entry's lock and reuses it), and the summary
    comes from the rows the jobs wrote, not from this process's memory."""
    import subprocess
    import sys

    args = ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "recipe=digits_cnn"]
    args += ["quantization=none,int8", f"cache_dir={tmp_path}/cache", f"build_dir={tmp_path}/b"]
    run = subprocess.run(
        [sys.executable, "-m", "edgeflow", "run", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    out = run.stdout
    assert run.returncode == 0, run.stderr[-2000:]
    events = Cache(tmp_path / "cache").events()  # counted by the two job processes
    assert events["export", "ran"] == 1 and events["export", "hit"] == 1
    assert events["load", "ran"] == 1 and events["load", "hit"] == 1
    assert len(list((tmp_path / "cache" / "export").glob("*/*"))) == 1
    assert "sweep: 2 builds" in out
    jobs = json.loads((tmp_path / "b" / "sweep.json").read_text())["jobs"]
    assert sorted(j["build"] for j in jobs) == ["onnxruntime_micro-int8", "onnxruntime_micro-none"]
    assert all(j["status"] == "verified" for j in jobs)
    assert 'id="plot-sweep"' in (tmp_path / "b" / "sweep.html").read_text()  # by the parent


@pytest.mark.parametrize(
    ("arg", "expected"),
    [
        ("rewrites=[fx.fuse_conv_bnn]",
         "<command line> (rewrites=['fx.fuse_conv_bnn']): rewrites[0]: unknown rule"),
        ("+rewrites=[onnx.made_up]", "<command line> (rewrites[0]=onnx.made_up): rewrites[0]: "
         "unknown rule 'onnx.made_up'"),
        ("++rewrites=[{rule: fx.replace_activation, frm: relu}]", "rewrites[0].frm: unknown key"),
        ("+rewrites=[onnx.simplify,fx.fuse_conv_bn]",
         "fx rule 'fx.fuse_conv_bn' after onnx rule 'onnx.simplify'"),
        ("+foo=1", "+foo=1: unknown key 'foo'"),
        ("++verfy.max_abs_diff=1", "unknown key 'verfy'\nhint: did you mean 'verify'?"),
        ("quantization.per_chanel=false", "unknown quantization key 'per_chanel'"),
        ("~verify.max_abs_diff", "a recipe key cannot be removed on the command line"),
        ("name=123", "<command line> (name=123): name: must be a valid string"),
    ],
)  # fmt: skip
def test_no_override_is_ignored(arg: str, expected: str, capsys) -> None:
    """Rewrites are set (`rewrites=`), appended to (`+rewrites=`) and validated like the
    file's; a key nothing reads is an error, never silently dropped."""
    assert main(["run", "recipe=digits_cnn", arg]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err


@pytest.mark.slow
def test_a_recipe_file_in_the_working_folder_and_an_appended_rule(
    tmp_path: Path, shared_cache: Path, monkeypatch, capsys
) -> None:
    """`recipe=my.yaml` and `recipe=./my.yaml` run the file here (not "unknown recipe 'my'");
    `+rewrites=[...]` adds the rule the precheck suggests without editing the file."""
    text = DEMO_RECIPE.read_text().replace("../models/", f"{DEMO_WEIGHTS.parent}/")
    (tmp_path / "my.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    common = [f"cache_dir={shared_cache}", "build_dir=out"]
    for given in ("my.yaml", "./my.yaml"):
        assert main(["run", f"recipe={given}", *common]) == 0
    report = tmp_path / "out" / "my" / "onnxruntime_micro-int8" / "report.md"
    assert "`fx.fuse_conv_bn`" not in report.read_text()
    assert main(["run", "recipe=my.yaml", "+rewrites=[fx.fuse_conv_bn]", *common]) == 0
    assert "`fx.fuse_conv_bn`: changed" in report.read_text()
    capsys.readouterr()


@pytest.mark.slow
def test_two_recipes_of_one_name_never_replace_each_others_build(
    tmp_path: Path, shared_cache: Path, capsys
) -> None:
    text = DEMO_RECIPE.read_text().replace("../models/", f"{DEMO_WEIGHTS.parent}/")
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "model.yaml").write_text(text)
    common = [f"cache_dir={shared_cache}", f"build_dir={tmp_path / 'build'}"]
    assert main(["run", f"recipe={tmp_path / 'a' / 'model.yaml'}", *common]) == 0
    capsys.readouterr()
    assert main(["run", f"recipe={tmp_path / 'b' / 'model.yaml'}", *common]) == 2
    out, err = capsys.readouterr()
    assert f"holds the build of {tmp_path / 'a' / 'model.yaml'}, another recipe file" in err
    assert " ran " not in out and " cached " not in out  # refused before any stage
