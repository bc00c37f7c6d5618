"""Every kind of report page opened in headless Chromium, as a reader gets it: it loads with
no console error and no request, every plot is drawn, and the screenshot is not blank.

EDGEFLOW_UPDATE_DOCS=1 writes the demo report's screenshot to docs/report.png (the README
shows it)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.browser import Chromium, PageCheck, variation
from tests.conftest import REPO
from tests.report import DEMO

pytestmark = pytest.mark.slow

PAGES = {  # page -> the plots it must draw, in order
    "build/digits_cnn/onnxruntime_micro-int8/report.html": [
        "latency", "outputs", "confusion-logits", "memory",
    ],
    "build/digits_cnn/onnxruntime_micro-none/report.html": [
        "latency", "outputs", "confusion-logits", "memory",
    ],
    "build/digits_cnn/tflite_micro-int8/report.html": [
        "latency", "outputs", "confusion-logits", "memory",
    ],
    f"failing/digits_cnn/{DEMO}/report.html": [
        "latency", "outputs", "confusion-logits", "layers", "memory",
    ],
    "build/sweep.html": ["sweep"],
}  # fmt: skip


def opened(chromium: Chromium, page: Path, shot: Path) -> PageCheck:
    check = chromium.open_page(page, screenshot=shot)
    assert check.console_errors == () and check.page_errors == (), check
    assert check.requests == ()  # self-contained: nothing fetched, not even a favicon
    assert variation(shot) > 0.05  # text and plots, not a blank page
    return check


@pytest.mark.parametrize("name", list(PAGES))
def test_page_loads_clean_with_every_plot_drawn(
    name: str, builds: Path, chromium: Chromium, tmp_path: Path
) -> None:
    check = opened(chromium, builds / name, tmp_path / "page.png")
    assert [p.id for p in check.plots] == [f"plot-{p}" for p in PAGES[name]]
    for plot in check.plots:
        assert plot.width > 300 and plot.height > 100, plot
        assert plot.drawn >= 12, plot  # the frame, ticks and their labels, and the data
    if name.endswith("report.html"):
        assert check.text.startswith("digits_cnn -> ")
        assert "Thresholds" in check.text and "Stages" in check.text
    else:
        assert "2 builds, 2 verified" in check.text


def test_the_pages_say_what_each_build_is(builds: Path, chromium: Chromium, tmp_path: Path) -> None:
    """The words next to the plots: the verdict, the measured arena, the first divergence."""
    shot = tmp_path / "page.png"
    demo = opened(chromium, builds / "build/digits_cnn" / DEMO / "report.html", shot)
    assert "VERIFIED\n" in demo.text
    tflm = opened(chromium, builds / "build/digits_cnn/tflite_micro-int8/report.html", shot)
    assert "arena predicted" in tflm.text and "measured" in tflm.text
    failing = opened(chromium, builds / "failing/digits_cnn" / DEMO / "report.html", shot)
    assert "NOT VERIFIED: a threshold missed" in failing.text and "first divergence" in failing.text
    if os.environ.get("EDGEFLOW_UPDATE_DOCS"):
        shutil.copyfile(
            chromium.open_page(
                builds / "build/digits_cnn" / DEMO / "report.html", screenshot=shot
            ).screenshot
            or shot,
            REPO / "docs" / "report.png",
        )
