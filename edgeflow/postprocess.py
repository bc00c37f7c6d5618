"""Host-side post-processing: the model's tail runs beside the artifact, not in it.

A detector's post-processing (box decoding, per-class top-k, NMS) is long, integer- and
bool-heavy code that some converters mis-lay or take an hour on, while the runtime on the
device's application processor can run it as it is. With `postprocess: {cut: [...]}` in the
recipe, rewrite_onnx splits the exported graph at those tensors: the part before them becomes
the target's artifact, the part after them (the tail) is written as postprocess.onnx with a
generated postprocess.py, a function that runs it with ONNX Runtime. The split is checked in
ONNX Runtime (tail after head equals the whole graph) and verify runs the artifact followed by
that same postprocess.py against the source model.
"""

from __future__ import annotations

import importlib.util
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeflow.core.errors import EdgeflowError

if TYPE_CHECKING:
    import onnx

HOST_MODEL = "postprocess.onnx"
HOST_CODE = "postprocess.py"


def split(model: onnx.ModelProto, cut: list[str]) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """(head, tail): the head computes the `cut` tensors from the model's inputs, the tail the
    model's outputs from the `cut` tensors alone."""
    import onnx

    from edgeflow.core.onnxgraph import constants_to_initializers, node_reads, tensor_types
    from edgeflow.rules.base import RewriteContext
    from edgeflow.rules.onnx.cut import Cut, needed_nodes

    try:
        head = Cut().apply(model, Cut.Options(outputs=cut), RewriteContext([])).model
    except EdgeflowError as exc:
        raise EdgeflowError(f"postprocess.cut: {exc.message}", exc.hint) from None
    graph = model.graph
    outputs = [o.name for o in graph.output]
    keep = needed_nodes(graph, outputs, frozenset(cut))
    nodes = [n for i, n in enumerate(graph.node) if i in keep]
    inputs = {v.name for v in graph.input} - {t.name for t in graph.initializer}
    produced = {o for n in nodes for o in n.output} | set(cut)
    reads = {r for n in nodes for r in node_reads(n)} | set(outputs)
    raw = sorted(r for r in reads if r in inputs and r not in produced)
    if raw:
        raise EdgeflowError(
            f"postprocess.cut {cut} does not separate the post-processing: it also reads the "
            f"model's input(s) {raw}",
            "cut at tensors that every path from the inputs to the outputs passes through",
        )
    types = tensor_types(model)
    tail_graph = onnx.helper.make_graph(
        nodes,
        f"{graph.name}_postprocess",
        [_value(name, types) for name in cut],
        list(graph.output),
        [t for t in graph.initializer if t.name in reads],
        value_info=[v for v in graph.value_info if v.name in produced - set(cut)],
    )
    tail = onnx.helper.make_model(tail_graph, opset_imports=list(model.opset_import))
    tail.ir_version = model.ir_version
    # The TorchScript exporter copies a constant at every use (ssdlite320's [27000] labels:
    # 301 copies, 65 MB of a 66 MB tail): one initializer per distinct value.
    constants_to_initializers(tail.graph, share=True)
    onnx.checker.check_model(tail)
    return head, tail


def _value(name: str, types: dict[str, Any]) -> Any:
    import onnx

    type_proto = types.get(name)
    if type_proto is None or not type_proto.tensor_type.HasField("shape"):
        raise EdgeflowError(f"cannot infer the type and shape of tensor '{name}' (postprocess.cut)")
    value = onnx.ValueInfoProto(name=name)
    value.type.CopyFrom(type_proto)
    return value


def check_split(
    model: onnx.ModelProto,
    head: onnx.ModelProto,
    tail: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
) -> None:
    """Run the whole model and head-then-tail in ONNX Runtime on `feeds`: the same kernels on
    the same values, so the outputs must be equal; raise when they are not."""
    whole = _session(model).run(None, feeds)
    middle = _session(head).run(None, feeds)
    names = [v.name for v in tail.graph.input]
    chained = _session(tail).run(None, dict(zip(names, middle, strict=True)))
    for name, a, b in zip([o.name for o in model.graph.output], whole, chained, strict=True):
        if a.shape != b.shape:
            how = f"shape {b.shape} instead of {a.shape}"
        elif not np.array_equal(a, b, equal_nan=a.dtype.kind == "f"):
            how = f"max diff {np.abs(a.astype(np.float64) - b.astype(np.float64)).max():.3g}"
        else:
            continue
        raise EdgeflowError(
            f"postprocess.cut: output '{name}' of head + tail differs from the whole graph ({how})",
            "cut at tensors the post-processing reads as a whole",
        )


