"""The savedmodels part: SavedModels whose graph does I/O (writes, reads, lists files, saves
tensors, calls Python), given to a recipe: nothing may run, at `edgeflow validate` or at
`edgeflow run`; each must be an exit 2 that names the op."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .common import BenchError, Row, Settings, edgeflow_env, run_args, say
from .fuzz_run import Worker

# variant -> (the TensorFlow expression of the effect, the op names a message may name)
VARIANTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "write_file": ("tf.io.write_file(MARKER, 'written by the graph')", ("WriteFile",)),
    "read_file": ("tf.strings.length(tf.io.read_file(SECRET))", ("ReadFile",)),
    "matching_files": ("tf.size(tf.io.matching_files(GLOB))", ("MatchingFiles",)),
    "raw_save": (
        "tf.raw_ops.Save(filename=MARKER, tensor_names=['image'], data=[image])",
        ("Save",),
    ),
    "py_function": (
        "tf.py_function(lambda: touch(), [], tf.float32)",
        ("PyFunc", "EagerPyFunc"),
    ),
    "numpy_function": (
        "tf.numpy_function(lambda: touch(), [], tf.float32)",
        ("PyFunc",),
    ),
    "control": ("tf.constant(0.0)", ()),
}

BUILD = """
import sys, tensorflow as tf
MARKER, SECRET, GLOB, OUT = sys.argv[1:5]
def touch():
    open(MARKER, "w").close()
    return __import__("numpy").float32(0)
class M(tf.Module):
    def __init__(self):
        self.w = tf.Variable(tf.random.stateless_normal([64, 10], seed=[0, 1]))
    @tf.function(input_signature=[tf.TensorSpec([1, 8, 8, 1], tf.float32, name="image")])
    def __call__(self, image):
        effect = EFFECT
        with tf.control_dependencies([effect]):
            y = tf.matmul(tf.reshape(image, [1, 64]), self.w)
        if isinstance(effect, tf.Tensor):  # the output depends on it: it cannot be pruned
            y = y + 0.0 * tf.reduce_sum(tf.cast(effect, tf.float32))
        return {"logits": y}
m = M()
tf.saved_model.save(m, OUT, signatures=m.__call__)
"""


def build_savedmodel(s: Settings, variant: str, folder: Path) -> Path:
    """Write the variant's SavedModel (in a TensorFlow subprocess): its folder."""
    out = folder / "saved_model"
    script = BUILD.replace("EFFECT", VARIANTS[variant][0])
    args = [
        str(folder / "MARKER"),
        str(folder.parent / "SECRET"),
        str(folder.parent / "globbed" / "*"),
        str(out),
    ]
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        env=edgeflow_env(s.repo, "build"),
        timeout=300,
        check=False,
    )
    if done.returncode != 0 or not (out / "saved_model.pb").is_file():
        raise BenchError(f"cannot build the {variant} SavedModel: {done.stderr[-600:]}")
    return out


def recipe(model: Path) -> str:
    """A valid TensorFlow-source recipe naming the SavedModel (TFLite's own converter)."""
    data = '"edgeflow.zoo.digits_keras:digits_nhwc"'
    return (
        "source:\n  kind: tensorflow\n"
        f"  model: {json.dumps(str(model))}\n"
        "  inputs: [{name: image, shape: [1, 8, 8, 1]}]\n  outputs: [logits]\n"
        f"calibration: {{dataset: {data}, split: calibration, samples: 16}}\n"
        f"evaluation: {{dataset: {data}, split: test, samples: 16, metric: agreement}}\n"
        "quantization: {mode: none}\ntarget: tflite\n"
        "verify: {max_abs_diff: 1.0e-4, latency_runs: 2, warmup_runs: 1}\n"
    )


@dataclass
class SavedResult:
    """One SavedModel: per command its exit status, whether I/O ran, whether the op was named."""

    variant: str
    codes: dict[str, int | None] = field(default_factory=dict)
    io_ran: dict[str, bool] = field(default_factory=dict)
    named: dict[str, bool] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)

    @property
    def holds(self) -> bool:
        """No I/O ran; refused with exit 2 naming the op (the control: built, exit 0)."""
        if self.variant == "control":
            return self.codes.get("run") == 0 and not any(self.io_ran.values())
        return not any(self.io_ran.values()) and all(
            self.codes[c] == 2 and self.named[c] for c in self.codes
        )


