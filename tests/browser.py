"""Open an HTML page in headless Chromium and report what a reader gets: console errors, the
requests it tried (recorded and refused), its plots, its text and a screenshot."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tests import needs

if TYPE_CHECKING:
    from playwright.sync_api import Browser, ConsoleMessage, Route, ViewportSize, WebSocket

# Debian's chromium, driven by playwright (its wheel carries its own driver; `playwright install`
# is never needed). No sandbox: CI runs as root. The browser's own services stay off, and no
# host name resolves, so even what the flags miss cannot leave the machine: with the flags
# alone, Chromium 156 still asks update.googleapis.com and accounts.google.com at start.
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND",
)
VIEWPORT: ViewportSize = {"width": 1280, "height": 720}

# What a plot draws with; glyphs, clip paths and markers defined but not drawn do not count.
_PLOTS_JS = """() => [...document.querySelectorAll("figure.plot")].map((figure) => {
  const svg = figure.querySelector("svg");
  if (svg === null) return {id: figure.id, width: 0, height: 0, drawn: 0};
  const box = svg.getBoundingClientRect();
  const marks = [...svg.querySelectorAll(
    "path, rect, line, polyline, polygon, circle, ellipse, use, text, image")];
  const drawn = marks.filter((el) => !el.closest("defs, clipPath, mask, marker, pattern, symbol"));
  return {id: figure.id, width: box.width, height: box.height, drawn: drawn.length};
})"""


@dataclass(frozen=True)
class Plot:
    """One `<figure class="plot">`: its id, its svg's rendered size and how many marks it draws."""

    id: str
    width: float
    height: float
    drawn: int

    @property
    def empty(self) -> bool:
        return self.width == 0 or self.height == 0 or self.drawn == 0


@dataclass(frozen=True)
class PageCheck:
    """What loading one page showed."""

    url: str
    title: str
    text: str  # document.body.innerText
    console_errors: tuple[str, ...]
    page_errors: tuple[str, ...]  # uncaught exceptions
    requests: tuple[str, ...]  # every URL but the page's own; all were refused
    plots: tuple[Plot, ...]
    screenshot: Path | None  # a full-page PNG, when one was asked for

    def plot(self, id: str) -> Plot:
        found = [plot for plot in self.plots if plot.id == id]
        if not found:
            raise KeyError(f"no figure.plot with id {id!r} (ids: {[p.id for p in self.plots]})")
        return found[0]


class Chromium:
    """A launched headless Chromium; each page opens in a fresh context of its own."""

    def __init__(self, browser: Browser) -> None:
        self._browser = browser

    def open_page(self, html: Path, screenshot: Path | None = None) -> PageCheck:
        url = html.resolve().as_uri()
        console_errors: list[str] = []
        page_errors: list[str] = []
        requests: list[str] = []

        def refuse_all_but_the_page(route: Route) -> None:
            if route.request.url == url:
                route.continue_()
            else:
                requests.append(route.request.url)
                route.abort()

        def record_error(message: ConsoleMessage) -> None:
            if message.type == "error":
                console_errors.append(message.text)

        def record_websocket(socket: WebSocket) -> None:
            requests.append(socket.url)  # routes do not see them; no host name resolves

        context = self._browser.new_context(viewport=VIEWPORT)
        try:
            page = context.new_page()
            page.on("console", record_error)
            page.on("pageerror", lambda error: page_errors.append(str(error)))
            page.on("websocket", record_websocket)
            page.route("**/*", refuse_all_but_the_page)
            page.goto(url, wait_until="load")
            plots = tuple(Plot(**plot) for plot in page.evaluate(_PLOTS_JS))
            title = page.title()
            text = page.evaluate("document.body.innerText")
            if screenshot is not None:
                page.screenshot(path=screenshot, full_page=True)
        finally:
            context.close()
        return PageCheck(
            url=url,
            title=title,
            text=text,
            console_errors=tuple(console_errors),
            page_errors=tuple(page_errors),
            requests=tuple(requests),
            plots=plots,
            screenshot=screenshot,
        )


@contextmanager
def launch_chromium() -> Iterator[Chromium]:
    """Start headless Chromium; skip the test when it or playwright is missing (fail under CI).
    One at a time per process: playwright's sync API refuses a second while one is open."""
    executable = needs.command("chromium")
    needs.require("playwright")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield Chromium(browser)
        finally:
            browser.close()


def open_page(html: Path, screenshot: Path | None = None) -> PageCheck:
    """Load one page in a browser of its own. Tests of many pages share the `chromium` fixture
    (tests/report/conftest.py), and cannot call this while it is open."""
    with launch_chromium() as chromium:
        return chromium.open_page(html, screenshot)


def variation(png: Path) -> float:
    """The fraction of pixels whose colour differs from the image's most common colour."""
    from PIL import Image

    with Image.open(png) as image:
        rgb = image.convert("RGB")
    pixels = rgb.width * rgb.height
    counts = rgb.getcolors(maxcolors=pixels)
    assert counts is not None  # maxcolors covers every pixel
    return 1 - max(count for count, _ in counts) / pixels


def is_blank(png: Path, min_variation: float = 1e-4) -> bool:
    """True when (almost) every pixel has one colour: fewer than 1 in 10,000 differ by default."""
    return variation(png) < min_variation
