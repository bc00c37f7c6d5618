"""The `edgeflow` command. Thin: parse arguments, call the library, turn user errors into exit 2.

Heavy imports (torch, onnxruntime, hydra) happen inside the subcommands that need them, so
`edgeflow --help` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

from edgeflow import __version__
from edgeflow.core.errors import EdgeflowError, InternalError, Interrupted, first_line

RUN_HELP = """\
usage: edgeflow run recipe=NAME|PATH [target=NAME] [quantization=PRESET] [KEY=VALUE ...] [-m]
                    [--quiet]

Build, verify and report a recipe. Arguments are Hydra overrides:
  recipe=digits_cnn                a recipe from ./recipes/ or the built-ins, or a YAML path
  target=onnxruntime_micro         a target profile from ./targets/ or the built-ins
  quantization=int8                a preset ({presets})
  quantization.mode=fp16           or any single quantization key
  verify.max_abs_diff=1e-4         any key of the recipe's other sections ({sections})
  convert.via=onnx                 a tensorflow source: tf2onnx and the ONNX pipeline, not
                                   TensorFlow's own TFLite converter (native)
  target_rewrites=false            skip the target profile's default rewrites
  target.accelerator=ethos-u85-256 an NPU target's accelerator (ethos_u; the recipe key
                                   accelerator:)
  rewrites=[onnx.decompose]        set the recipe's rewrites; +rewrites=[...] appends to them
  rewrites=auto                    apply the rules the precheck proves remove a finding (and,
                                   for PyTorch, those explain names for an export failure);
                                   +rewrites=[auto] after the recipe's own
  verify.allow_unverified=true     exit 0, not 3, when the target's runtime is absent here
  cache_dir=.edgeflow/cache build_dir=build
  -m target=a,b quantization.mode=int8,none    sweep every combination (Hydra multirun); ends
                                   with one table and build/sweep.json, Pareto builds marked
  -q, --quiet                      print only each build's summary (its `-> build/...`
                                   line, verified or error lines), its warnings, a sweep's table
Hydra's own flags work too: --cfg job, --info, hydra/launcher=joblib (the `sweep` extra).
Output: one line per stage as it ends; on a terminal also, while a stage runs, what it does
(calibration, evaluation, latency runs, ...) with a bar, a count and the elapsed time, and
a sweep's jobs done. Piped, in CI (CI set) or in jobs a launcher runs in other processes:
the stage lines only, without escape sequences. Errors go to stderr.
A key nothing reads is an error. Exit status: 0 verified, 1 a threshold missed, a tool crash
or a bug in edgeflow, 2 a problem for you to fix, 3 NOT VERIFIED (the runtime is absent).
"""


def run_help() -> str:
    """RUN_HELP with the presets and the recipe's sections as the schema has them."""
    import textwrap

    from edgeflow.hydra_app import keyed_sections
    from edgeflow.schema.sections import QUANTIZATION_PRESETS

    def listed(words: list[str] | tuple[str, ...], first: int) -> str:
        text = ", ".join(words)
        lines = textwrap.wrap(text, 97 - 35, initial_indent=" " * first)
        return "\n".join([lines[0].lstrip(), *(" " * 35 + line for line in lines[1:])])

    presets = [p for p in QUANTIZATION_PRESETS if p != "recipe"]
    return RUN_HELP.format(presets=listed(presets, 12), sections=listed(keyed_sections(), 40))


