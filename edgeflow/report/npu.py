"""An NPU build's figures (the ethos_u target, compiled by Arm's Vela): metrics.json's `npu`,
the checks of its memory against the board, and the report's NPU section.

What each figure rests on, said where it is shown:
- numerics: verified, the pre-Vela model on TFLite Micro's reference kernels (BASIS links
  Arm's statement that Vela is tested bit-exact against them);
- placement (NPU or CPU, with Vela's reason) and memory (SRAM, flash): what Vela compiled and
  allocated, exact for its output file, not measured on a device;
- cycles, time and inferences per second: Vela's performance estimate (ESTIMATED), the time
  at the board's NPU clock where the board states one, else at the clock of Vela's system
  configuration.
"""

from __future__ import annotations

from typing import Any

from edgeflow.report.plots import short_name

BASIS = "numerics verified on TFLite Micro reference kernels; NPU performance estimated by Vela"
# Arm's words: "Vela is tested by comparing the bit exact numerical behaviour of the Ethos-U
# optimised operators against that of the corresponding TensorFlow Lite reference kernels
# (or TensorFlow Lite for Microcontrollers reference kernels in the case of the
# UNIDIRECTIONAL_SEQUENCE_LSTM operator)" (Vela's README, "TensorFlow Support", 3.x-4.x).
# Quoted from the copy of Vela 3.x-4.x at NXP (5.2.0's README no longer carries it).
STATEMENT = "https://github.com/nxp-imx/ethos-u-vela#tensorflow-support"
ESTIMATED = ("cycles", "latency_ms", "inferences_per_second")
HEADING = "NPU: placement, memory, estimated time"  # report.md's section; report.html plots it
LAYERS_FILE = "vela_per_layer.csv"  # in the build folder: Vela's per-layer figures
BOARD_ORIGIN = ("precheck.board (", ")")  # a memory check's origin: around the board's name
MAX_LAYER_ROWS = 60  # the report's per-layer table; vela_per_layer.csv has every row


