"""A recipe's TensorFlow source: a Keras model (built by a function, or a .keras file) or a
SavedModel, loaded with TensorFlow, checked against the recipe's signature, run, and written
as the canonical SavedModel both conversion paths start from.

The canonical SavedModel has one `serving_default` signature: the recipe's fed inputs by
name with their declared static shapes and dtypes, and a dict of the recipe's outputs (or
the model's own output names) in their order. TensorFlow's TFLite converter (the native
path) and tf2onnx (the ONNX path) both read it, so both convert exactly what was verified
as the reference. TensorFlow is imported here only, inside a stage's worker process.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeflow.core import savedmodel
from edgeflow.core.errors import EdgeflowError, MissingDependency, first_line
from edgeflow.core.refs import ImportRef, user_frame
from edgeflow.schema.signatures import fed_inputs

if TYPE_CHECKING:
    from edgeflow.schema.sections import TensorSpec
    from edgeflow.schema.source import TensorFlowSource

SIGNATURE = "serving_default"
LOOPS = "serving_loops"  # a Keras model's recurrent layers as loops (save_canonical)


def require(module: str = "tensorflow") -> ModuleType:
    """TensorFlow (or Keras), or how to install it: it comes with the tflite extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependency("source kind tensorflow", "tensorflow", "tflite") from exc


@dataclass
class TfModel:
    """The loaded source: a Keras model, or a SavedModel's serving function."""

    what: str  # for messages: the file or the builder
    keras: Any  # the keras.Model, or None for a SavedModel
    function: Any  # a SavedModel's signature function (keyword inputs -> dict), or None
    input_names: list[str]  # the model's own input names, in its order
    input_shapes: dict[str, tuple[int | None, ...]]
    input_dtypes: dict[str, str]
    output_names: list[str]  # the model's own output names, in its order
    owner: Any = None  # what keeps a SavedModel function's variables alive
    # the outputs' shapes as the model declares them (None: a dynamic dim), by name
    output_shapes: dict[str, tuple[int | None, ...]] = field(default_factory=dict)

    def call(self, tensors: dict[str, Any]) -> list[Any]:
        """The model's outputs (tensors) for inputs by name, in output order."""
        if self.function is not None:
            found = self.function(**tensors)
            return [found[name] for name in self.output_names]
        model = self.keras
        args = [tensors[name] for name in self.input_names]
        outputs = model(args[0] if len(args) == 1 else args, training=False)
        if isinstance(outputs, dict):
            return [outputs[name] for name in self.output_names]
        return list(outputs) if isinstance(outputs, list | tuple) else [outputs]


def load(source: TensorFlowSource) -> TfModel:
    """The source model, its weights loaded; a problem of the user's model is an
    EdgeflowError that names it (a SavedModel with ops that reach outside it:
    savedmodel.GraphOpsRefused, before TensorFlow runs anything of it)."""
    model = source.model
    if isinstance(model, ImportRef):
        require()
        keras = require("keras")
        what = f"{Path(model.module).name}:{model.attr}" if model.is_file else str(model)
        return _keras_model(_built(model, source.init, keras), what, source.weights, keras)
    return load_file(Path(model), source.weights, source.allow_graph_ops)


def load_file(
    path: Path, weights: Path | None = None, allow_graph_ops: list[str] | None = None
) -> TfModel:
    """A SavedModel folder (its graph checked for ops that reach outside the model before
    TensorFlow loads it) or a .keras / .h5 file, `weights` loaded into the Keras model."""
    if path.is_dir():
        savedmodel.check(path, allow_graph_ops or [])  # its graph runs when it loads
    tf = require()
    keras = require("keras")
    if path.is_dir():
        return _saved_model(path, tf)
    try:
        built = keras.saving.load_model(str(path), compile=False)
    except Exception as exc:  # Keras raises ValueError, TypeError, OSError...
        raise EdgeflowError(
            f"Keras cannot load {path.name}: {type(exc).__name__}: {first_line(exc)}",
            "save the model with model.save('model.keras'); a model with custom layers needs "
            "a 'module:function' that builds it",
        ) from exc
    return _keras_model(built, path.name, weights, keras)


def _built(ref: ImportRef, init: dict[str, Any], keras: Any) -> Any:
    function = ref.load()
    if not callable(function):
        raise EdgeflowError(
            f"{ref} is a {type(function).__name__}, not a function",
            "name a function that builds and returns the keras.Model",
        )
    try:
        return function(**init)
    except TypeError as exc:
        raise EdgeflowError(
            f"cannot call {ref}({', '.join(init)}): {exc}", "fix source.init"
        ) from exc
    except EdgeflowError:
        raise
    except Exception as exc:  # the user's builder: their error, said as such
        raise EdgeflowError(
            f"{ref}({', '.join(init)}) raised {type(exc).__name__}: {first_line(exc)} "
            f"({user_frame(exc)})",
            "run the function in Python with source.init's arguments to reproduce it",
        ) from exc


