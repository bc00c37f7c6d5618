"""`edgeflow dvc stage`: the command of each DVC stage that `edgeflow dvc init` writes.

One edgeflow stage, its inputs read from the upstream stages' DVC outputs, its result renamed
into place only when complete (from a `.work-` holder beside it, edgeflow/engine/owned.py,
which the stage's next run removes if its process was killed); the last stage of a build
writes build/<recipe>/<build>/ exactly as `edgeflow run` does.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from edgeflow.core.errors import EXIT_FAILED, EXIT_NOT_VERIFIED, EdgeflowError
from edgeflow.core.loader import display_path
from edgeflow.core.records import read_record
from edgeflow.engine import owned
from edgeflow.engine.dvcfile import plan
from edgeflow.engine.dvcparams import Params, read_params
from edgeflow.recipe import load_recipe
from edgeflow.stages.base import WARNINGS_FILE


def run_stage(
    root: Path, recipe: str, stage_name: str, build: str | None, echo: Callable[[str], None] = print
) -> int:
    """Run one planned stage (the command of a DVC stage); returns the exit status."""
    import json
    import time

    from edgeflow.engine.publish import publish, replace_folder
    from edgeflow.engine.runner import PUBLISHED_SLOTS, execute

    root = root.resolve()
    recipe_path = (root / recipe).resolve()
    params = read_params(root) or Params()
    builds = [build] if build else list(params.builds)
    loaded_builds = {b: load_recipe(recipe_path, params.overrides(b), root) for b in builds}
    loaded = loaded_builds[builds[0]]
    wanted = (
        f"{recipe_path.stem}.{build}.{stage_name}" if build else f"{recipe_path.stem}.{stage_name}"
    )
    planned = {p.name: p for p in plan(recipe_path, loaded_builds, root)}
    if wanted not in planned:
        raise EdgeflowError(
            f"no stage {wanted} in the plan of {recipe}",
            "dvc.yaml is out of date: run `edgeflow dvc init` again",
        )
    step = planned[wanted]
    missing = [p for p in step.inputs.values() if not (root / p).exists()]
    if missing:
        raise EdgeflowError(
            f"{wanted}: input {missing[0]} is missing", "run `dvc repro`, which makes it first"
        )
    out = root / step.out
    out.parent.mkdir(parents=True, exist_ok=True)
    _sweep_work_folders(out)
    holder = owned.make(out.parent, f".{out.name}.work")
    tmp = holder / owned.CONTENT
    tmp.mkdir()
    start = time.perf_counter()
    inputs = {slot: root / path for slot, path in step.inputs.items()}
    try:
        execute(step.stage, loaded, inputs, tmp)
        warnings = tmp / WARNINGS_FILE
        messages = json.loads(warnings.read_text()) if warnings.is_file() else []
        if step.last:  # build/<recipe>/<build>/ as `edgeflow run` writes it
            slots = {slot: root / path for slot, path in step.published.items()}
            slots.update(
                {s: tmp / f for s, f in step.stage.produces.items() if s in PUBLISHED_SLOTS}
            )
            publish(out, slots, recipe_path)
        else:
            replace_folder(tmp, out)
    finally:
        owned.remove(holder, out.parent)
    echo(f"  {wanted:<40} ran {time.perf_counter() - start:7.2f} s")
    for message in messages:
        echo("  warning: " + message.replace("\n", "\n  "))
    if step.last:
        metrics = read_record("metrics", out / "metrics.json").dump()
        if metrics.get("not_verified") and not loaded.recipe.verify.allow_unverified:
            print(f"NOT VERIFIED: {metrics['not_verified']}", file=sys.stderr)
            return EXIT_NOT_VERIFIED
        if not metrics["verified"] and not metrics.get("not_verified"):
            print(
                f"error: verification failed; the build is kept for inspection in "
                f"{display_path(out)} (see report.md)",
                file=sys.stderr,
            )
            return EXIT_FAILED
    return 0


def _sweep_work_folders(out: Path) -> None:
    """Remove the work holders of this stage's killed runs (provably edgeflow's, their
    process gone); any other folder of that name shape stays."""
    for folder in out.parent.glob(f".{out.name}.work-*"):
        owner = owned.read(folder)
        if owner is not None and owner.dead():
            owned.remove(folder, out.parent)