DIFF_HELP = """\
usage: edgeflow diff RECIPE [--bisect] [--quiet] [target=NAME] [quantization=PRESET]
                     [KEY=VALUE ...]

Build the recipe (cached stages are reused), then compare every tensor of the artifact, run
in the target's real runtime, with its counterpart in the source ONNX model (after the
recipe's rewrites, in onnxruntime float32) on the first diff.samples evaluation samples.
Writes layers_diff.csv (tensor, op, node, shape, max abs diff, error relative to the tensor's
range, SQNR in dB, how it was paired) and diff.json into the build folder, and prints the
first tensor whose SQNR falls below diff.min_sqnr_db (default by mode: none 60, fp16 40,
int8 15, int8_weights 20 dB):
  first divergence: <tensor> (<op>, node <name>), SQNR 41 dB -> 7 dB
Where no tensor inside the model pairs with one of the artifact's, it bisects (below).
--bisect instead cuts the model at its tensors and converts and runs each prefix in a child
process (binary search, about log2(tensors) conversions) to find the shortest prefix that
crashes, fails to convert or diverges; it runs also when convert or verify fails (bisect.json).
On a terminal the prefixes converted so far show while the bisection runs. --quiet prints
the finding and the build's summary, not the stage lines.
The arguments are those of `edgeflow run` (RECIPE is recipe=RECIPE); the exit status too.
`edgeflow run` runs the same diff after a build that misses an accuracy or agreement
threshold (diff.on_failure: true).
"""


INIT_HELP = """\
Write a recipe for a model, read from the model itself: its inputs (static shapes; an open
dim gets 1 on axis 0, 32 elsewhere, and the recipe's comment says so), dtypes and outputs;
batch axes, 0-D inputs and state links (an output of an input's shape, named like it:
state -> new_state, h -> h_out) proposed with a comment. Every key's comment points to its
section of docs/recipe.md. Beside the recipe goes NAME_data.py, whose samples() returns
RANDOM arrays of the inputs' shapes and dtypes, to be replaced by real data (--data
FILE.npz: the recipe reads that file instead). Metric: agreement with the model; float32.
The recipe is validated before it is written; an existing file is never overwritten.

MODEL is one of:
  model.onnx                       an ONNX file
  saved_model/                     a TensorFlow SavedModel folder
  model.keras, model.h5            a Keras model file
  net.py:Net, pkg.module:Net       a torch.nn.Module class (or a function returning a module,
                                   a keras.Model, or (apply_fn, params) for JAX); its inputs
                                   are forward's (apply_fn's) parameters, each shaped with
                                   --input, its constructor's arguments from --init

examples:
  edgeflow init model.onnx
  edgeflow init net.py:Net --init hidden=16 --input x:1x40 --input state:1x16
  edgeflow init edgeflow.zoo.digits_flax:digits_cnn --input image:1x8x8x1
Then: edgeflow run recipe=recipes/NAME.yaml rewrites=auto   (the rules the precheck proves
      it needs; edgeflow fix recipes/NAME.yaml writes them into the recipe)
"""

