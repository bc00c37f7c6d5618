"""Every onnx.* rule on a small exported transformer block: valid, idempotent, same outputs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from edgeflow.core.onnxsession import as_declared
from edgeflow.rules.onnx import RULES
from tests.rules.onnx.helpers import apply, run, specs

FLOAT = onnx.TensorProto.FLOAT
OPTIONS = {
    "onnx.convert_opset": {"opset": 19},
    "onnx.cut": {"outputs": ["/ln/LayerNormalization_output_0"]},
}


def test_catalogue_entries_are_complete() -> None:
    assert [r.name for r in RULES] == [
        "onnx.cast_float64_to_float32",
        "onnx.int64_to_int32",
        "onnx.optimize",
        "onnx.simplify",
        "onnx.fold_constants",
        "onnx.cancel_transposes",
        "onnx.equalize_channels",
        "onnx.channel_layernorm",
        "onnx.decompose",
        "onnx.unroll_loop",
        "onnx.unroll_recurrent",
        "onnx.sqrt_newton",
        "onnx.multiplicative_mask",
        "onnx.maxpool_edge_pad",
        "onnx.pad_with_concat",
        "onnx.reduce_max_as_pool",
        "onnx.sum_as_mean",
        "onnx.pad_all_axes",
        "onnx.split_groups",
        "onnx.shuffle_to_conv",
        "onnx.lower_matmul",
        "onnx.resize_to_matmul",
        "onnx.gather_to_slice",
        "onnx.ids_as_float",
        "onnx.slice_rank",
        "onnx.split_slice",
        "onnx.tile_to_concat",
        "onnx.explicit_broadcast",
        "onnx.fix_shapes",
        "onnx.convert_opset",
        "onnx.fold_if",
        "onnx.cut",
    ]
    for rule in RULES:
        assert rule.description and "\n" not in rule.description and rule.example
        assert rule.Options.__doc__ or not rule.Options.model_fields


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_rule_on_an_exported_block(rule: type, block: onnx.ModelProto) -> None:
    options = OPTIONS.get(rule.name, {})
    result = apply(rule, block, **options)  # checker, idempotence, input untouched
    feeds = {"ids": np.random.default_rng(0).integers(0, 50, (2, 7))}
    if rule.name == "onnx.cut":
        assert [o.name for o in result.model.graph.output] == options["outputs"]
        return
    tolerance = rule().tolerance(rule.Options.model_validate(options))
    if tolerance is None:  # verify judges the rule's numbers; on this block, float rounding
        tolerance = 1e-5
    declared = {v.name: v.type.tensor_type.elem_type for v in result.model.graph.input}
    fed = {
        k: as_declared(v, "tensor(float)") if declared[k] == FLOAT else v for k, v in feeds.items()
    }
    want, got = run(block, feeds)[0], run(result.model, fed)[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=tolerance)
    # the interface stays what the recipe feeds, but where a rule feeds the ids as float
    fed_as = "float32" if rule.name == "onnx.ids_as_float" else "int64"
    assert specs(result.model)[0].dtype == fed_as
