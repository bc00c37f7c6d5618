"""The onnx part: malformed ONNX files (truncated, random, cyclic, unknown domains, absent or
oversized initializers, external data outside the model's folder, through symlinks, on /proc
and /dev, bombs) through `edgeflow validate`, `edgeflow precheck` and `edgeflow run`: no
traceback, nothing read outside the model's folder, bounded memory, exit 2 naming the file."""

from __future__ import annotations

import os
import random
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .common import Row, Settings, edgeflow_env, run_args, say
from .inputs import tiny_onnx
from .untrusted import untrusted_recipe

MEMORY_LIMIT = 8 << 30  # address space of each command (a bomb must not take the machine)
RSS_LIMIT_MB = 3072  # the requirement: peak resident memory of each command
COMMANDS = ("validate", "precheck", "run")
# Well-formed files that stress a runtime rather than break the format: a 2^40 input dim (a
# legal static shape), a negative dim (onnxruntime reads it as dynamic, as old exporters meant),
# a 160 GB ConstantOfShape (well formed; it fails only when it runs). A command may accept them
# or judge them against the target (precheck exit 1); what must hold is the rest: no
# traceback, nothing read outside, bounded memory, and a refusal that names the file.
STRESS = frozenset({"huge_dims", "negative_dims", "constant_of_shape_bomb"})
Writer = Callable[[Path, "Place"], Any]


@dataclass(frozen=True)
class Place:
    """Where a case lives: its folder (the model's), the secret outside it, the valid model."""

    folder: Path
    secret: Path  # outside the model's folder; its bytes must never reach any output
    token: bytes
    valid: Path


def _onnx() -> Any:
    import onnx

    return onnx


def model(nodes: list[Any], inits: list[Any] | None = None, **kw: Any) -> Any:
    """A model x [1, 64] -> ... -> y [1, 10] from nodes (opset 17, IR 8 unless given)."""
    onnx = _onnx()
    h = onnx.helper
    x_type = kw.get("x_type", onnx.TensorProto.FLOAT)
    inputs = kw.get("inputs", [h.make_tensor_value_info("x", x_type, kw.get("x_shape", [1, 64]))])
    outputs = kw.get("outputs", [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 10])])
    graph = h.make_graph(nodes, "g", inputs, outputs, inits or [])
    opsets = [h.make_opsetid("", kw.get("opset", 17)), *kw.get("extra_opsets", [])]
    m = h.make_model(graph, opset_imports=opsets, functions=kw.get("functions", []))
    m.ir_version = kw.get("ir", 8)
    return m


def weight(name: str = "w") -> Any:
    """The 64x10 float weight as an initializer."""
    import numpy as np

    onnx = _onnx()
    w = np.random.default_rng(0).standard_normal((64, 10)).astype(np.float32)
    return onnx.numpy_helper.from_array(w, name)


def mlp(op: str = "Relu", domain: str = "", w: Any = None, **kw: Any) -> Any:
    """MatMul(x, w) -> op -> y."""
    h = _onnx().helper
    nodes = [h.make_node("MatMul", ["x", "w"], ["h"]), h.make_node(op, ["h"], ["y"], domain=domain)]
    return model(nodes, [weight() if w is None else w], **kw)


def external(location: str, dims: tuple[int, ...] = (64, 10), **extra: str) -> Any:
    """A weight whose data is external, at `location` (relative to the model's folder)."""
    onnx = _onnx()
    t = onnx.TensorProto(name="w", data_type=onnx.TensorProto.FLOAT, dims=list(dims))
    t.data_location = onnx.TensorProto.EXTERNAL
    for key, value in {"location": location, **extra}.items():
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    return t


def save(m: Any) -> Writer:
    """A writer of a built model (serialized without any check)."""
    return lambda path, place: path.write_bytes(m.SerializeToString())


def save_with(make: Callable[[Place], Any]) -> Writer:
    """A writer of a model built for the case's place."""
    return lambda path, place: path.write_bytes(make(place).SerializeToString())


