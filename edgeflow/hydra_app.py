"""`edgeflow run` as a Hydra app: config groups recipe, target and quantization.

The groups are filled from the working directory's recipes/ and targets/ folders and from the
built-ins, so `recipe=NAME target=NAME quantization=PRESET`, single keys such as
`quantization.mode=fp16`, and `-m` sweeps all work. A recipe can also be given by path.
Hydra only selects; each job loads its recipe file itself, so errors keep file:line:col.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import sys
import threading
import time
import traceback
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeflow.core import progress, resources
from edgeflow.core.codehash import recording
from edgeflow.core.errors import EXIT_FAILED, EXIT_NOT_VERIFIED, EdgeflowError, InternalError
from edgeflow.schema.sections import QUANTIZATION_KEYS, QUANTIZATION_PRESETS

if TYPE_CHECKING:
    from edgeflow.engine.uptodate import Invocation

_exit_codes: list[int] = []
_results: list[Any] = []  # the BuildResults of the builds run in this process (run_hydra)
_diff: list[str | None] = [None]  # run_build's `diff` for the jobs of this run
_said: list[tuple[str, str]] = []  # ("out" | "err", line): what the jobs printed after a build
ROWS = "edgeflow-rows"  # in the sweep folder: one JSON row per job (edgeflow.report.sweep)


def run_hydra(
    args: list[str],
    diff: str | None = None,
    quiet: bool = False,
    results: list[Any] | None = None,
    stamp: Invocation | None = None,
) -> int:
    """Run `edgeflow run ARGS`; returns the worst exit status over all jobs. `diff`: the
    per-layer diff ("layers") or the bisection ("bisect") after each build (`edgeflow diff`),
    or the diff only after a build that misses a threshold (None). `quiet`: print only each
    build's summary (edgeflow.engine.console). `results`: gets the BuildResult of each build
    that ran in this process (`edgeflow fix` reads what they chose). `stamp`: the run's
    up-to-date stamp is written when its one build ends (edgeflow/engine/uptodate.py)."""
    with recording() as hashed:
        code = _run_hydra(args, diff, quiet, results)
    if stamp is not None and len(_results) == 1 and len(_exit_codes) == 1:
        stamp.write(_results[0], hashed, list(_said), code)
    return code


def _run_hydra(args: list[str], diff: str | None, quiet: bool, results: list[Any] | None) -> int:
    import hydra

    from edgeflow.engine import console

    args = _route(_register_groups(args))
    _exit_codes.clear()
    _results.clear()
    _said.clear()
    _diff[0] = diff
    app = hydra.main(version_base=None, config_name="edgeflow_run")(_job)
    sweep_dir = None
    if {"-m", "--multirun"} & set(args):
        # Each job writes its row into the sweep folder (launchers such as joblib run jobs in
        # other processes); a sweep folder given on the command line is used as it is.
        given = [a.split("=", 1)[1] for a in args if a.startswith("hydra.sweep.dir=")]
        stamp = f"{time.strftime('%Y-%m-%d_%H-%M-%S')}-{os.getpid()}"
        sweep_dir = Path(given[-1]) if given else Path(".edgeflow/multirun") / stamp
        if not given:
            args = [*args, f"hydra.sweep.dir={sweep_dir}"]
    if quiet and not any(a.startswith("hydra/hydra_logging=") for a in args):
        args = [*args, "hydra/hydra_logging=disabled"]  # its `Launching 4 jobs` lines
    launcher = [a.split("=", 1)[1] for a in args if a.startswith("hydra/launcher=")]
    elsewhere = sweep_dir is not None and launcher[-1:] not in ([], ["basic"])  # jobs' processes
    saved = sys.argv
    sys.argv = ["edgeflow run", *args]
    from edgeflow.engine.worker import session

    try:
        with (
            console.session(console.choose(quiet), elsewhere),
            session(),  # the jobs Hydra runs in this process share one worker
            _counted(sweep_dir, args),
        ):
            app()
    finally:
        sys.argv = saved
    if sweep_dir is not None:  # jobs that ran in other processes report only in their rows
        _exit_codes.extend(_summarize(sweep_dir))
    if results is not None:
        results.extend(_results)
    return max(_exit_codes, default=0)


@contextlib.contextmanager
def _counted(sweep_dir: Path | None, args: list[str]) -> Iterator[None]:
    """A sweep as a progress task: its jobs (`sweep_jobs`) and how many are done, counted
    from the rows the jobs write, in this process or in a launcher's."""
    if sweep_dir is None or not progress.enabled():
        yield
        return
    rows = sweep_dir / ROWS
    before = _rows(rows)  # a sweep folder given on the command line may hold some
    done, stop = [0], threading.Event()
    with progress.task("sweep", total=sweep_jobs(args), unit="jobs") as task:

        def count() -> None:
            now = _rows(rows) - before
            if now > done[0]:
                task.advance(now - done[0])
                done[0] = now

        def poll() -> None:
            while not stop.wait(0.5):
                count()

        poller = threading.Thread(target=poll, name="edgeflow-sweep-progress", daemon=True)
        poller.start()
        try:
            yield
        finally:
            stop.set()
            poller.join()
            count()


