"""Where an NPU compiler will put a model's operators, said before converting.

A profile with an NPU (ethos_u) carries `npu_placement`: per generation and ONNX operator,
where Vela put the operator's probe graphs (measured by edgeflow/targets/ethos_u/derive.py).
The precheck applies it to each node, by the node's first input type and the checkers its
variants failed, and reports:

- an operator Vela leaves on the CPU (all of it, or part): a warning, since TFLite Micro runs
  it there (the build checks that), with Vela's reason and the rule that moves it to the NPU
  where one does (the precheck tries the rules on the model, as for its errors);
- an operator Vela failed on: an error where the model has what the failing probe had (a
  bool or int64 tensor at the graph's edge), else a warning that says so;
- the transposes and reshapes Vela adds on the NPU to run an operator: a warning (time, not
  accuracy), with the rule that avoids them.

`predict` sums the same up for precheck.json's `npu`, which the report sets beside what Vela
then did.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from edgeflow.rules.fixes import Fix
from edgeflow.targets.findings import DTYPE_FINDINGS, Finding, GraphFacts
from edgeflow.targets.profile import OpPlacement, Placement, TargetProfile

SKIPPED = ("Constant",)  # values, not operators


def applies(profile: TargetProfile, quantization: str) -> bool:
    """Whether the profile has placements for its NPU's generation (int8 builds only)."""
    return (
        profile.npu is not None
        and quantization == "int8"
        and profile.npu.generation in profile.npu_placement
    )


def placements(
    model: Any, profile: TargetProfile, facts: GraphFacts | None = None
) -> Iterator[tuple[str, str, Placement | None, str]]:
    """(node name, operator, where it goes (None: not measured), the input type it was
    measured for where that decided it) of each node of a shape-inferred model."""
    assert profile.npu is not None
    table = profile.npu_placement[profile.npu.generation]
    facts = facts or GraphFacts.of(model)
    for name, node in facts.nodes:
        op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        if op in SKIPPED:
            continue
        spec = table.get(op)
        yield (name, op, *_for_node(spec, node, facts)) if spec else (name, op, None, "")


def _for_node(spec: OpPlacement, node: Any, facts: GraphFacts) -> tuple[Placement, str]:
    """The placement measured for a node like this one: of its input type, else of the
    variant whose checker it fails, else the operator's; and the input type where it
    decided."""
    import onnx

    from edgeflow.targets.checkers import CHECKERS

    dtype = facts.types.get(node.input[0]) if node.input and node.input[0] else None
    if dtype is not None:
        name = onnx.TensorProto.DataType.Name(dtype).lower()
        if name in spec.dtypes:
            return spec.dtypes[name], name
    for checker, variant in spec.checks.items():
        if CHECKERS[checker](facts.node(node)) is not None:
            return variant, ""
    return spec, ""


def findings(model: Any, profile: TargetProfile, facts: GraphFacts) -> list[Finding]:
    """The precheck's findings of placement (see the module's doc)."""
    assert profile.npu is not None
    npu = f"an Ethos-{profile.npu.generation.upper()}"
    edges = _edge_types(model)
    groups: dict[tuple[str, str], Finding] = {}

    def add(op: str, key: str, reason: str, at: str, dtype: str, severity: str = "warning") -> None:
        finding = groups.get((op, key + dtype))
        if finding is None:
            # the rule that removes what decided it (an int64 input), else the operator
            typed = DTYPE_FINDINGS.get(dtype)
            fixes = [*([Fix.finding(typed)] if typed else []), Fix.op(op)]
            finding = Finding(op, reason, severity=severity, fixes=fixes, confirm=True)
            groups[op, key + dtype] = finding
        finding.nodes.append(at)
        finding.count = len(finding.nodes)

    for name, op, where, dtype in placements(model, profile, facts):
        if where is None:
            continue
        if where.placed == "cpu":
            reason = (
                f"Vela leaves it on the CPU of {npu} ({', '.join(where.cpu)}: TFLite Micro runs "
                f"it there): {where.why}"
            )
            add(op, "cpu", reason, name, dtype)
        elif where.placed == "partly":
            reason = (
                f"Vela leaves part of it on the CPU of {npu} ({', '.join(where.cpu)}): {where.why}"
            )
            add(op, "partly", reason, name, dtype)
        elif where.placed == "fails":
            shared = sorted(set(where.io) & edges.get(name, set()))
            if not where.io or shared:
                at_edge = f" (a {', '.join(shared)} tensor at the graph's edge, as measured)"
                add(op, "fails", f"{where.why}{at_edge if shared else ''}", name, dtype, "error")
            else:
                reason = (
                    f"{where.why}, measured where a {', '.join(where.io)} tensor was the graph's "
                    "input or output (here it is inside the graph: not measured)"
                )
                add(op, "fails inside", reason, name, dtype)
        moved = ", ".join(f"{n} {kind}" for kind, n in where.moves.items())
        if moved:
            reason = f"Vela adds {moved} on the NPU to run it on {npu} (time, not accuracy)"
            add(op, "moves", reason, name, dtype)
    return list(groups.values())


def edge_types(graph: Any) -> dict[str, str]:
    """The graph's inputs and outputs (not its weights) -> their element type's onnx name."""
    import onnx

    weights = {t.name for t in graph.initializer}
    return {
        v.name: onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type).lower()
        for v in (*graph.input, *graph.output)
        if v.name not in weights
    }


def _edge_types(model: Any) -> dict[str, set[str]]:
    """Node name -> the non-float types of the graph inputs it reads and outputs it writes."""
    kinds = edge_types(model.graph)
    found: dict[str, set[str]] = {}
    for i, node in enumerate(model.graph.node):
        touched = {kinds[t] for t in (*node.input, *node.output) if t in kinds}
        found[node.name or f"#{i}"] = touched - {"float"}
    return found


def predict(model: Any, profile: TargetProfile, quantization: str) -> dict[str, Any] | None:
    """precheck.json's `npu`: how many nodes Vela is expected to put where, by operator
    (None: the profile has no placement for this build)."""
    if not applies(profile, quantization):
        return None
    assert profile.npu is not None
    counts: dict[str, Counter[str]] = {k: Counter() for k in ("cpu", "partly", "fails", "moves")}
    unmeasured: Counter[str] = Counter()
    nodes = on_npu = 0
    for _, op, where, _ in placements(model, profile):
        nodes += 1
        if where is None:
            unmeasured[op] += 1
            continue
        if where.placed == "npu":
            on_npu += 1
        else:
            counts[where.placed][op] += 1
        if where.moves:
            counts["moves"][op] += 1
    return {
        "accelerator": profile.npu.accelerator,
        "generation": profile.npu.generation,
        "nodes": nodes,
        "npu": on_npu,
        **{k: dict(sorted(v.items())) for k, v in counts.items()},
        "unmeasured": dict(sorted(unmeasured.items())),
    }


def prediction_line(predicted: dict[str, Any]) -> str:
    """One line of the prediction, for the precheck's output and the report."""
    parts = [f"{predicted['npu']} of {predicted['nodes']} nodes on the NPU"]
    for key, said in (
        ("cpu", "on the CPU"),
        ("partly", "partly on the CPU"),
        ("fails", "Vela fails on"),
        ("unmeasured", "not measured"),
    ):
        if predicted[key]:
            ops = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in predicted[key].items())
            parts.append(f"{said}: {ops}")
    return (
        f"NPU placement predicted for {predicted['accelerator']} (Vela on the probe graphs): "
        + "; ".join(parts)
    )