QUIET = ("-q", "--quiet")  # `run` and `diff`: the summary only (edgeflow.engine.console)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="edgeflow",
        description="Convert trained models to edge runtimes from a YAML recipe, and verify them.",
    )
    parser.add_argument("--version", action="version", version=f"edgeflow {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    init = sub.add_parser(
        "init",
        help="write a recipe (and random data to replace) for a model file or class",
        description=INIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    init.add_argument("model", metavar="MODEL", help="the model: a file, a folder or code")
    init.add_argument(
        "--target", default="onnxruntime_micro", help="the recipe's target (onnxruntime_micro)"
    )
    init.add_argument(
        "-o",
        "--output",
        type=Path,
        metavar="RECIPE.yaml",
        help="where to write it (default: NAME.yaml in ./recipes/ if there is one, else in "
        "the current folder; NAME from the model's file or class); NAME_data.py goes beside",
    )
    init.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME:SHAPE[:DTYPE]",
        help="an input's shape, SHAPE as sizes joined by x (1x3x32x32) or scalar (0-D), "
        "DTYPE float32 by default: needed for code, for a file it sets open dims; repeat it",
    )
    init.add_argument(
        "--init",
        action="append",
        default=[],
        dest="init_args",
        metavar="KEY=VALUE",
        help="a constructor (or builder) argument, VALUE read as YAML (16, 0.5, true, "
        "[1, 2]); repeat it",
    )
    init.add_argument(
        "--data",
        type=Path,
        metavar="FILE.npz",
        help="your samples (an array per input name) for calibration and evaluation, "
        "instead of a NAME_data.py of random ones",
    )
    init.add_argument(
        "--kind",
        choices=("onnx", "tensorflow", "pytorch", "jax"),
        help="the source kind it must be (default: what the model is)",
    )
    sub.add_parser("run", help="build, verify and report a recipe (Hydra overrides; -m sweeps)")
    sub.add_parser("diff", help="build a recipe, then compare every tensor of the artifact")
    validate = sub.add_parser("validate", help="check recipe files without running them")
    validate.add_argument("recipes", nargs="+", metavar="RECIPE", help="recipe name or path")
    sub.add_parser("list", help="list the recipes, targets and pipelines edgeflow can see")
    sub.add_parser("rules", help="list the rewrite rules with their options")
    pre = sub.add_parser("precheck", help="check any ONNX file against a target, no recipe needed")
    pre.add_argument("model", type=Path, metavar="MODEL.onnx")
    pre.add_argument("--target", required=True, help="a target profile name")
    pre.add_argument("--json", action="store_true", help="print the findings as JSON")
    pre.add_argument("--board", help="a memory preset of the target (default: its default)")
    pre.add_argument(
        "--quantization",
        choices=("none", "fp16", "int8", "int8_weights"),
        help="the mode the check and the memory estimate assume (default: none, or the "
        "target's first mode where it builds no float32: int8 for ethos_u)",
    )
    dvc = sub.add_parser("dvc", help="a DVC pipeline for this repository's recipes")
    dvc_sub = dvc.add_subparsers(dest="dvc_command", metavar="SUBCOMMAND", required=True)
    dvc_init = dvc_sub.add_parser(
        "init", help="write dvc.yaml and params.yaml: every recipe's stages, per build"
    )
    dvc_init.add_argument(
        "--target", help="comma-separated targets: the builds become target x quantization"
    )
    dvc_init.add_argument(
        "--quantization", help="comma-separated presets (none, fp16, int8, int8_per_tensor, ...)"
    )
    dvc_init.add_argument(
        "--check", action="store_true", help="exit 1 if the files are out of date; write nothing"
    )
    dvc_init.add_argument("--recipes", help="comma-separated recipe names (default: all)")
    dvc_init.add_argument(
        "--hydra",
        action="store_true",
        help="builds in conf/config.yaml with target and quantization groups, for DVC's "
        "Hydra composition (dvc exp run -S target=armnn -S quantization=int8_per_tensor)",
    )
    dvc_stage = dvc_sub.add_parser("stage", help="run one stage (the command of a DVC stage)")
    dvc_stage.add_argument("recipe", metavar="RECIPE.yaml")
    dvc_stage.add_argument("stage", metavar="STAGE")
    dvc_stage.add_argument("--build", help="the build, for a stage that is not shared")
    report = sub.add_parser(
        "report", help="make report.html again from a build folder's files (or sweep.html)"
    )
    report.add_argument(
        "path",
        type=Path,
        metavar="BUILD_DIR",
        help="a build folder (build/RECIPE/BUILD), or a sweep's sweep.json or its folder",
    )
    report.add_argument("--open", action="store_true", help="open the page in a web browser")
    explain = sub.add_parser(
        "explain", help="why a recipe's model does not trace or export, and which rules help"
    )
    explain.add_argument("recipe", metavar="RECIPE", help="recipe name or path")
    explain.add_argument("--json", action="store_true", help="print a machine-readable list")
    explain.add_argument(
        "--no-rewrites",
        action="store_true",
        help="diagnose the model as built, without the recipe's rewrites",
    )
    fix = sub.add_parser(
        "fix",
        help="build with rewrites: auto and write the rules it chose into the recipe",
        description="Build the recipe on each target with `rewrites: auto` (and "
        "quantization.fallback=auto where int8 misses its thresholds), write the rules every "
        "target's build chose into the recipe's rewrites: (comments and formatting kept), "
        "print the diff and the commands for rules only some targets need, then build the "
        "recipe as written.",
    )
    fix.add_argument("recipe", metavar="RECIPE", help="recipe path (or name in ./recipes/)")
    fix.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="target=a,b (one build each), and any `edgeflow run` override",
    )
    fix.add_argument("-q", "--quiet", action="store_true", help="each build's summary only")
    if argv[:1] == ["run"] and any(a in ("-h", "--help") for a in argv[1:]):
        print(run_help())
        return 0
    if argv[:1] == ["diff"] and any(a in ("-h", "--help") for a in argv[1:]):
        print(DIFF_HELP)
        return 0
    args = parser.parse_args(argv[:1] if argv[:1] in (["run"], ["diff"]) else argv)
    try:
        with _sigterm_unwinds():
            return _command(parser, args, argv)
    except EdgeflowError as exc:
        print(f"error: {exc.render()}", file=sys.stderr)
        return exc.exit_code
    except InternalError as exc:
        print(f"error: {exc.render()}", file=sys.stderr)
        return exc.exit_code
    except (KeyboardInterrupt, Interrupted) as exc:
        name = exc.signal_name if isinstance(exc, Interrupted) else "SIGINT"
        print(f"edgeflow: stopped by {name}; nothing half-written was kept", file=sys.stderr)
        return 128 + signal.Signals[name].value
    except Exception:
        print(
            "error: internal error (a bug in edgeflow); please report it with this traceback:\n"
            + traceback.format_exc(),
            file=sys.stderr,
        )
        return 1


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """SIGTERM raises Interrupted (as Ctrl-C raises KeyboardInterrupt), so that temporary
    folders are removed and worker processes stopped on the way out."""

    def stop(signum: int, frame: object) -> None:
        raise Interrupted(signal.Signals(signum).name)

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread (an embedding application): leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _command(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str]) -> int:
    """Run the chosen subcommand; errors are rendered by main."""
    if args.command in ("run", "diff"):
        rest = [a for a in argv[1:] if a not in QUIET]
        quiet = len(rest) < len(argv) - 1
        if args.command == "run":
            return _run(rest, quiet)
        from edgeflow.hydra_app import run_hydra

        given = len(rest)
        rest = [a for a in rest if a != "--bisect"]
        mode = "bisect" if len(rest) < given else "layers"
        return run_hydra(_recipe_argument(rest), diff=mode, quiet=quiet)
    if args.command == "fix":
        from edgeflow.fix import fix

        return fix(args.recipe, args.overrides, args.quiet)
    if args.command == "validate":
        return _validate(args.recipes)
    if args.command == "init":
        return _init(args)
    if args.command == "list":
        return _list()
    if args.command == "precheck":
        return _precheck(args.model, args.target, args.json, args.board, args.quantization)
    if args.command == "dvc":
        return _dvc(args)
    if args.command == "explain":
        return _explain(args.recipe, args.json, not args.no_rewrites)
    if args.command == "report":
        return _report(args.path, args.open)
    if args.command == "rules":
        from edgeflow.rules.catalogue import render_terminal

        print(render_terminal())
        return 0
    parser.print_help()
    return 0