def raw(make: Callable[[Place], bytes]) -> Writer:
    """A writer of bytes."""
    return lambda path, place: path.write_bytes(make(place))


def _varint(n: int) -> bytes:
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def nested_if(depth: int) -> bytes:
    """The tiny model with an If node whose then_branch nests `depth` levels of If (a
    subgraph bomb deeper than protobuf readers allow), written as raw protobuf: the Python
    protobuf library refuses to build it. The graph field is merged into the valid model's."""
    graph = b""
    for _ in range(depth):  # GraphProto.node(1) -> NodeProto.attribute(5) -> AttributeProto.g(6)
        attribute = _field(1, b"then_branch") + _varint(20 << 3) + _varint(5) + _field(6, graph)
        node = _field(1, b"c") + _field(2, b"y") + _field(4, b"If") + _field(5, attribute)
        graph = _field(1, node)
    return mlp().SerializeToString() + _field(7, graph)


def recursive_function() -> Any:
    """A local function that calls itself."""
    onnx = _onnx()
    h = onnx.helper
    f = h.make_function(
        "local",
        "F",
        ["a"],
        ["b"],
        [h.make_node("F", ["a"], ["b"], domain="local")],
        [h.make_opsetid("", 17)],
    )
    nodes = [
        h.make_node("MatMul", ["x", "w"], ["h"]),
        h.make_node("F", ["h"], ["y"], domain="local"),
    ]
    return model(nodes, [weight()], functions=[f], extra_opsets=[h.make_opsetid("local", 1)])


