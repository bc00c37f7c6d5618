"""report.md: what was built, how it compares with the source model, and what each stage did.

`render` gives it as a ReportRecord (edgeflow.core.records): a title, an intro and titled
sections of markdown. report.md joins them; report.html renders the same record with its
plots, so nothing reads the markdown back.
"""

from __future__ import annotations

from typing import Any

from edgeflow.core.records import ReportRecord, Section
from edgeflow.report import npu
from edgeflow.targets.memory import memory_line
from edgeflow.targets.placement import prediction_line
from edgeflow.targets.precheck import entry, render_table


def render(
    title: str,
    about: str,
    metrics: dict[str, Any],
    checks: list[dict[str, Any]],
    details: dict[str, Any],
) -> ReportRecord:
    """The report of a build: `title` names it, `about` is the recipe's own name and
    description ("" when it sets neither)."""
    if metrics.get("not_verified"):
        return _not_verified(title, about, metrics, details)
    lat = metrics["latency_ms"]
    verdict = "VERIFIED" if metrics["verified"] else "NOT VERIFIED"
    runs = details["verify"]
    stream = runs.get("stream")
    samples = (
        f"{runs['samples']} evaluation sequences of {stream['steps']} steps"
        if stream
        else f"{runs['samples']} evaluation samples"
    )
    intro = [
        *([about, ""] if about else []),
        f"**{verdict}**: target `{metrics['target']}`, quantization `{metrics['quantization']}`, "
        f"{samples}, runtime `{runs['runtime']}`."
        + (f" Its {npu.BASIS}." if metrics.get("npu") else ""),
        "",
        "| metric | value |",
        "|---|---|",
        *_agreement_rows(metrics),
        f"| latency p50 / p90 | {lat['p50']:.3f} / {lat['p90']:.3f} ms |",
        f"| artifact size | {metrics['size_bytes']:,} bytes |",
        *(npu.headline(metrics["npu"]) if metrics.get("npu") else []),
    ]
    lines: list[str] = []
    if checks:
        lines += ["| check | value | threshold | result |", "|---|---|---|---|"]
        lines += [
            f"| {c['metric']}{_for_output(c)} | {_value(c['value'])} | "
            f"{_value(c['threshold'])} | "
            f"{'pass' if c['passed'] else '**FAIL**'} |"
            for c in checks
        ]
        failed = [c["message"] for c in checks if not c["passed"]]
        lines += ["", *(f"- **FAIL**: {m}" for m in failed)] if failed else []
    else:
        lines.append("No thresholds set in the recipe's `verify:` section.")
    sections = [Section(heading="Thresholds", body=_text(lines))]
    if metrics.get("npu"):
        body = npu.section_lines(metrics["npu"], details["convert"]["npu"])
        sections.append(Section(heading=npu.HEADING, body=_text(body)))
    sections.append(_per_output(details["verify"]["agreement"]))
    sections += stream_sections(stream)
    sections.append(_stages(metrics, details, checks))
    return ReportRecord(title=title, intro=_text(intro), sections=sections)


def _text(lines: list[str]) -> str:
    return "\n".join(lines).strip("\n") + "\n"


