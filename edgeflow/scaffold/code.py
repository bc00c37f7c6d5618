"""`edgeflow init`, what it reads from a model in code: `file.py:Name` or `pkg.module:Name`.

A torch.nn.Module class (or a function that returns a module), a function returning
`(apply_fn, params)` (JAX), or one returning a Keras model. The inputs are the forward's (or
apply_fn's) parameters by name; code does not say their shapes, so each comes from `--input`
(a missing one is an error carrying shapes guessed from the first layer that ran the model);
the outputs come from one run on zeros, named by a returned dict's keys or by the variables
of the function's `return a, b`.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from edgeflow.core.errors import EdgeflowError, first_line
from edgeflow.core.refs import ImportRef, user_frame
from edgeflow.scaffold.model import (
    SHAPE_SYNTAX,
    Asked,
    Given,
    Model,
    Output,
    Tensor,
    shape_text,
    tf_model,
    unknown_inputs,
)

# an input named like a recurrent state: guessed with the recurrent layer's hidden size
STATE_NAME = re.compile(r"(^|_)(h|c|h0|c0|hx|hidden|state|states|memory|carry)($|_)", re.I)


class MissingShapes(EdgeflowError):
    """Inputs without --input. `guessed`: shapes for every input that ran the model (the
    caller turns them into a command), or `why` none were found."""

    def __init__(self, message: str, guessed: dict[str, Given], missing: list[str], why: str):
        flags = " ".join(f"--input {n}:SHAPE" for n in missing)
        super().__init__(message, f"{flags}, SHAPE as {SHAPE_SYNTAX} ({why})")
        self.guessed = guessed


def resolve(text: str) -> ImportRef:
    """The reference, checked from its source as a recipe's are (nothing runs yet)."""
    try:
        ref = ImportRef.parse(text, Path.cwd())
        ref.check()
    except ValueError as exc:
        raise EdgeflowError(
            f"{text}: {exc}",
            getattr(exc, "hint", None)
            or "name a class or function: 'path/to/file.py:Name' or 'pkg.module:Name'",
        ) from exc
    return ref


def read_code(ref: ImportRef, text: str, asked: Asked, init: Mapping[str, Any]) -> Model:
    """Build what `ref` names with `init` and read it; its kind is what it built."""
    found = ref.load()
    torch = sys.modules.get("torch")  # imported by the user's module if it is a torch one
    if isinstance(found, type) and not (torch and issubclass(found, torch.nn.Module)):
        raise EdgeflowError(
            f"{text} is a class that does not subclass torch.nn.Module",
            "name a torch.nn.Module subclass, or a function that builds the model",
        )
    if not callable(found):
        raise EdgeflowError(f"{text} is a {type(found).__name__}, not a class or function")
    built = _call(found, init, text)
    kind = kind_of(built)
    path = Path(ref.module) if ref.is_file else None
    if kind == "tensorflow":
        from edgeflow.frameworks import tensorflow as tfw

        return tf_model(tfw.from_keras(built, text), asked, text, path, init)
    if kind == "pytorch":
        return _read_module(built, text, path, asked.given, init)
    if kind == "jax":
        return _read_jax(built, text, path, asked.given, init)
    raise EdgeflowError(
        f"{text}({_args(init)}) gave a {type(built).__name__}: not a torch.nn.Module, a "
        "keras.Model, or (apply_fn, params) for JAX",
        "name a torch.nn.Module class, or a function that returns one of those",
    )


def kind_of(built: Any) -> str | None:
    """The source kind of what a class or function built (None: none of them)."""
    torch, keras = sys.modules.get("torch"), sys.modules.get("keras")
    if torch is not None and isinstance(built, torch.nn.Module):
        return "pytorch"
    if keras is not None and isinstance(built, keras.Model):
        return "tensorflow"
    if isinstance(built, tuple | list) and len(built) == 2 and callable(built[0]):
        return "jax"
    return None


def _args(init: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in init.items())


def _call(found: Callable[..., Any], init: Mapping[str, Any], text: str) -> Any:
    """`found(**init)`: the user's constructor or builder; its errors said as theirs."""
    try:
        return found(**init)
    except TypeError as exc:
        missing = [p for p in _required(found) if p not in init]
        flags = " ".join(f"--init {p}=VALUE" for p in missing)
        raise EdgeflowError(
            f"cannot call {text}({_args(init)}): {exc}",
            f"give its arguments with --init: {flags}" if missing else "check the --init names",
        ) from exc
    except EdgeflowError:
        raise
    except Exception as exc:  # the user's code
        raise EdgeflowError(
            f"{text}({_args(init)}) raised {type(exc).__name__}: {first_line(exc)} "
            f"({user_frame(exc)})",
            "call it in Python with these arguments to reproduce it",
        ) from exc


