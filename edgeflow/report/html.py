"""report.html and sweep.html: the report as a page people look at, self-contained.

A build's page is made from the files of its build folder alone (report.json, metrics.json,
checks.json, verify.json, precheck.json and the CSV tables), so `edgeflow report BUILD_DIR`
can make it again. It holds the report's sections (report.json: the record report.md is
joined from, rendered with markdown-it, raw HTML off) with the plots drawn from the same
figures, inline as SVG: no script, no font, no request leaves the page.
"""

from __future__ import annotations

import csv
import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edgeflow.core.records import read_record
from edgeflow.report import npu, plots

# The files of a build folder the page is made from; the first five are always there.
REQUIRED = ("report.json", "metrics.json", "checks.json", "verify.json", "precheck.json")
OPTIONAL = ("layers.csv", "layers_diff.csv", "diff.json", npu.LAYERS_FILE)
SOURCES = (*REQUIRED, *OPTIONAL)

STYLE = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0;
  color: #1d1d1f; background: #fafafa; }
main { max-width: 980px; margin: 0 auto; padding: 24px 28px 48px; background: #fff; }
h1 { font-size: 1.5em; margin: 0 0 6px; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; }
.verdict { display: inline-block; padding: 4px 12px; border-radius: 4px; font-weight: 700;
  color: #fff; margin: 6px 0; }
.verdict.pass { background: #2e7d32; } .verdict.fail { background: #c62828; }
.verdict.unverified { background: #6d6d6d; }
.summary { color: #444; margin: 4px 0 12px; }
table { border-collapse: collapse; margin: 8px 0; font-size: 0.92em; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
td.pass { color: #2e7d32; font-weight: 600; } td.fail { color: #c62828; font-weight: 700; }
code { background: #f2f2f2; padding: 0 3px; border-radius: 3px; font-size: 0.92em; }
figure.plot { margin: 14px 0; } figure.plot svg { width: 100%; height: auto; }
figure.plot.square svg { max-width: 560px; }
figcaption { color: #555; font-size: 0.9em; }
.note { color: #555; }
"""


def render_build(files: Mapping[str, Path]) -> str:
    """The build's page from its files (name -> path); see SOURCES."""
    missing = [name for name in REQUIRED if name not in files]
    if missing:
        raise FileNotFoundError(f"a build's report needs {', '.join(missing)}")
    report = read_record("report_record", files["report.json"])
    metrics = read_record("metrics", files["metrics.json"]).dump()
    checks = read_record("checks", files["checks.json"]).dump()
    verify = read_record("verify", files["verify.json"]).dump()
    precheck = read_record("precheck", files["precheck.json"]).dump()
    title = report.title
    # Thresholds: drawn from checks.json, with pass and FAIL marked
    sections = {s.heading: s.body for s in report.sections if s.heading != "Thresholds"}
    body = [_header(title, metrics), _thresholds(checks), _markdown(report.intro)]
    verified = not metrics.get("not_verified")
    if verified:
        body.append(_latency(verify))
    if verified and "Per output" not in sections:  # no per-output table: plots alone
        body.append(_outputs(verify, checks, ""))
    for heading, part in sections.items():
        if heading == "Stages":  # what the build found along the graph, then how it ran
            if verified and "layers_diff.csv" in files and "diff.json" in files:
                diff = read_record("diff", files["diff.json"]).dump()
                body.append(_layers(_rows(files["layers_diff.csv"]), diff))
            if "layers.csv" in files:
                body.append(_memory(_rows(files["layers.csv"]), precheck, metrics))
        if heading == "Per output" and verified:
            body.append(_outputs(verify, checks, part))
        elif heading == npu.HEADING and npu.LAYERS_FILE in files:
            body.append(_npu(part, _rows(files[npu.LAYERS_FILE]), metrics, checks))
        else:
            body.append(_section(heading, _markdown(part)))
    return _page(title, "".join(body))


def render_sweep(
    rows: Sequence[dict[str, Any]], links: Mapping[int, str], latency: str = "latency_p50_ms"
) -> str:
    """A sweep's page: every build as a point (quality vs `latency`, the rows' key that
    edgeflow.report.sweep ranks, and size), the Pareto front drawn, each point and row linking
    to its build's report (`links`: row index -> href)."""
    rows = [{**r, "link": links.get(k)} for k, r in enumerate(rows)]
    verified = [r for r in rows if r["status"] == "verified"]
    quality = next(
        (q for q in ("accuracy", "agreement", "sqnr_db") if verified and _all_set(verified, q)),
        None,
    )
    parts = [
        '<header><h1>Sweep</h1><p class="summary">'
        f"{len(rows)} builds, {len(verified)} verified, "
        f"{sum(bool(r.get('pareto')) for r in rows)} Pareto-optimal (no other verified build "
        "of the same recipe is as good on every objective and better on one)</p></header>"
    ]
    if quality is not None and _all_set(verified, latency, "size_bytes"):
        against = (
            "the NPU's time as Vela estimates it" if latency == "npu_latency_ms" else "p50 latency"
        )
        parts.append(
            _plot(
                "sweep",
                plots.sweep(verified, quality, latency),
                f"{quality} against {against} and artifact size. Stars: Pareto-optimal over "
                "every objective of the table; lines: each recipe's front in the panel's two "
                "figures. Click a point for its build's report.",
            )
        )
    else:
        parts.append('<p class="note">No verified build with figures to plot.</p>')
    parts.append(_sweep_table(rows))
    return _page("edgeflow sweep", "".join(parts))


def build_files(folder: Path) -> dict[str, Path]:
    """The files of a build folder the page is made from."""
    return {name: folder / name for name in SOURCES if (folder / name).is_file()}


# ---- the build's sections ------------------------------------------------------------------


def _header(title: str, metrics: dict[str, Any]) -> str:
    from edgeflow.report.markdown import one_line

    if metrics.get("not_verified"):
        verdict, kind = "NOT VERIFIED: not run here", "unverified"
    elif metrics["verified"]:
        verdict, kind = "VERIFIED", "pass"
    else:
        verdict, kind = "NOT VERIFIED: a threshold missed", "fail"
    return (
        f"<header><h1>{_e(title)}</h1>"
        f'<div class="verdict {kind}" id="verdict">{verdict}</div>'
        f'<p class="summary">{_e(one_line(metrics))}</p></header>'
    )


def _thresholds(checks: list[dict[str, Any]]) -> str:
    if not checks:
        return _section("Thresholds", "<p>No thresholds set in the recipe's verify: section.</p>")
    rows = []
    for c in checks:
        output = f" (<code>{_e(c['output'])}</code>)" if "output" in c else ""
        result = '<td class="pass">pass</td>' if c["passed"] else '<td class="fail">FAIL</td>'
        rows.append(
            f"<tr><td>{_e(c['metric'])}{output}</td><td>{_num(c['value'])}</td>"
            f"<td>{_num(c['threshold'])}</td>{result}</tr>"
        )
    failed = "".join(f"<li>{_e(c['message'])}</li>" for c in checks if not c["passed"])
    table = (
        '<table id="thresholds"><thead><tr><th>check</th><th>value</th><th>threshold</th>'
        f"<th>result</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )
    return _section("Thresholds", table + (f'<ul class="fail">{failed}</ul>' if failed else ""))


def _latency(verify: dict[str, Any]) -> str:
    latency = verify["latency_ms"]
    samples = latency.get("samples") or []
    if not samples:
        return ""
    caption = (
        f"wall-clock time of {len(samples)} single inferences on this machine's CPU after "
        f"{latency.get('warmup', 0)} warm-up runs: a relative figure, not the device's"
    )
    svg = plots.latency(samples, latency["p50"], latency["p90"])
    return _section("Latency", _plot("latency", svg, caption))


def _outputs(verify: dict[str, Any], checks: list[dict[str, Any]], table_md: str) -> str:
    outputs = verify["agreement"].get("outputs") or []
    if not outputs and not table_md:  # detections: their own section says it
        return ""
    parts = [_markdown(table_md)] if table_md else []
    if outputs:
        minimum = next(
            (c["threshold"] for c in checks if c["metric"] == "verify.min_sqnr_db"), None
        )
        parts.append(
            _plot(
                "outputs",
                plots.output_sqnr(outputs, minimum),
                "per output: SQNR of the artifact against the source model on the evaluation "
                "split (10·log10 of the source's energy over the error's)",
            )
        )
    for o in outputs:
        name = str(o.get("name", o["index"]))
        if "confusion" in o:
            parts.append(
                _plot(
                    f"confusion-{name}",
                    plots.confusion(name, o["confusion"]),
                    f"'{name}': the class the artifact picked for each class the source model "
                    "picked; off the diagonal, the samples where they disagree",
                    square=True,
                )
            )
        elif "per_class" in o:
            parts.append(
                _plot(
                    f"per-class-{name}",
                    plots.per_class_agreement(
                        name, o["per_class"]["picked"], o["per_class"]["agreed"]
                    ),
                    f"'{name}': top-1 agreement per class the source model picked",
                )
            )
    return _section("Outputs", "".join(parts))


def _layers(rows: list[dict[str, str]], diff: dict[str, Any]) -> str:
    first = (diff.get("first_divergence") or {}).get("tensor")
    text = f"<p>{_e(diff['line'])}</p>"
    if diff.get("hint"):
        text += f'<p class="note">hint: {_e(diff["hint"])}</p>'
    if not rows:
        return _section("Per-layer error", text + "<p>No tensor could be compared.</p>")
    caption = (
        f"every tensor of the artifact read in its runtime ({diff['runtime']}) against its "
        f"source counterpart on {diff['samples']} samples; the first below "
        f"{diff['min_sqnr_db']:g} dB is marked (layers_diff.csv has every figure)"
    )
    svg = plots.layer_error(rows, first, diff.get("min_sqnr_db"))
    return _section("Per-layer error", text + _plot("layers", svg, caption))


def _memory(rows: list[dict[str, str]], precheck: dict[str, Any], metrics: dict[str, Any]) -> str:
    from edgeflow.targets.memory import memory_line

    memory = precheck.get("memory")
    if not rows or not memory:
        return ""
    svg = plots.memory(
        rows,
        memory.get("ram_bytes"),
        memory.get("peak_node"),
        metrics.get("arena_bytes"),  # measured by the runtime (TFLite Micro)
        memory.get("arena_bytes"),  # the precheck's estimate (metrics' arena_predicted_bytes)
    )
    caption = (
        "the estimate of activation bytes alive while each layer runs (layers.csv), against "
        "the board's RAM; the runtime's measured arena where the target measures one"
    )
    return _section("Memory", f"<p>{_e(memory_line(memory))}</p>" + _plot("memory", svg, caption))


def _npu(
    part: str, rows: list[dict[str, str]], metrics: dict[str, Any], checks: list[dict[str, Any]]
) -> str:
    """An NPU build's section: its text, Vela's cycles along the graph, and its memory
    against the board (the thresholds of its memory checks, where a board set them)."""
    limits = {c["metric"]: c["threshold"] for c in checks}
    figures = metrics["npu"]
    used = [
        (what, figures[f"{key}_bytes"], limits.get(f"npu.{key}_bytes"))
        for what, key in (("SRAM", "sram"), ("flash", "flash"))
    ]
    plotted = _plot(
        "npu",
        plots.npu_layers(rows),
        "Vela's estimated cycles per layer along the graph; the layers it left to the CPU "
        "(TFLite Micro) marked",
    ) + _plot(
        "npu-memory",
        plots.npu_memory(used),
        "the SRAM and flash Vela allocates against the board's (red: does not fit)",
    )
    return _section(npu.HEADING, _markdown(part) + plotted)


# ---- the sweep's table ---------------------------------------------------------------------


def _sweep_table(rows: Sequence[dict[str, Any]]) -> str:
    head = (
        "<tr><th>recipe</th><th>build</th><th>status</th><th>accuracy</th><th>agreement</th>"
        "<th>min SQNR dB</th><th>p50 ms</th><th>NPU ms (est.)</th><th>size</th><th>arena</th>"
        "<th>Pareto</th></tr>"
    )
    lines = []
    for r in sorted(rows, key=lambda r: (r["recipe"], r["build"])):
        build = _e(r["build"])
        if r.get("link"):
            build = f'<a href="{_e(r["link"])}">{build}</a>'
        status = _e(r["status"])
        if r.get("error"):
            status += f"<br><small>{_e(r['error'])}</small>"
        lines.append(
            f"<tr><td>{_e(r['recipe'])}</td><td>{build}</td><td>{status}</td>"
            f"<td>{_fmt(r.get('accuracy'), '.4f')}</td><td>{_fmt(r.get('agreement'), '.4f')}</td>"
            f"<td>{_fmt(r.get('sqnr_db'), '.1f')}</td>"
            f"<td>{_fmt(r.get('latency_p50_ms'), '.3f')}</td>"
            f"<td>{_fmt(r.get('npu_latency_ms'), '.4f')}</td>"
            f"<td>{_fmt(r.get('size_bytes'), ',')}</td><td>{_fmt(r.get('arena_bytes'), ',')}</td>"
            f"<td>{'*' if r.get('pareto') else ''}</td></tr>"
        )
    return f'<table id="builds"><thead>{head}</thead><tbody>{"".join(lines)}</tbody></table>'


# ---- pieces --------------------------------------------------------------------------------


def _page(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'  # no favicon request
        f"<title>{_e(title)}</title><style>{STYLE}</style></head>"
        f"<body><main>{body}</main></body></html>\n"
    )


def _section(title: str, content: str) -> str:
    anchor = title.lower().replace(" ", "-")
    return f'<section id="{_e(anchor)}"><h2>{_e(title)}</h2>{content}</section>'


def _plot(name: str, svg: str, caption: str, square: bool = False) -> str:
    kind = "plot square" if square else "plot"
    return (
        f'<figure class="{kind}" id="plot-{_e(name)}">{svg}'
        f"<figcaption>{_e(caption)}</figcaption></figure>"
    )


def _markdown(text: str) -> str:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False}).enable("table").render(text)


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _all_set(rows: Sequence[dict[str, Any]], *keys: str) -> bool:
    return all(r.get(k) is not None for r in rows for k in keys)


def _e(text: Any) -> str:
    return html.escape(str(text))


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.6g}"


def _fmt(value: Any, spec: str) -> str:
    return "" if value is None else format(value, spec)
