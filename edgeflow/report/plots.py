"""The report's plots, drawn with matplotlib as SVG text to inline in report.html.

Each function takes the figures a build folder holds (verify.json, layers.csv, ...) and
returns one `<svg>` element. No pyplot: figures are plain objects (no global state), text is
drawn as paths (no font files), and element ids are salted per plot, so that several plots
can share one page and a build renders byte-identically twice.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

# One palette for every plot: source/estimate blue, artifact/measured orange, failure red.
BLUE, ORANGE, RED, GREEN, GREY = "#1f77b4", "#ff7f0e", "#d62728", "#2ca02c", "#7f7f7f"
WIDTH = 7.5  # inches; the page scales the SVG to its column


def _figure(height: float = 3.0, width: float = WIDTH) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _svg(fig: Any, name: str) -> str:
    """The figure as an inline <svg> element, sized by the page, ids salted by `name`."""
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": name}):
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    text = text[text.index("<svg") :]
    head, rest = text.split(">", 1)
    for attribute in ("width", "height"):  # the viewBox keeps the aspect; CSS sets the size
        start = head.find(f' {attribute}="')
        if start >= 0:
            end = head.index('"', start + len(attribute) + 3)
            head = head[:start] + head[end + 1 :]
    return f'{head} role="img">{rest}'


def latency(samples_ms: Sequence[float], p50: float, p90: float) -> str:
    """A histogram of the timed runs with p50 and p90 marked; log-spaced when the slowest run
    is over ten times the fastest (one scheduler hiccup would squash a linear one)."""
    import numpy as np

    fig = _figure()
    ax = fig.add_subplot()
    values = np.asarray(samples_ms, dtype=float)
    low, high = float(values.min()), float(values.max())
    if low > 0 and high / low > 10:
        bins: Any = np.geomspace(low, high, 40)
        ax.set_xscale("log")
    else:
        bins = 40
    ax.hist(values, bins=bins, color=BLUE, alpha=0.8)
    ax.axvline(p50, color=ORANGE, linewidth=2, label=f"p50 {p50:.4g} ms")
    ax.axvline(p90, color=RED, linewidth=2, linestyle="--", label=f"p90 {p90:.4g} ms")
    ax.set_xlabel("milliseconds per inference")
    ax.set_ylabel("runs")
    ax.set_title(f"{len(values)} timed runs")
    ax.legend()
    return _svg(fig, "latency")


def output_sqnr(outputs: Sequence[dict[str, Any]], threshold_db: float | None) -> str:
    """Each output's SQNR against the source model (exact outputs drawn at the top, marked),
    with the recipe's minimum."""
    names = [str(o.get("name", o["index"])) for o in outputs]
    values = [o.get("sqnr_db") for o in outputs]
    finite = [v for v in values if v is not None and math.isfinite(v)]
    top = max([*finite, threshold_db or 0.0, 1.0]) * 1.15
    fig = _figure(max(1.6, 0.45 * len(outputs) + 1.2))
    ax = fig.add_subplot()
    drawn = [top if v is not None and v == math.inf else (v or 0.0) for v in values]
    colors = [
        GREY if v is None else RED if threshold_db is not None and v < threshold_db else BLUE
        for v in values
    ]
    bars = ax.barh(range(len(names)), drawn, color=colors)
    labels = ["n/a" if v is None else "exact" if v == math.inf else f"{v:.1f} dB" for v in values]
    ax.bar_label(bars, labels, padding=3)
    if threshold_db is not None:
        ax.axvline(threshold_db, color=RED, linestyle="--", label=f"minimum {threshold_db:g} dB")
        ax.legend(loc="lower right")
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlim(min([0.0, *finite]), top * 1.12)
    ax.set_xlabel("SQNR against the source model (dB; higher is closer)")
    return _svg(fig, "outputs")