def _run(args: list[str], quiet: bool) -> int:
    """`edgeflow run ARGS`: answered by the up-to-date stamp where nothing changed since the
    last run of the same command (edgeflow/engine/uptodate.py), else by Hydra's app."""
    from edgeflow.engine.uptodate import Invocation

    invocation = Invocation.of(args, quiet)
    replayed = invocation.replay() if invocation else None
    if replayed is not None:
        return replayed
    from edgeflow.hydra_app import run_hydra

    return run_hydra(args, quiet=quiet, stamp=invocation)


def _recipe_argument(args: list[str]) -> list[str]:
    """`edgeflow diff RECIPE ...`: the first plain argument is the recipe."""
    for k, arg in enumerate(args):
        if not arg.startswith("-") and "=" not in arg:
            return [*args[:k], f"recipe={arg}", *args[k + 1 :]]
    return args


def _dvc(args: argparse.Namespace) -> int:
    from edgeflow.engine import dvcfile

    root = Path.cwd()
    if args.dvc_command == "stage":
        from edgeflow.engine.dvcstage import run_stage

        return run_stage(root, args.recipe, args.stage, args.build)
    split = lambda text: [v for v in text.split(",") if v] if text else None  # noqa: E731
    changed = dvcfile.init(
        root,
        split(args.target),
        split(args.quantization),
        split(args.recipes),
        args.check,
        args.hydra,
    )
    return 1 if changed and args.check else 0