def kinds() -> dict[str, Writer]:
    """Every malformed ONNX file, by name."""
    onnx = _onnx()
    h = onnx.helper
    F = onnx.TensorProto.FLOAT
    relu = lambda a, b: h.make_node("Relu", [a], [b])  # noqa: E731
    mm = h.make_node("MatMul", ["x", "w"], ["h"])
    big = onnx.TensorProto(name="w", data_type=F, dims=[2**31])
    unused = onnx.TensorProto(name="u", data_type=F, dims=[2**31])
    table: dict[str, Writer] = {
        "truncated": raw(lambda p: p.valid.read_bytes()[: p.valid.stat().st_size // 2]),
        "random_bytes": raw(lambda p: random.Random(7).randbytes(4096)),
        "empty": raw(lambda p: b""),
        "text": raw(lambda p: b"ir_version: 8\ngraph { }\n"),
        "tensor_proto": save(weight()),
        "graph_proto": save(h.make_graph([relu("x", "y")], "g", [], [])),
        "cyclic": save(
            model(
                [mm, h.make_node("Add", ["h", "z"], ["y2"]), relu("y2", "z"), relu("z", "y")],
                [weight()],
            )
        ),
        "unknown_domain": save(
            mlp("Frob", "com.example", extra_opsets=[h.make_opsetid("com.example", 1)])
        ),
        "undeclared_domain": save(mlp("Frob", "org.nowhere")),
        "unknown_op": save(mlp("NoSuchOp")),
        "absent_initializer": save(model([mm, relu("h", "y")])),
        "oversized_initializer_no_data": save(mlp(w=big)),
        "unused_initializer_no_data": save(model([mm, relu("h", "y")], [weight(), unused])),
        "raw_data_short": save(
            mlp(w=onnx.TensorProto(name="w", data_type=F, dims=[64, 10], raw_data=b"\0" * 12))
        ),
        "external_parent": save_with(
            lambda p: mlp(w=external(os.path.relpath(p.secret, p.folder)))
        ),
        "external_absolute": save(mlp(w=external("/etc/passwd"))),
        "external_symlink": save_with(lambda p: mlp(w=external(link(p)))),
        "external_proc_self_mem": save(mlp(w=external("/proc/self/mem", offset="4096"))),
        "external_dev_zero": save(mlp(w=external("/dev/zero"))),
        "external_dev_urandom": save(mlp(w=external("/dev/urandom"))),
        "external_sparse_8gib": save_with(lambda p: mlp(w=external(sparse(p), dims=(2**31,)))),
        "external_offset_beyond": save_with(
            lambda p: mlp(w=external(small(p), offset=str(1 << 40)))
        ),
        "ir_99": save(mlp(ir=99)),
        "opset_99": save(mlp(opset=99)),
        "empty_graph": save(model([], inputs=[], outputs=[])),
        "duplicate_outputs": save(
            model([mm, relu("h", "y"), h.make_node("Sigmoid", ["h"], ["y"])], [weight()])
        ),
        "dangling_input": save(
            model([h.make_node("MatMul", ["nowhere", "w"], ["h"]), relu("h", "y")], [weight()])
        ),
        "wrong_tensor_types": save(mlp(x_type=onnx.TensorProto.STRING)),
        "nested_if_bomb": raw(lambda p: nested_if(300)),
        "recursive_function": save(recursive_function()),
        "huge_dims": save(mlp(x_shape=[2**40, 64])),
        "negative_dims": save(mlp(x_shape=[-5, 64])),
        "constant_of_shape_bomb": save(
            model(
                [
                    h.make_node(
                        "Constant",
                        [],
                        ["s"],
                        value=h.make_tensor("v", onnx.TensorProto.INT64, [2], [200000, 200000]),
                    ),
                    h.make_node("ConstantOfShape", ["s"], ["big"]),
                    mm,
                    h.make_node("ReduceSum", ["big"], ["t"], keepdims=0),
                    h.make_node("Add", ["h", "t"], ["y"]),
                ],
                [weight()],
            )
        ),
    }
    return table


def link(p: Place) -> str:
    """weights.bin in the model's folder, a symlink to the secret outside it."""
    (p.folder / "weights.bin").symlink_to(p.secret)
    return "weights.bin"


def sparse(p: Place) -> str:
    """An 8 GiB sparse file in the model's folder (holes: no disk)."""
    with open(p.folder / "big.bin", "wb") as f:
        f.truncate(8 << 30)
    return "big.bin"


def small(p: Place) -> str:
    """A small data file in the model's folder."""
    (p.folder / "small.bin").write_bytes(bytes(2560))
    return "small.bin"


@dataclass
class Outcome:
    """One command on one file: exit, traceback, peak memory, outside read, file named."""

    code: int | None
    traceback: bool
    rss_mb: float
    outside: bool
    named: bool
    message: str


@dataclass
class OnnxResult:
    """One malformed file through the three commands."""

    kind: str
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    leaked: bool = False  # the secret's bytes in an output

    @property
    def holds(self) -> bool:
        """Every command: exit 2 naming the file (a STRESS kind: accepted, judged against the
        target, or refused naming the file), no traceback, nothing read outside, memory
        bounded; and the secret in no output."""

        def answered(o: Outcome) -> bool:
            if self.kind in STRESS:
                return o.code in (0, 1) or (o.code == 2 and o.named)
            return o.code == 2 and o.named

        return not self.leaked and all(
            answered(o) and not o.traceback and not o.outside and o.rss_mb < RSS_LIMIT_MB
            for o in self.outcomes.values()
        )


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def measured(
    s: Settings, argv: list[str], folder: Path, timeout: float
) -> tuple[int | None, str, float, str]:
    """`edgeflow ARGV` (under strace where there is one): exit, output, peak RSS in MB, trace."""
    folder.mkdir(parents=True, exist_ok=True)
    trace = folder / "strace.txt"
    strace = shutil.which("strace")
    prefix = (
        [strace, "-f", "-qq", "-e", "trace=open,openat,openat2", "-o", str(trace)] if strace else []
    )
    out = folder / "out.txt"
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "edgeflow", *argv],
            cwd=folder,
            env=edgeflow_env(s.repo, "onnx"),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_limit,
        )
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                os.killpg(proc.pid, 9)
                pid, status, usage = os.wait4(proc.pid, 0)
                status = -1
                break
            time.sleep(0.05)
    proc.returncode = 0  # reaped by us
    code = os.waitstatus_to_exitcode(status) if status != -1 else None
    text = out.read_text(errors="replace")
    return (
        code,
        text,
        usage.ru_maxrss / 1024,
        trace.read_text(errors="replace") if trace.is_file() else "",
    )