def stream_sections(stream: dict[str, Any] | None) -> list[Section]:
    """A stateful model's error step by step (source.state): where it starts, ends, peaks,
    and how it grows along the sequence."""
    if not stream:
        return []
    steps = stream["steps"]
    marks = sorted({1, max(1, steps // 4), max(1, steps // 2), max(1, 3 * steps // 4), steps})
    lines = [
        f"{stream['sequences']} sequences of {steps} steps, each run from the initial state "
        "with its state outputs fed back, in the source model and in the artifact. The error "
        "of each step is the largest |artifact - source| over the sequences, relative to the "
        "output's range; growth is its mean over the last quarter of the steps over the first "
        "quarter's (state drift: above 1, the error accumulates).",
        "",
        "| output | " + " | ".join(f"step {m}" for m in marks) + " | worst (step) | growth |",
        "|---|" + "---|" * (len(marks) + 2),
    ]
    for o in stream["outputs"]:
        per_step = o["per_step"]
        growth = "-" if o["growth"] is None else f"×{o['growth']:.2f}"
        lines.append(
            f"| `{o['name']}` | "
            + " | ".join(_g(per_step[m - 1]) for m in marks)
            + f" | {_g(o['worst'])} ({o['worst_step']}) | {growth} |"
        )
    return [Section(heading="Streaming", body=_text(lines))]


def one_line(metrics: dict[str, Any]) -> str:
    """The build's figures in one line, for the terminal."""
    acc, agree = metrics["accuracy"], metrics["agreement"]
    if metrics.get("not_verified"):
        return f"NOT VERIFIED ({metrics['not_verified']}), {metrics['size_bytes']:,} bytes"
    if "match_rate" in agree:
        head = (
            f"{agree['matched']} of {agree['reference_detections']} detections matched, "
            f"max box diff {agree['max_box_diff_px']:.3g} px"
        )
    else:
        accuracy = f"accuracy {acc['artifact']:.4f} (source {acc['source']:.4f}), " if acc else ""
        head = f"{accuracy}{_outputs_line(agree.get('outputs') or {})}"
        head += f", max abs diff {_g(agree['max_abs_diff'])}"
        if agree.get("non_finite_samples"):
            head += f", NaN/Inf outputs on {agree['non_finite_samples']} samples"
    if metrics.get("float_layers") is not None:
        head += f", {search_line(metrics['float_layers'], metrics.get('fallback') or {})}"
    if metrics.get("npu"):
        head += f", {npu.one_line(metrics['npu'])}"
    return f"{head}, p50 {metrics['latency_ms']['p50']:.3f} ms, {metrics['size_bytes']:,} bytes"


MAX_OUTPUTS_IN_LINE = 4  # beyond it, the one-line summary names the worst output only


def _outputs_line(outputs: dict[str, dict[str, Any]]) -> str:
    """Each output's SQNR and its kind's own figure; one output: without its name."""
    if len(outputs) > MAX_OUTPUTS_IN_LINE:
        name, o = min(outputs.items(), key=lambda kv: _sortable(kv[1].get("sqnr_db")))
        return f"lowest SQNR of {len(outputs)} outputs: '{name}' {db(o.get('sqnr_db'))}"
    parts = []
    for name, o in outputs.items():
        figures = [f"SQNR {db(o.get('sqnr_db'))}", *kind_figures(o)]
        named = f"'{name}' " if len(outputs) > 1 else ""
        parts.append(named + ", ".join(figures))
    return "; ".join(parts)


def kind_figures(o: dict[str, Any]) -> list[str]:
    """The figure that means something for the output's kind, as words."""
    found = []
    if o.get("top1") is not None:
        per = " per position" if "sequence" in o else ""
        found.append(f"top-1 agreement{per} {o['top1']:.4f}")
    if o.get("sequence") is not None:
        found.append(f"sequence agreement {o['sequence']:.4f}")
    if o.get("decision") is not None:
        found.append(f"decision agreement {o['decision']:.4f}")
    if o.get("match_rate") is not None:
        found.append(f"detections matched {o['match_rate']:.4f}")
    if o.get("cosine_min") is not None:
        found.append(
            f"cosine similarity {o['cosine_min']:.4f} (lowest), {o['cosine_mean']:.4f} (mean)"
        )
    found += retrieval_words(o.get("retrieval"))
    if o.get("retrieval_skipped"):
        found.append(f"retrieval {o['retrieval_skipped']}")
    return found


def retrieval_words(found: dict[str, Any] | None) -> list[str]:
    """An embedding's retrieval over its declared pairs, source against artifact."""
    if not found:
        return []
    return [
        f"match retrieved first {found['recall_at_1_artifact']:.4f} (source "
        f"{found['recall_at_1_source']:.4f}), mean rank {found['mean_rank_artifact']:.2f} (source "
        f"{found['mean_rank_source']:.2f}) among {found['candidates']}, rank kept for "
        f"{found['rank_kept']:.4f} of {found['pairs']} pairs"
    ]


def db(value: float | None) -> str:
    """An SQNR in dB: inf when the artifact is exact, n/a when nothing finite was compared."""
    if value is None:
        return "n/a"
    return "inf dB (exact)" if value == float("inf") else f"{value:.1f} dB"


def _sortable(value: float | None) -> float:
    return float("-inf") if value is None else value


def _agreement_rows(metrics: dict[str, Any]) -> list[str]:
    acc, agree = metrics["accuracy"], metrics["agreement"]
    if "match_rate" in agree:
        return [
            f"| detections matched (same label, within tolerance) | {agree['matched']} of "
            f"{agree['reference_detections']} ({agree['match_rate']:.4f}) |",
            f"| detections, source / artifact | {agree['reference_detections']} / "
            f"{agree['artifact_detections']} |",
            f"| max box diff | {agree['max_box_diff_px']:.3g} px "
            f"({agree['max_box_diff_relative']:.3g} of the image side) |",
            f"| max score diff | {agree['max_score_diff']:.3g} |",
        ]
    accuracy = (
        [
            f"| accuracy, source model | {acc['source']:.4f} |",
            f"| accuracy, artifact | {acc['artifact']:.4f} |",
            f"| accuracy drop | {acc['drop'] * 100:+.2f} percentage points |",
        ]
        if acc
        else []  # evaluation.metric: agreement
    )
    top1 = agree.get("top1")
    return [
        *accuracy,
        *([f"| top-1 agreement with source (class outputs) | {top1:.4f} |"] if top1 else []),
        f"| lowest SQNR of the outputs | {db(agree.get('min_sqnr_db'))} |",
        f"| max abs diff of outputs | {_g(agree['max_abs_diff'])} |",
        *(
            [f"| max diff relative to the output range | {_g(agree['max_relative_diff'])} |"]
            if "max_relative_diff" in agree
            else []
        ),
        *(
            [f"| samples with NaN/Inf artifact outputs | {agree['non_finite_samples']} |"]
            if agree.get("non_finite_samples")
            else []
        ),
    ]


def _for_output(check: dict[str, Any]) -> str:
    return f" (`{check['output']}`)" if "output" in check else ""


def _value(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.6g}"


def _g(value: float | None) -> str:
    """A figure, or why there is none (every sample's output was NaN or Inf)."""
    return "n/a (no finite outputs)" if value is None else f"{value:.3g}"


def _per_output(agreement: dict[str, Any]) -> Section:
    if "per_image" in agreement:
        lines = ["| image | source | artifact | matched | max box diff |"]
        lines.append("|---|---|---|---|---|")
        for i, o in enumerate(agreement["per_image"]):
            lines.append(
                f"| {i} | {o['reference']} | {o['artifact']} | {o['matched']} | "
                f"{o['max_box_diff_px']:.3g} px |"
            )
        return Section(heading="Per image", body=_text(lines))
    lines = [
        "| output | shape | kind | SQNR | relative error | max abs diff | agreement | NaN/Inf |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for o in agreement["outputs"]:
        kind = o.get("kind", "values") + (" (by shape)" if o.get("kind_from") == "shape" else "")
        figures = kind_figures({**o, "match_rate": (o.get("detections") or {}).get("match_rate")})
        if "threshold" in o:
            figures = [f"{f} at {o['threshold']:g}" for f in figures]
        lines.append(
            f"| {o['index']} `{o.get('name', o['index'])}` | {o['shape']}{_batched(o)} | {kind} | "
            f"{db(o.get('sqnr_db'))} | {_g(o['max_rel_to_range'])} | {_g(o['max_abs_diff'])} | "
            f"{'; '.join(figures) or 'SQNR and relative error only'} | "
            f"{o.get('non_finite_samples', 0)} samples |"
        )
    lines += ["", *TRUST]
    return Section(heading="Per output", body=_text(lines))


def _batched(o: dict[str, Any]) -> str:
    """Where an output's samples are in the model's layout, when not on axis 0 (the shape
    shown is per sample)."""
    return f" (samples on axis {o['batch_axis']})" if o.get("batch_axis") else ""


# Under the per-output table: which figure to trust for which output (docs/recipe.md).
TRUST = (
    "SQNR (10·log10 of the source's energy over the error's) and the relative error (max abs "
    "diff over the output's largest |value|) hold for every output. Top-1 agreement is shown "
    "only for class vectors ([batch, C > 1], or declared `kind: classes`), decision agreement "
    "for probabilities (one value per sample within [0, 1], or declared), detections matched "
    "for declared detector heads; `evaluation.outputs` overrides what the shape decides.",
)


def _not_verified(
    title: str, about: str, metrics: dict[str, Any], details: dict[str, Any]
) -> ReportRecord:
    intro = [
        *([about, ""] if about else []),
        f"**NOT VERIFIED**: {metrics['not_verified']}. The artifact was built "
        f"({metrics['size_bytes']:,} bytes) but not run in `{metrics['target']}`'s runtime, so "
        "nothing was compared with the source model.",
    ]
    return ReportRecord(title=title, intro=_text(intro), sections=[_stages(metrics, details)])


def _target_rules(info: dict[str, Any]) -> list[str]:
    """The target profile's default rewrites: what they did, or why they did not run."""
    if not info:
        return []
    target = info["target"]
    replaced = info.get("replaced_by_recipe") or []
    tail = f" ({', '.join(f'`{r}`' for r in replaced)} as the recipe sets it)" if replaced else ""
    if info.get("off"):
        return [f"- target rewrites of `{target}`: off (target_rewrites: false){tail}"]
    if not info["rules"]:
        return [f"- target rewrites of `{target}`: none{tail}"]
    lines = [f"- target rewrites of `{target}` (its profile's `rewrites:`){tail}:"]
    for r in info["rules"]:
        lines += rule_lines(r)
    return lines


def auto_lines(info: dict[str, Any]) -> list[str]:
    """`rewrites: auto`: the rules it chose, each with what it removed, and what is left."""
    if not info.get("auto"):
        return []
    if not info["chosen"]:
        left = "the precheck found nothing to fix" if not info["errors_left"] else (
            "no rule removes what the precheck found")  # fmt: skip
        return [f"- auto rewrites of the ONNX graph (rewrites: auto): none, {left}"]
    lines = ["- auto rewrites of the ONNX graph (rewrites: auto), in order, each removing errors:"]
    by_rule = {r["rule"]: r for r in info.get("rules", [])}
    for c in info["chosen"]:
        lines.append(f"  - `{entry(c['rule'], c['options'])}`: removed {'; '.join(c['removed'])}")
        record = by_rule.get(c["rule"])
        if record is not None:
            lines += ["  " + line for line in rule_lines(record)[1:]]
    if info["errors_left"]:
        lines.append(f"  - left for the precheck: {'; '.join(info['errors_left'])}")
    return lines


MAX_SITES = 12  # a rule's sites shown in report.md; the stage's JSON record has them all
STATUS_TEXT = {"changed": "changed", "kept": "kept", "not_applicable": "nothing to do"}


def rule_lines(record: dict[str, Any]) -> list[str]:
    """One rule's record (rewrite.json, rewrite_onnx.json) as list items: what it did, where."""
    state = "changed" if record["changed"] else "no change"
    lines = [f"  - `{record['rule']}`: {state}, {record['matches']} matches"]
    graph = record.get("graph")
    if graph:
        note = f": {graph['note']}" if graph["note"] else ""
        lines.append(f"    - graph from {graph['kind']}{note}")
    changed = changed_ops(record)
    if changed:
        counts = ", ".join(f"{op} {before} -> {after}" for op, before, after in changed)
        lines.append(f"    - {record['ops']['kind']}: {counts}")
    sites = record["sites"]
    for site in sites[:MAX_SITES]:
        where = f" `{site['where']}`" if site["where"] else ""
        lines.append(f"    - {STATUS_TEXT[site['status']]}{where}: {site['message']}")
    if len(sites) > MAX_SITES:
        lines.append(f"    - ... and {len(sites) - MAX_SITES} more (in the stage's JSON)")
    return lines


def changed_ops(record: dict[str, Any]) -> list[tuple[str, int, int]]:
    """A rule record's operator (or layer) counts that it changed: (name, before, after)."""
    ops = record.get("ops")
    if not ops:
        return []
    names = sorted({*ops["before"], *ops["after"]})
    found = [(n, ops["before"].get(n, 0), ops["after"].get(n, 0)) for n in names]
    return [(n, b, a) for n, b, a in found if b != a]


def _stages(
    metrics: dict[str, Any], details: dict[str, Any], checks: list[dict[str, Any]] | None = None
) -> Section:
    lines: list[str] = []
    lines += load_lines(details.get("source", {}))
    lines += path_lines(details)
    rules = details.get("rewrite", {}).get("rules", [])
    rules += details.get("rewrite_onnx", {}).get("rules", [])
    if rules:
        lines.append("- rewrite rules, in order:")
        for r in rules:
            lines += rule_lines(r)
    else:
        lines.append("- rewrite rules: none in the recipe")
    source_auto = details.get("rewrite", {}).get("auto")
    if source_auto:  # rewrites: auto on a PyTorch source (listed above, with the recipe's)
        chosen = ", ".join(f"`{c['rule']}`" for c in source_auto["chosen"]) or "none"
        left = "; ".join(source_auto["left"])
        lines.append(
            f"- auto rewrites of the source (rewrites: auto): {chosen}"
            + (f"; left in the export: {left}" if left else "")
        )
    lines += _target_rules(details.get("rewrite_target", {}))
    lines += auto_lines(details.get("rewrite_auto", {}))
    pre = details["precheck"]
    lines.append(
        f"- precheck: {'passed' if pre['passed'] else 'FAILED'} against `{pre['target']}`"
        f" ({len(pre['findings'])} findings)"
    )
    if pre.get("memory"):
        lines.append(f"  - {memory_line(pre['memory'])}")
        if "arena_predicted_bytes" in metrics:
            predicted, measured = metrics["arena_predicted_bytes"], metrics["arena_bytes"]
            lines.append(
                f"  - arena predicted {predicted:,} B, measured {measured:,} B "
                f"({(predicted - measured) / measured:+.1%})"
            )
    if pre.get("npu"):
        lines.append(f"  - {prediction_line(pre['npu'])}")
    rows = pre["findings"]
    if metrics.get("npu"):  # what Vela then did, in the same table
        found = npu.after_vela(metrics["npu"], details["convert"]["npu"], pre, checks or [])
        rows = [*rows, *found]
    if rows:
        lines += ["", render_table(rows), ""]
    if "optimize" in details:
        opt = details["optimize"]
        lines.append(f"- optimize: {opt['nodes_before']} -> {opt['nodes_after']} nodes")
    lines += _quantize_lines(details.get("quantize"))
    lines += fallback_lines(
        details.get("quantize", {}).get("fallback") or details["convert"].get("fallback")
    )
    conv = details["convert"]
    lines.append(f"- convert: {', '.join(conv['files'])}")
    if conv.get("int8"):  # a converter that quantizes itself (onnx2tf)
        settings = ", ".join(
            f"{k}={v}" for k, v in conv["int8"].items() if k in ("per_channel", "method")
        )
        imposed = ", ".join(f"{k}={v}" for k, v in conv.get("imposed_by_target", {}).items())
        by_target = f" (set by the target: {imposed})" if imposed else ""
        scheme = f"; {conv['int8']['scheme']}" if conv["int8"].get("scheme") else ""
        lines.append(f"  - int8 by the converter: {settings}{by_target}{scheme}")
        lines += island_lines(conv["int8"].get("float_islands"))
    if conv.get("int8_weights"):  # a converter that stores int8 weights itself (TFLite)
        lines += weight_lines(conv["int8_weights"], "by the converter")
    lines += retry_lines(conv.get("retry"))
    if conv.get("operators"):
        lines.append(f"  - operators in the artifact: {', '.join(conv['operators'])}")
    host = conv.get("host")
    if host:  # postprocess.cut: the tail of the graph runs on the host
        timing = details["verify"].get("extra", {}).get("host_postprocess_ms_p50")
        took = f", {timing:.1f} ms per batch (p50)" if timing is not None else ""
        lines.append(
            f"  - post-processing on the host, not in the artifact: {host['nodes']:,} nodes from "
            f"{', '.join(host['inputs'])} in {', '.join(host['files'])} "
            f"({host['size_bytes']:,} bytes, ONNX Runtime{took}); verified together with "
            "the artifact"
        )
    return Section(heading="Stages", body=_text(lines))


def _quantize_lines(q: dict[str, Any] | None) -> list[str]:
    """The quantize stage (the ONNX path's; the native path quantizes in its converter)."""
    if q is None:
        return []
    lines: list[str] = []
    extra = ", ".join(
        f"{k}={q[k]}" for k in ("per_channel", "symmetric", "method", "reduce_range") if k in q
    )
    calib = (
        f", {q['calibration_samples']} calibration samples" if "calibration_samples" in q else ""
    )
    if q.get("qat"):
        calib = (
            f", the QAT model's own scales ({q['weights_folded_to_int8']} weight tensors "
            "stored as int8), no calibration"
        )
    imposed = ", ".join(f"{k}={v}" for k, v in q.get("imposed_by_target", {}).items())
    by_target = f" (set by the target: {imposed})" if imposed else ""
    lines.append(f"- quantize: mode {q['mode']}{', ' + extra if extra else ''}{calib}{by_target}")
    if q.get("weights"):  # int8_weights
        lines += weight_lines(q, "by onnxruntime")
    if q.get("opset_converted"):
        was = q["opset_converted"]
        why = "DynamicQuantizeLinear" if q.get("weights") else "int8 Q/DQ"
        lines.append(f"  - converted from opset {was['from']} to {was['to']} for {why}")
    if q.get("reduce_range_auto"):
        lines.append(f"  - reduce_range auto: {q['reduce_range_auto']}")
    if q.get("shape_inference", {}).get("symbolic") is False:
        lines.append(f"  - {q['shape_inference']['symbolic_failed']}; onnx's shape inference used")
    if q.get("float_infinities"):
        lines.append(
            f"  - {len(q['float_infinities'])} nodes float: they read an infinite constant (a "
            "mask value), which no int8 grid holds"
        )
    for refused in q.get("refused_by_quantizer") or []:
        lines.append(
            f"  - node '{refused['node']}' ({refused['op']}) float: onnxruntime's quantizer "
            f"fails on it ({refused['error'].rstrip('.')})"
        )
    return lines + island_lines(q.get("float_islands"))


def island_lines(record: dict[str, Any] | None) -> list[str]:
    """The float islands an int8 build kept (quantization.keep_float or the target's)."""
    if not record or not record.get("asked"):
        return []
    kept = record["summary"] or f"none in this graph ({', '.join(record['asked'])} asked)"
    lost = ", ".join(f"{i['kind']} ({', '.join(i['exits'])})" for i in record["lost"])
    gone = f"; not found in the quantized graph: {lost}" if lost else ""
    return [f"  - float islands (quantization.keep_float): {kept}{gone}"]


def weight_lines(record: dict[str, Any], by: str) -> list[str]:
    """An int8_weights build's weights, their bytes against the float32 model's."""
    before, after = record["weights"]["float_bytes"], record["weights"]["bytes"]
    lines = [
        f"  - int8 weights {by}: {record['int8_tensors']} int8 tensors, constants {before:,} -> "
        f"{after:,} bytes ({after / max(before, 1):.0%}); {record['scheme']}"
    ]
    kept = record.get("kept_float") or {}  # onnxruntime's (stages/quantize.py)
    if kept.get("small") or kept.get("grouped"):
        lines.append(
            f"  - float: {len(kept['small'])} operators with weights under 1,024 elements, "
            f"{len(kept['grouped'])} grouped convolutions (onnxruntime's int8 Conv weight is "
            "per tensor)"
        )
    return lines


def load_lines(source: dict[str, Any]) -> list[str]:
    """A checkpoint as shipped: where its state_dict was found, what was stripped; a file
    from another or an older exporter: what ingest made of it."""
    note = source.get("weights_note")
    lines = [f"- load: {note}"] if note else []
    return lines + [f"- ingest: {n}" for n in source.get("normalised") or []]


def path_lines(details: dict[str, Any]) -> list[str]:
    """A TensorFlow source: which path ran, and the error each step added (max |delta|
    relative to the output's range on the evaluation split, the worst output)."""
    source = details.get("source", {})
    if not source.get("framework"):
        return []
    conv, verify = details["convert"], details["verify"]

    def worst(errors: list[dict[str, Any]]) -> str:
        rel = [e["max_rel_to_range"] for e in errors if e["max_rel_to_range"] is not None]
        diff = max(e["max_abs_diff"] for e in errors)
        return f"{diff:.3g} abs" + (f", {max(rel):.3g} of the range" if rel else "")

    if conv.get("path") == "native":
        lines = [
            f"- path: native, {source['framework']} model {source['model']} -> "
            f"{conv['converter']} (no ONNX, no layout change)"
        ]
        outputs = verify.get("agreement", {}).get("outputs") or []
        if outputs:
            errors = [
                {"max_abs_diff": o["max_abs_diff"], "max_rel_to_range": o["max_rel_to_range"]}
                for o in outputs
            ]
            lines.append(f"  - error added: source -> target {worst(errors)}")
        return lines
    export = details.get("export", {})
    lines = [
        f"- path: via ONNX, {source['framework']} model {source['model']} -> "
        f"{export.get('converter', 'tf2onnx')} (opset {export.get('opset')}) -> "
        f"{conv.get('converter') or conv['target'] + ' converter'}"
    ]
    steps = verify.get("steps")
    if export.get("error_vs_source") and steps:
        lines.append(
            f"  - error added: source -> ONNX {worst(export['error_vs_source'])}; "
            f"ONNX -> target {worst(steps['onnx_to_artifact'])}; "
            f"source -> target {worst(steps['source_to_artifact'])}"
        )
    return lines


def retry_lines(retry: dict[str, Any] | None) -> list[str]:
    """onnx2tf failed, wrote its parameter replacement JSON, and the retry with it converted."""
    if not retry:
        return []
    ops = ", ".join(retry["operations"]) or "no operations"
    return [
        f"  - retried: onnx2tf failed ({retry['reason']}) and generated a parameter replacement "
        f"JSON; converted again with it (-prf {retry['param_replacement_file']}, kept in the "
        f"build folder; it changes {ops})"
    ]


def search_line(float_layers: int, search: dict[str, Any]) -> str:
    """ "fallback: 7 mixes in 41 s, 3 layers float" (and the bound that ended it, if one did)."""
    layers = f"{float_layers} layer{'' if float_layers == 1 else 's'} float"
    if not search:
        return f"fallback: {layers}"
    seconds = search.get("seconds")
    took = "" if seconds is None else f" in {seconds:.{1 if seconds < 10 else 0}f} s"
    mixes = search["mixes"]
    line = f"fallback: {mixes} mix{'' if mixes == 1 else 'es'}{took}, {layers}"
    bound = {
        "trials": "quantization.fallback_max_trials",
        "time": "quantization.fallback_max_seconds",
    }
    if search.get("stopped_by") in bound:
        line += f" (stopped by {bound[search['stopped_by']]})"
    return line


def fallback_lines(record: dict[str, Any] | None) -> list[str]:
    """quantization.fallback: auto: the budget, the layers kept float and what they cost."""
    if record is None:
        return []
    budget = ", ".join(f"{k} {v:g}" for k, v in record["budget"].items())
    full, chosen = record["int8"], record["chosen"]
    search = {
        "mixes": len(record["trials"]),
        "seconds": record.get("seconds"),
        "stopped_by": record.get("stopped_by"),
    }
    blocks = f", {record['blocks']} blocks ranked first" if record.get("blocks") else ""
    lines = [
        f"- {search_line(len(record['float_layers']), search)}{blocks} "
        f"(quantization.fallback: auto): budget {budget} on the {record['measured_on']}"
    ]
    lines.append(f"  - all int8: {_figures(full)}")
    if not chosen["float_layers"]:
        if full["passed"]:
            lines.append("  - the all-int8 build meets the budget: no layer kept float")
        else:
            lines.append(
                "  - **no mix met the budget**; the all-int8 build is the closest and kept"
            )
        return lines
    verdict = "meets the budget" if record["met"] else "**misses the budget** (the closest found)"
    kept = ", ".join(f"`{_short(f['layer'])}` ({f['op']})" for f in record["float_layers"])
    lines.append(
        f"  - kept float ({len(record['float_layers'])}): {kept}; {verdict}: {_figures(chosen)}"
    )
    lines.append(
        f"  - cost: size ({record['size_of']}) {full['size_bytes']:,} -> "
        f"{chosen['size_bytes']:,} bytes "
        f"({chosen['size_bytes'] - full['size_bytes']:+,}), latency p50 "
        f"{full['latency_ms_p50']:.4f} -> {chosen['latency_ms_p50']:.4f} ms "
        f"({len(record['trials'])} mixes built and run)"
    )
    return lines


def _figures(trial: dict[str, Any]) -> str:
    """A mix's figures, one per check of the budget ("max_accuracy_drop 0.0028, min_sqnr_db
    (logits) 31.2"), and the thresholds it misses."""
    parts = [
        f"{name.removeprefix('verify.')} " + ("n/a" if value is None else f"{value:.4g}")
        for name, value in trial["figures"].items()
    ]
    missed = f"; misses {', '.join(trial['missed'])}" if trial["missed"] else ""
    return ", ".join(parts) + missed


def _short(name: str) -> str:
    """A TFLite tensor name up to its first ';' (TensorFlow joins fused ops' names)."""
    return name.split(";")[0]
