"""The TensorFlow forms of ONNX LSTM and GRU (edgeflow.frameworks.tf_recurrent), unrolled and
looped, compute what onnxruntime's kernels compute: every direction, initial states,
peepholes, both GRU reset forms; Y, Y_h and Y_c."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tests.rules.onnx.helpers import feeds, run, specs
from tests.rules.onnx.test_recurrent import recurrent
from tests.targets.conftest import needs_tflite

pytestmark = needs_tflite

CASES = [
    ("LSTM", "forward", {}),
    ("LSTM", "reverse", {"initial": True}),
    ("LSTM", "bidirectional", {"initial": True, "peepholes": True}),
    ("GRU", "forward", {"linear_before_reset": 1}),
    ("GRU", "bidirectional", {"initial": True, "linear_before_reset": 0}),
    ("GRU", "reverse", {"linear_before_reset": 1, "initial": True}),
]


@pytest.mark.parametrize(
    ("form", "biased"),
    [("unrolled", True), ("looped", False)],
    ids=["unrolled, armnn's biases", "looped, zero biases left out"],
)
@pytest.mark.parametrize(("op", "direction", "options"), CASES)
def test_the_steps_match_onnxruntime(
    op: str, direction: str, options: dict, form: str, biased: bool
) -> None:
    import tensorflow as tf

    from edgeflow.frameworks import tf_recurrent
    from edgeflow.frameworks.tf_recurrent import Recurrent

    m = recurrent(op, direction, **options)
    node = m.graph.node[0]
    weights = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    backwards = {"forward": (False,), "reverse": (True,), "bidirectional": (False, True)}
    spec = Recurrent(
        op,
        weights["W"],
        weights["R"],
        weights["B"],
        weights.get("P"),
        backwards[direction],
        bool(attrs.get("linear_before_reset", 0)),
        biased,
    )
    for seed in range(2):
        inputs = feeds(specs(m), seed=seed, scale=1.0)
        want = dict(zip([o.name for o in m.graph.output], run(m, inputs), strict=True))
        states = [
            None if name not in inputs else tf.unstack(tf.constant(inputs[name]))
            for name in ("h0", "c0")
        ]
        y, y_h, y_c = getattr(tf_recurrent, form)(spec, tf.constant(inputs["x"]), *states)
        got = {"Y": y, "Y_h": y_h, "Y_c": y_c}
        for name, value in want.items():
            np.testing.assert_allclose(got[name].numpy(), value, atol=2e-6, err_msg=name)


def test_a_zero_bias_is_kept_for_arm_nn() -> None:
    """TensorFlow's converter drops an all-zero bias, and Arm NN 22 rejects a
    FULLY_CONNECTED without one: the smallest normal float32 instead."""
    from edgeflow.frameworks.tf_recurrent import kept_bias

    assert kept_bias(np.zeros(3, np.float32)).tolist() == [np.finfo(np.float32).tiny] * 3
    assert kept_bias(np.array([0.0, 1.0], np.float32)).tolist() == [0.0, 1.0]


@pytest.mark.parametrize("count", [1, 7, 10, 127, 400])
def test_the_steps_are_split_by_splits_of_at_most_ten_outputs(count: int) -> None:
    """`split` gives what one tf.split would, in order, from SPLITs of at most 10 outputs
    (127 steps, with no divisor up to 10, are cut 120 + 7 first)."""
    import tensorflow as tf

    from edgeflow.frameworks.tf_recurrent import split

    x = np.arange(count * 2 * 3, dtype=np.float32).reshape(count * 2, 3)  # 2 rows per step
    graph = (
        tf.function(lambda t: split(t, count))
        .get_concrete_function(tf.TensorSpec(x.shape, tf.float32))
        .graph
    )
    fans = [op.get_attr("num_split") for op in graph.get_operations() if op.type == "Split"]
    assert all(n <= 10 for n in fans) and (count == 1 or fans)
    parts = [p.numpy() for p in split(tf.constant(x), count)]
    assert len(parts) == count
    for got, want in zip(parts, np.split(x, count), strict=True):
        assert np.array_equal(got, want)