def _required(found: Callable[..., Any]) -> list[str]:
    try:
        params = inspect.signature(found).parameters.values()
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in params if p.default is p.empty and p.kind in kinds]


def input_names(
    fn: Callable[..., Any], given: Mapping[str, Given], skip: int, where: str
) -> list[str]:
    """The positional inputs of `fn` after `skip` leading parameters: its required ones,
    the optional ones --input names (in order: none skipped, inputs are fed by position),
    and for `*args` the other --input names."""
    try:
        params = list(inspect.signature(fn).parameters.values())[skip:]
    except (TypeError, ValueError):
        params = []
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names: list[str] = []
    for i, p in enumerate(positional):
        if p.default is not p.empty and p.name not in given:
            later = [q.name for q in positional[i + 1 :] if q.name in given]
            if later:
                raise EdgeflowError(
                    f"--input {given[later[0]].text}: {where} takes '{p.name}' before "
                    f"'{later[0]}', and inputs are fed by position",
                    f"give '{p.name}' an --input too",
                )
            break
        names.append(p.name)
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        names += [n for n in given if n not in names]
    unknown_inputs(given, names, where)
    return names


def _missing_shapes(
    names: Sequence[str],
    given: Mapping[str, Given],
    fn: Callable[..., Any],
    where: str,
    guess: Callable[[], dict[str, Given] | str],
) -> None:
    """Inputs without --input: an error located at the function, with shapes that ran the
    model (guessed) or why none were found."""
    missing = [n for n in names if n not in given]
    if not missing:
        return
    try:
        file = Path(inspect.getsourcefile(fn) or "?").name
        place = f"{file}:{inspect.getsourcelines(fn)[1]}: "
    except (OSError, TypeError):
        place = ""
    guessed = guess()
    raise MissingShapes(
        f"{place}{where}: no shape for {', '.join(missing)} (code does not say its input "
        "shapes): give each with --input NAME:SHAPE[:DTYPE]",
        {} if isinstance(guessed, str) else guessed,
        missing,
        guessed if isinstance(guessed, str) else "",
    )


