"""report.html and sweep.html: what each page holds, made from a build folder's files alone."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from edgeflow.cli import main
from edgeflow.report.html import build_files, render_build, render_sweep
from edgeflow.verify.kinds import confusion
from tests.report import DEMO, plots_in

pytestmark = pytest.mark.slow


def page(folder: Path) -> str:
    return (folder / "report.html").read_text(encoding="utf-8")


def test_the_demos_page_has_its_plots_and_the_verdict_first(builds: Path) -> None:
    html = page(builds / "build" / "digits_cnn" / DEMO)
    assert plots_in(html) == ["latency", "outputs", "confusion-logits", "memory"]
    verdict, thresholds = html.index('id="verdict"'), html.index('id="thresholds"')
    assert verdict < thresholds < html.index('id="plot-latency"')
    assert '<div class="verdict pass" id="verdict">VERIFIED</div>' in html
    rows = re.findall(r"<tr><td>(verify\.[a-z0-9_]+)[^<]*(?:<code>[^<]*</code>\))?</td>", html)
    assert rows == ["verify.max_accuracy_drop", "verify.min_sqnr_db", "verify.min_top1_agreement"]
    assert html.count('<td class="pass">pass</td>') == 3 and "FAIL" not in html
    # report.md's figures are on the page too
    for text in ("0.9889", "37,928 bytes", "arena 3,072 B", "peak 3,072 B at node_Conv_22"):
        assert text in html, text
    # self-contained: nothing to fetch, nothing to run
    assert "<script" not in html and "<img" not in html and "@import" not in html
    assert not re.search(r'(?:src|href)="(?:https?:)?//', html)


def test_a_build_that_misses_a_threshold_shows_where_its_error_starts(builds: Path) -> None:
    folder = builds / "failing" / "digits_cnn" / DEMO
    html = page(folder)
    assert '<div class="verdict fail" id="verdict">NOT VERIFIED: a threshold missed</div>' in html
    assert html.count('<td class="fail">FAIL</td>') == 1
    assert "layers" in plots_in(html)  # the page again, after the per-layer diff
    diff = json.loads((folder / "diff.json").read_text())
    first = diff["first_divergence"]["tensor"]
    assert f"first divergence: {first}" in html  # marked on the plot, named in the text
    assert diff["line"].replace("->", "-&gt;") in html


def test_edgeflow_report_makes_the_same_page_from_the_folder(builds: Path, capsys) -> None:
    folder = builds / "build" / "digits_cnn" / DEMO
    before = page(folder)
    (folder / "report.html").write_text("stale")
    assert main(["report", str(folder)]) == 0
    assert page(folder) == before  # byte-identical: a pure function of the folder's files
    assert f"wrote {folder / 'report.html'}" in capsys.readouterr().out
    record = json.loads((folder / ".edgeflow-build.json").read_text())
    assert record["files"]["report.html"]  # still edgeflow's file: a rebuild replaces it
    assert render_build(build_files(folder)) == before


def test_edgeflow_report_names_what_a_folder_lacks(tmp_path: Path, builds: Path, capsys) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "is neither a build folder" in capsys.readouterr().err
    old = tmp_path / "old"  # a build folder of an edgeflow that wrote no checks.json
    old.mkdir()
    for name in ("metrics.json", "report.md", "verify.json", "precheck.json"):
        (old / name).write_bytes((builds / "build" / "digits_cnn" / DEMO / name).read_bytes())
    assert main(["report", str(old)]) == 2
    err = capsys.readouterr().err
    assert "lacks report.json, checks.json" in err and "edgeflow run" in err


def test_confusion_counts_what_the_artifact_picked_for_each_source_class() -> None:
    source = np.array([0, 0, 1, 1, 1, 2])
    artifact = np.array([0, 1, 1, 1, 2, 2])
    found = confusion(source, artifact, 4)
    assert found["confusion"] == [[1, 1, 0, 0], [0, 2, 1, 0], [0, 0, 1, 0], [0, 0, 0, 0]]
    assert found["per_class"] == {"picked": [2, 3, 1, 0], "agreed": [1, 2, 1, 0]}
    many = confusion(np.arange(100) % 40, np.arange(100) % 40, 40)
    assert "confusion" not in many  # 40 classes: agreement per class only
    assert many["per_class"]["agreed"] == many["per_class"]["picked"]


def test_many_classes_get_agreement_per_class(builds: Path, tmp_path: Path) -> None:
    folder = tmp_path / "b"
    source = builds / "build" / "digits_cnn" / DEMO
    for name, path in build_files(source).items():
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_bytes(path.read_bytes())
    verify = json.loads((folder / "verify.json").read_text())
    output = verify["agreement"]["outputs"][0]
    del output["confusion"]
    output["per_class"] = {"picked": [3] * 40, "agreed": [3] * 39 + [1]}
    (folder / "verify.json").write_text(json.dumps(verify))
    html = render_build(build_files(folder))
    assert plots_in(html) == ["latency", "outputs", "per-class-logits", "memory"]
    assert "class 39: 0.33" in html  # the worst class named on the plot


def test_sweep_page_links_each_point_and_draws_only_verified_builds() -> None:
    rows = [
        {"recipe": "r", "build": "a-int8", "status": "verified", "accuracy": 0.98,
         "agreement": 0.99, "sqnr_db": 30.0, "latency_p50_ms": 0.5, "size_bytes": 1000,
         "arena_bytes": None, "pareto": True, "error": ""},
        {"recipe": "r", "build": "a-none", "status": "verified", "accuracy": 0.99,
         "agreement": 1.0, "sqnr_db": 120.0, "latency_p50_ms": 1.0, "size_bytes": 4000,
         "arena_bytes": None, "pareto": True, "error": ""},
        {"recipe": "r", "build": "b-int8", "status": "failed", "error": "r.yaml:3: boom",
         "pareto": False},
    ]  # fmt: skip
    html = render_sweep(rows, {0: "r/a-int8/report.html", 1: "r/a-none/report.html"})
    assert plots_in(html) == ["sweep"]
    assert html.count('<a href="r/a-int8/report.html"><') == 2  # one point per panel
    assert '<a href="r/a-none/report.html">a-none</a>' in html
    assert "r.yaml:3: boom" in html and "3 builds, 2 verified, 2 Pareto-optimal" in html
    nothing = render_sweep([rows[2]], {})
    assert plots_in(nothing) == [] and "No verified build" in nothing


def test_plots_draw_exact_missing_and_failing_figures() -> None:
    """An exact output (inf dB), one with no finite sample (None) and one under the minimum:
    each drawn and labelled, none dropped, no NaN reaching the SVG."""
    from edgeflow.report import plots

    outputs = [
        {"index": 0, "name": "exact", "sqnr_db": float("inf")},
        {"index": 1, "name": "no_finite_sample", "sqnr_db": None},
        {"index": 2, "name": "noisy", "sqnr_db": 9.5},
    ]
    svg = plots.output_sqnr(outputs, 15.0)
    assert svg.startswith("<svg") and "nan" not in svg.lower()
    assert svg.count('class="bar"') == 3  # three bars
    assert all(words in svg for words in (">exact<", ">n/a<", ">9.5 dB<"))
    rows = [
        {"tensor": "a", "op": "Conv", "sqnr_db": "inf"},
        {"tensor": "b", "op": "Relu", "sqnr_db": "42.00"},
        {"tensor": "c;fused", "op": "Add", "sqnr_db": "7.50"},
    ]
    assert "nan" not in plots.layer_error(rows, "c;fused", 15.0).lower()
    spread = plots.latency([0.01] * 5 + [1.0], 0.01, 0.01)  # log bins: 0.01 and 1 both seen
    assert spread.count('class="bar"') == 2 and ">0.1<" in spread and ">1<" in spread
