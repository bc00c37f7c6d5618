"""Facts about this machine that change what a runtime computes, for stage keys and settings.

onnxruntime's x86 int8 kernels multiply unsigned 8-bit activations by signed 8-bit weights
with an instruction (VPMADDUBSW, AVX2 and AVX-512 without VNNI) that adds pairs of products
into a saturating int16: with weights that use the full int8 range the sum can clip, and an
int8 model loses accuracy on that machine alone. VNNI's VPDPBUSD sums in int32, and ARM's
kernels do not saturate. `quantization.reduce_range: auto` gives 7-bit weights exactly where
this machine's kernels would saturate (docs/debugging.md#known-runtime-traps).
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

X86 = ("x86_64", "amd64", "i386", "i686", "x86")
VNNI = ("avx512_vnni", "avx_vnni")  # /proc/cpuinfo flag names


def cpu_flags() -> set[str] | None:
    """The CPU's feature flags from /proc/cpuinfo; None where that cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return None


def int8_saturation(machine: str | None = None, flags: set[str] | None = None) -> str | None:
    """Why onnxruntime's int8 kernels saturate on this CPU, or None where they do not. An x86
    CPU whose flags cannot be read counts as saturating (the safe side: 7-bit weights)."""
    machine = (machine if machine is not None else platform.machine()).lower()
    if machine not in X86:
        return None
    if flags is None:
        flags = cpu_flags()
    if flags is None:
        return f"{machine} CPU whose features cannot be read (no /proc/cpuinfo)"
    if flags & set(VNNI):
        return None
    return f"{machine} CPU without VNNI (int16-saturating u8 x s8 multiply-add)"


@functools.cache
def fact(name: str) -> str:
    """One host fact by name, as a stage key records it (`host:NAME` in a stage's tools)."""
    if name == "int8":
        why = int8_saturation()
        return f"{platform.machine()}: " + (f"saturating ({why})" if why else "exact")
    raise ValueError(f"unknown host fact '{name}'")
