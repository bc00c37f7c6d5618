"""targets._tflite_unroll: the WHILE loops of a converted .tflite unrolled in the file, for a
runtime with no WHILE (Arm NN 22): the same outputs, bit for bit, in one subgraph, each weight
stored once; a loop whose step count depends on data left as it is."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests import needs

needs.require("tensorflow")

from edgeflow.targets import emitted  # noqa: E402
from edgeflow.targets._tflite_unroll import unroll  # noqa: E402


def convert(function: object, specs: list[object]) -> bytes:
    import tensorflow as tf

    concrete = tf.function(function).get_concrete_function(*specs)
    return bytes(tf.lite.TFLiteConverter.from_concrete_functions([concrete], function).convert())


def outputs(model: bytes, feeds: list[np.ndarray]) -> list[np.ndarray]:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=model)
    interpreter.allocate_tensors()
    for detail, value in zip(interpreter.get_input_details(), feeds, strict=True):
        interpreter.set_tensor(detail["index"], value)
    interpreter.invoke()
    return [interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()]


def recurrent(op: str, directions: int, hidden: int = 8, features: int = 5) -> object:
    from edgeflow.frameworks.tf_recurrent import Recurrent

    gates = 4 if op == "LSTM" else 3
    rng = np.random.default_rng(0)

    def weights(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.5).astype(np.float32)

    return Recurrent(
        op=op,
        w=weights(directions, gates * hidden, features),
        r=weights(directions, gates * hidden, hidden),
        b=weights(directions, 2 * gates * hidden),
        p=None,
        backwards=(False, True)[:directions],
        linear_before_reset=op == "GRU",
        biased=False,
    )


@pytest.mark.parametrize(("op", "directions"), [("GRU", 2), ("LSTM", 1), ("LSTM", 2)])
def test_the_unrolled_file_computes_what_the_loops_do(
    op: str, directions: int, tmp_path: Path
) -> None:
    import tensorflow as tf

    from edgeflow.frameworks.tf_recurrent import looped

    node = recurrent(op, directions)
    steps, batch = 30, 2

    def layer(x: object, h: object) -> object:
        initial = [h[d] for d in range(directions)]
        y, y_h, _ = looped(node, x, initial, initial if op == "LSTM" else None)
        return y, y_h

    specs = [tf.TensorSpec([steps, batch, 5]), tf.TensorSpec([directions, batch, 8])]
    model = convert(layer, specs)
    unrolled, count = unroll(model, "tflite", biased=True)
    assert count == directions
    (tmp_path / "looped.tflite").write_bytes(model)
    (tmp_path / "unrolled.tflite").write_bytes(unrolled)
    ops = emitted.counts(tmp_path / "unrolled.tflite", "tflite")
    assert ops["LOGISTIC"] == steps * directions * (2 if op == "GRU" else 3)
    names = emitted.operators(tmp_path / "unrolled.tflite", "tflite")
    for gone in ("WHILE", "LESS", "DYNAMIC_UPDATE_SLICE", "SLICE", "PACK"):
        assert gone not in names  # nor the codes only the loop used
    # each weight once: what is added (Arm NN's zero biases, the SPLITs' axis) is less than
    # one recurrent weight matrix, where a copy per step would add 30 of each
    looped_bytes = emitted.constant_bytes(tmp_path / "looped.tflite", "tflite")
    added = emitted.constant_bytes(tmp_path / "unrolled.tflite", "tflite") - looped_bytes
    assert 0 <= added < node.r[0].nbytes
    rng = np.random.default_rng(1)
    feeds = [rng.standard_normal(s.shape).astype(np.float32) for s in specs]
    for got, want in zip(outputs(unrolled, feeds), outputs(model, feeds), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_loop_whose_steps_depend_on_data_stays_a_loop() -> None:
    import tensorflow as tf

    def halve(x: object) -> object:
        return tf.while_loop(lambda v: tf.reduce_max(v) > 1.0, lambda v: [v * 0.5], [x])[0]

    model = convert(halve, [tf.TensorSpec([4])])
    same, count = unroll(model, "tflite", biased=True)
    assert count == 0 and same == model