def _rows(folder: Path) -> int:
    return sum(1 for _ in folder.glob("*.json")) if folder.is_dir() else 0


def sweep_jobs(args: list[str]) -> int | None:
    """How many jobs Hydra's basic sweeper makes of these overrides: the product of each
    sweep's length (`target=a,b quantization.mode=none,int8`: 4). None where a sweep's
    length is not in the overrides alone (a glob over a config group's options, an interval,
    a sweeper's own `hydra.sweeper.params`)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ValueType
    from hydra.errors import HydraException

    overrides = [a for a in args if "=" in a and not a.startswith("-")]  # not -m, --cfg job
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException:  # Hydra says what is wrong when it parses them itself
        return None
    jobs = 1
    for override in parsed:
        if override.get_key_element().startswith("hydra.sweeper.params"):
            return None
        if not override.is_sweep_override():
            continue
        if not override.is_discrete_sweep() or override.value_type == ValueType.GLOB_CHOICE_SWEEP:
            return None
        jobs *= len(list(override.sweep_string_iterator()))
    return jobs


def _summarize(sweep_dir: Path) -> list[int]:
    """After a sweep: one table of every job's row (written by the jobs, wherever the
    launcher ran them), Pareto-optimal builds marked, and sweep.json; returns the jobs'
    exit statuses."""
    import json

    from edgeflow.report import sweep

    found = sorted((sweep_dir / ROWS).glob("*.json"), key=lambda p: int(p.stem))
    rows = [json.loads(p.read_text(encoding="utf-8")) for p in found]
    if not rows:
        return []
    sweep.mark_pareto(rows)
    print(f"\nsweep: {len(rows)} builds ({sum(r['pareto'] for r in rows)} Pareto-optimal *)")
    print(sweep.render(rows))
    for build_dir in sorted({r.pop("build_dir") for r in rows}):
        sweep.write(rows, Path(build_dir) / "sweep.json")
        sweep.write_html(rows, Path(build_dir) / "sweep.html")
        print(f"sweep.json: {Path(build_dir) / 'sweep.json'}")
        print(f"sweep.html: {Path(build_dir) / 'sweep.html'}")
    return [int(r.pop("exit")) for r in rows]


def _record(row: dict[str, Any], build_dir: str, code: int) -> None:
    """Keep the job's exit status, and in a sweep its row, on disk for _summarize."""
    import json

    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    _exit_codes.append(code)
    config = HydraConfig.get()
    if config.mode != RunMode.MULTIRUN:
        return
    folder = Path(config.sweep.dir) / ROWS
    folder.mkdir(parents=True, exist_ok=True)
    row = {**row, "build_dir": build_dir, "exit": code}
    (folder / f"{config.job.num}.json").write_text(json.dumps(row), encoding="utf-8")


# Recipe sections (and top-level keys) any key of which can be set on the command line
# (`verify.max_abs_diff=1e-4`, `precheck.continue_on_failure=true`, `target_rewrites=false`,
# `rewrites=[onnx.decompose]`, `+rewrites=[...]` to append): every top-level key of the
# recipe schema but the config groups (target and quantization, chosen as groups instead)
# and what the loader sets itself (rewrites_auto, from `rewrites: auto`).
NOT_SET_AS_KEYS = ("target", "quantization", "rewrites_auto")


