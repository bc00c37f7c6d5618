"""onnx.* rules. RULES lists every built-in rule of this level, in catalogue order."""

from __future__ import annotations

from edgeflow.rules.base import OnnxRule
from edgeflow.rules.onnx.attention import MultiplicativeMask
from edgeflow.rules.onnx.broadcast import ExplicitBroadcast
from edgeflow.rules.onnx.casts import CastFloat64ToFloat32, Int64ToInt32
from edgeflow.rules.onnx.conv_pool import (
    MaxPoolEdgePad,
    PadAllAxes,
    PadWithConcat,
    ReduceMaxAsPool,
    ShuffleToConv,
    SplitGroups,
    SumAsMean,
)
from edgeflow.rules.onnx.cut import Cut
from edgeflow.rules.onnx.decompose import Decompose
from edgeflow.rules.onnx.equalize import EqualizeChannels
from edgeflow.rules.onnx.fold import FoldConstants
from edgeflow.rules.onnx.fold_if import FoldIf
from edgeflow.rules.onnx.ids import IdsAsFloat
from edgeflow.rules.onnx.indexing import GatherToSlice, SliceRank, SplitSlice, TileToConcat
from edgeflow.rules.onnx.linear import LowerMatMul, ResizeToMatMul, SqrtNewton
from edgeflow.rules.onnx.loop import UnrollLoop
from edgeflow.rules.onnx.norm import ChannelLayerNorm
from edgeflow.rules.onnx.opset import ConvertOpset
from edgeflow.rules.onnx.optimize import Optimize
from edgeflow.rules.onnx.recurrent import UnrollRecurrent
from edgeflow.rules.onnx.shapes import FixShapes
from edgeflow.rules.onnx.simplify import Simplify
from edgeflow.rules.onnx.transposes import CancelTransposes

RULES: tuple[type[OnnxRule], ...] = (
    CastFloat64ToFloat32,
    Int64ToInt32,
    Optimize,
    Simplify,
    FoldConstants,
    CancelTransposes,
    EqualizeChannels,
    ChannelLayerNorm,
    Decompose,
    UnrollLoop,
    UnrollRecurrent,
    SqrtNewton,
    MultiplicativeMask,
    MaxPoolEdgePad,
    PadWithConcat,
    ReduceMaxAsPool,
    SumAsMean,
    PadAllAxes,
    SplitGroups,
    ShuffleToConv,
    LowerMatMul,
    ResizeToMatMul,
    GatherToSlice,
    IdsAsFloat,
    SliceRank,
    SplitSlice,
    TileToConcat,
    ExplicitBroadcast,
    FixShapes,
    ConvertOpset,
    FoldIf,
    Cut,
)
