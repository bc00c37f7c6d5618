"""How the recipe's tensors map onto a .tflite's: each input's and output's position and
axis permutation (`io_layout`), found from the shapes onnx2tf wrote and, where a shape fits
several layouts, by a float32 probe against onnxruntime. The runners apply it
(edgeflow.targets._tflite_io); the native TensorFlow path uses the orders alone."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import numpy as np

from edgeflow.core.errors import EdgeflowError
from edgeflow.targets._onnx2tf_copy import scope_safe
from edgeflow.targets._tflite_deps import require
from edgeflow.targets._tflite_io import CStderr
from edgeflow.targets.base import channel_last


def inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argsort(perm))


def io_layout(
    onnx_path: Path, artifact: Path, float32: Path, target: str, kept: tuple[str, ...] = ()
) -> dict[str, Any]:
    """How the recipe's NCHW tensors map onto the artifact's: position and permutation.

    Inputs: channel-last for rank 3-5, as onnx2tf does, except the `kept` ones (onnx2tf's
    keep_shape_absolutely_input_names: a channel-last source's), taken as declared; onnx2tf
    leaves some inputs as declared by its own choice, which a shape that is not symmetric
    shows. Outputs: the artifact's shape decides between the ONNX layout and channel-last (or,
    where neither fits, any permutation of the axes that does). Where a shape fits several
    (e.g. 1x4x4x4), a probe with the float32 .tflite against onnxruntime on one random input
    decides, for inputs and outputs together.
    """
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    litert = require("ai_edge_litert.interpreter", target)
    interp = litert.Interpreter(model_path=str(artifact))
    in_details, out_details = interp.get_input_details(), interp.get_output_details()
    weights = {t.name for t in graph.initializer}  # old IR versions list them as inputs
    onnx_in = {i.name: _dims(i) for i in graph.input if i.name not in weights}
    onnx_out = [(o.name, _dims(o)) for o in graph.output]
    if len(in_details) != len(onnx_in) or len(out_details) != len(onnx_out):
        raise EdgeflowError(
            f"the .tflite has {len(in_details)} inputs and {len(out_details)} outputs, "
            f"the ONNX model {len(onnx_in)} and {len(onnx_out)}"
        )
    inputs = []
    for pos, name in enumerate(input_order(list(onnx_in), in_details)):
        dims = onnx_in[name]
        identity = tuple(range(len(dims)))
        shape = tuple(int(d) for d in in_details[pos]["shape"])
        usual = identity if name in kept else channel_last(len(dims))
        fits = [
            list(p)
            for p in dict.fromkeys((usual, identity))  # onnx2tf's usual layout first
            if tuple(dims[i] for i in p) == shape
        ]
        if not fits:
            raise EdgeflowError(f"input '{name}': .tflite shape {shape} vs ONNX {dims}")
        inputs.append({"name": name, "index": pos, "perm": fits[0], "candidates": fits})
    order = output_order(interp, out_details, [name for name, _ in onnx_out])
    outputs = []
    for k, (name, dims) in enumerate(onnx_out):
        pos = order[k]
        shape = tuple(int(d) for d in out_details[pos]["shape"])
        if not dims and shape == (
            1,
        ):  # a 0-D output written as [1] (TfliteRuntime.rank0_outputs false)
            outputs.append({"name": name, "index": pos, "perm": [0], "candidates": [[0]]})
            continue
        if len(shape) != len(dims):
            raise EdgeflowError(f"output '{name}': .tflite shape {shape} vs ONNX {dims}")
        identity, to_nchw = tuple(range(len(dims))), inverse(channel_last(len(dims)))
        fits = [
            list(p)
            for p in dict.fromkeys((identity, to_nchw))  # distinct, in this order
            if tuple(shape[i] for i in p) == tuple(dims)
        ]
        if not fits:  # onnx2tf moved other axes (a [layers, batch, hidden] state): any
            # permutation that gives the ONNX shape, the probe choosing among several
            fits = [
                list(p)
                for p in itertools.permutations(range(len(dims)))
                if tuple(shape[i] for i in p) == tuple(dims)
            ]
        if not fits:
            raise EdgeflowError(f"output '{name}': .tflite shape {shape} vs ONNX {dims}")
        outputs.append({"name": name, "index": pos, "perm": fits[0], "candidates": fits})
    layout: dict[str, Any] = {"inputs": inputs, "outputs": outputs}
    if any(len(spec["candidates"]) > 1 for spec in (*inputs, *outputs)):
        layout["ambiguous_layout"] = _probe(onnx_path, float32, inputs, outputs, target)
    for spec in (*inputs, *outputs):
        del spec["candidates"]
    return layout


def _dims(value: Any) -> tuple[int, ...]:
    return tuple(d.dim_value for d in value.type.tensor_type.shape.dim)


def input_order(onnx_names: list[str], details: list[dict[str, Any]]) -> list[str]:
    """The ONNX input name at each .tflite input position (by name, else by position)."""

    def plain(name: str) -> str:
        # TensorFlow's converter names a signature's inputs after its key
        for key in ("serving_default_", "serving_loops_"):  # frameworks.tensorflow's
            name = name.removeprefix(key)
        name = name.rsplit(":", 1)[0]
        return name.removeprefix("wa/")

    wanted = {plain(scope_safe(n)).lstrip("/"): n for n in onnx_names}
    found = [wanted.get(plain(d["name"]).lstrip("/")) for d in details]
    if None in found or len(set(found)) != len(found):
        return onnx_names  # onnx2tf keeps the ONNX input order
    return [n for n in found if n is not None]


def output_order(interp: Any, details: list[dict[str, Any]], names: list[str]) -> list[int]:
    """The .tflite output position of each ONNX output (`names`): by the signature's output
    keys where it has one (the ONNX names, as TensorFlow's converter writes them from the
    SavedModel, or 'output_K'), else by position (onnx2tf's own files have no signature and
    keep the ONNX order)."""
    signatures = interp._get_full_signature_list()
    if signatures:
        outputs = next(iter(signatures.values()))["outputs"]
        by_tensor = {d["index"]: pos for pos, d in enumerate(details)}
        positional = {
            int(m.group(1)): key for key in outputs if (m := re.fullmatch(r"output_(\d+)", key))
        }
        keys = [positional.get(k) for k in range(len(details))]
        if set(outputs) == set(names):
            keys = list(names)
        found = [by_tensor.get(outputs[k]) if k is not None else None for k in keys]
        if None not in found and len(set(found)) == len(details):
            return [int(p) for p in found if p is not None]
    return list(range(len(details)))


# At most this many combinations of the ambiguous inputs' layouts are tried by the probe.
PROBED_INPUT_LAYOUTS = 64


def _probe(
    onnx_path: Path,
    float32: Path,
    inputs: list[dict[str, Any]],
    outputs: list[dict[str, Any]],
    target: str,
) -> str:
    """Choose the permutation of shape-ambiguous inputs and outputs by comparing real
    numbers; returns how it was decided (the float32 .tflite may not run, e.g. with a Flex
    op: then onnx2tf's usual layouts, channel-last, are assumed and verify's comparison
    will tell)."""
    try:
        choice, errors = _probe_errors(onnx_path, float32, inputs, outputs, target)
    except Exception as exc:  # any failure to run the probe leaves the usual layout
        for spec in outputs:
            spec["perm"] = spec["candidates"][-1]
        return f"assumed channel-last: the float32 probe failed ({str(exc).splitlines()[0]})"
    for spec, perm in zip(inputs, choice, strict=True):
        spec["perm"] = perm
    for spec, diffs in zip(outputs, errors, strict=True):
        spec["perm"] = spec["candidates"][int(np.argmin(diffs))]
    return "float32 probe against onnxruntime"


def _probe_errors(
    onnx_path: Path,
    float32: Path,
    inputs: list[dict[str, Any]],
    outputs: list[dict[str, Any]],
    target: str,
) -> tuple[list[list[int]], list[list[float]]]:
    """The inputs' permutations that bring the outputs closest to onnxruntime's, and, with
    them, each output's max abs diff under each of its candidate permutations."""
    from edgeflow.core.onnxsession import checking_session

    litert = require("ai_edge_litert.interpreter", target)
    session = checking_session(onnx_path)
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.random(i.shape, dtype=np.float32) for i in session.get_inputs()}
    reference = session.run(None, feeds)
    interp = litert.Interpreter(model_path=str(float32))
    err = CStderr()
    with err:
        interp.allocate_tensors()
    in_details, out_details = interp.get_input_details(), interp.get_output_details()
    combos = itertools.islice(
        itertools.product(*(spec["candidates"] for spec in inputs)), PROBED_INPUT_LAYOUTS
    )
    best: tuple[float, list[list[int]], list[list[float]]] | None = None
    for combo in combos:
        for spec, perm in zip(inputs, combo, strict=True):
            data = feeds[spec["name"]].transpose(perm)
            interp.set_tensor(in_details[spec["index"]]["index"], np.ascontiguousarray(data))
        interp.invoke()
        errors = []
        for k, spec in enumerate(outputs):
            got = interp.get_tensor(out_details[spec["index"]]["index"])
            diffs = [
                float(np.abs(got.transpose(p) - reference[k]).max()) for p in spec["candidates"]
            ]
            errors.append([d if np.isfinite(d) else np.inf for d in diffs])
        score = float(sum(min(diffs) for diffs in errors))
        if best is None or score < best[0]:
            best = (score, list(combo), errors)
    assert best is not None  # product() of non-empty candidate lists yields at least one
    return best[1], best[2]
