"""Tests of report.html and sweep.html; helpers other test modules use on the pages."""

from __future__ import annotations

import re

DEMO = "onnxruntime_micro-int8"  # the demo's build folder name


def plots_in(html: str) -> list[str]:
    """The names of a report page's plots, in page order."""
    return re.findall(r'<figure class="plot[^"]*" id="plot-([^"]+)"><svg', html)
