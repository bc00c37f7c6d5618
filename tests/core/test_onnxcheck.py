"""The structural check of an ONNX file (core/onnxcheck through onnx_problems): each malformed
kind that onnxruntime refuses at load is named at validate, and files onnxruntime runs (old
IR, old and new opsets, subgraphs, contrib and ML ops, local functions) pass."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeflow.core.onnxcheck import graph_problems
from edgeflow.core.onnxfile import onnx_problems

F = TensorProto.FLOAT


def vi(name: str, shape: list[Any] | None = None, dtype: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, [1, 4] if shape is None else shape)


def w(name: str = "w") -> TensorProto:
    return numpy_helper.from_array(np.ones((1, 4), np.float32), name)


def build(nodes: list[onnx.NodeProto], **kw: Any) -> onnx.ModelProto:
    """x [1, 4] -> nodes -> y [1, 4], w a [1, 4] initializer; opset 17, IR 8 unless given."""
    graph = helper.make_graph(
        nodes,
        "g",
        kw.get("inputs", [vi("x")]),
        kw.get("outputs", [vi("y")]),
        kw.get("inits", [w()]),
    )
    opsets = [helper.make_opsetid("", kw.get("opset", 17)), *kw.get("extra", [])]
    model = helper.make_model(graph, opset_imports=opsets, functions=kw.get("functions", []))
    model.ir_version = kw.get("ir", 8)
    return model


def node(op: str, ins: list[str], outs: list[str], **kw: Any) -> onnx.NodeProto:
    return helper.make_node(op, ins, outs, **kw)


def problems(model: onnx.ModelProto, tmp_path: Path) -> list[str]:
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    return onnx_problems(path)


def function(name: str, body_op: str, domain: str = "local") -> onnx.FunctionProto:
    body = [node(body_op, ["a"], ["b"], domain=domain if body_op != "Relu" else "")]
    return helper.make_function(domain, name, ["a"], ["b"], body, [helper.make_opsetid("", 17),
                                helper.make_opsetid(domain, 1)])  # fmt: skip


LOCAL = [helper.make_opsetid("local", 1)]
ADD = node("Add", ["x", "w"], ["h"])


def nested_if(depth: int) -> bytes:
    """An If whose then_branch nests `depth` Ifs, as raw protobuf (too deep to build)."""

    def varint(n: int) -> bytes:
        out = b""
        while True:
            byte, n = n & 0x7F, n >> 7
            out += bytes([byte | (0x80 if n else 0)])
            if not n:
                return out

    def field(number: int, payload: bytes) -> bytes:
        return varint(number << 3 | 2) + varint(len(payload)) + payload

    graph = b""
    for _ in range(depth):
        attribute = field(1, b"then_branch") + varint(20 << 3) + varint(5) + field(6, graph)
        graph = field(1, field(1, b"c") + field(2, b"y") + field(4, b"If") + field(5, attribute))
    return build([node("Relu", ["x"], ["y"])]).SerializeToString() + field(7, graph)


MALFORMED = {
    "cyclic": (
        build([ADD, node("Add", ["h", "z"], ["y2"]), node("Relu", ["y2"], ["z"]),
               node("Relu", ["z"], ["y"])]),
        "the graph has a cycle: no order runs node 1 (Add -> 'y2'), node 2 (Relu -> 'z'), "
        "node 3 (Relu -> 'y') (each waits on another)",
    ),
    "self_loop": (
        build([node("Add", ["x", "y"], ["y"], name="loop")]),
        "the graph has a cycle: no order runs node 'loop' (Add)",
    ),
    "unknown_domain": (
        build([node("Frob", ["x"], ["y"], domain="com.example")],
              extra=[helper.make_opsetid("com.example", 1)]),
        "node 0 (Frob -> 'y'): com.example:Frob is no ONNX op, no onnxruntime op and no local "
        "function of the model",
    ),
    "undeclared_domain": (
        build([node("Frob", ["x"], ["y"], domain="org.nowhere")]),
        "node 0 (Frob -> 'y'): its domain 'org.nowhere' has no opset import (org.nowhere:Frob)",
    ),
    "unknown_op": (
        build([node("NoSuchOp", ["x"], ["y"])]),
        "node 0 (NoSuchOp -> 'y'): ai.onnx:NoSuchOp is no op of opset 17 of 'ai.onnx'",
    ),
    "op_newer_than_opset": (
        build([node("Gelu", ["x"], ["y"])], opset=17),
        "ai.onnx:Gelu is no op of opset 17 of 'ai.onnx'",
    ),
    "absent_producer": (
        build([node("Add", ["x", "nowhere"], ["y"], name="a")]),
        "nothing produces 'nowhere' (node 'a' (Add))",
    ),
    "wrong_tensor_type": (
        build([node("Add", ["x", "w"], ["y"], name="a")],
              inputs=[vi("x", dtype=TensorProto.STRING)]),
        "node 'a' (Add): its input 'x' is tensor(string); Add's A takes tensor(bfloat16), "
        "tensor(double), tensor(float)",
    ),
    "ir_99": (build([node("Relu", ["x"], ["y"])], ir=99), "its IR version 99 is newer than"),
    "opset_99": (build([node("Relu", ["x"], ["y"])], opset=99), "it imports opset 99 of 'ai.onnx'"),
    "empty_graph": (build([], inputs=[], outputs=[], inits=[]), "the graph has no outputs"),
    "duplicate_outputs": (
        build([node("Relu", ["x"], ["y"], name="r"), node("Sigmoid", ["x"], ["y"], name="s")]),
        "node 's' (Sigmoid): writes 'y', which node 'r' (Relu) writes too",
    ),
    "writes_an_input": (
        build([node("Relu", ["x"], ["w"], name="r"), node("Add", ["x", "w"], ["y"])]),
        "node 'r' (Relu): writes 'w', a graph input or initializer",
    ),
    "output_not_produced": (
        build([node("Relu", ["x"], ["h"])]),
        "nothing produces the graph output 'y'",
    ),
    "recursive_function": (
        build([node("F", ["x"], ["y"], domain="local")], functions=[function("F", "F")],
              extra=LOCAL),
        "local function 'local:F' calls itself (recursion, which ONNX does not allow)",
    ),
    "mutually_recursive_functions": (
        build([node("F", ["x"], ["y"], domain="local")],
              functions=[function("F", "G"), function("G", "F")], extra=LOCAL),
        "local function 'local:G' calls itself",
    ),
    "subgraph_absent_name": (
        build([node("If", ["c"], ["y"], name="if",
                    then_branch=helper.make_graph([node("Relu", ["ghost"], ["t"])], "t", [],
                                                  [vi("t")]),
                    else_branch=helper.make_graph([node("Relu", ["x"], ["e"])], "e", [],
                                                  [vi("e")]))],
              inputs=[vi("x"), vi("c", [], TensorProto.BOOL)]),
        "node 'if' (If) then_branch: nothing produces 'ghost' (node 0 (Relu -> 't'))",
    ),
}  # fmt: skip
MALFORMED["no_default_import"] = (
    helper.make_model(
        helper.make_graph([node("Relu", ["x"], ["y"])], "g", [vi("x")], [vi("y")]),
        opset_imports=[helper.make_opsetid("ai.onnx.ml", 3)],
        ir_version=8,
    ),
    "node 0 (Relu -> 'y'): its domain 'ai.onnx' has no opset import (ai.onnx:Relu)",
)


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_each_malformed_graph_is_named(kind: str, tmp_path: Path) -> None:
    model, says = MALFORMED[kind]
    found = problems(model, tmp_path)
    assert any(says in p for p in found), found
    assert refused(model)


def refused(model: onnx.ModelProto) -> bool:
    """Whether onnxruntime refuses to load the model, or onnx's checker (which rewrite_onnx
    runs) refuses it: onnxruntime runs a node of an unimported known domain at its newest."""
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:  # onnxruntime's errors are untyped
        return True
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError:
        return True
    return False


def test_a_nested_if_bomb_is_refused_without_recursion(tmp_path: Path) -> None:
    (tmp_path / "m.onnx").write_bytes(nested_if(300))
    found = onnx_problems(tmp_path / "m.onnx")
    assert len(found) == 1 and "m.onnx" not in found[0], found  # the caller names the file
    assert "does not parse" in found[0] or "nest deeper than" in found[0], found


def test_many_problems_are_listed_then_counted(tmp_path: Path) -> None:
    nodes = [node("Add", ["x", f"ghost{i}"], [f"h{i}"]) for i in range(12)]
    found = problems(build([*nodes, node("Relu", ["x"], ["y"])]), tmp_path)
    assert len(found) == 9 and found[-1] == "and 4 more problems", found


def loop_body() -> onnx.GraphProto:
    """i, cond, acc -> cond, acc + w (w from the outer scope)."""
    return helper.make_graph(
        [node("Identity", ["cond"], ["cond_out"]), node("Add", ["acc", "w"], ["acc_out"])],
        "body",
        [vi("i", [], TensorProto.INT64), vi("cond", [], TensorProto.BOOL), vi("acc")],
        [vi("cond_out", [], TensorProto.BOOL), vi("acc_out")],
    )


def branch(name: str, op: str) -> onnx.GraphProto:
    return helper.make_graph([node(op, ["h"], [name])], name, [], [vi(name)])


VALID = {
    "ir3_initializer_not_an_input_opset9": build([node("Add", ["x", "w"], ["y"])], ir=3, opset=9),
    "initializer_also_an_input": build([node("Add", ["x", "w"], ["y"])], inputs=[vi("x"), vi("w")]),
    "opset7": build([node("Add", ["x", "w"], ["y"])], ir=3, opset=7),
    "opset23": build([node("Add", ["x", "w"], ["y"])], ir=10, opset=23),
    "newest": build([node("Add", ["x", "w"], ["y"])], ir=onnx.IR_VERSION,
                    opset=onnx.defs.onnx_opset_version()),
    "if_with_outer_names": build(
        [ADD, node("If", ["c"], ["y"], then_branch=branch("t", "Relu"),
                   else_branch=branch("e", "Sigmoid"))],
        inputs=[vi("x"), vi("c", [], TensorProto.BOOL)]),
    "loop": build(
        [node("Loop", ["n", "", "x"], ["y"], body=loop_body())],
        inputs=[vi("x"), vi("n", [], TensorProto.INT64)]),
    "com_microsoft": build(
        [node("FusedMatMul", ["x", "t"], ["m"], domain="com.microsoft", transB=1),
         node("Gelu", ["m"], ["g"], domain="com.microsoft"),
         node("Slice", ["g", "s", "e"], ["y"])],
        inits=[numpy_helper.from_array(np.ones((4, 4), np.float32), "t"),
               numpy_helper.from_array(np.array([0], np.int64), "s"),
               numpy_helper.from_array(np.array([4], np.int64), "e")],
        extra=[helper.make_opsetid("com.microsoft", 1)]),
    "ai_onnx_ml": build(
        [node("Normalizer", ["x"], ["y"], domain="ai.onnx.ml", norm="L2")],
        extra=[helper.make_opsetid("ai.onnx.ml", 3)]),
    "optional_empty_inputs": build(
        [node("Clip", ["x", "", "hi"], ["y"])],
        inits=[numpy_helper.from_array(np.array(1.0, np.float32), "hi")]),
    "local_function": build(
        [node("F", ["x"], ["y"], domain="local")], functions=[function("F", "Relu")],
        extra=LOCAL),
    "node_named_like_an_output_of_if_branch": build(
        [node("If", ["c"], ["y"], then_branch=branch("y_t", "Relu"),
              else_branch=branch("y_e", "Relu")), node("Relu", ["x"], ["h"])],
        inputs=[vi("x"), vi("c", [], TensorProto.BOOL)]),
}  # fmt: skip


@pytest.mark.parametrize("kind", list(VALID))
def test_a_model_onnxruntime_runs_passes(kind: str, tmp_path: Path) -> None:
    model = VALID[kind]
    assert problems(model, tmp_path) == []
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {
        i.name: np.ones([1, 4], np.float32)
        if i.type == "tensor(float)"
        else np.array(True if i.type == "tensor(bool)" else 3)
        for i in session.get_inputs()
    }
    (y,) = session.run(None, feeds)
    assert y.shape == (1, 4)


def test_external_data_beyond_the_address_space_is_refused_at_validate_too(
    tmp_path: Path,
) -> None:
    """validate said ok and precheck refused (MemoryError); now both ask the same question."""
    tensor = TensorProto(name="big", data_type=F, dims=[2**31], data_location=1)
    for key, value in (("location", "w.bin"), ("length", str(2**33))):
        tensor.external_data.add(key=key, value=value)
    model = build([node("Add", ["x", "w"], ["y"])], inits=[w(), tensor])
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    with open(tmp_path / "w.bin", "wb") as f:
        f.truncate(2**33)
    code = (
        "import resource, pathlib\n"
        "resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))\n"
        "from edgeflow.core.onnxfile import onnx_problems\n"
        "print(onnx_problems(pathlib.Path('m.onnx')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )  # fmt: skip
    needed = 2**33 + (tmp_path / "m.onnx").stat().st_size
    assert (
        f"its weights ({needed:,} bytes with its external data)" in done.stdout
        and "do not fit in this process's address-space limit (ulimit -v) (6,442,450,944 bytes)"
        in done.stdout
    ), done.stdout
    if resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY:
        import psutil

        fits = psutil.virtual_memory().total >= needed
        assert (onnx_problems(tmp_path / "m.onnx") == []) == fits


def test_every_model_of_onnx_s_own_node_tests_passes() -> None:
    """onnx's backend test models (1,884 with onnx 1.23: every op, Loop, If, Scan, sequences,
    optional inputs, functions, ML and training ops) are well formed: none is refused."""
    import warnings

    from onnx.backend.test.case import node as cases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy, in onnx's expected outputs
        models = [(c.name, c.model) for c in cases.collect_testcases(None) if c.model is not None]
    assert len(models) > 1000
    refused = {name: graph_problems(model) for name, model in models if graph_problems(model)}
    assert refused == {}
