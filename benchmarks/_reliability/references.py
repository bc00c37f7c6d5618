"""The references part: standard-library callables named in every reference slot of a recipe
(the model, its builders, the datasets, rules, patterns), each aimed at a marker: nothing may
run, at `edgeflow validate` or at `edgeflow run`; each must be a located exit 2."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .common import Row, Settings, run_args, run_edgeflow, say
from .fuzz_run import Worker, shown_output

CALLABLES = ("shutil:rmtree", "os:remove", "subprocess:run", "builtins:exec", "os:system")
SLOTS = (
    "source.model",
    "calibration.dataset",
    "evaluation.dataset",
    "rewrites.rule",
    "fx.replace_pattern.pattern",
    "fx.replace_pattern.replacement",
    "fx.wrap_leaf.functions",
    "tensorflow.model",
    "jax.model",
)
PATTERNS = "import torch\n\n\ndef p(x):\n    return torch.relu(x) * 2\n\n\ndef r(x):\n" + (
    "    return torch.relu(x) + torch.relu(x)\n"
)


@dataclass
class Victims:
    """What the payloads aim at: a folder rmtree would delete, a file remove would delete, a
    marker a command would create."""

    folder: Path
    file: Path
    marker: Path

    def reset(self) -> None:
        """Put the victims back (after a payload ran) and remove the marker."""
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "precious.txt").write_text("precious\n")
        self.file.write_text("precious\n")
        self.marker.unlink(missing_ok=True)

    def hit(self) -> bool:
        """Whether a payload ran: the folder or the file gone, or the marker made."""
        gone = not (self.folder / "precious.txt").is_file() or not self.file.is_file()
        return gone or self.marker.exists()


def arguments(callable_: str, v: Victims) -> dict[str, Any]:
    """The keyword arguments (init / options) that aim the callable at a victim."""
    table: dict[str, dict[str, Any]] = {
        "shutil:rmtree": {"path": str(v.folder)},
        "os:remove": {"path": str(v.file)},
        "subprocess:run": {"args": ["touch", str(v.marker)]},
        "builtins:exec": {"source": f"open({str(v.marker)!r}, 'w').close()"},
        "os:system": {"command": f"touch {v.marker}"},
    }
    return table[callable_]


def recipe(slot: str, ref: str, v: Victims, repo: Path, folder: Path) -> dict[str, Any]:
    """A valid recipe with `ref` in `slot` (aimed at the victims where the slot takes
    arguments)."""
    args = arguments(ref, v)
    data = {"dataset": "edgeflow.datasets:sklearn_digits", "samples": 16}
    tree: dict[str, Any] = {
        "name": "refs",
        "source": {
            "kind": "pytorch",
            "model": "edgeflow.zoo.digits:DigitsCNN",
            "init": {"num_classes": 10},
            "weights": str(repo / "models" / "digits_cnn.pt"),
            "inputs": [{"name": "image", "shape": [1, 1, 8, 8], "dtype": "float32"}],
        },
        "calibration": data | {"split": "calibration"},
        "evaluation": data | {"split": "test", "metric": "agreement"},
        "quantization": {"mode": "int8"},
        "target": "onnxruntime_micro",
        "verify": {"latency_runs": 5, "warmup_runs": 1},
    }
    patterns = str(folder / "patterns.py")
    if slot == "source.model":
        tree["source"] |= {"model": ref, "init": args}
        del tree["source"]["weights"]
    elif slot in ("calibration.dataset", "evaluation.dataset"):
        tree[slot.split(".")[0]] = {"dataset": ref, "options": args, "samples": 16}
        if slot.startswith("evaluation"):
            tree["evaluation"]["metric"] = "agreement"
    elif slot == "rewrites.rule":
        tree["rewrites"] = [{"rule": ref}]
    elif slot == "fx.replace_pattern.pattern":
        tree["rewrites"] = [
            {"rule": "fx.replace_pattern", "pattern": ref, "replacement": f"{patterns}:r"}
        ]
    elif slot == "fx.replace_pattern.replacement":
        tree["rewrites"] = [
            {"rule": "fx.replace_pattern", "pattern": f"{patterns}:p", "replacement": ref}
        ]
    elif slot == "fx.wrap_leaf.functions":
        tree["rewrites"] = [{"rule": "fx.wrap_leaf", "functions": [ref]}]
    elif slot in ("tensorflow.model", "jax.model"):
        tree["source"] = {
            "kind": slot.split(".")[0],
            "model": ref,
            "init": args,
            "inputs": [{"name": "image", "shape": [1, 8, 8, 1], "dtype": "float32"}],
        }
        nhwc = {"dataset": "edgeflow.zoo.digits_keras:digits_nhwc", "samples": 16}
        tree["calibration"] = nhwc | {"split": "calibration"}
        tree["evaluation"] = nhwc | {"split": "test", "metric": "agreement"}
    return tree


@dataclass
class RefResult:
    """One case: per command (validate, run) its exit status, whether code ran, whether the
    message was located in the recipe, whether it was an internal error."""

    slot: str
    ref: str
    codes: dict[str, int | None] = field(default_factory=dict)
    ran: dict[str, bool] = field(default_factory=dict)
    located: dict[str, bool] = field(default_factory=dict)
    internal: dict[str, bool] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)

    @property
    def holds(self) -> bool:
        """Nothing ran, and both commands refused it with a located exit 2."""
        return not any(self.ran.values()) and all(
            self.codes[c] == 2 and self.located[c] and not self.internal[c] for c in self.codes
        )


def is_located(name: str, text: str) -> bool:
    """The message names the recipe with a line (`refs.yaml:12`)."""
    return re.search(re.escape(name) + r":\d+", text) is not None


def run_case(s: Settings, worker: Worker, slot: str, ref: str, index: int) -> RefResult:
    """Write the case, validate it in the worker, then `edgeflow run` it; judge both."""
    folder = s.work / "references" / f"r{index:02d}"
    folder.mkdir(parents=True)
    (folder / "patterns.py").write_text(PATTERNS)
    v = Victims(folder / "victim", folder / "victim.txt", folder / "MARKER")
    path = folder / "refs.yaml"
    path.write_text(json.dumps(recipe(slot, ref, v, s.repo, folder), indent=1) + "\n")
    result = RefResult(slot, ref)
    v.reset()
    answer = worker.validate(path, s.args.case_timeout)
    code, text = (
        (None, "(no answer: hang)") if answer is None else (answer[0], answer[1] + answer[2])
    )
    judge(result, "validate", code, text, v, path.name)
    v.reset()
    ran = run_edgeflow(
        s,
        run_args(path, folder / "cache", folder / "build"),
        folder / "run",
        s.args.untrusted_timeout,
    )
    judge(result, "run", ran.code, ran.text, v, path.name)
    if v.folder.is_dir():  # a payload that ran may have left the victims half-gone
        shutil.rmtree(v.folder)
    return result


def judge(
    result: RefResult, command: str, code: int | None, text: str, v: Victims, name: str
) -> None:
    """Record one command's outcome."""
    result.codes[command] = code
    result.ran[command] = v.hit()
    result.located[command] = is_located(name, text)
    result.internal[command] = "internal error" in text or "Traceback" in text
    result.messages[command] = shown_output(text) if "Traceback" in text else error_line_of(text)


