"""Starting the browser check: a page in a browser of its own, and what happens when Chromium or
playwright is missing (a skip, but a failure under CI, which installs both)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests import browser, needs


def test_open_page_launches_a_browser_of_its_own(tmp_path: Path) -> None:
    page = tmp_path / "page.html"
    page.write_text("<title>alone</title><p>one page", encoding="utf-8")

    check = browser.open_page(page)

    assert (check.title, check.text, check.requests) == ("alone", "one page", ())


@pytest.mark.parametrize("ci", ["", "true"])
def test_a_missing_chromium_skips_but_fails_under_ci(
    monkeypatch: pytest.MonkeyPatch, ci: str
) -> None:
    monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(needs.shutil, "which", lambda name, path=None: None)
    outcome = pytest.fail.Exception if ci else pytest.skip.Exception

    with pytest.raises(outcome, match="install Chromium with sudo apt-get install -y chromium"):
        browser.open_page(Path("unused.html"))


@pytest.mark.parametrize("ci", ["", "true"])
def test_a_missing_playwright_skips_but_fails_under_ci(
    monkeypatch: pytest.MonkeyPatch, ci: str
) -> None:
    monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(needs.shutil, "which", lambda name, path=None: "/usr/bin/chromium")
    monkeypatch.setitem(sys.modules, "playwright.sync_api", None)  # import raises ImportError
    outcome = pytest.fail.Exception if ci else pytest.skip.Exception

    with pytest.raises(outcome, match=r"install playwright with pip install -c constraints.txt"):
        browser.open_page(Path("unused.html"))
