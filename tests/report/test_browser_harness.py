"""The browser check on hand-written pages: what it reports for a good page, errors, requests
(refused, so nothing leaves the machine), empty plots and blank screenshots."""

from __future__ import annotations

import http.server
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.browser import Chromium, is_blank, variation

GOOD_PAGE = """
<!doctype html>
<html><head><meta charset="utf-8"><title>digits_cnn report</title>
<style>body { font: 16px sans-serif; margin: 16px } figure { margin: 8px 0 }</style></head>
<body>
<h1>digits_cnn: onnxruntime_micro int8</h1>
<figure class="plot" id="plot-accuracy">
  <svg xmlns="http://www.w3.org/2000/svg" width="320" height="160" viewBox="0 0 320 160">
    <defs><clipPath id="clip"><rect width="320" height="160"/></clipPath></defs>
    <rect width="320" height="160" fill="#eef2fa"/>
    <polyline points="0,150 80,90 160,60 240,40 320,30" fill="none" stroke="#1f77b4"
      stroke-width="3" clip-path="url(#clip)"/>
    <text x="8" y="20">accuracy</text>
  </svg>
  <figcaption>Accuracy per step</figcaption>
</figure>
<figure class="plot" id="plot-latency">
  <svg xmlns="http://www.w3.org/2000/svg" width="240" height="120">
    <rect x="10" y="60" width="40" height="60" fill="#ff7f0e"/>
    <rect x="70" y="20" width="40" height="100" fill="#2ca02c"/>
  </svg>
</figure>
</body></html>
"""


def write(tmp_path: Path, html: str, name: str = "page.html") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(html).lstrip(), encoding="utf-8")
    return path


def test_a_good_page(chromium: Chromium, tmp_path: Path) -> None:
    check = chromium.open_page(write(tmp_path, GOOD_PAGE), screenshot=tmp_path / "page.png")

    assert (check.console_errors, check.page_errors, check.requests) == ((), (), ())
    assert check.title == "digits_cnn report"
    assert "digits_cnn: onnxruntime_micro int8" in check.text
    assert "Accuracy per step" in check.text
    assert [plot.id for plot in check.plots] == ["plot-accuracy", "plot-latency"]
    accuracy = check.plot("plot-accuracy")
    assert (accuracy.width, accuracy.height) == (320, 160)
    assert accuracy.drawn == 3  # rect, polyline, text; not the clip path's rect
    assert check.plot("plot-latency").drawn == 2
    assert not any(plot.empty for plot in check.plots)
    assert check.screenshot == tmp_path / "page.png"
    assert not is_blank(check.screenshot)


def test_console_errors_and_uncaught_exceptions(chromium: Chromium, tmp_path: Path) -> None:
    logged = chromium.open_page(write(tmp_path, '<script>console.error("x")</script><p>hi'))
    thrown = chromium.open_page(write(tmp_path, '<script>throw new Error("boom")</script>'))

    assert (logged.console_errors, logged.page_errors) == (("x",), ())
    assert thrown.console_errors == ()
    assert len(thrown.page_errors) == 1 and "boom" in thrown.page_errors[0]


@pytest.mark.parametrize(
    ("element", "url"),
    [
        ('<img src="https://example.com/a.png">', "https://example.com/a.png"),
        ('<link rel=stylesheet href="http://127.0.0.1:9/x.css">', "http://127.0.0.1:9/x.css"),
        (
            "<script>fetch('https://example.com/data.json')</script>",
            "https://example.com/data.json",
        ),
        ('<img src="beside.png">', "beside.png"),  # a file next to it: not self-contained
    ],
)
def test_requests_are_recorded_and_refused(
    chromium: Chromium, tmp_path: Path, element: str, url: str
) -> None:
    (tmp_path / "beside.png").write_bytes(b"")
    page = write(tmp_path, f"<!doctype html><title>t</title>{element}<p>text")
    if "://" not in url:
        url = (tmp_path / url).as_uri()

    check = chromium.open_page(page)

    assert check.requests == (url,)
    assert any("net::ERR_FAILED" in error for error in check.console_errors)


@pytest.fixture
def local_server() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on this machine and the paths it was asked for."""
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


def test_refused_requests_never_reach_a_server(
    chromium: Chromium, tmp_path: Path, local_server: tuple[str, list[str]]
) -> None:
    base, asked = local_server
    live = base.replace("http://", "ws://") + "/live"
    page = write(
        tmp_path,
        f"""
        <link rel=stylesheet href="{base}/style.css">
        <img src="{base}/plot.png">
        <script>new WebSocket("{live}")</script>
        """,
    )

    check = chromium.open_page(page)

    assert set(check.requests) == {f"{base}/style.css", f"{base}/plot.png", live}
    assert asked == []


@pytest.mark.parametrize(
    "figure",
    [
        '<svg width="0" height="0"></svg>',
        '<svg width="200" height="100"><defs><path d="M0 0 L10 10"/></defs></svg>',
        "<p>no svg at all</p>",
        '<svg width="200" height="100" style="display: none"><rect width="9" height="9"/></svg>',
    ],
)
def test_an_empty_plot(chromium: Chromium, tmp_path: Path, figure: str) -> None:
    page = write(tmp_path, f'<figure class="plot" id="plot-empty">{figure}</figure>')

    (plot,) = chromium.open_page(page).plots

    assert plot.id == "plot-empty"
    assert plot.empty


def test_a_blank_page_is_blank(chromium: Chromium, tmp_path: Path) -> None:
    page = write(tmp_path, '<!doctype html><body style="background: #fff"></body>')

    check = chromium.open_page(page, screenshot=tmp_path / "blank.png")

    assert check.screenshot is not None
    assert variation(check.screenshot) == 0
    assert is_blank(check.screenshot)


def test_text_is_drawn_with_an_installed_font(chromium: Chromium, tmp_path: Path) -> None:
    """Without any font Chromium draws text as nothing at all, so a report would look empty
    around its plots; apt's chromium brings fonts-dejavu-core (.ci/run names it too)."""
    page = write(tmp_path, '<p style="font: 24px sans-serif">accuracy 0.9861 ± 0.002 → int8</p>')

    check = chromium.open_page(page, screenshot=tmp_path / "text.png")

    assert check.screenshot is not None
    assert variation(check.screenshot) > 1e-3