def opened(trace: str, cwd: Path) -> set[str]:
    """The paths a trace shows opened (successfully or not), symlinks and `..` resolved."""
    import re

    found = re.findall(r'open(?:at2?)?\((?:[^,]+, )?"([^"]+)"', trace)
    return {os.path.realpath(os.path.join(cwd, p)) for p in found}


def outside_read(paths: set[str], allowed: set[str], place: Place) -> bool:
    """Whether the command opened the secret, or a path outside the model's folder that the
    valid model's run did not (and that is a data-file path a model could name)."""
    targets = {str(place.secret), "/etc/passwd", "/proc/self/mem", "/dev/zero", "/dev/urandom"}
    return any(p in targets and p not in allowed for p in paths) or str(place.secret) in paths


def run_kind(
    s: Settings, kind: str, write: Writer, root: Path, allowed: dict[str, set[str]]
) -> OnnxResult:
    """Write the file, run the three commands on it, judge them."""
    folder = root / kind
    (folder / "model").mkdir(parents=True)
    place = Place(
        folder / "model", root / "outside" / "secret.bin", token(root), root / "valid" / "tiny.onnx"
    )
    path = place.folder / f"{kind}.onnx"
    write(path, place)
    result = OnnxResult(kind)
    files = {"onnx": path, "onnx_data": root / "valid" / "tiny.npz"}
    recipe = folder / "recipe.yaml"
    recipe.write_text(untrusted_recipe("onnx", files), encoding="utf-8")
    argvs = {
        "validate": ["validate", str(recipe)],
        "precheck": ["precheck", str(path), "--target", "onnxruntime_micro"],
        "run": run_args(recipe, folder / "cache", folder / "build"),
    }
    for command in COMMANDS:
        code, text, rss, trace = measured(s, argvs[command], folder / command, s.args.onnx_timeout)
        outside = outside_read(opened(trace, folder / command), allowed[command], place)
        tb = "Traceback" in text or "internal error" in text or code is None
        lines = [x for x in text.splitlines() if x.strip()] or [""]
        message = next((x for x in lines if x.startswith("error:")), lines[-1])[:300]
        result.outcomes[command] = Outcome(code, tb, rss, outside, path.name in text, message)
    result.leaked = leaked(folder, place.token)
    return result


def token(root: Path) -> bytes:
    """The secret's unique bytes."""
    return (root / "outside" / "token").read_bytes()


def leaked(folder: Path, secret: bytes) -> bool:
    """Whether any output under the case's folder (cache, build, logs; not the model's own
    folder, nor the traces) holds the secret."""
    for p in folder.rglob("*"):
        mine = p.is_relative_to(folder / "model") or p.name == "strace.txt"
        readable = p.is_file() and not p.is_symlink() and p.stat().st_size < (256 << 20)
        if not mine and readable and secret in p.read_bytes():
            return True
    return False