def _session(model: onnx.ModelProto) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def summary(tail: onnx.ModelProto) -> dict[str, Any]:
    """What the host part is, for convert.json and the report."""
    ops = Counter(n.op_type for n in tail.graph.node)
    return {
        "inputs": [v.name for v in tail.graph.input],
        "outputs": [v.name for v in tail.graph.output],
        "nodes": len(tail.graph.node),
        "operators": dict(ops.most_common()),
        "runtime": "onnxruntime",
    }


def write_host(tail_path: Path, out_dir: Path, artifact: str) -> dict[str, Any]:
    """Copy the tail next to the artifact as postprocess.onnx and generate postprocess.py."""
    import onnx

    from edgeflow import __version__

    tail = onnx.load(str(tail_path))
    info = summary(tail)
    (out_dir / HOST_MODEL).write_bytes(tail_path.read_bytes())
    dtypes = [
        onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name
        for v in tail.graph.input
    ]
    shapes = [[d.dim_value or None for d in v.type.tensor_type.shape.dim] for v in tail.graph.input]
    (out_dir / HOST_CODE).write_text(
        _CODE.format(
            version=__version__,
            artifact=artifact,
            inputs=info["inputs"],
            dtypes=dtypes,
            shapes=shapes,
            outputs=info["outputs"],
            nodes=info["nodes"],
            names=", ".join(info["outputs"]),
        )
    )
    info["files"] = [HOST_MODEL, HOST_CODE]
    info["size_bytes"] = (out_dir / HOST_MODEL).stat().st_size
    return info


def load_host(artifact_dir: Path) -> Callable[..., list[np.ndarray]]:
    """The generated postprocess() function from an artifact folder (what a user ships)."""
    path = artifact_dir / HOST_CODE
    spec = importlib.util.spec_from_file_location(f"edgeflow_host_{abs(hash(path))}", path)
    if spec is None or spec.loader is None:
        raise EdgeflowError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.postprocess


class HostChained:
    """A runner followed by the host post-processing: outputs as the whole model's."""

    def __init__(self, runner: Any, postprocess: Callable[..., list[np.ndarray]]) -> None:
        self.runner = runner
        self.postprocess = postprocess
        self.host_ms: list[float] = []

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        middle = self.runner.run(feeds)
        start = time.perf_counter()
        outputs = self.postprocess(*middle)
        self.host_ms.append((time.perf_counter() - start) * 1000)
        return outputs

    def extra_metrics(self) -> dict[str, Any]:
        inner = getattr(self.runner, "extra_metrics", None)
        extra = dict(inner()) if inner else {}
        if self.host_ms:  # the first call loads the session: not counted
            extra["host_postprocess_ms_p50"] = float(np.median(self.host_ms[1:] or self.host_ms))
        return extra


_CODE = '''"""Host-side post-processing for {artifact}, generated by edgeflow {version}.

{artifact} ends at the tensors below; this function computes the model's outputs from them
on the host, with ONNX Runtime running postprocess.onnx ({nodes} nodes, beside this file).
Pass them in this order and in the ONNX graph's layout (SHAPES; a channel-last runtime's
outputs need transposing back). edgeflow verified {artifact} followed by this function against
the source model: see report.md and verify.json of the build.

    outputs = ...  # run {artifact} in its runtime, e.g. LiteRT's Interpreter
    {names} = postprocess(*outputs)

Needs: numpy, onnxruntime (pip install onnxruntime).
"""

from pathlib import Path

import numpy as np

ARTIFACT_OUTPUTS = {inputs!r}
DTYPES = {dtypes!r}
SHAPES = {shapes!r}  # None: any size
OUTPUTS = {outputs!r}
MODEL = Path(__file__).with_name("postprocess.onnx")
_session = None


def postprocess(*artifact_outputs):
    """The model's outputs ({names}) from the artifact's outputs."""
    global _session
    if len(artifact_outputs) != len(ARTIFACT_OUTPUTS):
        raise ValueError(
            f"expected {{len(ARTIFACT_OUTPUTS)}} artifact outputs {{ARTIFACT_OUTPUTS}}, "
            f"got {{len(artifact_outputs)}}"
        )
    if _session is None:
        import onnxruntime

        _session = onnxruntime.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
    feeds = {{}}
    for name, value, dtype, shape in zip(ARTIFACT_OUTPUTS, artifact_outputs, DTYPES, SHAPES):
        value = np.asarray(value, dtype=dtype)
        if len(value.shape) != len(shape) or any(
            want not in (None, got) for want, got in zip(shape, value.shape)
        ):
            raise ValueError(f"{{name}}: expected shape {{shape}}, got {{list(value.shape)}}")
        feeds[name] = value
    return _session.run(OUTPUTS, feeds)
'''
