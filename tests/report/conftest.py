"""One headless Chromium per test module, for the pages its tests open."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.browser import Chromium, launch_chromium


@pytest.fixture(scope="module")
def chromium() -> Iterator[Chromium]:
    with launch_chromium() as browser:
        yield browser