def figures(
    record: dict[str, Any], board: tuple[str, Any] | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """metrics.json's `npu` from convert.json's, and the checks of its SRAM and flash against
    the board (`board`: its name and Board, or None)."""
    clock, clock_from = record["clock_hz"], f"Vela's {record['system_config']}"
    if board is not None and board[1].clock_hz:
        clock, clock_from = board[1].clock_hz, f"board {board[0]}"
    layers = record["layers"]
    cpu = [layer for layer in layers if layer["target"] != "NPU"]
    flash = record["off_chip_flash_bytes"] + record["on_chip_flash_bytes"] + record["dram_bytes"]
    found = {
        "accelerator": record["accelerator"],
        "system_config": record["system_config"],
        "memory_mode": record["memory_mode"],
        "compiler": record["compiler"],
        "basis": BASIS,
        "estimated": list(ESTIMATED),
        "operators_npu": record["operators_npu"],
        "operators_cpu": record["operators_cpu"],
        "cpu_operators": [f"{layer['op']} ({layer['name']})" for layer in cpu],
        "macs": record["macs"],
        "cycles": record["cycles"],
        "clock_hz": clock,
        "clock_from": clock_from,
        "latency_ms": record["cycles"] / clock * 1000,
        "inferences_per_second": clock / record["cycles"] if record["cycles"] else None,
        "sram_bytes": record["sram_bytes"],
        "flash_bytes": flash,
        "deployed_bytes": record["deployed_bytes"],
    }
    return found, _memory_checks(found, board)


def _memory_checks(found: dict[str, Any], board: tuple[str, Any] | None) -> list[dict[str, Any]]:
    if board is None:
        return []
    name, limits = board
    checks = []
    for what, value, limit in (
        ("SRAM", found["sram_bytes"], limits.ram_bytes),
        ("flash", found["flash_bytes"], limits.flash_bytes),
    ):
        if limit is None:
            continue
        passed = value <= limit
        fits = "fits in" if passed else "does not fit in"
        checks.append(
            {
                "metric": f"npu.{what.lower()}_bytes",
                "value": value,
                "threshold": limit,
                "passed": passed,
                "message": f"the {what} Vela allocates, {value:,} bytes, {fits} board "
                f"{name}'s {limit:,}",
                "origin": f"{BOARD_ORIGIN[0]}{name}{BOARD_ORIGIN[1]}",
            }
        )
    return checks


def headline(npu: dict[str, Any]) -> list[str]:
    """The report's rows of metrics for an NPU build."""
    return [
        f"| NPU time (Vela's estimate) | {npu['latency_ms']:.3f} ms: {npu['cycles']:,} cycles at "
        f"{npu['clock_hz'] / 1e6:g} MHz ({npu['clock_from']}) |",
        f"| NPU operators | {npu['operators_npu']} on the NPU, {npu['operators_cpu']} on the CPU |",
        f"| NPU memory (Vela's allocation) | SRAM {npu['sram_bytes']:,} bytes, flash "
        f"{npu['flash_bytes']:,} bytes |",
    ]


def one_line(npu: dict[str, Any]) -> str:
    cpu = f", {npu['operators_cpu']} ops on the CPU" if npu["operators_cpu"] else ""
    return (
        f"{npu['accelerator']} est. {npu['latency_ms']:.3f} ms ({npu['cycles']:,} cycles at "
        f"{npu['clock_hz'] / 1e6:g} MHz){cpu}, SRAM {npu['sram_bytes']:,} B"
    )


def section_lines(npu: dict[str, Any], record: dict[str, Any]) -> list[str]:
    """The report's NPU section: what is verified and what is estimated, where the operators
    run, and Vela's figures per layer."""
    lines = [
        f"**{BASIS[0].upper()}{BASIS[1:]}.** The model.tflite that Vela compiled ran in TFLite "
        "Micro's reference kernels against the source (the figures above); Arm tests Vela by "
        "comparing the Ethos-U's results with those kernels bit for bit "
        f"([Vela's statement]({STATEMENT})). The operators Vela left on the CPU ran there "
        "too. Cycles and times are Vela's estimates; no Ethos-U ran this build.",
        "",
        f"- compiled by {npu['compiler']} for {npu['accelerator']}, system "
        f"{npu['system_config']}, memory mode {npu['memory_mode']}: `{record['command']}`",
        f"- model_vela.tflite, the file the device loads: {npu['deployed_bytes']:,} bytes",
        f"- {npu['operators_npu']} operators on the NPU, {npu['operators_cpu']} on the CPU; "
        f"{npu['macs']:,} MACs on the NPU",
        f"- estimated {npu['cycles']:,} cycles: {npu['latency_ms']:.3f} ms, "
        f"{npu['inferences_per_second']:,.0f} inferences/s at {npu['clock_hz'] / 1e6:g} MHz "
        f"({npu['clock_from']})",
        f"- SRAM {npu['sram_bytes']:,} bytes, flash {npu['flash_bytes']:,} bytes "
        f"(Vela's allocation; weights in {record['weights_storage']})",
    ]
    cpu = [layer for layer in record["layers"] if layer["target"] != "NPU"]
    if cpu:
        lines += ["", "On the CPU (TFLite Micro), with Vela's reason:", ""]
        lines += [f"- {layer['op']} `{layer['name']}`: {layer['reason']}" for layer in cpu]
    lines += [
        "",
        "| # | operator | as lowered | on | cycles (est.) | MACs | name |",
        "|---|---|---|---|---|---|---|",
    ]
    for k, layer in enumerate(record["layers"][:MAX_LAYER_ROWS]):
        on = layer["target"] if layer["target"] == "NPU" else f"**{layer['target']}**"
        lines.append(
            f"| {k} | {layer['op']} | {layer['lowered']} | {on} | {layer['cycles']:,} | "
            f"{layer['macs']:,} | `{short_name(layer['name'], 60)}` |"
        )
    if len(record["layers"]) > MAX_LAYER_ROWS:
        lines.append(f"\n{len(record['layers']) - MAX_LAYER_ROWS} more in vela_per_layer.csv")
    return lines


def after_vela(
    npu: dict[str, Any], record: dict[str, Any], pre: dict[str, Any], checks: list[dict[str, Any]]
) -> list[dict]:
    """The precheck table's rows for what Vela then did: its placement against the
    prediction, its SRAM and flash against the board (the build's checks of them, beside the
    memory the precheck estimated), and the transposes and reshapes it runs on the NPU. Rows
    as precheck findings are written (severity: passed, warning or error)."""
    predicted = pre.get("npu") or {}
    memory = pre.get("memory") or {}
    left = ", ".join(record.get("cpu_builtins") or []) or "none"
    expected = sorted({*predicted.get("cpu", {}), *predicted.get("partly", {})})
    if predicted:
        guess = f"predicted on the CPU: {', '.join(expected) or 'none'}"
    elif pre.get("path"):  # TensorFlow's own converter: no ONNX graph was judged
        guess = "no prediction (the precheck judged the converter's builtins, not ONNX nodes)"
    else:
        guess = "no prediction (no placements measured for this generation)"
    rows = [
        _row(
            "(NPU placement, Vela)",
            npu["operators_cpu"],
            f"Vela placed {npu['operators_npu']} operators on the NPU and {npu['operators_cpu']} "
            f"on the CPU (builtins left: {left}); {guess}",
            "warning" if npu["operators_cpu"] else "passed",
        )
    ]
    verdicts = {c["metric"]: c for c in checks}
    arena = (
        f"; the precheck estimated activations of {memory['activations_bytes']:,} B in a "
        f"{memory['arena_bytes']:,}-B TFLite Micro arena"
        if memory
        else ""
    )
    weights = f"; the precheck estimated {memory['weights_bytes']:,} B of weights" if memory else ""
    for what, value, said in (
        ("SRAM", npu["sram_bytes"], arena),
        ("flash", npu["flash_bytes"], weights),
    ):
        check = verdicts.get(f"npu.{what.lower()}_bytes")  # _memory_checks'
        if check is None:
            reason, severity = f"Vela allocates {value:,} B{said}; no board limit", "passed"
        else:
            fits = "fits in" if check["passed"] else "does not fit in"
            board = check["origin"].removeprefix(BOARD_ORIGIN[0]).removesuffix(BOARD_ORIGIN[1])
            limit = check["threshold"]
            reason = f"Vela allocates {value:,} B, which {fits} board {board}'s {limit:,} B{said}"
            severity = "passed" if check["passed"] else "error"
        rows.append(_row(f"({what}, Vela)", 1, reason, severity))
    moved = [layer for layer in record["layers"] if layer["lowered"] in ("Transpose", "Reshape")]
    if moved:
        cycles = sum(layer["cycles"] for layer in moved)
        share = cycles / npu["cycles"] if npu["cycles"] else 0.0
        ahead = sum(predicted.get("moves", {}).values())
        rows.append(
            _row(
                "(transposes, Vela)",
                len(moved),
                f"{len(moved)} Transpose/Reshape operations on the NPU: {cycles:,} cycles, "
                f"{share:.1%} of the estimate (the precheck foresaw them for {ahead} nodes; "
                "the converter's layout transposes are among them)",
                "warning",
            )
        )
    return rows


def _row(operator: str, count: int, reason: str, severity: str) -> dict[str, Any]:
    return {
        "operator": operator,
        "count": count,
        "reason": reason,
        "nodes": [],
        "rule": "",
        "options": {},
        "severity": severity,
        "tried": [],
    }
