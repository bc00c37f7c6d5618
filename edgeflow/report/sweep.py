"""The summary of a sweep (`edgeflow run -m ...`): every job's figures in one table and in
sweep.json, with the Pareto-optimal builds of each recipe marked.

A build is Pareto-optimal when no other verified build of the same recipe is at least as good
on every objective and better on one. Objectives: accuracy (higher; detection recipes: the
match rate), top-1 agreement (higher), p50 latency, size and arena bytes (lower; arena only
where every compared build has one). Builds that failed or were not verified are listed, not
ranked. Where every compared build is an NPU build (ethos_u), the latency ranked and plotted
is the NPU's time as Vela estimates it, not TFLite Micro's on this machine's CPU (the same
pre-Vela model for every accelerator: its host time tells them apart by noise alone).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def row(recipe: str, build: str, metrics: dict[str, Any] | None, error: str = "") -> dict:
    """One job's entry: its figures, or the error that stopped it."""
    if metrics is None:
        return {"recipe": recipe, "build": build, "status": "failed", "error": error}
    acc, agree = metrics.get("accuracy") or {}, metrics.get("agreement") or {}
    status = "verified" if metrics.get("verified") else "not verified"
    if metrics.get("verified") and error:
        status = "failed checks"
    return {
        "recipe": recipe,
        "build": build,
        "status": status,
        "error": error or metrics.get("not_verified") or "",
        "accuracy": acc.get("artifact")
        if acc.get("artifact") is not None
        else agree.get("match_rate"),
        "agreement": agree.get("top1", agree.get("match_rate")),
        "sqnr_db": agree.get("min_sqnr_db"),  # shown, not ranked: float always wins it
        "latency_p50_ms": (metrics.get("latency_ms") or {}).get("p50"),
        "size_bytes": metrics.get("size_bytes"),
        "arena_bytes": metrics.get("arena_bytes"),
        "npu_latency_ms": (metrics.get("npu") or {}).get("latency_ms"),  # Vela's estimate
    }


def latency_key(rows: list[dict]) -> str:
    """The latency a sweep ranks and plots: the NPU's estimated time where every row has one,
    else the measured p50."""
    if rows and all(r.get("npu_latency_ms") is not None for r in rows):
        return "npu_latency_ms"
    return "latency_p50_ms"


def mark_pareto(rows: list[dict]) -> list[dict]:
    """Set `pareto` on every row: True for the verified builds no other one dominates."""
    for r in rows:
        r["pareto"] = False
    for recipe in {r["recipe"] for r in rows}:
        ranked = [r for r in rows if r["recipe"] == recipe and r["status"] == "verified"]
        keys = _objectives(ranked)
        for r in ranked:
            r["pareto"] = not any(_dominates(o, r, keys) for o in ranked if o is not r)
    return rows


def _objectives(rows: list[dict]) -> list[tuple[str, int]]:
    """(key, +1 higher is better / -1 lower is better) that every row has a value for."""
    wanted = [
        ("accuracy", 1),
        ("agreement", 1),
        (latency_key(rows), -1),
        ("size_bytes", -1),
        ("arena_bytes", -1),
    ]
    return [(k, sign) for k, sign in wanted if rows and all(r.get(k) is not None for r in rows)]


def _dominates(a: dict, b: dict, keys: list[tuple[str, int]]) -> bool:
    at_least = all(sign * a[k] >= sign * b[k] for k, sign in keys)
    better = any(sign * a[k] > sign * b[k] for k, sign in keys)
    return at_least and better


def render(rows: list[dict]) -> str:
    """The sweep as a Markdown table, Pareto-optimal builds marked with *."""
    lines = [
        "| recipe | build | status | accuracy | agreement | min SQNR dB | p50 ms | NPU ms (est.) "
        "| size | arena | pareto |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def num(value: Any, fmt: str) -> str:
        return "" if value is None else format(value, fmt)

    for r in sorted(rows, key=lambda r: (r["recipe"], r["build"])):
        lines.append(
            f"| {r['recipe']} | {r['build']} | {r['status']} | {num(r.get('accuracy'), '.4f')} "
            f"| {num(r.get('agreement'), '.4f')} | {num(r.get('sqnr_db'), '.1f')} "
            f"| {num(r.get('latency_p50_ms'), '.3f')} | {num(r.get('npu_latency_ms'), '.4f')} "
            f"| {num(r.get('size_bytes'), ',')} | {num(r.get('arena_bytes'), ',')} "
            f"| {'*' if r.get('pareto') else ''} |"
        )
    failed = [r for r in rows if r.get("error")]
    lines += [f"- {r['recipe']}/{r['build']}: {r['error']}" for r in failed]
    return "\n".join(lines)


def write(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"jobs": rows}, indent=2) + "\n", encoding="utf-8")


def write_html(rows: list[dict], path: Path) -> None:
    """sweep.html beside sweep.json: each build as a point, linking to its report.html
    where the build folder has one (paths relative to the page)."""
    from edgeflow.report.html import render_sweep

    links = {
        k: f"{r['recipe']}/{r['build']}/report.html"
        for k, r in enumerate(rows)
        if (path.parent / r["recipe"] / r["build"] / "report.html").is_file()
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    verified = [r for r in rows if r["status"] == "verified"]
    tmp.write_text(render_sweep(rows, links, latency_key(verified)), encoding="utf-8")
    tmp.replace(path)
