"""bisect: the shortest prefix of the model whose converted artifact fails.

For a conversion that crashes (a converter or runtime that aborts) or a runtime whose tensors
cannot be read, the per-layer diff has nothing to compare. Bisection cuts the float model the
converter reads after its k-th node: the prefix is nodes 0..k (onnx.utils.Extractor), its
outputs every float tensor that crosses the cut (read by a later node, or a model output), so
a branch that hides an error (a squeeze-excite gate saturating) cannot mask it. The prefix is
converted with the target's own converter and quantization (the recipe's calibration
samples), run in the target's runtime, and each output compared with onnxruntime's on the
same prefix (SQNR, as the diff). Each attempt runs in a child process, so an abort is a
verdict ("crash"), not the end of the search. A binary search over the cut points (nodes
with a float output of static shape, in graph order) finds the first whose prefix fails, in
about log2(nodes) conversions: a prefix holds every shorter one, so once one fails, every
longer one does.

`edgeflow diff --bisect` runs it after the build, also when convert or verify failed.
"""

from __future__ import annotations

import shutil
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edgeflow.core import progress
from edgeflow.core.errors import EdgeflowError, ToolCrashed
from edgeflow.schema.sections import fed_inputs
from edgeflow.schema.source import kept_layout
from edgeflow.stages.base import Stage, StageContext
from edgeflow.stages.convert import RUNTIMES
from edgeflow.stages.diff import READS as DIFF_READS

# A child that has not answered in this long is stopped and the prefix counted as a crash.
ATTEMPT_SECONDS = 600


@dataclass
class Attempt:
    index: int  # the cut tensor's position among the candidates
    tensor: str
    op: str
    node: str
    verdict: str  # ok, diverges, convert, run, crash
    detail: str = ""
    sqnr_db: float | None = None

    @property
    def failed(self) -> bool:
        return self.verdict != "ok"


def run(ctx: StageContext) -> None:
    import onnx

    from edgeflow.targets.taps import batches_of
    from edgeflow.verify.layers import DIVERGENCE_DB
    from edgeflow.verify.runners import batching
    from edgeflow.verify.stream import load_steps

    recipe, profile = ctx.recipe, ctx.profile
    if not profile.family.bisect:
        from edgeflow.targets.registry import offering

        raise EdgeflowError(
            f"bisection converts and runs prefixes: {profile.backend} cannot run them here",
            f"bisect a build for {' or '.join(offering(lambda b: b.bisect))}",
        )
    model = onnx.shape_inference.infer_shapes(onnx.load(str(ctx.inputs["float_onnx"])))
    candidates = cut_points(model)
    if not candidates:
        raise EdgeflowError("the model has no float tensor with a static shape to cut at")
    samples = load_steps(recipe.evaluation, recipe.source, "evaluation", ctx.inputs["float_onnx"])
    feeds = list(batches_of(samples, *batching(recipe.source), recipe.diff.samples))
    calibration = None
    if recipe.quantization.mode == "int8":
        calibration = load_steps(
            recipe.calibration, recipe.source, "calibration", ctx.inputs["float_onnx"]
        )
    threshold = recipe.diff.min_sqnr_db
    if threshold is None:
        threshold = DIVERGENCE_DB[recipe.quantization.mode]
    job = {
        "profile": profile,
        "quantization": profile.quantization_for(recipe.quantization),
        "inputs": list(fed_inputs(recipe.source.inputs)),
        "calibration": calibration,
        "kept_layout": kept_layout(recipe.source),
        "feeds": feeds,
        "threshold": threshold,
    }
    work = ctx.out_dir / ".work"
    work.mkdir()

    def attempt(k: int) -> Attempt:
        tensor, op, node = candidates[k]
        path = work / f"prefix-{k}.onnx"
        onnx.save(prefix(model, candidates, k), str(path))
        verdict, detail, sqnr = _in_child(path, work / f"prefix-{k}", job)
        tried.advance(detail=f"prefix {k + 1}/{len(candidates)} up to {tensor}: {verdict}")
        return Attempt(k, tensor, op, node, verdict, detail, sqnr)

    with progress.task("bisection", unit="prefixes converted") as tried:  # about log2(cuts)
        attempts = search(len(candidates), attempt)
    shutil.rmtree(work, ignore_errors=True)
    first = next((a for a in attempts if a.failed and _is_boundary(a, attempts)), None)
    last_ok = max((a for a in attempts if not a.failed), key=lambda a: a.index, default=None)
    ctx.write(
        "bisect",
        {
            "target": profile.name,
            "mode": recipe.quantization.mode,
            "candidates": len(candidates),
            "min_sqnr_db": threshold,
            "attempts": [asdict(a) for a in sorted(attempts, key=lambda a: a.index)],
            "first_failing": first and asdict(first),
            "last_passing": last_ok and asdict(last_ok),
            "line": line(first, last_ok, len(candidates)),
        },
    )


def cut_points(model: Any) -> list[tuple[str, str, str]]:
    """(tensor, op, node) for every float tensor with a static shape, in graph order."""
    import onnx

    graph = model.graph
    known = {
        v.name: v.type.tensor_type
        for v in (*graph.value_info, *graph.output)
        if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    }
    points = []
    for k, node in enumerate(graph.node):
        for name in node.output:
            t = known.get(name)
            if t is None or not t.HasField("shape"):
                continue
            if all(d.HasField("dim_value") for d in t.shape.dim):
                points.append((name, node.op_type, node.name or f"#{k}"))
    return points


