"""The copy of an ONNX model that onnx2tf converts: changed only where onnx2tf would fail on
the original, computing the same values with the same inputs and output order (the names
it gives inputs are `tf_name`'s, which the calibration files and io_layout use)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from edgeflow.core.errors import EdgeflowError

# The names TensorFlow takes for ops; onnx2tf names each output's op after the tensor.
TF_OP_NAME = re.compile(r"[A-Za-z0-9.][A-Za-z0-9_.\\/>-]*")
# What TensorFlow refuses in a scope name (onnx2tf opens one per node, named after the node
# or its output): ':' onnx2tf itself writes '__' (as here); '@' (Paddle), spaces, '#', ...
NOT_IN_SCOPE = re.compile(r"[^A-Za-z0-9_.\\/>-]")
OP_NAME_START = re.compile(r"[A-Za-z0-9./]")


def prepare(onnx_path: Path, copy: Path, rank1_outputs: bool = False) -> None:
    """Copy the model for onnx2tf, changed where onnx2tf would fail on it (or, with
    `rank1_outputs`, the runtime: see `_rank1_outputs`); the graph computes the same values,
    with the same output order.

    - Constant nodes become initializers: onnx2tf moves initializers to channel-last with the
      tensors they meet, but not a Constant node's value (`images - mean` with mean a
      [1, 3, 1, 1] Constant fails: "Dimensions must be equal, but are 320 and 3").
    - Outputs whose names TensorFlow refuses as op names (an internal tensor such as
      `/head/Concat_output_0`, after onnx.cut or postprocess.cut) are renamed
      `edgeflow_output_K` behind an Identity ("Generation of saved_model failed because the
      OP name does not match the following pattern").
    - Node and intermediate tensor names with characters TensorFlow refuses in a scope name
      (Paddle's `softmax_0.tmp_0@...`: "'...' is not a valid scope name") have them replaced
      (`_scope_safe_names`); an input's is `scope_safe(name)`, which the calibration files
      and `io_layout` map back to the name the recipe declares.
    - A ConvTranspose without `kernel_shape` (optional in ONNX: the weight's shape says it)
      gets it from its constant weight: onnx2tf 1.28.8 reads the kernel's rank from that
      attribute alone and fails without it ("axes don't match array"; torch's exports set it).
    - An LSTM or GRU initial state of zeros (torch exports it as an Expand of a 0 to a shape
      taken from the input) is left out, which ONNX defines as zeros: the recurrent layers
      (_onnx2tf_recurrent) then start from no state.
    """
    import onnx
    from onnx import helper

    from edgeflow.core.onnxgraph import constants_to_initializers

    model = onnx.load(str(onnx_path))
    graph = model.graph
    renamed = [k for k, o in enumerate(graph.output) if not TF_OP_NAME.fullmatch(o.name)]
    hoisted = constants_to_initializers(graph)
    shaped = _kernel_shapes(graph)
    shaped += _drop_zero_states(model)
    shaped += _rank1_outputs(graph) if rank1_outputs else 0
    for k in renamed:
        output = graph.output[k]
        graph.node.append(helper.make_node("Identity", [output.name], [f"edgeflow_output_{k}"]))
        output.name = f"edgeflow_output_{k}"
    if not (_scope_safe_names(model) or hoisted or renamed or shaped):
        shutil.copyfile(onnx_path, copy)
        return
    onnx.save(model, str(copy))


def _rank1_outputs(graph: Any) -> int:
    """Give every 0-D graph output the shape [1] (a Reshape behind it, under its name);
    returns how many. Arm NN has no 0-D tensor: its parser refuses the model at load
    ("Tensor numDimensions must be greater than 0"), as it did PLCMOS's score, which the
    model squeezes to 0-D. Verify reads a 0-D output of a one-sample batch as that sample's
    value, so [1] compares the same."""
    import numpy as np
    from onnx import helper, numpy_helper

    produced = {o for node in graph.node for o in node.output}
    changed = 0
    for output in graph.output:
        dims = output.type.tensor_type.shape.dim
        scalar = output.type.tensor_type.HasField("shape") and len(dims) == 0
        if not scalar or output.name not in produced:  # (an input passed through: as it is)
            continue
        inner = f"{output.name}_0d"
        for node in graph.node:
            node.output[:] = [inner if o == output.name else o for o in node.output]
            node.input[:] = [inner if i == output.name else i for i in node.input]
        shape = f"{output.name}_shape"
        graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64), shape))
        graph.node.append(helper.make_node("Reshape", [inner, shape], [output.name]))
        dims.add().dim_value = 1
        changed += 1
    return changed


def _drop_zero_states(model: Any) -> int:
    """LSTM/GRU initial states (inputs 5 and 6) that are zeros by construction, left out;
    what only they read removed. Returns how many were left out."""
    from onnx import numpy_helper

    from edgeflow.core.onnxgraph import is_zero
    from edgeflow.rules.onnx.fold_if import _remove_dead_code

    graph = model.graph
    constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    dropped = 0
    for node in graph.node:
        if node.op_type in ("LSTM", "GRU"):
            for i in (5, 6):
                name = node.input[i] if i < len(node.input) else ""
                if name and is_zero(name, constants, producers):
                    node.input[i] = ""
                    dropped += 1
    if dropped:
        _remove_dead_code(model)
    return dropped


def scope_safe(name: str) -> str:
    """A name TensorFlow takes for a scope and an op: ':' as '__' (as onnx2tf writes it), any
    other character it refuses as '_', and an 'n' before a first character an op name cannot
    start with ('@x' -> 'n_x'; onnx2tf itself turns a leading '/' into 'wa/'). Other names
    come out as onnx2tf names them."""
    safe = NOT_IN_SCOPE.sub("_", name.replace(":", "__"))
    return safe if not safe or OP_NAME_START.match(safe) else f"n{safe}"


def _scope_safe_names(model: Any) -> int:
    """Rename the nodes and tensors whose names hold characters TensorFlow refuses in a
    scope name, in every graph; returns how many. Graph inputs become `scope_safe(name)` (so
    calibration files and the .tflite's input names can be matched to the recipe's by that
    function); other tensors and nodes the same, made unique. The graph's outputs keep their
    names (`_prepare` put those TensorFlow refuses behind an Identity already)."""
    from edgeflow.core.onnxgraph import all_graphs, graph_names

    taken = graph_names(model.graph)
    graph = model.graph
    inputs = {
        v.name: scope_safe(v.name)
        for v in graph.input
        if scope_safe(v.name) != v.name.replace(":", "__")
    }
    clash = sorted(n for n, new in inputs.items() if new in taken)
    if clash or len(set(inputs.values())) != len(inputs):
        raise EdgeflowError(
            f"onnx2tf cannot take the input name(s) {clash or sorted(inputs)}, and their "
            "TensorFlow-safe forms clash with other names in the graph",
            "rename the model's inputs to letters, digits and _ . / -",
        )
    taken.update(inputs.values())

    def fresh(name: str) -> str:
        base = scope_safe(name)
        new, i = base, 0
        while new in taken:
            i += 1
            new = f"{base}_{i}"
        taken.add(new)
        return new

    values: set[str] = set()
    for g in all_graphs(graph):
        values.update(v.name for v in (*g.input, *g.output, *g.value_info, *g.initializer))
        values.update(n for node in g.node for n in (*node.input, *node.output))
    kept = set(inputs) | {v.name for v in graph.output}
    mapping = {n: fresh(n) for n in sorted(values - kept) if NOT_IN_SCOPE.search(n)}
    mapping.update(inputs)
    count = len(mapping)
    for g in all_graphs(graph):
        for node in g.node:
            node.input[:] = [mapping.get(n, n) for n in node.input]
            node.output[:] = [mapping.get(n, n) for n in node.output]
            if NOT_IN_SCOPE.search(node.name):
                node.name, count = fresh(node.name), count + 1
        for item in (*g.input, *g.output, *g.value_info, *g.initializer):
            item.name = mapping.get(item.name, item.name)
    return count


def _kernel_shapes(graph: Any) -> int:
    """Set `kernel_shape` on the ConvTranspose nodes that lack it, from their constant
    weights ([C_in, C_out / group, k1, k2, ...]); returns how many nodes changed."""
    from onnx import helper

    dims = {t.name: list(t.dims) for t in graph.initializer}
    changed = 0
    for node in graph.node:
        weight = dims.get(node.input[1]) if len(node.input) > 1 else None
        named = {a.name for a in node.attribute}
        if node.op_type == "ConvTranspose" and "kernel_shape" not in named and weight:
            node.attribute.append(helper.make_attribute("kernel_shape", weight[2:]))
            changed += 1
    return changed


def tf_name(name: str) -> str:
    """onnx2tf's own name for an input in the SavedModel and the calibration files: as
    `_prepare` made it scope-safe (':' -> '__', other refused characters '_'), and a leading
    '/' as 'wa/' (int8 mode)."""
    name = scope_safe(name)
    return "wa/" + name[1:] if name.startswith("/") else name
