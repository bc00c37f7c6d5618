"""Run a recipe's pipeline: key each stage, reuse cached results, publish the build folder."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeflow.core import progress
from edgeflow.core.errors import AtRecipeKey, EdgeflowError, InternalError, StageFailed
from edgeflow.core.loader import relocated
from edgeflow.core.records import RECORDS, read_record, stale
from edgeflow.core.refs import file_sha256
from edgeflow.engine import console, keys
from edgeflow.engine.cache import Cache, slot_digest
from edgeflow.engine.pipeline import load_pipeline, pipeline_name
from edgeflow.engine.publish import check_owner, publish
from edgeflow.engine.tracebacks import summary, write_traceback
from edgeflow.engine.worker import Worker, for_build, run_isolated
from edgeflow.recipe import LoadedRecipe
from edgeflow.stages.base import WARNINGS_FILE, Stage, StageContext

# Files of the final stages that are copied into build/<recipe>/<target>-<mode>/.
PUBLISHED_SLOTS = (
    "artifact",
    "metrics",
    "report",
    "report_record",
    "html",
    "checks",
    "plots",
    "precheck",
    "layers",
    "verify",
    "layers_diff",
    "diff",
    "bisect",
)
# Checks that a per-layer diff cannot explain: it runs after a build misses any other one.
NOT_NUMERICAL = ("verify.max_latency_ms", "verify.max_size_bytes")


@dataclass(frozen=True)
class Slot:
    path: Path
    key: str  # identifies the content: the producing stage + a hash of the files, or a file hash


@dataclass
class StageOutcome:
    stage: str
    status: str  # ran | cached | failed
    seconds: float
    key: str = ""


@dataclass
class BuildResult:
    loaded: LoadedRecipe
    build_dir: Path
    outcomes: list[StageOutcome] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    failed_checks: list[str] = field(default_factory=list)
    # What the up-to-date stamp (edgeflow/engine/uptodate.py) keeps: the build's lines as a
    # rerun shows them (console.Event), the tool versions its keys held, the cache entries
    # it used.
    events: list[console.Event] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    entries: list[Path] = field(default_factory=list)


def stage_key(
    stage: Stage,
    loaded: LoadedRecipe,
    inputs: dict[str, Slot],
    memo: dict[str, Any] | None = None,
) -> str:
    return keys.digest(
        {
            "stage": stage.name,
            "version": stage.version,
            "code": keys.edgeflow_code(),
            "tools": keys.tool_versions(stage.tools_for(loaded.profile), memo),
            "recipe": keys.recipe_slice(loaded, stage.reads, stage.rule_levels, memo),
            "inputs": {slot: inputs[slot].key for slot in inputs},
        }
    )


def execute(
    stage: Stage,
    loaded: LoadedRecipe,
    inputs: dict[str, Path],
    out_dir: Path,
    worker: Worker | None = None,
) -> None:
    """Run one stage into `out_dir`; in a worker process when a native crash is possible
    (the build's warm `worker`, or one of its own).

    A user error stays an EdgeflowError; any other exception is a bug in edgeflow: an
    InternalError naming the stage, its full traceback written to out_dir/traceback.txt."""
    ctx = StageContext(stage, loaded, inputs, out_dir)
    if stage.isolated:
        if worker is None:
            run_isolated(ctx)
        else:
            worker.run(ctx)
        return
    try:
        stage.run(ctx)
    except AtRecipeKey as exc:
        raise relocated(exc, loaded.path) from exc
    except EdgeflowError:
        raise
    except InternalError as exc:
        write_traceback(out_dir)
        exc.details = out_dir
        raise
    except Exception as exc:
        write_traceback(out_dir)
        raise InternalError(f"stage '{stage.name}'", summary(exc), out_dir) from exc


def run_build(
    loaded: LoadedRecipe,
    cache: Cache,
    build_root: Path = Path("build"),
    echo: Callable[[str], None] = print,
    diff: str | None = None,
    notice: Callable[[str], None] | None = None,
) -> BuildResult:
    """Run every stage of the recipe's pipeline (cached where possible) and publish the build.

    `echo` gets the build's lines (one per stage); `notice` (default: `echo`) what must
    be said also when those are not shown: the stages' warnings and the finding of the
    per-layer diff or the bisection. While a stage runs it is a progress task
    (edgeflow.core.progress), its work the tasks inside it.

    `diff`: "layers" runs the per-layer diff after the pipeline; "bisect" the bisection
    (stages/bisect.py), also when convert or verify failed. Besides, the per-layer diff runs
    when the build misses an accuracy or agreement threshold and the recipe's
    diff.on_failure is set. The isolated stages share one worker process, started when the
    first of them runs."""
    with for_build(cache.root / "tmp") as worker:
        return _run_build(loaded, cache, build_root, worker, diff, echo, notice or echo)


def _run_build(
    loaded: LoadedRecipe,
    cache: Cache,
    build_root: Path,
    worker: Worker,
    diff: str | None,
    echo: Callable[[str], None],
    notice: Callable[[str], None],
) -> BuildResult:
    pipeline = load_pipeline(pipeline_name(loaded))
    result = BuildResult(loaded, build_root / loaded.stem / loaded.build_name)
    slots = seed_slots(loaded, pipeline.seeds)
    build = _Build(loaded, cache, slots, worker, echo, _recorded(notice, result.events), result)
    header = f"edgeflow: {loaded.stem} -> {loaded.build_name} ({pipeline.name} pipeline)"
    result.events.append(("line", header))
    echo(header)
    check_owner(result.build_dir, loaded.path)  # before the work, not after it
    cache.sweep()  # temporary folders of runs that were killed
    for stage in pipeline.stages:
        try:
            build.run(stage)
        except StageFailed:
            if diff == "bisect" and "float_onnx" in slots:  # a crash: where does it start?
                build.diagnose("bisect", forced=False, published=False)
            raise
    result.events.append(("all_cached", str(len(result.outcomes))))  # a rerun says so here
    if all(o.status == "cached" for o in result.outcomes):
        echo(console.all_cached(len(result.outcomes)))
    checks = read_record("checks", slots["checks"].path).dump() if "checks" in slots else []
    result.failed_checks = [c["message"] for c in checks if not c["passed"]]
    missed = [c for c in checks if not c["passed"] and c["metric"] not in NOT_NUMERICAL]
    if diff == "layers" or (missed and loaded.recipe.diff.on_failure):
        build.diagnose("diff", forced=diff == "layers")
    if diff == "bisect":
        build.diagnose("bisect", forced=True)
    if "layers_diff" in slots and "html" in slots:  # the page again, with the diff's plot
        from edgeflow.stages import STAGES

        build.run(STAGES["html"])
    published = {s: slots[s].path for s in PUBLISHED_SLOTS if s in slots}
    publish(result.build_dir, published, loaded.path)
    result.metrics = read_record("metrics", result.build_dir / "metrics.json").dump()
    result.versions = dict(build.memo.get("versions", {}))
    return result


def _recorded(notice: Callable[[str], None], events: list[console.Event]) -> Callable[[str], None]:
    def said(line: str) -> None:
        events.append(("notice", line))
        notice(line)

    return said


@dataclass
class _Build:
    """One build in progress: the slots filled so far and where stages run and report."""

    loaded: LoadedRecipe
    cache: Cache
    slots: dict[str, Slot]
    worker: Worker
    echo: Callable[[str], None]  # the build's lines
    notice: Callable[[str], None]  # warnings and findings: said also where lines are not
    result: BuildResult
    memo: dict[str, Any] = field(default_factory=dict)  # the target's JSON, tool versions

    def run(self, stage: Stage) -> None:
        """Run (or reuse) one stage and put what it produced into the slots."""
        loaded, echo, result = self.loaded, self.echo, self.result
        used = {s: self.slots[s] for s in (*stage.consumes, *stage.optional) if s in self.slots}
        key = stage_key(stage, loaded, used, self.memo)
        inputs = {slot: value.path for slot, value in used.items()}
        start = time.perf_counter()

        def produce(out_dir: Path) -> None:
            execute(stage, loaded, inputs, out_dir, self.worker)

        meta: dict[str, object] = {
            "recipe": str(loaded.path),
            "inputs": {k: str(v) for k, v in inputs.items()},
        }
        try:
            with progress.task(stage.name):
                entry, cached = self.cache.get_or_create(
                    stage.name, key, produce, meta, lambda entry: _stale_record(stage, entry)
                )
        except InternalError:
            _report(echo, result, stage.name, "failed", start, key)
            raise
        except EdgeflowError as exc:
            _report(echo, result, stage.name, "failed", start, key)
            if isinstance(exc, StageFailed):
                raise
            raise StageFailed(stage.name, exc.message, exc.hint, exc.exit_code) from exc
        _report(echo, result, stage.name, "cached" if cached else "ran", start, key)
        result.entries.append(entry)
        warnings = entry / WARNINGS_FILE
        for message in json.loads(warnings.read_text()) if warnings.is_file() else []:
            self.notice("  warning: " + message.replace("\n", "\n  "))
        for slot, name in stage.produces.items():  # keyed by content: early cut-off
            self.slots[slot] = Slot(entry / name, f"{stage.name}:{slot_digest(entry, name)}")

    def diagnose(self, name: str, forced: bool, published: bool = True) -> None:
        """The per-layer diff or the bisection after the pipeline; its one-line finding is
        echoed. When it runs because the build failed (not `forced`), a failure of its own
        is reported and the build's verdict stands. Not `published`: a stage failed, so the
        build folder is not written and only the cache entry holds the figures."""
        from edgeflow.stages import STAGES

        what = "per-layer diff" if name == "diff" else "bisection"
        missing = [s for s in STAGES[name].consumes if s not in self.slots]
        if missing:  # the native TensorFlow path: no ONNX model to compare the layers with
            reason = (
                f"the {what} compares the artifact's tensors with the ONNX model's, and this "
                "build made none (TensorFlow's own converter: convert.via native)"
            )
            hint = "build it with convert.via=onnx to diff it layer by layer"
            if forced:
                raise EdgeflowError(reason, hint)
            self.notice(f"  no {what}: {reason}")
            return
        try:
            self.run(STAGES[name])
        except (EdgeflowError, InternalError) as exc:
            if forced:
                raise
            self.notice(f"  the {what} failed: {exc.render()}")
            return
        found = read_record(name, self.slots[name].path).dump()
        self.notice(f"  {found['line']}")
        if found.get("hint"):
            self.notice(f"  hint: {found['hint']}")
        file = "layers_diff.csv" if name == "diff" else "bisect.json"
        where = self.slots[name].path.parent
        if published:
            self.notice(f"  figures: {self.result.build_dir / file} (and in {where})")
        else:
            self.notice(f"  figures: {where / file} (the build folder is not written)")
        if found.get("bisect"):  # the diff could not locate it: the bisection's turn
            self.notice(f"  {found['bisect']}: bisecting")
            self.diagnose("bisect", forced, published)


def _stale_record(stage: Stage, entry: Path) -> str | None:
    """What is wrong with a cached entry's records (one an older edgeflow wrote), if anything."""
    for slot, name in stage.produces.items():
        if slot in RECORDS:
            found = stale(slot, entry / name)
            if found:
                return found
    return None


def seed_slots(loaded: LoadedRecipe, seeds: dict[str, str]) -> dict[str, Slot]:
    """The slots a pipeline starts with: files the recipe names (an ONNX source model)."""
    slots = {}
    for slot, dotted in seeds.items():
        value: Any = loaded.recipe
        for part in dotted.split("."):
            value = getattr(value, part)
        path = Path(value)
        slots[slot] = Slot(path, f"file:{file_sha256(path)}")
    return slots


def _report(
    echo: Callable[[str], None],
    result: BuildResult,
    stage: str,
    status: str,
    start: float,
    key: str,
) -> None:
    seconds = time.perf_counter() - start
    result.outcomes.append(StageOutcome(stage, status, seconds, key))
    result.events.append(("stage", stage))
    echo(console.stage_line(stage, status, seconds))