@functools.cache
def recipe_sections() -> tuple[str, ...]:
    from edgeflow.recipe.schema import Recipe

    return tuple(name for name in Recipe.model_fields if name not in NOT_SET_AS_KEYS)


@functools.cache
def keyed_sections() -> tuple[str, ...]:
    """The recipe sections with keys of their own (`verify.max_abs_diff=1e-4`), as the
    schema declares them: those whose value is a model (or a choice of models)."""
    from pydantic import BaseModel

    from edgeflow.recipe.schema import Recipe

    def models(annotation: Any) -> bool:
        if isinstance(annotation, type):
            return issubclass(annotation, BaseModel)
        return any(models(arg) for arg in typing.get_args(annotation))

    return tuple(n for n in recipe_sections() if models(Recipe.model_fields[n].annotation))


RUN_KEYS = ("recipe", "target", "quantization", "cache_dir", "build_dir")
# `target.<key>=value`: the recipe keys that choose within a target (its accelerator)
TARGET_KEYS = ("accelerator",)
OVERRIDES = "recipe_overrides"  # where Hydra keeps them: +recipe_overrides.<key>=<value>
APPENDS = "recipe_appends"  # +rewrites=[...]: appended to the recipe's list


def _route(args: list[str]) -> list[str]:
    """Check every override and route recipe keys to where the job finds them:
    `verify.max_abs_diff=1e-4` -> `+recipe_overrides.verify.max_abs_diff=1e-4` (Hydra then
    accepts and sweeps any recipe key; the job hands them to the recipe loader, which
    validates them and names the command line in its errors), `+rewrites=[...]` ->
    `+recipe_appends.rewrites=[...]`. An override of a key nothing reads is an error: no
    override is ever ignored."""
    from edgeflow.core.suggest import did_you_mean

    routed = []
    for arg in args:
        if arg.startswith("-") or ("=" not in arg and not arg.startswith("~")):
            routed.append(arg)  # a flag (-m, --cfg job) or a flag's value
            continue
        prefix = next(p for p in ("++", "+", "~", "") if arg.startswith(p))
        key, _, value = arg[len(prefix) :].partition("=")
        head, _, rest = key.partition(".")
        if head == "hydra" or head.startswith("hydra/"):
            routed.append(arg)
        elif head == "target" and rest in TARGET_KEYS:  # an NPU target's accelerator
            if prefix == "~":
                raise _not_removable(arg, key)
            routed.append(f"+{OVERRIDES}.{rest}={value}")
        elif head in RUN_KEYS and not (head == "quantization" and rest):
            if head == "target" and rest:
                raise EdgeflowError(
                    f"{arg}: a target is chosen whole (target=NAME), but for "
                    f"{', '.join(f'target.{k}' for k in TARGET_KEYS)}",
                    "write a profile that extends it (docs/targets.md), or see `edgeflow run "
                    "--help`",
                )
            if prefix == "~" or rest:
                raise EdgeflowError(f"{arg}: cannot be removed or set part by part", RUN_HELP_HINT)
            routed.append(f"{key}={value}")  # `+cache_dir=x` means the same as `cache_dir=x`
        elif head == "quantization":
            if rest not in QUANTIZATION_KEYS:
                raise EdgeflowError(
                    f"{arg}: unknown quantization key '{rest}'",
                    did_you_mean(rest, QUANTIZATION_KEYS)
                    or f"quantization keys: {', '.join(QUANTIZATION_KEYS)}",
                )
            if prefix == "~":
                raise _not_removable(arg, key)
            routed.append(f"{key}={value}")
        elif head in recipe_sections():
            if prefix == "~":
                raise _not_removable(arg, key)
            if prefix == "+" and key == "rewrites":
                routed.append(f"+{APPENDS}.rewrites={value}")
            else:
                routed.append(f"+{OVERRIDES}.{key}={value}")
        else:
            raise EdgeflowError(
                f"{arg}: unknown key '{head}'",
                did_you_mean(head, [*RUN_KEYS, *recipe_sections()]) or RUN_HELP_HINT,
            )
    return routed


RUN_HELP_HINT = "see `edgeflow run --help` for the keys a run takes"