def from_keras(model: Any, what: str = "the Keras model") -> TfModel:
    """A Keras model built in this process, as a source (its weights as they are)."""
    return _keras_model(model, what, None, require("keras"))


def _keras_model(model: Any, what: str, weights: Path | None, keras: Any) -> TfModel:
    if not isinstance(model, keras.Model):
        raise EdgeflowError(
            f"{what} gave a {type(model).__name__}, not a keras.Model",
            "return a Keras model (keras.Model, keras.Sequential) from the function",
        )
    try:
        tensors = model.inputs
    except (AttributeError, ValueError):  # a subclassed or unbuilt Sequential model
        tensors = None
    if not tensors:
        raise EdgeflowError(
            f"{what}: the Keras model has no defined inputs (a subclassed model, or a "
            "Sequential model without an Input)",
            "build it with the functional API, or start the Sequential model with "
            "keras.Input(shape, name=...)",
        )
    if weights is not None:
        try:
            model.load_weights(str(weights))
        except Exception as exc:
            raise EdgeflowError(
                f"weights {weights.name} do not fit {what}: {type(exc).__name__}: "
                f"{first_line(exc)}",
                "save them with model.save_weights('name.weights.h5') from this architecture "
                "(check source.init)",
            ) from exc
    names = [str(t.name) for t in tensors]
    outputs = list(getattr(model, "output_names", None) or [])
    if len(outputs) != len(model.outputs):
        outputs = [f"output_{i}" for i in range(len(model.outputs))]
    return TfModel(
        what=what,
        keras=model,
        function=None,
        input_names=names,
        input_shapes={n: tuple(t.shape) for n, t in zip(names, tensors, strict=True)},
        input_dtypes={n: str(t.dtype) for n, t in zip(names, tensors, strict=True)},
        output_names=outputs,
        output_shapes={n: tuple(t.shape) for n, t in zip(outputs, model.outputs, strict=True)},
    )


def _saved_model(path: Path, tf: Any) -> TfModel:
    try:
        loaded = tf.saved_model.load(str(path))
    except Exception as exc:
        raise EdgeflowError(
            f"TensorFlow cannot load the SavedModel {path.name}: {type(exc).__name__}: "
            f"{first_line(exc)}",
            "save it again with tf.saved_model.save or model.export",
        ) from exc
    signatures = dict(loaded.signatures)
    if not signatures:
        raise EdgeflowError(
            f"the SavedModel {path.name} has no signatures: nothing says what its inputs are",
            "save it with model.export(path), or tf.saved_model.save(obj, path, "
            "signatures=fn.get_concrete_function(tf.TensorSpec(...)))",
        )
    key = SIGNATURE if SIGNATURE in signatures else sorted(signatures)[0]
    function = signatures[key]
    args, kwargs = function.structured_input_signature
    if args:
        raise AssertionError(f"signature {key} of {path.name} takes positional inputs")
    outputs = function.structured_outputs
    if not isinstance(outputs, dict):
        raise EdgeflowError(f"signature {key} of {path.name} does not return named outputs")
    names = list(kwargs)
    return TfModel(
        what=path.name,
        keras=None,
        function=function,
        input_names=names,
        input_shapes={n: tuple(kwargs[n].shape.as_list()) for n in names},
        input_dtypes={n: kwargs[n].dtype.name for n in names},
        output_names=list(outputs),
        owner=loaded,
        output_shapes={
            n: tuple(t.shape.as_list()) for n, t in outputs.items() if t.shape.rank is not None
        },
    )


def signature_problems(model: TfModel, specs: list[TensorSpec]) -> list[tuple[str, str, str]]:
    """The recipe's inputs against the model's: names, dtypes, ranks and fixed sizes, as
    (dotted recipe key, message, hint) for every problem."""
    from edgeflow.core.suggest import did_you_mean
    from edgeflow.schema.signatures import SHAPE_HINT, shape_clash

    problems = []
    declared = {s.name for s in specs}
    for i, spec in enumerate(specs):
        key = f"source.inputs[{i}]"
        if spec.name not in model.input_names:
            hint = did_you_mean(spec.name, model.input_names) or "name the inputs after the model's"
            have = ", ".join(model.input_names)
            problems.append(
                (
                    f"{key}.name",
                    f"{model.what} has no input '{spec.name}' (its inputs: {have})",
                    hint,
                )
            )
            continue
        dtype = model.input_dtypes[spec.name]
        if dtype != spec.dtype:
            problems.append(
                (
                    f"{key}.dtype",
                    f"'{spec.name}' is {dtype} in {model.what}, the recipe has {spec.dtype}",
                    f"set dtype: {dtype}",
                )
            )
        dims = [-1 if d is None else int(d) for d in model.input_shapes[spec.name]]
        clash = shape_clash(dims, spec)
        if clash:
            problems.append((f"{key}.shape", f"'{spec.name}': {clash} in {model.what}", SHAPE_HINT))
    for name in model.input_names:
        if name not in declared:
            problems.append(
                (
                    "source.inputs",
                    f"{model.what} has input '{name}' ({model.input_dtypes[name]} "
                    f"{list(model.input_shapes[name])}) that source.inputs does not declare",
                    f"add {{name: {name}, shape: [...], dtype: {model.input_dtypes[name]}}}",
                )
            )
    return problems


