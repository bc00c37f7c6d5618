"""report: metrics.json in the fixed shape DVC and CI read, the threshold checks, report.md
(and report.json, the same report as a record for report.html)."""

from __future__ import annotations

from typing import Any

from edgeflow.core.records import RECORDS, ReportRecord
from edgeflow.stages.base import Stage, StageContext

ACCURACY = ("source", "artifact", "drop")
AGREEMENT = {
    "top1": ("top1", "max_abs_diff"),
    "agreement": ("top1", "max_abs_diff"),
    "detections": (
        "match_rate",
        "matched",
        "reference_detections",
        "artifact_detections",
        "max_box_diff_px",
        "max_box_diff_relative",
        "max_score_diff",
    ),
}
REQUIRED = ("verify", "precheck", "convert", "source")
DETAIL_SLOTS = (
    "verify",
    "precheck",
    "optimize",
    "quantize",
    "convert",
    "source",
    "rewrite_onnx",
    "rewrite_target",
    "rewrite_auto",
)


def auto_entries(details: dict[str, Any]) -> list[str]:
    """The rules `rewrites: auto` chose, in the order they ran, as `rewrites:` entries: the
    source's (ast, fx: rewrite.json) and the ONNX graph's (rewrite_auto.json)."""
    from edgeflow.targets.precheck import entry

    source = (details.get("rewrite") or {}).get("auto") or {}
    graph = details.get("rewrite_auto") or {}
    chosen = [*source.get("chosen", []), *graph.get("chosen", [])]
    return [entry(c["rule"], c["options"]) for c in chosen]


def run(ctx: StageContext) -> None:
    from edgeflow.report.markdown import render
    from edgeflow.verify.judge import build_checks, fallback_checks, thresholds

    details = {
        slot: ctx.read(slot).dump() if slot in RECORDS else ctx.read_json(slot)
        for slot in (*DETAIL_SLOTS, "rewrite", "export")
        if slot in ctx.inputs
    }
    v = details["verify"]
    if v.get("not_verified"):
        _not_verified(ctx, v, details)
        return
    metrics = {
        "recipe": ctx.recipe_file,
        "target": ctx.profile.name,
        "quantization": ctx.recipe.quantization.mode,
        "verified": False,
        "accuracy": {k: float(v["accuracy"][k]) for k in ACCURACY} if v["accuracy"] else None,
        "agreement": _agreement(v),
        "latency_ms": {k: float(v["latency_ms"][k]) for k in ("p50", "p90")},
        "size_bytes": int(v["size_bytes"]),
    }
    metrics.update(v.get("extra", {}))  # target-specific figures, e.g. arena_bytes
    ingested = details["source"].get("normalised")
    if ingested:  # what ingest did to a file from another or an older exporter
        metrics["ingest"] = list(ingested)
    if ctx.recipe.rewrites_auto:  # what it chose, as `rewrites:` entries
        metrics["auto_rewrites"] = auto_entries(details)
    path = conversion_path(details)
    if path is not None:  # a TensorFlow or JAX source: its path, and what each step added
        metrics["conversion"] = path
    if v.get("stream"):  # a stateful model's error along its sequences
        metrics["stream"] = {
            "steps": v["stream"]["steps"],
            "outputs": {
                o["name"]: {k: o[k] for k in ("first", "last", "worst", "growth")}
                for o in v["stream"]["outputs"]
            },
        }
    memory = details["precheck"].get("memory")
    if memory and "arena_bytes" in metrics:  # the precheck's prediction next to the measurement
        metrics["arena_predicted_bytes"] = int(memory["arena_bytes"])
    limits = thresholds(ctx.recipe.verify, ctx.recipe.quantization.mode)
    checks = build_checks(
        limits, v["agreement"], v["accuracy"], metrics["latency_ms"]["p50"], metrics["size_bytes"]
    )
    compiled = details["convert"].get("npu")
    if compiled:  # an NPU build: Vela's figures, its memory against the board
        from edgeflow.report import npu

        board = ctx.profile.board(ctx.recipe.precheck.board)
        metrics["npu"], memory_checks = npu.figures(compiled, board)
        checks += memory_checks
    mixed = fallback_record(details)
    if mixed is not None:  # quantization.fallback: auto
        metrics["float_layers"] = len(mixed["float_layers"])
        metrics["fallback"] = {
            "mixes": len(mixed["trials"]),
            "seconds": mixed.get("seconds"),
            "met": mixed["met"],
            "stopped_by": mixed.get("stopped_by"),
        }
        checks += fallback_checks(mixed)
    metrics["verified"] = all(c["passed"] for c in checks)
    _write(ctx, metrics, checks, render(*_title(ctx), metrics, checks, details), v)


def _write(
    ctx: StageContext,
    metrics: dict[str, Any],
    checks: list[dict[str, Any]],
    report: ReportRecord,
    v: dict[str, Any],
) -> None:
    ctx.write("metrics", metrics)
    ctx.write("checks", checks)
    ctx.write("report_record", report)
    _write_plots(ctx, v)
    ctx.output("report").write_text(report.markdown(), encoding="utf-8")


