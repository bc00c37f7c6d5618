"""The report's plots, written as SVG text to inline in report.html.

Each function takes the figures a build folder holds (verify.json, layers.csv, ...) and
returns one `<svg>` element, written here mark by mark (no plotting library: matplotlib's
import and layout cost a second of a cold build's CPU). Text is `<text>` in the page's own
sans-serif (no font file), ids are salted per plot so that several plots share one page, and
a build renders byte-identically twice. `Chart` is the little there is of a plotting library:
scales, ticks, axes, a legend.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# One palette for every plot: source/estimate blue, artifact/measured orange, failure red.
BLUE, ORANGE, RED, GREEN, GREY = "#1f77b4", "#ff7f0e", "#d62728", "#2ca02c", "#7f7f7f"
WIDTH = 720  # px of the viewBox; the page scales the SVG to its column
FONT = 12
DASHED, DOTTED = "6 4", "2 3"


@dataclass
class Scale:
    """Data -> pixels along one axis (`log`: log10), over [low, high]."""

    low: float
    high: float
    start: float  # px of `low`
    end: float  # px of `high`
    log: bool = False

    def __post_init__(self) -> None:
        if self.log:
            self.low, self.high = max(self.low, 1e-300), max(self.high, 1e-300)
        if self.high == self.low:  # one value: a range around it (high < low: drawn inverted)
            pad = abs(self.low) * 0.1 or 1.0
            self.low, self.high = self.low - pad, self.high + pad

    def __call__(self, value: float) -> float:
        a, b, v = self.low, self.high, value
        if self.log:
            a, b, v = math.log10(a), math.log10(b), math.log10(max(v, 1e-300))
        return self.start + (v - a) / (b - a) * (self.end - self.start)

    def ticks(self) -> list[float]:
        if self.log:
            first, last = math.floor(math.log10(self.low)), math.ceil(math.log10(self.high))
            step = max(1, (last - first) // 6)
            found = [10.0**e for e in range(first, last + 1, step)]
        else:
            raw = (self.high - self.low) / 6
            magnitude = 10 ** math.floor(math.log10(raw))
            step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
            k = math.ceil(self.low / step - 1e-9)
            found = []
            while k * step <= self.high + step * 1e-9:
                found.append(round(k * step, 12))
                k += 1
        return [t for t in found if self.low - 1e-12 <= t <= self.high * (1 + 1e-12) + 1e-12]


def label(value: float) -> str:
    """A tick's text: short, no trailing zeros; whole numbers with thousands separated."""
    if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
        exponent = math.floor(math.log10(abs(value)))
        mantissa = round(value / 10**exponent, 3)
        return f"1e{exponent}" if mantissa == 1 else f"{mantissa:g}e{exponent}"
    if value == int(value):
        return f"{int(value):,}"
    return f"{value:.4g}"


