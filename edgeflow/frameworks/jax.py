"""JAX sources: a function returning (apply_fn, params), run in JAX and exported to ONNX.

`source.model` names a function (`pkg.module:name` or `path/file.py:name`, resolved by
edgeflow.core.refs.ImportRef) that returns `(apply_fn, params)`, where
`apply_fn(params, *inputs)` returns an array or a pytree (tuple, list, dict) of arrays, e.g.
a Flax module's `apply` in inference mode and its variables. Outputs are taken in
`jax.tree_util.tree_leaves` order (dicts by sorted key), the order the exported graph has.
jax2onnx traces the function with the params bound as constants; 64-bit types stay off, so
the graph is float32 wherever JAX computes in float32.
"""

from __future__ import annotations

import importlib
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from edgeflow.core.errors import EdgeflowError, MissingDependency
from edgeflow.core.refs import ImportRef, user_frame

# Import name -> pip package, for "install it" messages.
PACKAGES = {"jax": "jax", "jaxlib": "jaxlib", "jax2onnx": "jax2onnx", "flax": "flax"}
RETURNS = "return (apply_fn, params), where apply_fn(params, *inputs) computes the outputs"


def require(module: str, what: str = "source.kind jax") -> ModuleType:
    """Import an optional tool, or say how to install it (the `jax` extra)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing = (exc.name or module).split(".")[0]
        raise MissingDependency(what, PACKAGES.get(missing, missing), "jax") from exc


@dataclass
class JaxModel:
    """A loaded JAX source: `apply_fn(params, *inputs)` and its params."""

    ref: str
    apply_fn: Callable[..., Any]
    params: Any
    _jitted: Callable[..., Any] | None = field(default=None, repr=False)

    def bound(self) -> Callable[..., Any]:
        """The function of the inputs alone, the params closed over (constants when traced)."""
        apply_fn, params = self.apply_fn, self.params
        return lambda *inputs: apply_fn(params, *inputs)


def load_source(source: Any) -> JaxModel:
    """A recipe's jax source: its function called with `init`, its `weights` restored."""
    model = load(source.model, None, source.init)
    return model if source.weights is None else with_weights(model, source.weights)


def load(
    ref: str | ImportRef, base: Path | None, init: Mapping[str, Any] | None = None
) -> JaxModel:
    """Import `ref` (a string: a file path relative to `base`, the recipe's folder, or the
    working directory; an ImportRef the recipe already resolved and checked), call it with
    `init` as keyword arguments and check that it returned (apply_fn, params)."""
    require("jax")
    if isinstance(ref, ImportRef):
        target = ref
    else:
        try:
            target = ImportRef.parse(ref, base if base is not None else Path.cwd())
            target.check()
        except ValueError as exc:
            raise EdgeflowError(
                f"source.model: {exc}",
                getattr(exc, "hint", None)
                or "name a function that returns (apply_fn, params): 'pkg.module:function' or "
                "'path/file.py:function'",
            ) from exc
    builder = target.load()
    if not callable(builder):
        raise EdgeflowError(
            f"source.model: {target} is a {type(builder).__name__}, not a function",
            f"point it at a function that takes no required arguments and {RETURNS}",
        )
    kwargs = dict(init or {})
    try:
        result = builder(**kwargs)
    except ModuleNotFoundError as exc:
        raise EdgeflowError(
            f"source.model: {target} imports '{exc.name}', which is not installed",
            f"install the package that provides '{exc.name}' in this environment",
        ) from exc
    except TypeError as exc:
        raise EdgeflowError(
            f"source.model: cannot call {target}({', '.join(kwargs)}): {exc}",
            "give the function's arguments as the recipe's keyword arguments",
        ) from exc
    except EdgeflowError:
        raise
    except Exception as exc:  # the user's function: their error, located
        raise EdgeflowError(
            f"source.model: {target}() raised {type(exc).__name__}: {exc} ({user_frame(exc)})",
            "call the function in Python to reproduce it",
        ) from exc
    if not isinstance(result, tuple | list) or len(result) != 2 or not callable(result[0]):
        got = type(result).__name__
        if isinstance(result, tuple | list):
            got = f"a {got} of {len(result)}: " + ", ".join(type(r).__name__ for r in result)
        raise EdgeflowError(
            f"source.model: {target}() returned {got}, not (apply_fn, params)",
            f"make it {RETURNS}; for Flax: return module.apply, variables",
        )
    return JaxModel(str(target), result[0], result[1])