def returned_names(fn: Callable[..., Any], count: int) -> list[str | None] | None:
    """The names a function's last `return a, self.head(x)` gives its outputs, one per
    output (None: no name); None when the source is not there or the count differs."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    func = tree.body[0] if tree.body else None
    if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    returns: list[ast.Return] = []
    todo: list[ast.AST] = list(func.body)
    while todo:  # the function's own returns, not those of functions defined inside it
        node = todo.pop(0)
        if isinstance(node, ast.Return) and node.value is not None:
            returns.append(node)
        nested = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
        if not isinstance(node, nested):
            todo.extend(ast.iter_child_nodes(node))
    if not returns:
        return None
    value = returns[-1].value
    assert value is not None  # returns without a value are not collected
    elts = value.elts if isinstance(value, ast.Tuple) else [value]
    if len(elts) != count:
        return None
    return [_named(e) for e in elts]


def _named(node: ast.expr) -> str | None:
    """`a` -> a, `self.head(...)` -> head: what names a returned value."""
    if isinstance(node, ast.Name):
        return node.id
    func = node.func if isinstance(node, ast.Call) else None
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return func.attr if func.value.id == "self" else None
    return None


def name_outputs(
    shapes: Sequence[tuple[int, ...]],
    keys: Sequence[str] | None,
    returned: Sequence[str | None] | None,
    inputs: Sequence[str],
) -> tuple[Output, ...]:
    """Output names: a returned dict's keys, else the variables `return a, b` names, else
    output / output_0, ...; a returned input variable (a state passed on in its own name)
    becomes `<name>_out`."""
    count = len(shapes)
    default = ["output"] if count == 1 else [f"output_{i}" for i in range(count)]
    names: list[str | None] = [None] * count
    by = "edgeflow's default names"
    if keys is not None:
        names, by = list(keys), "the returned dict's keys"
    elif returned is not None and any(returned):
        names, by = list(returned), "forward's return statement"
    outputs: list[Output] = []
    taken = set(inputs)
    for i, shape in enumerate(shapes):
        name, of_input = names[i] or default[i], None
        if name in inputs:
            name, of_input = f"{name}_out", name
        while name in taken:
            name += "_1"
        taken.add(name)
        named_by = by if names[i] else "edgeflow's default names"
        outputs.append(Output(name, shape, of_input, named_by))
    return tuple(outputs)


def _shapes(inputs: Sequence[Tensor]) -> str:
    return ", ".join(f"{t.name} {list(t.shape)}" for t in inputs)


def _read_module(
    module: Any, text: str, path: Path | None, given: Mapping[str, Given], init: Mapping[str, Any]
) -> Model:
    import numpy as np
    import torch

    from edgeflow.source import flat_tensors

    module = module.eval()
    where = f"{type(module).__name__}.forward"
    names = input_names(module.forward, given, 0, where)
    _missing_shapes(names, given, module.forward, where, lambda: _guess_torch(module, names, given))
    inputs = tuple(Tensor(n, given[n].shape, given[n].dtype or "float32") for n in names)
    try:
        with torch.inference_mode():
            result = module(*(torch.from_numpy(np.zeros(t.shape, t.dtype)) for t in inputs))
    except Exception as exc:  # the user's forward
        raise EdgeflowError(
            f"{where} raised {type(exc).__name__} on zeros of the --input shapes "
            f"({_shapes(inputs)}): {first_line(exc)} ({user_frame(exc)})",
            "check the --input shapes and dtypes",
        ) from exc
    tensors = flat_tensors(result)
    if not tensors:
        raise EdgeflowError(f"{where} returned {type(result).__name__}, which holds no tensor")
    keys = None
    if isinstance(result, dict) and all(isinstance(v, torch.Tensor) for v in result.values()):
        keys = [str(k) for k in result]
    outputs = name_outputs(
        [tuple(t.shape) for t in tensors],
        keys,
        returned_names(type(module).forward, len(tensors)),
        names,
    )
    return Model("pytorch", text, path, inputs, outputs, dict(init), text)


def _torch_shape(layer: Any) -> tuple[tuple[int, ...], str] | None:
    """The input shape a model whose first layer this is takes (a leading batch of 1)."""
    kind = type(layer).__name__
    spatial = {"1d": (64,), "2d": (32, 32), "3d": (8, 32, 32)}
    if kind[:-2] in ("Conv", "ConvTranspose") and kind[-2:] in spatial:
        return (1, layer.in_channels, *spatial[kind[-2:]]), "float32"
    if kind.startswith("BatchNorm") and kind[-2:] in spatial:
        extra = () if kind == "BatchNorm1d" else spatial[kind[-2:]]
        return (1, layer.num_features, *extra), "float32"
    if kind == "Linear":
        return (1, layer.in_features), "float32"
    if kind == "Embedding":
        return (1, 16), "int64"
    if kind in ("RNN", "GRU", "LSTM"):
        first = (1, 10) if layer.batch_first else (10, 1)
        return (*first, layer.input_size), "float32"
    if kind in ("RNNCell", "GRUCell", "LSTMCell"):
        return (1, layer.input_size), "float32"
    if kind == "LayerNorm":
        return (1, 16, *layer.normalized_shape), "float32"
    return None


def _torch_state_shape(module: Any) -> tuple[int, ...] | None:
    """The hidden state a model's first recurrent layer takes."""
    for layer in module.modules():
        kind = type(layer).__name__
        if kind in ("RNNCell", "GRUCell"):
            return (1, layer.hidden_size)
        if kind in ("RNN", "GRU"):
            return (layer.num_layers * (2 if layer.bidirectional else 1), 1, layer.hidden_size)
    return None