def _not_removable(arg: str, key: str) -> EdgeflowError:
    """`~key`: a recipe key cannot be removed here; the hint sets it to its default, where
    the schema has one (`verify.latency_runs=100`; `null` would not mean that)."""
    default = _default(key)
    instead = f"set it to its default instead ({key}={default}), or " if default else ""
    return EdgeflowError(
        f"{arg}: a recipe key cannot be removed on the command line",
        f"{instead}edit the recipe",
    )


def _default(key: str) -> str | None:
    """The recipe schema's default for a dotted key, as an override's value (None where the
    key is required, or its section is one of several kinds, as `source` is)."""
    import typing

    from pydantic import BaseModel

    from edgeflow.recipe.schema import Recipe
    from edgeflow.rules.entries import flow

    model: Any = Recipe
    *parents, last = key.split(".")
    for part in parents:
        field = model.model_fields.get(part)
        inner = field.annotation if field else None
        args = [a for a in typing.get_args(inner) if a is not type(None)]
        inner = args[0] if len(args) == 1 else inner  # X | None
        if not (isinstance(inner, type) and issubclass(inner, BaseModel)):
            return None
        model = inner
    field = model.model_fields.get(last)
    if field is None or field.is_required():
        return None
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):  # a section at its defaults: an empty mapping is that
        return "{}" if value == type(value)() else None
    try:
        return flow(list(value) if isinstance(value, tuple) else value)
    except (TypeError, ValueError):
        return None


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict) or (prefix and not node):  # `verify={}` is a value too
        return {prefix: node}
    found: dict[str, Any] = {}
    for key, value in node.items():
        found.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return found


def _register_groups(args: list[str]) -> list[str]:
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    recipes, targets = resources.available("recipes"), resources.available("targets")
    for name, path in recipes.items():
        store.store(group="recipe", name=name, node={"name": name, "path": str(path)})
    given: dict[str, Path] = {}  # recipes given by path, by the option name they get
    args = [_register_recipe_paths(store, a, given) if a.startswith("recipe=") else a for a in args]
    _check_choices(
        args,
        "recipe",
        {**recipes, **given},
        "a recipe name from ./recipes/ or a path to a YAML file",
    )
    _check_choices(args, "target", targets, "a profile name from ./targets/ or the built-ins")
    _check_choices(
        args, "quantization", QUANTIZATION_PRESETS, "or set one key: quantization.mode=int8"
    )
    store.store(group="target", name="recipe", node={"name": None})
    for name in targets:
        store.store(group="target", name=name, node={"name": name})
    for name, preset in QUANTIZATION_PRESETS.items():
        node = {key: preset.get(key) for key in QUANTIZATION_KEYS}
        store.store(group="quantization", name=name, node=node)
    store.store(
        name="edgeflow_run",
        node={
            "defaults": [
                "_self_",
                {"recipe": "???"},
                {"target": "recipe"},
                {"quantization": "recipe"},
                {"override hydra/job_logging": "disabled"},
            ],
            "cache_dir": ".edgeflow/cache",
            "build_dir": "build",
            "hydra": {
                "run": {"dir": "."},
                "output_subdir": None,
                "sweep": {
                    "dir": ".edgeflow/multirun/${now:%Y-%m-%d_%H-%M-%S}",
                    "subdir": "${hydra.job.num}",
                },
            },
        },
    )
    return args


def _check_choices(args: list[str], group: str, known: Any, hint: str) -> None:
    """Reject an unknown group option with a suggestion, before Hydra does it less kindly."""
    from edgeflow.core.suggest import did_you_mean

    for arg in args:
        if not arg.startswith(f"{group}="):
            continue
        for value in arg.split("=", 1)[1].split(","):
            if value not in known and "/" not in value:
                if group == "recipe" and Path(value).is_dir():
                    from edgeflow.recipe import folder_error

                    raise folder_error(Path(value))
                raise EdgeflowError(
                    f"{arg}: unknown {group} '{value}'", did_you_mean(value, known) or hint
                )