def part_onnx(s: Settings) -> list[Row]:
    """Every malformed ONNX kind through validate, precheck and run (and the valid model)."""
    root = s.work / "onnx"
    (root / "outside").mkdir(parents=True)
    (root / "valid").mkdir()
    secret = f"EDGEFLOW-SECRET-{random.SystemRandom().randrange(1 << 60):016x}".encode()
    (root / "outside" / "token").write_bytes(secret)
    (root / "outside" / "secret.bin").write_bytes((secret * 200)[:2560])
    tiny_onnx(root / "valid")
    table = kinds()
    chosen = list(table)[: s.args.onnx] if s.args.onnx > 0 else list(table)
    allowed = control(s, root)
    results = []
    for i, kind in enumerate(chosen):
        r = run_kind(s, kind, table[kind], root, allowed)
        results.append(r)
        codes = ", ".join(f"{c} {o.code}" for c, o in r.outcomes.items())
        peak = max(o.rss_mb for o in r.outcomes.values())
        verdict = "holds" if r.holds else "FAILS"
        say(f"onnx {i + 1}/{len(chosen)} {kind}: {codes}, peak {peak:.0f} MB, {verdict}")
    return [onnx_row(results, len(table))]


def control(s: Settings, root: Path) -> dict[str, set[str]]:
    """The valid model through the three commands: the paths they open (allowed)."""
    folder = root / "control"
    (folder / "model").mkdir(parents=True)
    shutil.copy(root / "valid" / "tiny.onnx", folder / "model" / "tiny.onnx")
    recipe = folder / "recipe.yaml"
    files = {"onnx": folder / "model" / "tiny.onnx", "onnx_data": root / "valid" / "tiny.npz"}
    recipe.write_text(untrusted_recipe("onnx", files), encoding="utf-8")
    argvs = {
        "validate": ["validate", str(recipe)],
        "precheck": ["precheck", str(files["onnx"]), "--target", "onnxruntime_micro"],
        "run": run_args(recipe, folder / "cache", folder / "build"),
    }
    allowed = {}
    for command in COMMANDS:
        code, _text, rss, trace = measured(s, argvs[command], folder / command, s.args.onnx_timeout)
        say(f"onnx control {command}: exit {code}, peak {rss:.0f} MB")
        allowed[command] = opened(trace, folder / command)
    return allowed


def onnx_row(results: list[OnnxResult], total: int) -> Row:
    """The onnx line: tracebacks, outside reads, secret leaks, peak memory, exit 2 naming."""
    failing = [r for r in results if not r.holds]
    for r in failing:
        for c, o in r.outcomes.items():
            why = [f"exit {o.code}"] + ["TRACEBACK"] * o.traceback + ["READ OUTSIDE"] * o.outside
            why += ["file not named"] * (not o.named) + [f"{o.rss_mb:.0f} MB"] * (
                o.rss_mb >= RSS_LIMIT_MB
            )
            say(f"  onnx {r.kind} [{c}] {', '.join(why)}: {o.message}")
        if r.leaked:
            say(f"  onnx {r.kind}: the secret's bytes are in an output")
    n = len(results)
    outs = [o for r in results for o in r.outcomes.values()]
    count = lambda c, pred: sum(pred(r.outcomes[c]) for r in results)  # noqa: E731
    malformed = [r for r in results if r.kind not in STRESS]
    figures: dict[str, Any] = {
        "hold": f"{n - len(failing)}/{n}",
        "malformed refused by every command": (
            f"{sum(r.holds for r in malformed)}/{len(malformed)}"
        ),
        "tracebacks": sum(o.traceback for o in outs),
        "read outside": sum(o.outside for o in outs),
        "secret leaked": sum(r.leaked for r in results),
        "peak MB": max((o.rss_mb for o in outs), default=0.0),
        **{
            f"{c} exit 2 named": f"{count(c, lambda o: o.code == 2 and o.named)}/{n}"
            for c in COMMANDS
        },
    }
    details = {
        "cases": [
            {
                "kind": r.kind,
                "leaked": r.leaked,
                "holds": r.holds,
                "outcomes": {c: o.__dict__ for c, o in r.outcomes.items()},
            }
            for r in results
        ]
    }
    note = f"quick size, acceptance is {total}" if n < total else ""
    size = f"{len(malformed)} malformed + {n - len(malformed)} stress files x 3 commands"
    return Row("onnx", size, figures, not failing, note, details)