def traced_run(s: Settings, argv: list[str], folder: Path) -> tuple[int | None, str, str]:
    """`edgeflow ARGV` under `strace -f -e trace=file` where strace exists: (exit, output,
    the trace)."""
    trace = folder / "strace.txt"
    strace = shutil.which("strace")
    prefix = [strace, "-f", "-qq", "-e", "trace=file", "-o", str(trace)] if strace else []
    folder.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            [*prefix, sys.executable, "-m", "edgeflow", *argv],
            cwd=folder,
            env=edgeflow_env(s.repo, "savedmodels"),
            capture_output=True,
            text=True,
            timeout=s.args.untrusted_timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None, "(timed out)", ""
    text = done.stdout + done.stderr
    return done.returncode, text, trace.read_text(errors="replace") if trace.is_file() else ""


def io_seen(folder: Path, trace: str) -> bool:
    """Whether the graph's I/O ran: the marker written, or the secret read or the folder
    listed (in the trace of the process)."""
    secret = str(folder.parent / "SECRET")
    listed = f'"{folder.parent / "globbed"}' in trace
    return (folder / "MARKER").exists() or f'"{secret}"' in trace or listed


def run_variant(s: Settings, worker: Worker, variant: str) -> SavedResult:
    """Build the SavedModel, validate (worker) and run (traced) a recipe naming it."""
    folder = s.work / "savedmodels" / variant
    folder.mkdir(parents=True)
    model = build_savedmodel(s, variant, folder)
    path = folder / "recipe.yaml"
    path.write_text(recipe(model), encoding="utf-8")
    result = SavedResult(variant)
    ops = VARIANTS[variant][1]
    answer = worker.validate(path, s.args.untrusted_timeout)
    code, text = (None, "(no answer)") if answer is None else (answer[0], answer[1] + answer[2])
    text = text.replace(str(folder), "")  # the op named, not the folder named after it
    record(result, "validate", code, text, (folder / "MARKER").exists(), ops)
    (folder / "MARKER").unlink(missing_ok=True)
    code, text, trace = traced_run(
        s, run_args(path, folder / "cache", folder / "build"), folder / "run"
    )
    record(result, "run", code, text.replace(str(folder), ""), io_seen(folder, trace), ops)
    return result


def record(
    result: SavedResult, command: str, code: int | None, text: str, ran: bool, ops: tuple[str, ...]
) -> None:
    """One command's outcome."""
    result.codes[command] = code
    result.io_ran[command] = ran
    result.named[command] = any(op in text for op in ops) and "internal error" not in text
    lines = text.strip().splitlines() or [""]
    result.messages[command] = next((x for x in lines if x.startswith("error:")), lines[-1])[:300]


def part_savedmodels(s: Settings) -> list[Row]:
    """Each I/O SavedModel (and a control) through validate and run."""
    variants = list(VARIANTS)
    worker = Worker(s.work, s.repo, max(s.args.fuzz_memory_mb, 8192))
    (s.work / "savedmodels").mkdir(parents=True)
    (s.work / "savedmodels" / "SECRET").write_text("secret\n")
    (s.work / "savedmodels" / "globbed").mkdir()
    (s.work / "savedmodels" / "globbed" / "a.txt").write_text("a\n")
    results = []
    try:
        for variant in variants:
            r = run_variant(s, worker, variant)
            results.append(r)
            say(
                f"savedmodels {variant}: validate exit {r.codes['validate']}, run exit "
                f"{r.codes['run']}, I/O ran {sum(r.io_ran.values())}, "
                f"{'holds' if r.holds else 'FAILS'}"
            )
    finally:
        worker.close()
    return [savedmodels_row(results)]


def savedmodels_row(results: list[SavedResult]) -> Row:
    """The savedmodels line: I/O run, exit 2 naming the op, per command; the control built."""
    hostile = [r for r in results if r.variant != "control"]
    failing = [r for r in results if not r.holds]
    for r in failing:
        for c in r.codes:
            say(
                f"  savedmodels {r.variant} [{c}] exit {r.codes[c]}"
                + ", I/O RAN" * r.io_ran[c]
                + ", op not named" * (not r.named[c])
                + f": {r.messages[c]}"
            )
    n = len(hostile)
    control = next((r for r in results if r.variant == "control"), None)
    figures: dict[str, Any] = {
        "hold": f"{n - sum(not r.holds for r in hostile)}/{n}",
        "I/O ran": sum(any(r.io_ran.values()) for r in hostile),
        "validate exit 2 naming the op": sum(
            r.codes["validate"] == 2 and r.named["validate"] for r in hostile
        ),
        "run exit 2 naming the op": sum(r.codes["run"] == 2 and r.named["run"] for r in hostile),
        "control built": control is not None and control.holds,
    }
    details = {"cases": [r.__dict__ | {"holds": r.holds} for r in results]}
    return Row("savedmodels", f"{n} SavedModels + 1 control", figures, not failing, "", details)