def error_line_of(text: str) -> str:
    """The first `error:` line of an output (else its first line)."""
    for line in text.splitlines():
        if line.startswith("error:"):
            return line.strip()[:300]
    return next((line.strip()[:300] for line in text.splitlines() if line.strip()), "")


def part_references(s: Settings) -> list[Row]:
    """Every standard-library callable in every reference slot, through validate and run."""
    cases = [(slot, ref) for slot in SLOTS for ref in CALLABLES]
    if 0 < s.args.references < len(cases):
        step = len(cases) / s.args.references
        cases = [cases[int(i * step)] for i in range(s.args.references)]
    worker = Worker(s.work, s.repo, s.args.fuzz_memory_mb)
    results = []
    try:
        for i, (slot, ref) in enumerate(cases):
            r = run_case(s, worker, slot, ref, i)
            results.append(r)
            verdict = "holds" if r.holds else "FAILS"
            say(
                f"references {i + 1}/{len(cases)} {slot} = {ref}: validate exit "
                f"{r.codes['validate']}, run exit {r.codes['run']}, code ran "
                f"{sum(r.ran.values())}, {verdict}"
            )
    finally:
        worker.close()
    return [references_row(results)]


def references_row(results: list[RefResult]) -> Row:
    """The references line: code run, exit 2 and located per command, internal errors."""
    failing = [r for r in results if not r.holds]
    if failing:
        say(f"\nreferences: {len(failing)} cases do not hold (all shown)")
    for r in failing:
        for c in ("validate", "run"):
            what = (
                f"exit {r.codes[c]}" + ", CODE RAN" * r.ran[c] + ", unlocated" * (not r.located[c])
            )
            say(f"  {r.slot} = {r.ref} [{c}] {what}: " + r.messages[c].replace("\n", " | "))
    n = len(results)
    count = lambda c, key: sum(getattr(r, key)[c] for r in results)  # noqa: E731
    figures: dict[str, Any] = {
        "hold": f"{n - len(failing)}/{n}",
        "code ran": sum(any(r.ran.values()) for r in results),
        "validate exit 2": f"{sum(r.codes['validate'] == 2 for r in results)}/{n}",
        "validate located": f"{count('validate', 'located')}/{n}",
        "run exit 2": f"{sum(r.codes['run'] == 2 for r in results)}/{n}",
        "run located": f"{count('run', 'located')}/{n}",
        "internal errors": sum(any(r.internal.values()) for r in results),
    }
    details = {"cases": [r.__dict__ | {"holds": r.holds} for r in results]}
    size = f"{n} references ({len(SLOTS)} slots x {len(CALLABLES)} callables)"
    note = f"quick size, acceptance is {len(SLOTS) * len(CALLABLES)}" if n < 45 else ""
    return Row("references", size, figures, not failing, note, details)