def _report(path: Path, open_it: bool) -> int:
    """`edgeflow report PATH [--open]`: report.html of a build folder, or sweep.html of a
    sweep, made again from the files there."""
    import json

    from edgeflow.engine.publish import replace_file
    from edgeflow.report import html, sweep

    sweep_file = path / "sweep.json" if path.is_dir() else path
    if (path / "metrics.json").is_file():
        files = html.build_files(path)
        missing = [name for name in html.REQUIRED if name not in files]
        if missing:
            raise EdgeflowError(
                f"{path} lacks {', '.join(missing)}: the page is made from them",
                "build it again with `edgeflow run` (an older edgeflow wrote neither report.json "
                "nor checks.json)",
            )
        page = replace_file(path, "report.html", html.render_build(files))
    elif sweep_file.name == "sweep.json" and sweep_file.is_file():
        rows = json.loads(sweep_file.read_text(encoding="utf-8"))["jobs"]
        page = sweep_file.with_name("sweep.html")
        sweep.write_html(rows, page)
    else:
        raise EdgeflowError(
            f"{path} is neither a build folder (it has no metrics.json) nor a sweep's sweep.json",
            "give a folder build/RECIPE/BUILD that `edgeflow run` wrote, or the build folder "
            "root where a sweep wrote sweep.json",
        )
    print(f"wrote {page}")
    if open_it:
        import webbrowser

        if not webbrowser.open(page.resolve().as_uri()):
            print(f"no web browser to open it here; open {page.resolve().as_uri()}")
    return 0


def _init(args: argparse.Namespace) -> int:
    """`edgeflow init MODEL ...`: the recipe and its data file, and what to check in them."""
    from edgeflow.scaffold import InitOptions, init

    options = InitOptions(
        args.model,
        args.target,
        args.output,
        tuple(args.input),
        tuple(args.init_args),
        args.data,
        args.kind,
    )
    written = init(options)
    model = written.plan.model
    counts = f"{len(model.inputs)} input(s), {len(model.outputs)} output(s)"
    print(f"wrote {written.recipe} ({model.kind} {model.what}: {counts})")
    if written.data is not None:
        print(f"wrote {written.data}: RANDOM samples; replace its samples() with your data")
    for note in written.notes:
        print(f"  {note}")
    print(f"next: edgeflow run recipe={written.recipe}")
    return 0


def _validate(names: list[str]) -> int:
    from edgeflow.recipe import find_recipe, load_recipe

    status = 0
    for name in names:
        try:
            loaded = load_recipe(find_recipe(name), user_code=False)  # runs nothing of yours
        except EdgeflowError as exc:
            print(exc.render(), file=sys.stderr)
            status = exc.exit_code
            continue
        print(f"{_shown(loaded.path)}: ok ({loaded.stem} -> {loaded.build_name})")
        for rule in loaded.unchecked:
            print(f"  {rule}: found in its source; its options are checked when the build runs")
    return status