def output_names(model: TfModel, declared: list[str] | None) -> list[str]:
    """The names the build gives the outputs: the recipe's, else the model's own."""
    if declared is None:
        return list(model.output_names)
    if len(declared) != len(model.output_names):
        raise EdgeflowError(
            f"source.outputs names {len(declared)} outputs, {model.what} has "
            f"{len(model.output_names)} ({', '.join(model.output_names)})",
            "name each of the model's outputs, in its order",
        )
    return list(declared)


class TfRunner:
    """run(feeds) -> outputs in order, for the reference and the stream (every input fed:
    verify.runners.WithConstants adds the bound ones)."""

    def __init__(self, model: TfModel) -> None:
        self.tf = require()
        self.model = model
        # in graph mode, as Keras' own predict runs a model: eagerly, a recurrent layer runs
        # its steps one op at a time (sleepecg's two bidirectional GRUs over 960 epochs, 8
        # samples: 104 s of its 114 s tf_load)
        self._call = self.tf.function(model.call, reduce_retracing=True)

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        tensors = {k: self.tf.constant(v) for k, v in feeds.items()}
        return [np.asarray(t) for t in self._call(tensors)]


def save_canonical(model: TfModel, specs: list[TensorSpec], outputs: list[str], path: Path) -> None:
    """The SavedModel both paths convert: `serving_default` takes the fed inputs (declared
    static shapes; constants bound inside) and returns {output name: tensor}. A Keras model
    with GRU or LSTM layers also gets `serving_loops`, the same function with those layers as
    the loops of frameworks._keras_recurrent, which TensorFlow's TFLite converter (the native
    path) converts; tf2onnx converts `serving_default` (it has no conversion for the loops'
    XlaDynamicUpdateSlice)."""
    tf = require()
    constants = {s.name: s.constant() for s in specs if s.value is not None}
    fed = list(fed_inputs(specs))
    signature = [tf.TensorSpec(s.shape, tf.as_dtype(s.dtype), name=s.name) for s in fed]

    def serving() -> Any:
        def serve(*args: Any) -> dict[str, Any]:
            tensors = {s.name: a for s, a in zip(fed, args, strict=True)}
            tensors.update({k: tf.constant(v) for k, v in constants.items()})
            return dict(zip(outputs, model.call(tensors), strict=True))

        return serve

    if model.keras is not None:
        from edgeflow.frameworks._keras_recurrent import as_loops, replaceable

        keras = require("keras")
        archive = keras.export.ExportArchive()
        archive.track(model.keras)
        archive.add_endpoint(SIGNATURE, serving(), input_signature=signature)
        if replaceable(model.keras):
            loops = tf.function(serving(), input_signature=signature)
            with as_loops():  # traced now: the archive keeps this trace
                loops.get_concrete_function()
            archive.add_endpoint(LOOPS, loops)
        archive.write_out(str(path), verbose=False)
        return
    module = tf.Module()
    module.owner = model.owner  # the variables the function captures
    function = tf.function(serving(), input_signature=signature)
    tf.saved_model.save(module, str(path), signatures={SIGNATURE: function})


def signatures(path: Path) -> list[str]:
    """The signature keys of a SavedModel, read from its file (without loading the model)."""
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((path / "saved_model.pb").read_bytes())
    return [key for graph in proto.meta_graphs for key in graph.signature_def]


class SavedModelRunner:
    """The canonical SavedModel's serving function: run(feeds) -> outputs in order."""

    def __init__(self, path: Path, names: list[str], signature: str = SIGNATURE) -> None:
        self.tf = require()
        self.loaded = self.tf.saved_model.load(str(path))
        self.function = self.loaded.signatures[signature]
        self.names = names

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        found = self.function(**{k: self.tf.constant(v) for k, v in feeds.items()})
        return [np.asarray(found[name]) for name in self.names]
