"""onnx.int64_to_int32: int64 becomes int32 where op schemas allow it and values fit."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from edgeflow.rules.base import Status
from edgeflow.rules.onnx.casts import Int64ToInt32
from tests.rules.onnx.helpers import apply, model, run
from tests.rules.sites import outcomes, wheres

I64, I32, F = T.INT64, T.INT32, T.FLOAT
INT64_MAX = np.iinfo(np.int64).max


def int_types(m: onnx.ModelProto) -> dict[str, int]:
    """Element type of every int initializer, Constant and typed value, by name."""
    inferred = onnx.shape_inference.infer_shapes(m).graph
    out = {
        v.name: v.type.tensor_type.elem_type
        for v in (*inferred.value_info, *inferred.input, *inferred.output)
    }
    out.update({t.name: t.data_type for t in m.graph.initializer})
    return {k: v for k, v in out.items() if v in (I64, I32)}


@pytest.fixture
def indexing() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Gather", ["x", "idx"], ["g"], axis=1, name="pick"),
        helper.make_node("Slice", ["g", "starts", "ends", "axes"], ["s"], name="tail"),
        helper.make_node("Reshape", ["s", "flat"], ["r"], name="flatten"),
        # positions: Range(0, n, 1) -> 5 - pos -> reversed columns
        helper.make_node("Range", ["zero", "six", "one"], ["pos"], name="range"),
        helper.make_node("Sub", ["five", "pos"], ["rev"], name="reverse"),
        helper.make_node("Gather", ["x", "rev"], ["xr"], axis=1, name="flip"),
        # the batch size from Shape: int64 by definition
        helper.make_node("Shape", ["x"], ["sh"], name="shape"),
        helper.make_node("Gather", ["sh", "zero"], ["b"], name="batch"),
        # an index computed from float data: no bound on its values
        helper.make_node("Cast", ["x"], ["xi"], to=I64, name="to_int"),
        helper.make_node("Relu", ["xi"], ["xr2"], name="relu_int"),
        helper.make_node("Gather", ["x", "xr2"], ["xg"], axis=1, name="data_index"),
        helper.make_node("ArgMax", ["x"], ["am"], axis=1, name="argmax"),
    ]
    inits = {
        "idx": np.array([0, 2, 5]),
        "starts": np.array([1]),
        "ends": np.array([INT64_MAX]),
        "axes": np.array([1]),
        "flat": np.array([-1]),
        "zero": np.array(0),
        "six": np.array(6),
        "one": np.array(1),
        "five": np.array(5),
    }
    outputs = [
        ("r", F, [4]),
        ("xr", F, [2, 6]),
        ("b", I64, []),
        ("xg", F, [2, 2, 6]),
        ("am", I64, [2, 1]),
    ]
    return model(nodes, [("x", F, [2, 6])], outputs, inits)


def test_indices_and_index_math_become_int32(indexing: onnx.ModelProto) -> None:
    result = apply(Int64ToInt32, indexing, [])
    types = int_types(result.model)
    for name in ("idx", "starts", "ends", "axes", "zero", "six", "one", "five", "pos", "rev"):
        assert types[name] == I32, name
    for name in ("flat", "sh", "b", "xi", "xr2", "am"):
        assert types[name] == I64, name
    ends = numpy_helper.to_array(
        next(t for t in result.model.graph.initializer if t.name == "ends")
    )
    assert ends.tolist() == [2**31 - 1]  # Slice clamps ends to the dim anyway
    assert result.matches == 2 + 9  # values, constant uses
    assert outcomes(result)[0] == ("changed", "")
    assert sorted(wheres(result, Status.KEPT)) == ["am", "b, sh", "flat", "xi, xr2"]
    # flat: Reshape's shape input; b, sh: Shape's output; xi: unbounded; am: ArgMax's output
    x = {"x": np.linspace(-1, 4, 12, dtype=np.float32).reshape(2, 6)}
    for got, want in zip(run(result.model, x), run(indexing, x), strict=True):
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype


def test_a_shared_constant_gets_an_int32_copy() -> None:
    """'k' is Reshape's shape (int64 only) and Gather's indices (int32 allowed)."""
    nodes = [
        helper.make_node("Reshape", ["x", "k"], ["r"]),
        helper.make_node("Gather", ["x", "k"], ["g"]),
    ]
    m = model(nodes, [("x", F, [4])], [("r", F, [4]), ("g", F, [1])], {"k": np.array([-1])})
    result = apply(Int64ToInt32, m)
    inits = {t.name: t.data_type for t in result.model.graph.initializer}
    assert inits == {"k": I64, "k_int32": I32}
    assert list(result.model.graph.node[1].input) == ["x", "k_int32"]
    x = {"x": np.arange(4, dtype=np.float32)}
    for got, want in zip(run(result.model, x), run(m, x), strict=True):
        np.testing.assert_array_equal(got, want)


def test_values_that_do_not_fit_stay_int64() -> None:
    nodes = [
        helper.make_node("Add", ["i", "big"], ["s"]),
        helper.make_node("Sub", ["s", "big"], ["d"]),
        helper.make_node("Gather", ["x", "d"], ["y"]),
    ]
    inits = {"i": np.array([0, 1]), "big": np.array(2**40)}
    m = model(nodes, [("x", F, [3])], [("y", F, [2])], inits)
    result = apply(Int64ToInt32, m)
    assert not result.changed
    assert outcomes(result) == [("kept", "big, d, i, s")]  # 'big' holds values outside int32


def test_interface_int64_stays_unless_io_int32() -> None:
    nodes = [
        helper.make_node("Add", ["ids", "offset"], ["shifted"]),
        helper.make_node("Gather", ["table", "shifted"], ["y"]),
    ]
    inits = {"offset": np.array(1), "table": np.arange(10, dtype=np.float32)}
    m = model(nodes, [("ids", I64, [3])], [("y", F, [3])], inits)
    kept = apply(Int64ToInt32, m)
    assert not kept.changed and outcomes(kept) == [("kept", "ids, offset, shifted")]  # io: keep
    # io: int32 promises int32-range ids: 'shifted' may then reach 2**31, one past int32.
    assert outcomes(apply(Int64ToInt32, m, io="int32")) == [("kept", "ids, offset, shifted")]
    m.graph.node[0].input[1] = "zero"
    m.graph.initializer.append(numpy_helper.from_array(np.array(0), "zero"))
    narrowed = apply(Int64ToInt32, m, io="int32")
    assert narrowed.model.graph.input[0].type.tensor_type.elem_type == I32
    ids = np.array([0, 4, 9])
    got = run(narrowed.model, {"ids": ids.astype(np.int32)})[0]
    np.testing.assert_array_equal(got, run(m, {"ids": ids})[0])


def test_insert_casts_converts_shape_math_and_casts_back() -> None:
    nodes = [
        helper.make_node("Concat", ["a", "b"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape"),
    ]
    inits = {"a": np.array([2]), "b": np.array([-1])}
    m = model(nodes, [("x", F, [2, 3])], [("y", F, [2, 3])], inits)
    kept = apply(Int64ToInt32, m)
    assert not kept.changed
    assert outcomes(kept) == [("kept", "a, b, shape")]  # Reshape's shape must be int64
    cast = apply(Int64ToInt32, m, insert_casts=True)
    assert [n.op_type for n in cast.model.graph.node] == ["Concat", "Cast", "Reshape"]
    assert outcomes(cast) == [("changed", ""), ("changed", "reshape")]  # a Cast before it
    x = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    np.testing.assert_array_equal(run(cast.model, x)[0], run(m, x)[0])


def test_cast_and_constant_of_shape_make_int32(tmp_path) -> None:
    nodes = [
        helper.make_node("Cast", ["flag"], ["n"], to=I64),  # bool -> 0..1
        helper.make_node(
            "ConstantOfShape", ["two"], ["c"], value=numpy_helper.from_array(np.array([3]))
        ),
        helper.make_node("Add", ["n", "c"], ["i"]),
        helper.make_node("Gather", ["x", "i"], ["y"]),
    ]
    m = model(
        nodes, [("x", F, [5]), ("flag", T.BOOL, [2])], [("y", F, [2])], {"two": np.array([2])}
    )
    result = apply(Int64ToInt32, m, [])
    types = int_types(result.model)
    assert types["n"] == types["c"] == types["i"] == I32 and types["two"] == I64
    feeds = {"x": np.arange(5, dtype=np.float32), "flag": np.array([True, False])}
    np.testing.assert_array_equal(run(result.model, feeds)[0], run(m, feeds)[0])


def test_reduced_onnxruntime_build_needs_no_int64_kernels(
    indexing: onnx.ModelProto, tmp_path
) -> None:
    """convert_onnx_models_to_ort's type-reduced operator config lists the kernels a minimal
    build compiles (it folds Range/Sub away itself). After the rule, Slice needs only int32
    indices and Gather gains int32 (the data-dependent index keeps its int64 kernel)."""
    from edgeflow.schema.sections import Quantization
    from edgeflow.targets import load_profile
    from edgeflow.targets.base import ConvertJob
    from edgeflow.targets.onnxruntime_micro import backend as onnxruntime_micro

    profile = load_profile("onnxruntime_micro")
    configs = {}
    for label, m in (("before", indexing), ("after", apply(Int64ToInt32, indexing, []).model)):
        (tmp_path / label).mkdir()
        onnx.save(m, str(tmp_path / label / "m.onnx"))
        job = ConvertJob(
            tmp_path / label / "m.onnx", tmp_path / label, profile, Quantization(), [], None
        )
        onnxruntime_micro.convert(job)
        configs[label] = (tmp_path / label / onnxruntime_micro.OPS_CONFIG).read_text()
    before, after = configs["before"], configs["after"]
    assert 'Slice{"inputs": {"0": ["float"], "1": ["int64_t"]}}' in before
    assert 'Slice{"inputs": {"0": ["float"], "1": ["int32_t"]}}' in after
    assert 'Gather{"inputs": {"0": ["float"], "1": ["int64_t"]}}' in before
    assert 'Gather{"inputs": {"0": ["float"], "1": ["int32_t", "int64_t"]}}' in after


def test_declared_types_of_converted_constants_follow() -> None:
    """Exporters (torch's dynamo one) declare value_info for initializers too."""
    m = model(
        [helper.make_node("Gather", ["x", "idx"], ["y"])],
        [("x", F, [4])],
        [("y", F, [2])],
        {"idx": np.array([3, 0])},
    )
    m.graph.value_info.append(helper.make_tensor_value_info("idx", I64, [2]))
    result = apply(Int64ToInt32, m)
    assert result.model.graph.value_info[0].type.tensor_type.elem_type == I32
    x = {"x": np.arange(4, dtype=np.float32)}
    np.testing.assert_array_equal(run(result.model, x)[0], [3, 0])


def test_ops_without_an_int32_kernel_in_onnxruntime_keep_int64() -> None:
    """OneHot's schema allows int32 everywhere, onnxruntime 1.32 has no int32 kernel."""
    nodes = [helper.make_node("OneHot", ["idx", "depth", "values"], ["y"], name="onehot")]
    inits = {"idx": np.array([0, 2]), "depth": np.array(3), "values": np.array([0, 5])}
    m = model(nodes, [], [("y", I64, [2, 3])], inits)
    result = apply(Int64ToInt32, m, [], io="int32")
    assert not result.changed
    assert ("kept", "values") in outcomes(result)  # onnxruntime has no int32 OneHot
    np.testing.assert_array_equal(run(result.model, {})[0], [[5, 0, 0], [0, 0, 5]])