def prefix(model: Any, candidates: list[tuple[str, str, str]], k: int) -> Any:
    """The model up to cut point k: its outputs are the cut points up to k that a node after
    it reads or that are model outputs (cut point k always)."""
    from onnx.utils import Extractor

    graph = model.graph
    position = {name: n for n, node in enumerate(graph.node) for name in node.output}
    end = position[candidates[k][0]]
    later = {i for node in list(graph.node)[end + 1 :] for i in node.input}
    later |= {o.name for o in graph.output}
    outputs = [t for j, (t, _, _) in enumerate(candidates[: k + 1]) if t in later or j == k]
    weights = {t.name for t in graph.initializer}
    inputs = [i.name for i in graph.input if i.name not in weights]
    return Extractor(model).extract_model(inputs, outputs)


def search(count: int, attempt: Any) -> list[Attempt]:
    """Binary search for the first failing cut point; the last one is tried first (when it
    passes, nothing fails and the search ends there)."""
    attempts = [attempt(count - 1)]
    if not attempts[0].failed:
        return attempts
    low, high = -1, count - 1  # prefix `low` passes (-1: the empty one), `high` fails
    while high - low > 1:
        middle = (low + high) // 2
        tried = attempt(middle)
        attempts.append(tried)
        if tried.failed:
            high = middle
        else:
            low = middle
    return attempts


def _is_boundary(failed: Attempt, attempts: list[Attempt]) -> bool:
    """The failing attempt with the lowest index is the boundary of the search."""
    return failed.index == min(a.index for a in attempts if a.failed)


def line(first: Attempt | None, last_ok: Attempt | None, count: int) -> str:
    if first is None:
        return f"bisect: the whole model ({count} cut points) converts and matches its source"
    why = f"{first.verdict}" + (f": {first.detail}" if first.detail else "")
    after = f"; up to {last_ok.tensor} ({last_ok.op}) it passes" if last_ok else ""
    return (
        f"bisect: the shortest failing prefix ends at {first.tensor} ({first.op}, node "
        f"{first.node}), {why}{after}"
    )


def _in_child(path: Path, out: Path, job: dict[str, Any]) -> tuple[str, str, float | None]:
    """One attempt in a child process: (verdict, detail, SQNR); a child that dies is a crash."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe(duplex=False)
    process = context.Process(target=_attempt, args=(child, path, out, job))
    process.start()
    child.close()
    try:
        if parent.poll(ATTEMPT_SECONDS):
            return parent.recv()
        process.kill()
        return "crash", f"no answer in {ATTEMPT_SECONDS} s", None
    except EOFError:
        process.join()
        return "crash", f"the process died (exit code {process.exitcode})", None
    finally:
        parent.close()
        process.join(timeout=30)


def _attempt(conn: Any, path: Path, out: Path, job: dict[str, Any]) -> None:
    try:
        conn.send(_convert_and_compare(path, out, job))
    except Exception as exc:  # a bug here must not read as the target's verdict
        text = "".join(traceback.format_exception_only(exc)).strip()
        conn.send(("error", f"internal error (a bug in edgeflow): {text}", None))
    conn.close()


def _convert_and_compare(
    path: Path, out: Path, job: dict[str, Any]
) -> tuple[str, str, float | None]:
    import numpy as np

    from edgeflow.core.onnxsession import checking_session
    from edgeflow.targets import backend
    from edgeflow.targets.base import ConvertJob
    from edgeflow.targets.trial import first_lines
    from edgeflow.verify.kinds import sqnr_db

    module = backend(job["profile"])
    out.mkdir()
    convert = ConvertJob(
        path,
        out,
        job["profile"],
        job["quantization"],
        job["inputs"],
        job["calibration"],
        kept_layout=job["kept_layout"],
    )
    try:
        info = module.convert(convert)
    except EdgeflowError as exc:
        return "convert", first_lines(exc.message), None
    try:
        runner = module.open_runner(out, info)
        got = [runner.run(feeds) for feeds in job["feeds"]]
    except ToolCrashed as exc:  # the runtime's own process died (Arm NN's aborts)
        return "crash", first_lines(exc.message), None
    except EdgeflowError as exc:
        return "run", first_lines(exc.message), None
    session = checking_session(path)
    names = [o.name for o in session.get_outputs()]
    wanted = [session.run(None, feeds) for feeds in job["feeds"]]
    sqnrs = {}
    for k, name in enumerate(names):
        for w, g in zip(wanted, got, strict=True):
            if np.shape(g[k]) != np.shape(w[k]):
                return "diverges", f"{name}: shape {np.shape(g[k])}, not {np.shape(w[k])}", None
        want = np.concatenate([np.ravel(w[k]) for w in wanted])
        sqnrs[name] = sqnr_db(want, np.concatenate([np.ravel(g[k]) for g in got]))
    worst = min(sqnrs, key=lambda n: sqnrs[n])
    sqnr = sqnrs[worst]
    if sqnr < job["threshold"]:
        why = f"{worst}: SQNR {sqnr:.1f} dB (below {job['threshold']:g} dB)"
        return "diverges", why, round(sqnr, 2)
    return "ok", "", round(sqnr, 2) if np.isfinite(sqnr) else None


STAGE = Stage(
    name="bisect",
    description="Find the shortest model prefix whose converted artifact fails.",
    run=run,
    consumes=("float_onnx",),
    produces={"bisect": "bisect.json"},
    reads=(*DIFF_READS, "calibration"),
    tools=("onnx", *RUNTIMES, "numpy"),
    isolated=True,
)
