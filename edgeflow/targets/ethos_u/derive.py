"""ethos_u's NPU placement, measured: where Vela puts each ONNX operator, per generation.

    python -m edgeflow.targets.derive ethos_u           # print the npu_placement section
    python -m edgeflow.targets.derive ethos_u --write   # replace it in targets/ethos_u.yaml
    python -m edgeflow.targets.derive ethos_u --verdicts p.json --write   # keep/reuse

Every probe graph of edgeflow.targets.probes becomes the int8 model.tflite that the
tflite_micro build (and so ethos_u's) makes of it (trial.build_tflite), and Vela compiles that
(_vela.compile_for, as a build does) for one accelerator of each generation, with Vela's own
system configuration and memory mode for it. Per ONNX operator the profile records where its
float32 probe went (all on the NPU, all on the CPU, partly, or Vela failed), the TFLite
builtins left for the CPU, Vela's reason, and the transposes and reshapes Vela added on the
NPU; where a probe with another input type, or a variant failing a checker, went elsewhere,
that too. The precheck reads it (edgeflow.targets.placement). Which operators a generation
takes is the same at every size (Vela's operator tables are per generation), so one size each
is measured. About 8 minutes: the conversions (onnx2tf), then 0.3 s a compile.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from edgeflow.core.errors import EdgeflowError
from edgeflow.targets.profile import Npu, OpPlacement, Placement, Where

# one accelerator per generation: placement depends on the generation, not the size
GENERATIONS = {"u55": "ethos-u55-128", "u65": "ethos-u65-256", "u85": "ethos-u85-256"}
# the NPU operators of data movement a precheck reports where Vela adds them to another op
MOVES = ("Transpose", "Reshape")
MOVERS = {"Transpose", "Reshape", "Squeeze", "ExpandDims"}  # ops that are themselves a move
# the float32 island around an op that stays float: said once, not per tensor
ISLAND = {"Quantize", "Dequantize"}
MARKER_TAIL = "ethos_u --write`: do not edit below ---"


def section(args: Any) -> str:
    """The generated part of targets/ethos_u.yaml (derive.main's family hook)."""
    from edgeflow.targets.probes import probes

    cases = [c for c in probes() if not c.emitted_only]
    saved: Path | None = args.verdicts
    if saved is not None and saved.is_file():  # an earlier run's measurements
        raw = json.loads(saved.read_text(encoding="utf-8"))
        missing = sorted({c.name for c in cases} - {*raw["placed"], *raw["skipped"]})
        if missing:
            raise SystemExit(f"{saved} has no placement for {', '.join(missing)}: delete it")
        skipped = raw["skipped"]
        placed = {
            name: {g: Placement.model_validate(p) if p else None for g, p in found.items()}
            for name, found in raw["placed"].items()
        }
    else:
        placed, skipped = measure(cases, _progress)
        if saved is not None:
            found = {
                name: {g: p.model_dump() if p else None for g, p in by_gen.items()}
                for name, by_gen in placed.items()
            }
            text = json.dumps({"placed": found, "skipped": skipped}, indent=1)
            saved.write_text(text, encoding="utf-8")
    return render(by_operator(cases, placed), skipped, len(cases))


def measure(
    cases: list[Any], progress: Any = None
) -> tuple[dict[str, dict[str, Placement | None]], dict[str, str]]:
    """({probe: {generation: its placement, None where nothing was left to place}}, {probe:
    why it did not convert})."""
    from edgeflow.targets.trial import Trial, build_tflite

    placed: dict[str, dict[str, Placement | None]] = {}
    skipped: dict[str, str] = {}
    for case in cases:
        trial = Trial(case.name, case.model.SerializeToString(), case.feeds)
        with tempfile.TemporaryDirectory(prefix="edgeflow-vela-probe-") as tmp:
            work = Path(tmp)
            try:
                model = build_tflite(trial, work, "tflite_micro")
            except Exception as exc:  # a probe the converter cannot take is not placed
                skipped[case.name] = _first_line(exc)
                if progress:
                    progress(case.name, {})
                continue
            placed[case.name] = {}
            for generation, accelerator in GENERATIONS.items():
                out = work / generation
                out.mkdir()
                npu = Npu(accelerator=accelerator)  # type: ignore[arg-type]
                placed[case.name][generation] = place(case.model, model, npu, out)
        if progress:
            progress(case.name, placed[case.name])
    return placed, skipped


def place(source: Any, model: Path, npu: Npu, out: Path) -> Placement | None:
    """Where Vela put the int8 .tflite `model` of the ONNX graph `source` (None: the converter
    left nothing to place)."""
    from edgeflow.targets.ethos_u import _vela
    from edgeflow.targets.ethos_u.backend import left_on_cpu

    try:
        got = _vela.compile_for(model, npu, out)
    except EdgeflowError as exc:
        return Placement(placed="fails", why=_vela_failure(str(exc)), io=_non_float_edges(source))
    if not got["operators_npu"] and not got["operators_cpu"]:
        return None
    left = sorted(left_on_cpu(out / got["deployed"]))
    on: Where = "npu" if not got["operators_cpu"] else "partly" if got["operators_npu"] else "cpu"
    layers = got["layers"]
    moves = Counter(
        layer["lowered"]
        for layer in layers
        if layer["target"] == "NPU" and layer["lowered"] in MOVES and layer["op"] not in MOVERS
    )
    return Placement(placed=on, cpu=left if on != "npu" else [], why=_reasons(layers), moves=moves)


def _non_float_edges(model: Any) -> list[str]:
    """The non-float element types of the graph's inputs and outputs."""
    from edgeflow.targets.placement import edge_types

    return sorted(set(edge_types(model.graph).values()) - {"float"})


def _reasons(layers: list[dict[str, Any]]) -> str:
    """Vela's reasons for the operators it left on the CPU, without tensor names, each once."""
    cpu = [layer for layer in layers if layer["target"] != "NPU"]
    own = [layer for layer in cpu if layer["op"] not in ISLAND] or cpu
    reasons: dict[str, None] = {}  # ordered, once each
    for layer in own:
        op = layer["op"] if layer["op"] != "None" else "(no Vela type)"
        reasons.setdefault(f"{op}: {_plain(layer.get('reason', ''))}", None)
    text = "; ".join(reasons)
    if len(own) < len(cpu):
        text += "; and the float32 island's QUANTIZE/DEQUANTIZE"
    return text[:400]


def _plain(reason: str) -> str:
    """A reason without its tensor names (`(model_1/conv)`) and Vela's type list."""
    reason = re.sub(r" \([^()]*\)", "", reason)
    return reason.split(" Feature-map dataTypes must be")[0].strip()


def _vela_failure(message: str) -> str:
    exit_code = re.search(r"\(exit (-?\d+)\)", message)
    lines = [line.strip() for line in message.split("\n")[1:] if line.strip()]
    last = lines[-1] if lines else message.splitlines()[0]
    return f"Vela failed (exit {exit_code[1] if exit_code else '?'}): {last}"[:300]


def by_operator(
    cases: list[Any], placed: dict[str, dict[str, Placement | None]]
) -> dict[str, dict[str, OpPlacement]]:
    """{generation: {ONNX op: its placement}}: the first float32 probe of the op that placed
    something (a plain one before a variant; else one of another input type), then the input
    types and checker variants placed otherwise."""
    from edgeflow.targets.derive import first_input_dtype

    by_op: dict[str, list[Any]] = {}
    for case in cases:
        if case.name in placed:
            by_op.setdefault(case.op, []).append(case)
    found: dict[str, dict[str, OpPlacement]] = {g: {} for g in GENERATIONS}
    for generation in GENERATIONS:
        for op, group in by_op.items():
            plain = [c for c in group if not c.checker]
            floats = [c for c in group if first_input_dtype(c) == "float"]
            # a float32 probe the converter folded away (a Transpose into the input's layout)
            # places nothing: a float variant speaks for the op before another input type
            ordered = sorted(floats, key=lambda c: bool(c.checker)) + [
                c for c in plain if c not in floats
            ]
            main = next((c for c in ordered if placed[c.name][generation] is not None), None)
            if main is None:
                continue
            base = placed[main.name][generation]
            assert base is not None
            dtypes: dict[str, Placement] = {}
            for case in plain:
                got, dtype = placed[case.name][generation], first_input_dtype(case)
                if got is not None and dtype != first_input_dtype(main) and _differs(got, base):
                    dtypes.setdefault(dtype, got)
            checks: dict[str, Placement] = {}
            for case in (c for c in group if c.checker):
                got = placed[case.name][generation]
                if got is not None and _differs(got, base):
                    checks.setdefault(case.checker, got)
            found[generation][op] = OpPlacement(**base.model_dump(), dtypes=dtypes, checks=checks)
    return found


def _differs(one: Placement, other: Placement) -> bool:
    return (one.placed, one.cpu, one.moves) != (other.placed, other.cpu, other.moves)


def render(found: dict[str, dict[str, OpPlacement]], skipped: dict[str, str], probes: int) -> str:
    from edgeflow.targets.derive import MARKER
    from edgeflow.targets.ethos_u import _vela

    lines = [
        f"{MARKER} {MARKER_TAIL}",
        f"# Measured with Vela {_vela.version()} on the int8 .tflite the tflite_micro build makes",
        f"# of each of {probes} probe graphs (edgeflow/targets/probes.py), compiled for "
        + ", ".join(GENERATIONS.values()),
        "# (Vela's own system configuration and memory mode for each). Per generation and",
        "# ONNX operator: placed npu | cpu | partly | fails, the TFLite builtins left for the",
        "# CPU, Vela's reason, the Transpose/Reshape NPU operators Vela added (moves), and",
        "# where another input type (dtypes) or a variant failing a checker (checks) went",
        "# elsewhere. io: a failure measured with such a tensor at the graph's inputs or outputs.",
        "npu_placement:",
    ]
    for generation, ops in found.items():
        lines.append(f"  {generation}:")
        for op in sorted(ops):
            lines.append(f"    {op}: {_flow(ops[op])}")
    lines.append(f"# Not placed ({len(skipped)}): the probe did not convert to int8")
    lines += [f"#   {name}: {why[:150]}" for name, why in sorted(skipped.items())]
    return "\n".join(lines) + "\n"


def _flow(spec: Placement) -> str:
    """A placement as one YAML flow mapping (defaults left out)."""
    parts = []
    for key, value in spec.model_dump(exclude_defaults=True).items():
        if key in ("dtypes", "checks"):
            inner = ", ".join(
                f"{k}: {_flow(Placement.model_validate(v))}" for k, v in value.items()
            )
            parts.append(f"{key}: {{{inner}}}")
        else:
            parts.append(f"{key}: {json.dumps(value)}")
    return "{" + ", ".join(parts) + "}"


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _progress(name: str, found: dict[str, Placement | None]) -> None:
    marks = " ".join(f"{g}:{p.placed if p else '-'}" for g, p in found.items()) or "not converted"
    print(f"  {name:32} {marks}", file=sys.stderr, flush=True)