def confusion(name: str, matrix: Sequence[Sequence[int]]) -> str:
    """Which class the artifact picked (columns) for each class the source picked (rows), as
    the share of the row; counts written in the cells."""
    import numpy as np

    counts = np.asarray(matrix, dtype=float)
    rows = counts.sum(axis=1, keepdims=True)
    share = np.divide(counts, rows, out=np.zeros_like(counts), where=rows > 0)
    classes = len(counts)
    side = min(6.0, 1.6 + 0.35 * classes)
    fig = _figure(side, width=side + 1.4)  # square cells, and the colour bar beside them
    ax = fig.add_subplot()
    image = ax.imshow(share, cmap="Blues", vmin=0, vmax=1)
    if classes <= 16:
        for i in range(classes):
            for j in range(classes):
                if counts[i, j]:
                    color = "white" if share[i, j] > 0.6 else "black"
                    ax.text(j, i, f"{int(counts[i, j])}", ha="center", va="center", color=color)
    ticks = range(classes) if classes <= 16 else range(0, classes, max(1, classes // 8))
    ax.set_xticks(list(ticks))
    ax.set_yticks(list(ticks))
    ax.set_xlabel("class the artifact picked")
    ax.set_ylabel("class the source model picked")
    ax.set_title(f"'{name}': source vs artifact predictions")
    fig.colorbar(image, ax=ax, label="share of the row")
    return _svg(fig, f"confusion-{name}")


def per_class_agreement(name: str, picked: Sequence[int], agreed: Sequence[int]) -> str:
    """Per class the source model picked: the share of those samples the artifact agreed on
    (for outputs with too many classes for a confusion matrix)."""
    import numpy as np

    total, same = np.asarray(picked, dtype=float), np.asarray(agreed, dtype=float)
    present = total > 0
    rate = np.divide(same, total, out=np.ones_like(total), where=present)
    fig = _figure()
    ax = fig.add_subplot()
    classes = np.arange(len(total))
    ax.bar(classes[present], rate[present], width=1.0, color=BLUE)
    worst = np.argsort(np.where(present, rate, 2.0))[:3]
    for c in worst:
        if present[c] and rate[c] < 1:
            ax.annotate(f"class {c}: {rate[c]:.2f}", (c, rate[c]), color=RED, fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("class the source model picked")
    ax.set_ylabel("top-1 agreement")
    ax.set_title(f"'{name}': agreement per class ({int(present.sum())} classes seen)")
    return _svg(fig, f"per-class-{name}")


def layer_error(
    rows: Sequence[dict[str, str]], first: str | None, threshold_db: float | None
) -> str:
    """SQNR of every compared tensor along the graph (the artifact's tensor in its runtime
    against the source's), the divergence threshold and the first divergence marked."""
    sqnr = [float(r["sqnr_db"]) for r in rows]
    finite = [v for v in sqnr if math.isfinite(v)]
    top = max([*finite, threshold_db or 0.0, 1.0]) * 1.1
    drawn = [top if v == math.inf else v for v in sqnr]
    fig = _figure(3.4)
    ax = fig.add_subplot()
    ax.plot(range(len(rows)), drawn, marker="o", markersize=3, color=BLUE, label="SQNR")
    if threshold_db is not None:
        ax.axhline(threshold_db, color=RED, linestyle="--", label=f"divergence {threshold_db:g} dB")
    names = [r["tensor"] for r in rows]
    if first is not None and first in names:
        k = names.index(first)
        ax.plot([k], [drawn[k]], marker="o", markersize=10, color=RED, fillstyle="none")
        ax.annotate(
            f"first divergence: {_short(first)} ({rows[k]['op']})",
            (k, drawn[k]),
            xytext=(8, -14),
            textcoords="offset points",
            color=RED,
        )
    ax.set_xlabel(f"compared tensor, in graph order ({len(rows)} tensors)")
    ax.set_ylabel("SQNR (dB)")
    ax.legend(loc="upper right")
    return _svg(fig, "layers")


def memory(
    rows: Sequence[dict[str, str]],
    ram_bytes: int | None,
    peak_node: str | None,
    measured_arena: int | None,
    predicted_arena: int | None,
) -> str:
    """The estimated activation bytes alive at each layer (log scale), the board's RAM, the
    peak, and the arena the runtime measured beside the estimate."""
    alive = [int(r["alive_bytes"]) for r in rows]
    nodes = [r["node"] for r in rows]
    peak = nodes.index(peak_node) if peak_node in nodes else alive.index(max(alive))
    fig = _figure(3.4)
    ax = fig.add_subplot()
    colors = [RED if k == peak else BLUE for k in range(len(rows))]
    ax.bar(range(len(rows)), [max(a, 1) for a in alive], width=0.9, color=colors)
    ax.set_yscale("log")
    ax.minorticks_off()  # decades suffice; minor ticks on a log axis cost a third of the page
    ax.annotate(
        f"peak {alive[peak]:,} B at {_short(nodes[peak])}",
        (peak, max(alive[peak], 1)),
        xytext=(0, 6),
        textcoords="offset points",
        ha="center",
        color=RED,
    )
    if ram_bytes:
        ax.axhline(ram_bytes, color=GREY, linestyle="-", label=f"board RAM {ram_bytes:,} B")
    if predicted_arena:
        label = f"arena estimate {predicted_arena:,} B"
        ax.axhline(predicted_arena, color=BLUE, linestyle=":", label=label)
    if measured_arena:
        label = f"arena measured {measured_arena:,} B"
        ax.axhline(measured_arena, color=ORANGE, linestyle="--", label=label)
    ax.set_xlabel(f"layer, in execution order ({len(rows)} layers)")
    ax.set_ylabel("activation bytes alive")
    if ram_bytes or predicted_arena or measured_arena:
        fig.legend(loc="outside lower center", ncols=3, fontsize=8)
    return _svg(fig, "memory")


def sweep(builds: Sequence[dict[str, Any]], quality: str) -> str:
    """Every verified build of a sweep as a point: `quality` (accuracy or agreement) against
    p50 latency (left) and size (right). Stars: Pareto-optimal over all the sweep's
    objectives; the line: each recipe's front in the panel's own two figures. Each point
    links to its build's report (its row's "link")."""
    import numpy as np

    fig = _figure(3.8)
    axes = fig.subplots(1, 2, sharey=True)
    recipes = sorted({b["recipe"] for b in builds})
    colors = [BLUE, ORANGE, GREEN, RED, "#9467bd", "#8c564b", "#e377c2", GREY]
    for ax, x_key, x_label in (
        (axes[0], "latency_p50_ms", "p50 latency (ms)"),
        (axes[1], "size_bytes", "artifact size (bytes)"),
    ):
        for k, recipe in enumerate(recipes):
            color = colors[k % len(colors)]
            own = [b for b in builds if b["recipe"] == recipe]
            for pareto, marker, size in ((False, "o", 40), (True, "*", 150)):
                group = [b for b in own if b["pareto"] == pareto]
                if not group:
                    continue
                points = ax.scatter(
                    [b[x_key] for b in group],
                    [b[quality] for b in group],
                    marker=marker,
                    s=size,
                    color=color,
                    edgecolors="black" if pareto else "none",
                    label=f"{recipe}{' (Pareto-optimal)' if pareto else ''}"
                    if ax is axes[0]
                    else None,
                    zorder=3,
                )
                points.set_urls([b.get("link") for b in group])
            front = _front(own, x_key, quality)
            ax.step(
                [b[x_key] for b in front],
                [b[quality] for b in front],
                where="post",
                color=color,
                alpha=0.5,
            )
            if len(builds) <= 12:
                for b in own:
                    label = ax.annotate(
                        b["build"],
                        (b[x_key], b[quality]),
                        xytext=(4, 6),
                        textcoords="offset points",
                        fontsize=7,
                        color="#333",
                        annotation_clip=True,
                        clip_on=True,
                    )
                    label.set_in_layout(False)  # a long name must not squeeze the axes
        values = np.asarray([b[x_key] for b in builds], dtype=float)
        if values.size and values.min() > 0 and values.max() / values.min() > 20:
            ax.set_xscale("log")
        ax.set_xlabel(x_label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(quality)
    axes[0].legend(fontsize=8)
    return _svg(fig, "sweep")


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


def _short(name: str, limit: int = 40) -> str:
    """A tensor or node name short enough for a label (TFLite joins fused names with ';')."""
    name = name.split(";")[0]
    return name if len(name) <= limit else "..." + name[-(limit - 3) :]
