"""Arm's Vela: compile an int8 .tflite for an Ethos-U NPU, and read what it says.

Vela 5.2 (`ethos-u-vela`) compiles with its C++ core, which prints why an operator stays on
the CPU straight to the process's stdout (not through Python's sys.stdout), so Vela runs in
a child process here: its output is captured, and a crash is a failed stage, not a dead
worker. It is run with the accelerator, and Arm/vela.ini's system configuration and memory
mode named (without them it warns and takes defaults), and `--verbose-performance`, which
writes the per-layer CSV. Not used: `--show-cpu-operations`, which crashed Vela 5.2.0 on a
U55 model with an ARG_MAX (KeyError in its statistics writer, no summary written).

What it writes, for `model.tflite` in the output folder:
- `model_vela.tflite`: the deployable file; the NPU's parts are CUSTOM `ethos-u` operators,
  what stays on the CPU is left as TFLite builtins for TFLite Micro;
- `model_summary_<system config>.csv`: one row: memory used (KiB), cycles, MACs, the
  clock, inferences per second;
- `model_per-layer.csv`: one row per operator as Vela lowered it (`Original Operator`,
  `NNG Operator`, `Target` NPU or CPU, `Op Cycles`, `MAC Count`, `Staging Usage`, and `Name`,
  the original operator's output tensor).
Measured 2026-12-07: byte-identical outputs over repeated runs; 0.3-0.4 s per model.
"""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeflow.core.errors import EdgeflowError

if TYPE_CHECKING:
    from edgeflow.targets.profile import Npu

CONFIG = "Arm/vela.ini"  # shipped in the wheel (ethosu/config_files/Arm/vela.ini)
TIMEOUT_S = 600
# Vela's Python entry point, run as `python -c` (its C++ core's prints reach the pipe)
RUN = "import sys; from ethosu.vela.vela import main; sys.exit(main(sys.argv[1:]))"
# A paragraph of Vela's output on an operator it leaves to the CPU: the operator, its
# output tensor, and "Reason: ..." with the constraint on the lines after it.
_FALLBACK = re.compile(r"Warning \(supported operators\) operator: (\S+), ofm: '(.*)'\n")
KIB = 1024


def version() -> str:
    """Vela's release; where it is not installed, the TFLite family's MissingDependency
    (which names the package and the extra that brings it)."""
    from edgeflow.core.versions import tool_version
    from edgeflow.targets._tflite_deps import require

    require("ethosu.vela", "ethos_u")
    return tool_version("ethos-u-vela")


def compile_for(model: Path, npu: Npu, out_dir: Path) -> dict[str, Any]:
    """Compile `model` (an int8 .tflite) into out_dir/<stem>_vela.tflite; return what Vela
    reported (convert.json's `npu`), its CSVs kept in out_dir as vela_summary.csv and
    vela_per_layer.csv."""
    release = version()
    work = out_dir / "vela"
    command = [
        str(model),
        "--accelerator-config",
        npu.accelerator,
        "--config",
        CONFIG,
        "--system-config",
        npu.system,
        "--memory-mode",
        npu.memory,
        "--output-dir",
        str(work),
        "--verbose-performance",
    ]
    try:
        done = subprocess.run(
            [sys.executable, "-c", RUN, *command],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise EdgeflowError(f"Vela did not finish in {TIMEOUT_S} s") from None
    shown = " ".join(["vela", model.name, *command[1:]]).replace(str(work), "vela/")
    if done.returncode != 0:
        tail = (done.stderr.strip() or done.stdout.strip())[-3000:]
        raise EdgeflowError(
            f"Vela {release} failed on {model.name} for {npu.accelerator} "
            f"(exit {done.returncode}):\n{tail}",
            f"the command was: {shown}; another accelerator or memory mode may compile it",
        )
    stem = model.stem
    deployed = out_dir / f"{stem}_vela.tflite"
    (work / f"{stem}_vela.tflite").replace(deployed)
    summary_file = work / f"{stem}_summary_{npu.system}.csv"
    layers_file = work / f"{stem}_per-layer.csv"
    summary_file.replace(out_dir / "vela_summary.csv")
    layers_file.replace(out_dir / "vela_per_layer.csv")
    work.rmdir()
    summary = _rows(out_dir / "vela_summary.csv")[0]
    fallbacks = _fallbacks(done.stdout)
    layers = [_layer(row, fallbacks) for row in _rows(out_dir / "vela_per_layer.csv")]
    return {
        "compiler": f"ethos-u-vela {release}",
        "command": shown,
        "accelerator": npu.accelerator,
        "system_config": npu.system,
        "memory_mode": npu.memory,
        "clock_hz": int(float(summary["core_clock"])),
        "cycles": int(summary["cycles_total"]),
        "cycles_npu": int(summary["cycles_npu"]),
        "macs": int(summary["nn_macs"]),
        "inferences_per_second": float(summary["inferences_per_second"]),
        "sram_bytes": _bytes(summary["sram_memory_used"]),
        "dram_bytes": _bytes(summary["dram_memory_used"]),
        "on_chip_flash_bytes": _bytes(summary["on_chip_flash_memory_used"]),
        "off_chip_flash_bytes": _bytes(summary["off_chip_flash_memory_used"]),
        "weights_storage": summary["weights_storage_area"],
        "deployed": deployed.name,
        "deployed_bytes": deployed.stat().st_size,
        "operators_npu": _count("NPU", done.stdout),
        "operators_cpu": _count("CPU", done.stdout),
        "layers": layers,
        "files": [deployed.name, "vela_summary.csv", "vela_per_layer.csv"],
    }


def _count(where: str, stdout: str) -> int:
    """Vela's own count of the original operators it placed (`NPU operators = 7 (100.0%)`;
    fused activations not counted, as it counts them without --show-cpu-operations)."""
    found = re.search(rf"^{where} operators = (\d+)", stdout, re.MULTILINE)
    if found is None:
        raise EdgeflowError(f"Vela printed no '{where} operators = N' line: another Vela?")
    return int(found[1])


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _layer(row: dict[str, str], fallbacks: dict[str, str]) -> dict[str, Any]:
    """One row of the per-layer CSV; a CPU row with the reason Vela printed for it."""
    layer: dict[str, Any] = {
        "op": row["Original Operator"],
        "lowered": row["NNG Operator"],
        "target": row["Target"],
        "cycles": int(float(row["Op Cycles"])),
        "macs": int(float(row["MAC Count"])),
        "staging_bytes": int(float(row["Staging Usage"])),
        "name": row["Name"],
    }
    if row["Target"] != "NPU":
        layer["reason"] = fallbacks.get(row["Name"], "(Vela printed no reason)")
    return layer


def _fallbacks(stdout: str) -> dict[str, str]:
    """Output tensor -> why Vela left its operator on the CPU, from the paragraphs it prints."""
    found = {}
    for paragraph in re.split(r"\n\s*\n", stdout):
        head = _FALLBACK.match(paragraph.strip())
        if head:
            rest = paragraph.strip()[head.end() :].splitlines()
            found[head[2]] = " ".join(line.strip().removeprefix("Reason: ") for line in rest)
    return found


def _bytes(kib: str) -> int:
    return round(float(kib) * KIB)
