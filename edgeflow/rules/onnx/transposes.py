"""onnx.cancel_transposes: push Transposes through layout-agnostic ops and cancel inverse pairs.

A channel-last model (Keras, Flax) exported to ONNX gets a Transpose before and after every
Conv: ONNX's Conv is channel-first, the model's tensors are not. jax2onnx leaves all of them
(16 in the Flax MobileNet demo); between two convolutions the pair NCHW->NHWC, elementwise
ops, NHWC->NCHW computes nothing. onnx2tf guesses each tensor's layout from its shape, and
where a tensor is square in the wrong way (1x16x16x16) it guesses wrong: the Flax MobileNet
converts to a .tflite at SQNR -5.7 dB (top-1 0.10), measured with onnx2tf 1.28.8.

onnxruntime's transpose optimizer does this job exactly: it moves Transposes through the ops
it knows to be layout-agnostic (elementwise, Conv with its weights, reductions with their
axes remapped, ...) and cancels inverse pairs. Run alone (every other onnxruntime
optimization disabled), it changes only where Transposes sit, leaves the computation as it
was (bit-exact on the demo) and writes only default-domain ops. The result is kept only when
it removes Transposes; otherwise the model is left as it was.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from edgeflow.core.onnxgraph import copy_model, op_counts
from edgeflow.rules.base import OnnxRule, RewriteContext, RuleOptions, RuleResult, Site

if TYPE_CHECKING:
    import onnx

# onnxruntime 1.32's graph transformers of level 1 (basic) other than its transpose
# optimizer; `disabled_optimizers` turns them off (unknown names are ignored).
OTHER_BASIC_OPTIMIZERS = (
    "Level1_RuleBasedTransformer",  # eliminations and fusions (Conv+BN, Relu+Clip, ...)
    "ConstantFolding",
    "ConstantSharing",
    "CommonSubexpressionElimination",
    "MatMulAddFusion",
    "ReshapeFusion",
    "FreeDimensionOverrideTransformer",
    "QDQPropagationTransformer",
    "EnsureUniqueDQForNodeUnitFusion",
    "QDQS8ToU8Transformer",
)


class CancelTransposes(OnnxRule):
    name = "onnx.cancel_transposes"
    description = (
        "Push Transposes through layout-agnostic ops and cancel inverse pairs "
        "(onnxruntime's transpose optimizer)."
    )
    runs_after: ClassVar[dict[str, str]] = {
        "onnx.channel_layernorm": "the LayerNorm2d's Transposes are channel_layernorm's to take",
    }

    class Options(RuleOptions):
        """No options: the transpose optimizer decides what moves."""

    example: ClassVar[tuple[str, str] | None] = (
        "Transpose(NCHW->NHWC) -> HardSwish -> Transpose(NHWC->NCHW) -> Conv",
        "HardSwish -> Conv",
    )

    def tolerance(self, opts: Any) -> float | None:
        return 1e-6  # moves data, not arithmetic

    def apply(
        self, model: onnx.ModelProto, opts: Options, ctx: RewriteContext
    ) -> RuleResult[onnx.ModelProto]:
        before = op_counts(model)["Transpose"]
        if before == 0:
            return RuleResult(copy_model(model), sites=[Site.not_applicable("no Transpose")])
        out = transposes_moved(model)
        after = op_counts(out)["Transpose"]
        if after >= before:
            nothing = Site.not_applicable(f"{before} Transpose(s), none cancels another")
            return RuleResult(copy_model(model), sites=[nothing])
        site = Site.changed("Transpose", f"{before} -> {after} nodes")
        return RuleResult(out, matches=before - after, sites=[site])


def transposes_moved(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model as onnxruntime's transpose optimizer (alone) leaves it, with the opset
    imports of the domains its nodes use."""
    import onnx
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.log_severity_level = 3
    with tempfile.TemporaryDirectory(prefix="edgeflow-transposes-") as tmp:
        path = Path(tmp) / "moved.onnx"
        options.optimized_model_filepath = str(path)
        ort.InferenceSession(
            model.SerializeToString(),
            options,
            providers=["CPUExecutionProvider"],
            disabled_optimizers=list(OTHER_BASIC_OPTIMIZERS),
        )
        out = onnx.load(str(path))
    used = {n.domain for n in out.graph.node} | {""}
    kept = [o for o in out.opset_import if o.domain in used or o.domain == "ai.onnx"]
    del out.opset_import[:]
    out.opset_import.extend(kept)
    return out