@dataclass
class Chart:
    """A plot area inside an SVG canvas: marks are written in data coordinates."""

    x: Scale
    y: Scale
    marks: list[str] = field(default_factory=list)

    def rect(self, x0: float, y0: float, x1: float, y1: float, color: str, cls: str = "") -> None:
        left, right = sorted((self.x(x0), self.x(x1)))
        top, bottom = sorted((self.y(y0), self.y(y1)))
        klass = f' class="{cls}"' if cls else ""
        self.marks.append(
            f'<rect{klass} x="{left:.1f}" y="{top:.1f}" width="{max(right - left, 0.5):.1f}" '
            f'height="{max(bottom - top, 0.5):.1f}" fill="{color}"/>'
        )

    def line(self, points: Sequence[tuple[float, float]], color: str, width: float = 1.5,
             dash: str = "", opacity: float = 1.0) -> None:  # fmt: skip
        coords = " ".join(f"{self.x(a):.1f},{self.y(b):.1f}" for a, b in points)
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        extra += f' stroke-opacity="{opacity}"' if opacity < 1 else ""
        self.marks.append(
            f'<polyline points="{coords}" fill="none" stroke="{color}" '
            f'stroke-width="{width}"{extra}/>'
        )

    def hline(self, value: float, color: str, dash: str = "") -> None:
        self.line([(self.x.low, value), (self.x.high, value)], color, 1.5, dash)

    def vline(self, value: float, color: str, dash: str = "") -> None:
        self.line([(value, self.y.low), (value, self.y.high)], color, 2, dash)

    def dot(self, a: float, b: float, color: str, radius: float = 3.0, fill: bool = True) -> None:
        paint = f'fill="{color}"' if fill else f'fill="none" stroke="{color}" stroke-width="2"'
        self.marks.append(
            f'<circle cx="{self.x(a):.1f}" cy="{self.y(b):.1f}" r="{radius}" {paint}/>'
        )

    def text(self, a: float, b: float, words: str, color: str = "#222", anchor: str = "start",
             dx: float = 0, dy: float = 0, size: int = FONT) -> None:  # fmt: skip
        self.marks.append(_text(self.x(a) + dx, self.y(b) + dy, words, color, anchor, size))


@dataclass
class Canvas:
    """An SVG of charts: their frames, ticks, labels and legends."""

    name: str
    width: float = WIDTH
    height: float = 290
    parts: list[str] = field(default_factory=list)
    defs: list[str] = field(default_factory=list)

    def chart(
        self, x: tuple[float, float, bool], y: tuple[float, float, bool],
        box: tuple[float, float, float, float] | None = None,
    ) -> Chart:  # fmt: skip
        """A chart in `box` (left, top, right, bottom px; default: the canvas less margins)."""
        left, top, right, bottom = box or (68, 30, self.width - 18, self.height - 46)
        return Chart(Scale(x[0], x[1], left, right, x[2]), Scale(y[0], y[1], bottom, top, y[2]))

    def frame(
        self, c: Chart, xlabel: str, ylabel: str = "", title: str = "",
        xticks: Sequence[tuple[float, str]] | None = None,
        yticks: Sequence[tuple[float, str]] | None = None, grid: bool = False,
    ) -> None:  # fmt: skip
        """The chart's marks inside its axes, with ticks (numbers, or the given labels)."""
        left, right, top, bottom = c.x.start, c.x.end, c.y.end, c.y.start
        out = [f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" '
               'fill="none" stroke="#444"/>']  # fmt: skip
        for value, words in xticks if xticks is not None else _numbers(c.x):
            px = c.x(value)
            if grid:
                out.append(_segment(px, top, px, bottom, "#ddd"))
            out.append(_segment(px, bottom, px, bottom + 4, "#444"))
            out.append(_text(px, bottom + 17, words, "#222", "middle"))
        for value, words in yticks if yticks is not None else _numbers(c.y):
            py = c.y(value)
            if grid:
                out.append(_segment(left, py, right, py, "#ddd"))
            out.append(_segment(left - 4, py, left, py, "#444"))
            out.append(_text(left - 7, py + 4, words, "#222", "end"))
        clip = f"{self.name}-clip-{len(self.defs)}"
        self.defs.append(
            f'<clipPath id="{clip}"><rect x="{left}" y="{top - 2}" width="{right - left}" '
            f'height="{bottom - top + 4}"/></clipPath>'
        )
        out.append(f'<g clip-path="url(#{clip})">{"".join(c.marks)}</g>')
        out.append(_text((left + right) / 2, bottom + 36, xlabel, "#222", "middle"))
        if ylabel:
            mid = (top + bottom) / 2
            out.append(
                f'<text x="14" y="{mid:.1f}" transform="rotate(-90 14 {mid:.1f})" '
                f'text-anchor="middle" font-size="{FONT}" fill="#222">{html.escape(ylabel)}</text>'
            )
        if title:
            out.append(_text((left + right) / 2, top - 10, title, "#222", "middle", FONT + 1))
        self.parts += out

    def legend(self, items: Sequence[tuple[str, str, str]], x: float, y: float) -> None:
        """(label, color, dash) rows, from the top-left corner (x, y)."""
        width = max(len(words) for words, _, _ in items) * 6.6 + 40
        rows = [f'<rect x="{x}" y="{y}" width="{width:.0f}" height="{len(items) * 18 + 8}" '
                'fill="white" fill-opacity="0.85" stroke="#ccc"/>']  # fmt: skip
        for k, (words, color, dash) in enumerate(items):
            rows += _key(x + 8, y + 16 + 18 * k, words, color, dash)
        self.parts += rows

    def svg(self) -> str:
        defs = f"<defs>{''.join(self.defs)}</defs>" if self.defs else ""
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {self.width:.0f} '
            f'{self.height:.0f}" font-family="system-ui, sans-serif" role="img">{defs}'
            f'<rect width="{self.width:.0f}" height="{self.height:.0f}" fill="white"/>'
            f"{''.join(self.parts)}</svg>"
        )