def _guess_torch(
    module: Any, names: list[str], given: Mapping[str, Given]
) -> dict[str, Given] | str:
    """Shapes for every input that run the module on zeros, from its first layer (and its
    recurrent layer's hidden size for an input named like a state); or why there are none."""
    import torch

    leaves = [m for m in module.modules() if not list(m.children()) and list(m.parameters(False))]
    first = next((g for g in map(_torch_shape, leaves) if g is not None), None)
    if first is None:
        return "its first layer does not say its input size"
    state = _torch_state_shape(module)
    guessed: dict[str, Given] = {}
    for name in names:
        shape, dtype = first
        if guessed and state is not None and STATE_NAME.search(name):
            shape, dtype = state, "float32"
        text = f"{name}:{shape_text(shape)}" + ("" if dtype == "float32" else f":{dtype}")
        guessed[name] = given.get(name) or Given(name, shape, dtype, text)
    zeros = [
        torch.zeros(g.shape, dtype=getattr(torch, g.dtype or "float32")) for g in guessed.values()
    ]
    try:
        with torch.inference_mode():
            module(*zeros)
    except Exception as exc:  # the user's forward on a guess
        tried = " ".join(g.text for g in guessed.values())
        return f"tried {tried}: {type(exc).__name__}: {first_line(exc)}"
    return guessed


def _read_jax(
    built: Sequence[Any],
    text: str,
    path: Path | None,
    given: Mapping[str, Given],
    init: Mapping[str, Any],
) -> Model:
    import numpy as np

    from edgeflow.frameworks import jax as jaxw

    jax = jaxw.require("jax")
    apply_fn, params = built
    where = f"{text}'s apply_fn"
    names = input_names(apply_fn, given, 1, where)
    if not names:
        raise EdgeflowError(
            f"{where} takes its inputs as *args: their names are not known",
            f"name and shape each, in order: --input NAME:SHAPE[:DTYPE], SHAPE as {SHAPE_SYNTAX}",
        )
    _missing_shapes(
        names, given, apply_fn, where, lambda: _guess_jax(apply_fn, params, names, given)
    )
    inputs = tuple(Tensor(n, given[n].shape, given[n].dtype or "float32") for n in names)
    with jax.enable_x64(False):
        try:
            result = apply_fn(params, *(np.zeros(t.shape, t.dtype) for t in inputs))
        except Exception as exc:  # the user's function
            raise EdgeflowError(
                f"{where} raised {type(exc).__name__} on zeros of the --input shapes "
                f"({_shapes(inputs)}): {first_line(exc)} ({user_frame(exc)})",
                "check the --input shapes and dtypes",
            ) from exc
    leaves = jax.tree_util.tree_leaves(result)
    if not leaves:
        raise EdgeflowError(f"{where} returned {type(result).__name__}, which holds no array")
    flat_dict = isinstance(result, dict) and len(result) == len(leaves)
    keys = sorted(str(k) for k in result) if flat_dict else None  # jax's leaf order
    outputs = name_outputs(
        [tuple(np.shape(leaf)) for leaf in leaves],
        keys,
        returned_names(apply_fn, len(leaves)),
        names,
    )
    return Model("jax", text, path, inputs, outputs, dict(init), text)


def _first_kernel(tree: Any) -> tuple[str, Any] | None:
    """The first `kernel` (or `embedding`) array of a Flax variables tree, in the order the
    layers were made (dicts keep it; jax's tree flattening sorts the keys)."""
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            if key in ("kernel", "embedding") and hasattr(value, "shape"):
                return key, value
            found = _first_kernel(value)
            if found is not None:
                return found
    return None


def _guess_jax(
    apply_fn: Any, params: Any, names: list[str], given: Mapping[str, Given]
) -> dict[str, Given] | str:
    """Shapes for every input that run the function on zeros, from its first kernel
    (channel-last, as Flax's layers take them); or why there are none."""
    import jax
    import numpy as np

    found = _first_kernel(params)
    if found is None:
        return "its parameters hold no Flax kernel to read an input size from"
    key, kernel = found
    dims = tuple(kernel.shape)
    if key == "embedding":
        shape, dtype = (1, 16), "int32"
    elif len(dims) >= 3:  # a convolution's (spatial..., in, out)
        shape, dtype = (1, *([32] * (len(dims) - 2)), dims[-2]), "float32"
    else:  # a dense layer's (in, out)
        shape, dtype = (1, dims[0]), "float32"
    text = shape_text(shape) + ("" if dtype == "float32" else f":{dtype}")
    guessed = {n: given.get(n) or Given(n, shape, dtype, f"{n}:{text}") for n in names}
    with jax.enable_x64(False):
        try:
            apply_fn(params, *(np.zeros(g.shape, g.dtype or "float32") for g in guessed.values()))
        except Exception as exc:  # the user's function on a guess
            tried = " ".join(g.text for g in guessed.values())
            return f"tried {tried}: {type(exc).__name__}: {first_line(exc)}"
    return guessed
