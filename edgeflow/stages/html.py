"""html: report.html, the report as a self-contained page with plots (edgeflow.report.html).

Made from the files the build folder gets, nothing else, so that `edgeflow report BUILD_DIR`
makes the same page again; after a per-layer diff it runs again with the diff's files.
"""

from __future__ import annotations

from pathlib import Path

from edgeflow.stages.base import Stage, StageContext


def run(ctx: StageContext) -> None:
    from edgeflow.report.html import render_build

    files: dict[str, Path] = {}
    for path in ctx.inputs.values():  # as published: a folder's files by their names
        files.update({p.name: p for p in path.iterdir()} if path.is_dir() else {path.name: path})
    ctx.output("html").write_text(render_build(files), encoding="utf-8")


STAGE = Stage(
    name="html",
    description="Write report.html: the report's figures with plots, one self-contained page.",
    run=run,
    consumes=("report_record", "metrics", "checks", "verify", "precheck"),
    # no layers.csv on TensorFlow's native path; the artifact's folder: an NPU build's
    # vela_per_layer.csv
    optional=("layers", "layers_diff", "diff", "artifact"),
    produces={"html": "report.html"},
    tools=("markdown-it-py",),
)