def _key(x: float, y: float, words: str, color: str, dash: str, size: int = FONT) -> list[str]:
    """One legend entry: a stretch of the line's stroke, then its words (baseline y)."""
    extra = f' stroke-dasharray="{dash}"' if dash else ""
    line = (
        f'<line x1="{x}" y1="{y - 4}" x2="{x + 22}" y2="{y - 4}" stroke="{color}" '
        f'stroke-width="2.5"{extra}/>'
    )
    return [line, _text(x + 28, y, words, "#222", size=size)]


def _numbers(scale: Scale) -> list[tuple[float, str]]:
    return [(t, label(t)) for t in scale.ticks()]


def _segment(x0: float, y0: float, x1: float, y1: float, color: str) -> str:
    return f'<line x1="{x0:.1f}" y1="{y0:.1f}" x2="{x1:.1f}" y2="{y1:.1f}" stroke="{color}"/>'


def _text(x: float, y: float, words: str, color: str, anchor: str = "start",
          size: int = FONT) -> str:  # fmt: skip
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}" '
        f'fill="{color}">{html.escape(words)}</text>'
    )


def latency(samples_ms: Sequence[float], p50: float, p90: float) -> str:
    """A histogram of the timed runs with p50 and p90 marked; log-spaced when the slowest run
    is over ten times the fastest (one scheduler hiccup would squash a linear one)."""
    import numpy as np

    values = np.asarray(samples_ms, dtype=float)
    low, high = float(values.min()), float(values.max())
    log = bool(low > 0 and high / low > 10)
    edges = np.geomspace(low, high, 41) if log else np.histogram_bin_edges(values, 40)
    counts, edges = np.histogram(values, bins=edges)
    canvas = Canvas("latency")
    c = canvas.chart(
        (float(edges[0]), float(edges[-1]), log), (0, float(counts.max()) * 1.1, False)
    )
    for k, count in enumerate(counts):
        if count:
            c.rect(float(edges[k]), 0, float(edges[k + 1]), float(count), BLUE, "bar")
    c.vline(p50, ORANGE)
    c.vline(p90, RED, DASHED)
    canvas.frame(c, "milliseconds per inference", "runs", f"{len(values)} timed runs")
    items = [(f"p50 {p50:.4g} ms", ORANGE, ""), (f"p90 {p90:.4g} ms", RED, DASHED)]
    canvas.legend(items, c.x.end - 150, c.y.end + 6)
    return canvas.svg()