def with_weights(model: JaxModel, path: Path) -> JaxModel:
    """The model with its params restored from a flax.serialization (msgpack) file, into the
    structure the function returned (source.weights, as a PyTorch state_dict is loaded)."""
    serialization = require("flax.serialization", "source.weights of a jax source")
    try:
        params = serialization.from_bytes(model.params, path.read_bytes())
    except (ValueError, KeyError, TypeError) as exc:
        raise EdgeflowError(
            f"weights {path.name} do not fit the params {model.ref} returns: {exc}",
            "write them with flax.serialization.to_bytes(params) from this function's params "
            "(check source.init)",
        ) from exc
    return JaxModel(model.ref, model.apply_fn, params)


def version() -> str:
    """The framework versions a reference was computed with."""
    jax = require("jax")
    return f"jax {jax.__version__}"


def parameter_count(model: JaxModel) -> int:
    import jax

    return int(sum(np.size(leaf) for leaf in jax.tree_util.tree_leaves(model.params)))


class JaxRunner:
    """run(feeds) -> outputs in order, for the reference and the stream: `names` the
    function's inputs in its order (verify.runners.WithConstants adds the bound ones)."""

    def __init__(self, model: JaxModel, names: list[str]) -> None:
        self.model, self.names = model, names

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return run(self.model, feeds, self.names)


def _outputs(result: Any) -> list[np.ndarray]:
    """The leaves of a pytree of outputs (the exporter's order), as float32 NumPy arrays."""
    import jax

    leaves = jax.tree_util.tree_leaves(result)
    if not leaves:
        raise EdgeflowError(
            f"the JAX model returned {type(result).__name__}, which holds no arrays",
            "return an array or a tuple/dict of arrays from apply_fn",
        )
    return [np.asarray(leaf).astype(np.float32, copy=False) for leaf in leaves]


def run(model: JaxModel, feeds: dict[str, np.ndarray], input_names: list[str]) -> list[np.ndarray]:
    """The model's outputs on `feeds`, fed in the order of `input_names`, as float32."""
    import jax

    if model._jitted is None:
        model._jitted = jax.jit(model.bound())
    args = [feeds[name] for name in input_names]
    with jax.enable_x64(False):
        try:
            result = model._jitted(*args)
        except Exception as exc:  # the user's model code: say so, not "a bug in edgeflow"
            shapes = ", ".join(
                f"{n} {list(a.shape)}" for n, a in zip(input_names, args, strict=True)
            )
            raise EdgeflowError(
                f"the JAX model {model.ref} raised {type(exc).__name__} on inputs ({shapes}): "
                f"{str(exc).splitlines()[0] if str(exc) else ''}",
                "call apply_fn(params, *inputs) on inputs of the declared source.inputs shapes "
                "in Python to reproduce it",
            ) from exc
    return _outputs(result)


