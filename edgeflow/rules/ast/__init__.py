"""ast.* rules. RULES lists every built-in rule of this level, in catalogue order.

These rules rewrite the Python source of `forward` (and the methods it reaches) before any
tracing; see `_source.py` for how. Rule modules do not import torch when they are imported.
"""

from __future__ import annotations

from typing import Any

from edgeflow.rules.ast.calls import ReplaceCall
from edgeflow.rules.ast.fake_quant import FreezeFakeQuant
from edgeflow.rules.ast.float64 import Float64ToFloat32
from edgeflow.rules.ast.item import StaticItem
from edgeflow.rules.ast.loops import UnrollLoops
from edgeflow.rules.ast.methods import ReplaceMethod
from edgeflow.rules.ast.nonzero import NonzeroToMask
from edgeflow.rules.ast.shapes import SpecializeShapes
from edgeflow.rules.ast.tensor_if import TensorIfToWhere

RULES: tuple[type[Any], ...] = (
    NonzeroToMask,
    SpecializeShapes,
    TensorIfToWhere,
    UnrollLoops,
    StaticItem,
    Float64ToFloat32,
    ReplaceCall,
    ReplaceMethod,
    FreezeFakeQuant,
)