def output_sqnr(outputs: Sequence[dict[str, Any]], threshold_db: float | None) -> str:
    """Each output's SQNR against the source model (exact outputs drawn at the top, marked),
    with the recipe's minimum."""
    names = [str(o.get("name", o["index"])) for o in outputs]
    values = [o.get("sqnr_db") for o in outputs]
    finite = [v for v in values if v is not None and math.isfinite(v)]
    top = max([*finite, threshold_db or 0.0, 1.0]) * 1.15
    left = 16 + 7 * min(max(len(n) for n in names), 24)
    above = 40 if threshold_db is not None else 16  # the legend's row, over the bars
    canvas = Canvas("outputs", height=max(120, 30 * len(outputs) + 74 + above))
    c = canvas.chart(
        (min([0.0, *finite]), top * 1.12, False),
        (len(names) - 0.5, -0.5, False),
        (left, above, WIDTH - 18, canvas.height - 46),
    )
    for k, v in enumerate(values):
        drawn = top if v is not None and v == math.inf else (v or 0.0)
        color = (
            GREY if v is None else RED if threshold_db is not None and v < threshold_db else BLUE
        )
        c.rect(0, k - 0.35, drawn, k + 0.35, color, "bar")
        words = "n/a" if v is None else "exact" if v == math.inf else f"{v:.1f} dB"
        c.text(max(drawn, 0), k, words, dx=4, dy=4)
    if threshold_db is not None:
        c.vline(threshold_db, RED, DASHED)
    ticks = [(k, short_name(n, 24)) for k, n in enumerate(names)]
    canvas.frame(c, "SQNR against the source model (dB; higher is closer)", yticks=ticks)
    if threshold_db is not None:
        canvas.legend([(f"minimum {threshold_db:g} dB", RED, DASHED)], c.x.end - 150, 4)
    return canvas.svg()