# Per output in metrics.json: its kind, the scale-free figures, its kind's own figure (with
# the strings a sequence figure counts), and where its samples are in the model's own layout
# (batch_axis, when not 0).
OUTPUT_FIGURES = (
    "sqnr_db",
    "max_abs_diff",
    "top1",
    "sequence",
    "sequences",
    "decision",
    "cosine_min",
    "cosine_mean",
    "retrieval",
    "retrieval_skipped",
    "batch_axis",
)


def conversion_path(details: dict) -> dict | None:
    """The source framework, the path its build took and the error each step added (the
    worst output's max abs diff): None for PyTorch and ONNX sources."""
    framework = details["source"].get("framework")
    if framework is None:
        return None

    def worst(errors: list[dict]) -> float:
        return max(float(e["max_abs_diff"]) for e in errors)

    native = details["convert"].get("path") == "native"
    found: dict = {"framework": framework, "path": "native" if native else "onnx"}
    outputs = details["verify"]["agreement"].get("outputs") or []
    steps = details["verify"].get("steps")
    if not native and steps and "export" in details:
        found["source_to_onnx"] = worst(details["export"]["error_vs_source"])
        found["onnx_to_target"] = worst(steps["onnx_to_artifact"])
    if outputs:
        found["source_to_target"] = max(float(o["max_abs_diff"]) for o in outputs)
    return found


def fallback_record(details: dict) -> dict | None:
    """The fallback search's record: the quantize stage's (onnxruntime) or the converter's."""
    return details.get("quantize", {}).get("fallback") or details["convert"].get("fallback")


def _agreement(v: dict) -> dict:
    found = v["agreement"]
    agreement = {k: found[k] for k in AGREEMENT[v.get("metric", "top1")] if k in found}
    outputs = found.get("outputs")
    if outputs:  # relative to each output's range: comparable across models
        relative = [o["max_rel_to_range"] for o in outputs]
        agreement["max_relative_diff"] = None if None in relative else max(relative)
        agreement["non_finite_samples"] = found["non_finite_samples"]
        agreement["min_sqnr_db"] = found["min_sqnr_db"]
        agreement["outputs"] = {o["name"]: _output_metrics(o) for o in outputs}
    if "task_metric" in found:  # verify.task_metric: the recipe's own figure
        agreement["task_metric"] = found["task_metric"]
    return agreement


def _output_metrics(o: dict) -> dict:
    figures = {"kind": o["kind"], "relative_error": o["max_rel_to_range"]}
    figures.update({k: o[k] for k in OUTPUT_FIGURES if k in o})
    if "detections" in o:
        figures["match_rate"] = o["detections"]["match_rate"]
    return figures


def _write_plots(ctx: StageContext, v: dict) -> None:
    """Tables DVC plots (`dvc plots show/diff`): one row per latency run, one per output.

    Empty (header only) when the artifact did not run here, so the files always exist.
    """
    folder = ctx.output("plots")
    folder.mkdir()
    samples = (v.get("latency_ms") or {}).get("samples", [])
    rows = [f"{i},{ms}" for i, ms in enumerate(samples)]
    (folder / "latency.csv").write_text("\n".join(["run,ms", *rows]) + "\n", encoding="utf-8")
    outputs = ((v.get("agreement") or {}).get("outputs")) or []
    lines = ["output,max_abs_diff,mean_abs_diff,max_rel_to_range,sqnr_db"]
    keys = ("index", "max_abs_diff", "mean_abs_diff", "max_rel_to_range", "sqnr_db")
    lines += [",".join("" if o.get(k) is None else str(o[k]) for k in keys) for o in outputs]
    (folder / "outputs.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _not_verified(ctx: StageContext, v: dict, details: dict) -> None:
    """The artifact could not run here: metrics say verified: false and why; no checks."""
    from edgeflow.report.markdown import render

    metrics = {
        "recipe": ctx.recipe_file,
        "target": ctx.profile.name,
        "quantization": ctx.recipe.quantization.mode,
        "verified": False,
        "not_verified": v["not_verified"],
        "accuracy": None,
        "agreement": None,
        "latency_ms": None,
        "size_bytes": int(v["size_bytes"]),
    }
    _write(ctx, metrics, [], render(*_title(ctx), metrics, [], details), v)


def _title(ctx: StageContext) -> tuple[str, str]:
    """The build, and the recipe's own name and description where it sets them."""
    recipe = ctx.recipe
    title = f"{ctx.recipe_file} -> {ctx.profile.name}-{recipe.quantization.mode}"
    about = [f"recipe `{recipe.name}`" if recipe.name else "", recipe.description]
    return title, ": ".join(a for a in about if a)


STAGE = Stage(
    name="report",
    description="Write metrics.json, the threshold checks and report.md (and as report.json).",
    run=run,
    consumes=REQUIRED,
    # the ONNX stages' records; the native TensorFlow path has none of them
    optional=tuple(s for s in (*DETAIL_SLOTS, "rewrite", "export") if s not in REQUIRED),
    produces={
        "metrics": "metrics.json",
        "checks": "checks.json",
        "report": "report.md",
        "report_record": "report.json",  # report.md as data, for report.html
        "plots": "plots",
    },
    reads=(
        "verify",
        "quantization.mode",
        "target",
        "recipe_file",
        "name",
        "description",
        "rewrites_auto",
        "precheck.board",  # an NPU build's memory is checked against it
    ),
)