def _precheck(
    model_path: Path, target: str, as_json: bool, board: str | None, quantization: str | None
) -> int:
    import json

    import onnx

    from edgeflow.core.onnxfile import check_onnx_file, external_size
    from edgeflow.targets import load_profile
    from edgeflow.targets.memory import memory_line, with_shapes
    from edgeflow.targets.placement import predict, prediction_line
    from edgeflow.targets.precheck import (
        check,
        check_memory,
        errors,
        render_table,
        to_json,
    )

    profile = load_profile(target)
    profile.board(board)  # an unknown board is an error before the model is read
    if quantization is None:
        quantization = "none" if "none" in profile.quantization else profile.quantization[0]
    if quantization not in profile.quantization:
        refused = {str(mode): why for mode, why in profile.family.refused_modes.items()}
        why = refused.get(quantization, "its profile does not offer it")
        raise EdgeflowError(
            f"target {target} does not build {quantization}: {why}",
            " or ".join(f"--quantization {m}" for m in profile.quantization),
        )
    if not model_path.is_file():
        raise EdgeflowError(f"model file not found: {model_path}")
    check_onnx_file(model_path)  # parses, and its initializers hold their data
    try:
        model = onnx.load(str(model_path))
    except MemoryError as exc:  # its external data, read whole into memory
        raise EdgeflowError(
            f"{model_path}: its weights ({external_size(model_path):,} bytes with its external "
            "data) do not fit in this machine's memory",
            "run the precheck on a machine with more memory, or on a smaller model",
        ) from exc
    except Exception as exc:  # onnx's own checks of its external data, which ours passed
        raise EdgeflowError(f"{model_path}: onnx cannot load it: {first_line(exc)}") from exc
    memory, too_big = check_memory(model, profile, quantization, board)
    findings = to_json(check(model, profile, quantization) + too_big)
    failed = errors(findings)
    npu = predict(with_shapes(model), profile, quantization)
    if as_json:
        result = {"target": target, "passed": not failed, "findings": findings, "memory": memory}
        print(json.dumps(result | ({"npu": npu} if npu else {}), indent=2))
        return 1 if failed else 0
    if failed:
        print(f"{model_path} does not fit {target}: {len(failed)} findings\n")
    else:
        print(f"{model_path} passes the {target} precheck")
    if findings:
        print(render_table(findings) + "\n")
    print(memory_line(memory))
    if npu:
        print(prediction_line(npu))
    return 1 if failed else 0


def _explain(name: str, as_json: bool, rewrites: bool) -> int:
    import json

    from edgeflow.explain import explain, render_table, to_json
    from edgeflow.recipe import find_recipe, load_recipe
    from edgeflow.schema.source import PyTorchSource

    loaded = load_recipe(find_recipe(name))
    kind = loaded.recipe.source.kind
    if kind == "tensorflow":
        from edgeflow.explain import explain_tensorflow

        attempts = explain_tensorflow(loaded.recipe)
    elif isinstance(source := loaded.recipe.source, PyTorchSource):
        from edgeflow.source import build_module
        from edgeflow.stages._rewritten import rewritten_module

        if rewrites:
            module, _, _ = rewritten_module(loaded.recipe, loaded.path.parent)
        else:
            module = build_module(source)
        attempts = explain(loaded.recipe, module)
    else:
        raise EdgeflowError(
            f"explain works on PyTorch and TensorFlow sources; this is a {kind} source",
            "for an ONNX model, `edgeflow precheck MODEL.onnx --target T` lists what a "
            "target lacks",
        )
    print(json.dumps(to_json(attempts), indent=2) if as_json else render_table(attempts))
    return 0 if all(a.ok for a in attempts) else 1


def _list() -> int:
    from edgeflow.core import resources

    kinds: tuple[resources.Kind, ...] = ("recipes", "targets", "pipelines")
    for kind in kinds:
        print(f"{kind}:")
        for name, path in resources.available(kind).items():
            print(f"  {name:<24} {_shown(path)}")
    return 0


def _shown(path: Path) -> str:
    from edgeflow.core.loader import display_path

    return display_path(path)


if __name__ == "__main__":
    raise SystemExit(main())