def export_onnx(
    model: JaxModel,
    inputs: Sequence[tuple[str, Sequence[int], str]],
    output_names: list[str],
    opset: int,
    out: Path,
) -> dict[str, Any]:
    """Export with jax2onnx to the single file `out`: graph inputs exactly the given names and
    static shapes, outputs exactly `output_names` in order, float32; returns the export info
    (converter versions, opset, seconds, op counts)."""
    import jax

    jax2onnx = require("jax2onnx")
    import onnx

    names = [name for name, _, _ in inputs]
    for name, shape, _ in inputs:
        if not all(isinstance(d, int) and d >= 1 for d in shape):
            raise EdgeflowError(
                f"source.inputs: {name}: a JAX export needs static shapes (got {list(shape)})",
                "give every dimension as a positive integer",
            )
    specs = [jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype)) for _, shape, dtype in inputs]
    with jax.enable_x64(False):
        leaves = jax.eval_shape(model.bound(), *specs)
        count = len(jax.tree_util.tree_leaves(leaves))
        if count != len(output_names):
            raise EdgeflowError(
                f"source.outputs: {model.ref} returns {count} output(s), {len(output_names)} "
                f"declared ({', '.join(output_names)})",
                "declare one output name per array apply_fn returns (dicts in sorted key order)",
            )
        start = time.perf_counter()
        try:
            proto = jax2onnx.to_onnx(
                model.bound(),
                specs,
                model_name=out.stem,
                opset=opset,
                enable_double_precision=False,
                input_names=names,
                output_names=output_names,
            )
        except (NotImplementedError, TypeError, ValueError) as exc:
            raise EdgeflowError(
                f"jax2onnx cannot export {model.ref}: {type(exc).__name__}: "
                f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}",
                "replace the JAX primitive or call it names in apply_fn (jax2onnx patches "
                "some Flax functions while tracing: call them with keyword arguments)",
            ) from exc
        seconds = time.perf_counter() - start
    if proto.functions:  # plain operators for the ONNX pipeline's rules and targets
        from onnx import inliner

        proto = inliner.inline_local_functions(proto)
    _set_names(proto.graph, names, output_names)
    _check_float32(proto, model.ref)
    proto = _checked(proto, model.ref, opset)
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(proto, str(out), save_as_external_data=False)
    converter = f"jax2onnx {metadata.version('jax2onnx')} / jax {jax.__version__}"
    ops = Counter(node.op_type for node in proto.graph.node)
    return {
        "converter": converter,
        "opset": opset,
        "seconds": round(seconds, 3),
        "ops": dict(sorted(ops.items())),
    }


def _set_names(graph: Any, inputs: list[str], outputs: list[str]) -> None:
    """Rename the graph's inputs and outputs to the declared names where the exporter chose
    others (every use of a renamed value follows)."""
    initializers = {t.name for t in graph.initializer}
    graph_inputs = [v for v in graph.input if v.name not in initializers]
    if len(graph_inputs) != len(inputs) or len(graph.output) != len(outputs):
        raise EdgeflowError(
            f"jax2onnx wrote {len(graph_inputs)} input(s) and {len(graph.output)} output(s), "
            f"{len(inputs)} and {len(outputs)} declared",
            "check source.inputs and source.outputs against apply_fn's arguments and results",
        )
    renames = {
        v.name: new
        for v, new in zip([*graph_inputs, *graph.output], [*inputs, *outputs], strict=True)
        if v.name != new
    }
    if not renames:
        return
    for value in [*graph_inputs, *graph.output, *graph.value_info]:
        value.name = renames.get(value.name, value.name)
    for node in graph.node:
        node.input[:] = [renames.get(n, n) for n in node.input]
        node.output[:] = [renames.get(n, n) for n in node.output]


def _checked(proto: Any, ref: str, opset: int) -> Any:
    """The model with its intermediate shapes inferred afresh, checked by onnx.checker.

    jax2onnx 0.17.1 annotates some values with their channel-last shape after it transposed
    them to channel-first for Conv (onnx's shape inference then fails: "Inferred shape and
    existing shape differ"), and writes ReduceMean with its opset-18 axes input whatever
    opset is asked for."""
    import onnx

    del proto.graph.value_info[:]
    try:
        proto = onnx.shape_inference.infer_shapes(proto, strict_mode=True, data_prop=True)
        onnx.checker.check_model(proto, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        hint = "export at opset 18 or later" if opset < 18 else "try another opset"
        raise EdgeflowError(
            f"jax2onnx wrote an invalid ONNX model for {ref} at opset {opset}: "
            f"{str(exc).strip().splitlines()[0]}",
            hint,
        ) from exc
    return proto


def _check_float32(proto: Any, ref: str) -> None:
    """Refuse a graph with float64 inputs, outputs or weights (the edge runtimes lack them)."""
    from onnx import TensorProto

    double = TensorProto.DOUBLE
    values = [*proto.graph.input, *proto.graph.output]
    bad = [v.name for v in values if v.type.tensor_type.elem_type == double]
    bad += [t.name for t in proto.graph.initializer if t.data_type == double]
    if bad:
        raise EdgeflowError(
            f"the ONNX export of {ref} has float64 tensors: {', '.join(bad[:5])}",
            "compute in float32 (jax_enable_x64 off; cast float64 params with .astype)",
        )