def _blues(share: float) -> str:
    """A light-to-dark blue for 0..1 (as matplotlib's Blues, approximately)."""
    light, dark = (247, 251, 255), (8, 48, 107)
    rgb = (round(a + (b - a) * share) for a, b in zip(light, dark, strict=True))
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def confusion(name: str, matrix: Sequence[Sequence[int]]) -> str:
    """Which class the artifact picked (columns) for each class the source picked (rows), as
    the share of the row; counts written in the cells."""
    classes = len(matrix)
    cell = max(8.0, min(40.0, 400.0 / classes))
    side = cell * classes
    canvas = Canvas(f"confusion-{name}", width=side + 190, height=side + 90)
    c = canvas.chart((-0.5, classes - 0.5, False), (classes - 0.5, -0.5, False),
                     (68, 30, 68 + side, 30 + side))  # fmt: skip
    for i, row in enumerate(matrix):
        total = sum(row)
        for j, count in enumerate(row):
            share = count / total if total else 0.0
            c.rect(j - 0.5, i - 0.5, j + 0.5, i + 0.5, _blues(share), "cell")
            if count and classes <= 16:
                color = "white" if share > 0.6 else "black"
                c.text(j, i, str(count), color, "middle", dy=4, size=11)
    every = 1 if classes <= 16 else max(1, classes // 8)
    ticks = [(k, str(k)) for k in range(0, classes, every)]
    title = f"'{name}': source vs artifact predictions"
    canvas.frame(c, "class the artifact picked", "class the source model picked", title,
                 xticks=ticks, yticks=ticks)  # fmt: skip
    gradient = f"{canvas.name}-share"
    stops = "".join(
        f'<stop offset="{k / 4:g}" stop-color="{_blues(1 - k / 4)}"/>' for k in range(5)
    )
    canvas.defs.append(
        f'<linearGradient id="{gradient}" x1="0" y1="0" x2="0" y2="1">{stops}</linearGradient>'
    )
    x = 68 + side + 24
    canvas.parts.append(
        f'<rect x="{x}" y="30" width="14" height="{side}" fill="url(#{gradient})" stroke="#444"/>'
    )
    for k in range(5):
        y = 30 + side * (1 - k / 4)
        canvas.parts.append(_segment(x + 14, y, x + 18, y, "#444"))
        canvas.parts.append(_text(x + 21, y + 4, f"{k / 4:g}", "#222"))
    mid = 30 + side / 2
    canvas.parts.append(
        f'<text x="{x + 62}" y="{mid}" transform="rotate(-90 {x + 62} {mid})" '
        f'text-anchor="middle" font-size="{FONT}" fill="#222">share of the row</text>'
    )
    return canvas.svg()


def per_class_agreement(name: str, picked: Sequence[int], agreed: Sequence[int]) -> str:
    """Per class the source model picked: the share of those samples the artifact agreed on
    (for outputs with too many classes for a confusion matrix)."""
    rates = [(k, a / p) for k, (p, a) in enumerate(zip(picked, agreed, strict=True)) if p > 0]
    canvas = Canvas(f"per-class-{name}")
    c = canvas.chart((-0.5, len(picked) - 0.5, False), (0, 1.05, False))
    for k, rate in rates:
        c.rect(k - 0.5, 0, k + 0.5, rate, BLUE, "bar")
    for k, rate in sorted(rates, key=lambda r: r[1])[:3]:
        if rate < 1:
            c.text(k, rate, f"class {k}: {rate:.2f}", RED, dx=4, dy=-4, size=10)
    title = f"'{name}': agreement per class ({len(rates)} classes seen)"
    canvas.frame(c, "class the source model picked", "top-1 agreement", title)
    return canvas.svg()


def layer_error(
    rows: Sequence[dict[str, str]], first: str | None, threshold_db: float | None
) -> str:
    """SQNR of every compared tensor along the graph (the artifact's tensor in its runtime
    against the source's), the divergence threshold and the first divergence marked."""
    sqnr = [float(r["sqnr_db"]) for r in rows]
    finite = [v for v in sqnr if math.isfinite(v)]
    top = max([*finite, threshold_db or 0.0, 1.0]) * 1.1
    drawn = [top if v == math.inf else v for v in sqnr]
    canvas = Canvas("layers", height=320)
    bottom = min([*finite, 0.0])
    c = canvas.chart((-0.5, max(len(rows) - 0.5, 0.5), False), (bottom, top * 1.08, False))
    c.line(list(enumerate(drawn)), BLUE)
    for k, v in enumerate(drawn):
        c.dot(k, v, BLUE)
    items = [("SQNR", BLUE, "")]
    if threshold_db is not None:
        c.hline(threshold_db, RED, DASHED)
        items.append((f"divergence {threshold_db:g} dB", RED, DASHED))
    names = [r["tensor"] for r in rows]
    if first is not None and first in names:
        k = names.index(first)
        c.dot(k, drawn[k], RED, radius=8, fill=False)
        words = f"first divergence: {short_name(first)} ({rows[k]['op']})"
        c.text(k, drawn[k], words, RED, "start" if k < len(rows) / 2 else "end", 10, 18)
    canvas.frame(c, f"compared tensor, in graph order ({len(rows)} tensors)", "SQNR (dB)")
    canvas.legend(items, c.x.end - 190, c.y.end + 6)
    return canvas.svg()


def memory(
    rows: Sequence[dict[str, str]],
    ram_bytes: int | None,
    peak_node: str | None,
    measured_arena: int | None,
    predicted_arena: int | None,
) -> str:
    """The estimated activation bytes alive at each layer (log scale), the board's RAM, the
    peak, and the arena the runtime measured beside the estimate."""
    alive = [max(int(r["alive_bytes"]), 1) for r in rows]
    nodes = [r["node"] for r in rows]
    peak = nodes.index(peak_node) if peak_node in nodes else alive.index(max(alive))
    lines = [
        (ram_bytes, f"board RAM {ram_bytes or 0:,} B", GREY, ""),
        (predicted_arena, f"arena estimate {predicted_arena or 0:,} B", BLUE, DOTTED),
        (measured_arena, f"arena measured {measured_arena or 0:,} B", ORANGE, DASHED),
    ]
    shown = [(v, words, color, dash) for v, words, color, dash in lines if v]
    high = max([*alive, *(v for v, _, _, _ in shown)]) * 3
    canvas = Canvas("memory", height=340 if shown else 310)
    box = (68, 30, WIDTH - 18, 340 - 46 - 34 if shown else 310 - 46)
    c = canvas.chart((-0.6, len(rows) - 0.4, False), (min(alive) / 2, high, True), box)
    for k, a in enumerate(alive):
        c.rect(k - 0.45, c.y.low, k + 0.45, a, RED if k == peak else BLUE, "bar")
    c.text(peak, alive[peak], f"peak {alive[peak]:,} B at {short_name(nodes[peak])}", RED, "middle",
           dy=-6)  # fmt: skip
    for value, _, color, dash in shown:
        assert value is not None
        c.hline(value, color, dash)
    canvas.frame(c, f"layer, in execution order ({len(rows)} layers)", "activation bytes alive")
    for k, (_, words, color, dash) in enumerate(shown):  # one row under the axes
        canvas.parts += _key(68 + k * 215, canvas.height - 14, words, color, dash, 11)
    return canvas.svg()


def npu_layers(rows: Sequence[dict[str, str]]) -> str:
    """Vela's estimated cycles of each layer along the graph (its per-layer CSV), the layers
    it left to the CPU marked (Vela times none of those: a red band and "CPU")."""
    cycles = [int(float(r["Op Cycles"])) for r in rows]
    top = max([*cycles, 1]) * 1.15
    canvas = Canvas("npu", height=320)
    c = canvas.chart((-0.6, len(rows) - 0.4, False), (0, top, False))
    on_cpu = 0
    for k, (row, n) in enumerate(zip(rows, cycles, strict=True)):
        if row["Target"] != "NPU":
            on_cpu += 1
            c.rect(k - 0.45, 0, k + 0.45, top, "#f8d0d0", "band")
            c.text(k, top * 0.94, "CPU", RED, "middle", size=10)
        elif n:
            c.rect(k - 0.45, 0, k + 0.45, n, BLUE, "bar")
    title = f"{len(rows)} layers as Vela lowered them; {on_cpu} on the CPU"
    canvas.frame(c, "layer, in graph order (vela_per_layer.csv)", "cycles (Vela's estimate)", title)
    return canvas.svg()


def npu_memory(used: Sequence[tuple[str, int, int | None]]) -> str:
    """(what, bytes Vela allocates, the board's bytes or None) as bar pairs on a log scale."""
    values = [v for _, a, b in used for v in (a, b) if v]
    canvas = Canvas("npu-memory", height=260)
    c = canvas.chart((-0.6, len(used) - 0.4, False), (min(values) / 2, max(values) * 3, True))
    for k, (_, allocated, limit) in enumerate(used):
        color = RED if limit is not None and allocated > limit else BLUE
        c.rect(k - 0.4, c.y.low, k - 0.02, max(allocated, 1), color, "bar")
        c.text(k - 0.21, max(allocated, 1), f"{allocated:,} B", "#222", "middle", dy=-5, size=10)
        if limit is not None:
            c.rect(k + 0.02, c.y.low, k + 0.4, limit, GREY, "bar")
            c.text(k + 0.21, limit, f"board {limit:,} B", "#222", "middle", dy=-5, size=10)
    ticks = [(k, what) for k, (what, _, _) in enumerate(used)]
    canvas.frame(c, "Vela's allocation (left) against the board (right)", "bytes", xticks=ticks)
    return canvas.svg()


def sweep(builds: Sequence[dict[str, Any]], quality: str, latency: str = "latency_p50_ms") -> str:
    """Every verified build of a sweep as a point: `quality` (accuracy or agreement) against
    `latency` (left: the p50, or an NPU's estimated time) and size (right). Stars:
    Pareto-optimal over all the sweep's
    objectives; the line: each recipe's front in the panel's own two figures. Each point
    links to its build's report (its row's "link")."""
    recipes = sorted({b["recipe"] for b in builds})
    colors = [BLUE, ORANGE, GREEN, RED, "#9467bd", "#8c564b", "#e377c2", GREY]
    canvas = Canvas("sweep", width=WIDTH, height=330)
    qualities = [float(b[quality]) for b in builds]
    q_low, q_high = min(qualities), max(qualities)
    pad = (q_high - q_low) * 0.1 or 0.01
    half = (WIDTH - 68 - 18 - 30) / 2
    legend: list[tuple[str, str, str]] = []
    for panel, (x_key, x_label) in enumerate(
        (
            (latency, "p50 latency (ms)" if latency == "latency_p50_ms" else "NPU, est. (ms)"),
            ("size_bytes", "artifact size (bytes)"),
        )
    ):
        xs = [float(b[x_key]) for b in builds]
        log = min(xs) > 0 and max(xs) / min(xs) > 20
        span = (max(xs) - min(xs)) * 0.15 or abs(max(xs)) * 0.1 or 1.0
        x_range = (min(xs) / 1.5, max(xs) * 1.5) if log else (min(xs) - span, max(xs) + span)
        left = 68 + panel * (half + 30)
        c = canvas.chart((*x_range, log), (q_low - pad, q_high + pad, False),
                         (left, 30, left + half, 330 - 46))  # fmt: skip
        for k, recipe in enumerate(recipes):
            color = colors[k % len(colors)]
            own = [b for b in builds if b["recipe"] == recipe]
            front = _front(own, x_key, quality)
            steps: list[tuple[float, float]] = []
            for b in front:  # a step line: flat until the next build of the front
                if steps:
                    steps.append((float(b[x_key]), steps[-1][1]))
                steps.append((float(b[x_key]), float(b[quality])))
            if len(steps) > 1:
                c.line(steps, color, 1.5, opacity=0.5)
            for b in own:
                x, y = c.x(float(b[x_key])), c.y(float(b[quality]))
                mark = _star(x, y, 9, color) if b["pareto"] else (
                    f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5" fill="{color}"/>'
                )  # fmt: skip
                link = b.get("link")
                c.marks.append(f'<a href="{html.escape(link)}">{mark}</a>' if link else mark)
                if len(builds) <= 12:  # named beside it, towards the middle
                    right = x > (c.x.start + c.x.end) / 2
                    c.marks.append(
                        _text(x - 5 if right else x + 5, y - 8, b["build"], "#333",
                              "end" if right else "start", 9)
                    )  # fmt: skip
            if panel == 0:
                legend.append((recipe, color, ""))
        canvas.frame(c, x_label, quality if panel == 0 else "", grid=True,
                     yticks=None if panel == 0 else [])  # fmt: skip
    canvas.legend(legend, 76, 36)  # the caption says what the stars are
    return canvas.svg()


def _star(x: float, y: float, radius: float, color: str) -> str:
    points = []
    for k in range(10):
        r = radius if k % 2 == 0 else radius * 0.45
        angle = math.pi / 2 + k * math.pi / 5
        points.append(f"{x + r * math.cos(angle):.1f},{y - r * math.sin(angle):.1f}")
    return f'<polygon points="{" ".join(points)}" fill="{color}" stroke="black"/>'


def _front(builds: Sequence[dict[str, Any]], x_key: str, quality: str) -> list[dict[str, Any]]:
    """The builds no other beats on both `x_key` (lower) and `quality` (higher), by x."""
    front = [
        b
        for b in builds
        if not any(
            o[x_key] <= b[x_key]
            and o[quality] >= b[quality]
            and (o[x_key] < b[x_key] or o[quality] > b[quality])
            for o in builds
        )
    ]
    return sorted(front, key=lambda b: b[x_key])


def short_name(name: str, limit: int = 40) -> str:
    """A tensor or node name short enough for a label (TFLite joins fused names with ';')."""
    name = name.split(";")[0]
    return name if len(name) <= limit else "..." + name[-(limit - 3) :]