def _register_recipe_paths(store: Any, arg: str, given: dict[str, Path]) -> str:
    """`recipe=path/to/x.yaml[,other]`: register each path as a group option (named under
    file/ or, outside the working directory, path/<hash>/, apart from the recipes known by
    name); rewrite the value."""
    values = []
    for value in arg.split("=", 1)[1].split(","):
        path = Path(value)
        if path.suffix not in (".yaml", ".yml") and "/" not in value:
            values.append(value)
            continue
        if not path.is_file():
            if path.is_dir():
                from edgeflow.recipe import folder_error

                raise folder_error(path)
            raise EdgeflowError(f"recipe file not found: {value}", "check the path")
        rel = Path("file") / path.with_suffix("")
        if path.is_absolute() or ".." in path.parts:
            digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]
            rel = Path("path") / digest / path.stem
        group = "/".join(("recipe", *rel.parts[:-1]))
        store.store(
            group=group, name=rel.name, node={"name": path.stem, "path": str(path.resolve())}
        )
        given[rel.as_posix()] = path
        values.append(rel.as_posix())
    return "recipe=" + ",".join(values)


def _job(cfg: Any) -> None:
    from omegaconf import OmegaConf

    from edgeflow.engine import console
    from edgeflow.engine.cache import Cache
    from edgeflow.engine.runner import run_build
    from edgeflow.recipe import load_recipe
    from edgeflow.report import sweep

    extra = OmegaConf.to_container(cfg[OVERRIDES]) if OVERRIDES in cfg else {}
    overrides: dict[str, Any] = _flat(extra)
    if APPENDS in cfg:
        appended: Any = OmegaConf.to_container(cfg[APPENDS])
        overrides["rewrites+"] = appended["rewrites"]
    if cfg.target.name:
        overrides["target"] = cfg.target.name
    for key in QUANTIZATION_KEYS:
        value = cfg.quantization[key]
        if value is not None:  # a list (keep_float) as a list, not OmegaConf's
            plain = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
            overrides[f"quantization.{key}"] = plain
    job = ", ".join(f"{k}={v}" for k, v in overrides.items()) or "as the recipe says"
    try:
        loaded = load_recipe(Path(cfg.recipe.path), overrides)
        lines = console.lines(console.job_mode())
        cache, build = Cache(Path(cfg.cache_dir)), Path(cfg.build_dir)
        result = run_build(loaded, cache, build, lines, _diff[0], notice=console.say)
    except (EdgeflowError, InternalError) as exc:
        print(f"error: {exc.render()}", file=sys.stderr)
        row = sweep.row(cfg.recipe.name, job, None, exc.render().splitlines()[0])
        _record(row, str(cfg.build_dir), exc.exit_code)
        return
    except Exception:  # a bug outside any stage: say so, with its traceback
        text = traceback.format_exc()
        print(f"error: internal error (a bug in edgeflow), report it:\n{text}", file=sys.stderr)
        row = sweep.row(cfg.recipe.name, job, None, "internal error (a bug in edgeflow)")
        _record(row, str(cfg.build_dir), EXIT_FAILED)
        return
    from edgeflow.report.markdown import one_line

    _results.append(result)
    row = sweep.row(loaded.stem, loaded.build_name, result.metrics, "; ".join(result.failed_checks))
    _say(f"  -> {result.build_dir}: {one_line(result.metrics)}")
    if "auto_rewrites" in result.metrics:
        _say(f"  auto rewrites: {', '.join(result.metrics['auto_rewrites']) or 'none needed'}")
    if result.failed_checks:
        for message in result.failed_checks:
            _say(f"error: verification failed: {message}", err=True)
        _say(f"  the artifact is kept for inspection in {result.build_dir}", err=True)
        _record(row, str(cfg.build_dir), 1)
    elif result.metrics.get("not_verified"):
        reason = result.metrics["not_verified"]
        if loaded.recipe.verify.allow_unverified:  # metrics.json still says verified: false
            _say(f"  not verified: {reason} (allowed by verify.allow_unverified)")
            _record(row, str(cfg.build_dir), 0)
        else:
            _say(f"NOT VERIFIED: {reason}", err=True)
            _say(
                "  the artifact is built but was not run; set verify.allow_unverified: true "
                "(verify.allow_unverified=true) to accept that",
                err=True,
            )
            _record(row, str(cfg.build_dir), EXIT_NOT_VERIFIED)
    else:
        _say("  verified: every threshold in the recipe holds")
        _record(row, str(cfg.build_dir), 0)


def _say(line: str, err: bool = False) -> None:
    """Print a line of what a build ends with; the up-to-date stamp keeps it for a rerun."""
    _said.append(("err" if err else "out", line))
    print(line, file=sys.stderr if err else sys.stdout)
