"""`edgeflow init`, what it proposes and writes: batch axes, state links, the recipe's text
(every key with a one-line comment pointing to its section of docs/recipe.md) and the
data file's (random samples under a banner that says to replace them).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgeflow.scaffold.model import Model, Output, Tensor

DOCS = "docs/recipe.md"
# docs/recipe.md's headings the comments point to, by their GitHub anchors
# (tests/test_scaffold.py checks each against the headings)
ANCHORS = {
    "top": "top-level",
    "reference": "what-a-code-reference-may-name",
    "source": "source",
    "tensorflow": "kind-tensorflow",
    "jax": "kind-jax",
    "inputs": "input-signatures-sourceinputs",
    "state": "stateful-models-sourcestate",
    "datasets": "datasets-calibration-evaluation",
    "export": "export",
    "quantization": "quantization",
    "verify": "verify",
}
SAMPLES = 32  # random samples per split
SEQUENCES, STEPS = 8, 10  # a stateful model's random sequences per split, steps in each
MAX_RELATIVE_DIFF = 1.0e-3  # docs/recipe.md#verify: suits float32 builds of any model
# names a state's input and output carry beside the state's own (state_in -> state_out)
STATE_IN = frozenset({"in", "input", "inp", "prev", "previous", "old", "past", "last", "init"})
STATE_OUT = frozenset({"out", "output", "new", "next", "present", "updated", "final"})


@dataclass(frozen=True)
class Link:
    """A proposed source.state entry: `output` is the next step's `input`."""

    input: str
    output: str
    why: str


@dataclass(frozen=True)
class Plan:
    """What the recipe says beyond the model: each input's batch axis and why, the state
    links, and whether they are on (the data are sequences) or why not."""

    model: Model
    source: str  # source.model as the recipe names it (paths relative to its folder)
    axes: Mapping[str, int | None]
    axis_notes: Mapping[str, str]
    links: tuple[Link, ...] = ()
    off: str = ""  # why the proposed links are written commented out ("": they are on)
    data_file: str = ""  # the --data file as the recipe names it ("": the generated data)
    data_module: str = ""  # the generated data file's name
    given: Mapping[str, bool] = field(default_factory=dict)  # --input names: with a dtype?
    target: str = "onnxruntime_micro"
    via_onnx: bool = False  # a tensorflow source streamed to a TFLite-family target
    header: Sequence[str] = field(default_factory=tuple)  # how it was written

    @property
    def streaming(self) -> bool:
        return bool(self.links) and not self.off

    def data_inputs(self) -> list[Tensor]:
        """The inputs the datasets hold: all, less the states the model feeds back."""
        states = {link.input for link in self.links} if self.streaming else set()
        return [t for t in self.model.inputs if t.name not in states]


def _key(name: str, words: frozenset[str]) -> str:
    """A name less the words a state's input or output adds (h0 / hn: torch's)."""
    tokens = [t for t in re.split(r"[^0-9a-z]+", name.lower()) if t and t not in words]
    if len(tokens) == 1 and re.fullmatch(r"[a-z][0n]", tokens[0]):
        return tokens[0][0]
    return "_".join(tokens)


def _fits(output: Output, tensor: Tensor) -> bool:
    shape = output.shape
    if shape is None or len(shape) != len(tensor.shape) or not shape:
        return False
    return all(d is None or d == t for d, t in zip(shape, tensor.shape, strict=True))


def state_links(model: Model) -> tuple[Link, ...]:
    """Outputs of an input's shape named like it (state -> new_state, h -> h_out, state_in
    -> state_out, h0 -> hn, or the input's variable returned again), each input once, and
    an input left for the data."""
    links: list[Link] = []
    for output in model.outputs:
        for tensor in model.inputs:
            if any(link.input == tensor.name for link in links) or not _fits(output, tensor):
                continue
            key = _key(tensor.name, STATE_IN)
            if output.of_input == tensor.name:
                why = f"forward returns its variable {tensor.name}, of its shape"
            elif key and key == _key(output.name, STATE_OUT) and output.name != tensor.name:
                why = f"named like {tensor.name}, of its shape"
            else:
                continue
            links.append(Link(tensor.name, output.name, why))
            break
    return tuple(links) if len(links) < len(model.inputs) else ()


def batch_axes(model: Model, links: Sequence[Link]) -> tuple[dict[str, int | None], dict[str, str]]:
    """Each input's batch axis and why: 0 where dim 0 is a batch (open in the model, or 1),
    none for a 0-D input, 1 for a [layers, batch, hidden] state and for the [sequence, batch,
    features] input of an ONNX recurrent layer."""
    states = {link.input for link in links}
    data = [t for t in model.inputs if t.name not in states and t.shape]
    batch = data[0].shape[0] if data else 1
    axes: dict[str, int | None] = {}
    notes: dict[str, str] = {}
    for t in model.inputs:
        if not t.shape:
            axes[t.name], notes[t.name] = None, "0-D: no batch; its one value is fed whole"
        elif t.sequence_first and len(t.shape) == 3:
            axes[t.name] = 1
            notes[t.name] = "[sequence, batch, features]: the X of an ONNX LSTM/GRU/RNN"
        elif t.name in states and len(t.shape) == 3 and t.shape[1] == batch:
            axes[t.name] = 1
            notes[t.name] = "[layers, batch, hidden], as RNN layers keep it (0: batch first)"
        elif t.open_batch:
            axes[t.name] = 0
            notes[t.name] = f"dim 0 is open in the model: a batch, {t.shape[0]} here"
        elif t.shape[0] == 1:
            axes[t.name], notes[t.name] = 0, "dim 0, of 1 in the model, taken for the batch"
        else:
            axes[t.name] = 0
            notes[t.name] = f"dim 0 ({t.shape[0]} in the model) taken for a batch; null: none"
    return axes, notes


def shape_note(tensor: Tensor, given: bool, data_file: str = "") -> str:
    """What the recipe's shape of an input comes from."""
    if given:
        return "from --input"
    if tensor.from_data and not tensor.chosen:
        dims = ", ".join(map(str, tensor.from_data))
        plural = "s" if len(tensor.from_data) > 1 else ""
        return f"the model's; open dim{plural} {dims} from {data_file}"
    if tensor.chosen:
        dims = ", ".join(map(str, tensor.chosen))
        size = tensor.shape[tensor.chosen[0]]
        plural = "s" if len(tensor.chosen) > 1 else ""
        return f"dim{plural} {dims} open in the model: {size} here; SET THE REAL SIZE"
    return "the model's"


# ------------------------------------------------------------------------------- YAML text

PLAIN = re.compile(r"(\.\.?/)*[A-Za-z_][A-Za-z0-9_./-]*")  # names, relative paths
WORDS = frozenset({"true", "false", "null", "yes", "no", "on", "off", "y", "n", "~"})


def scalar(value: Any) -> str:
    """A value in YAML flow style, read back as the same value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = repr(value)
        if text in ("inf", "-inf", "nan"):
            return {"inf": ".inf", "-inf": "-.inf", "nan": ".nan"}[text]
        if "e" in text and "." not in text.split("e")[0]:
            mantissa, exponent = text.split("e")
            text = f"{mantissa}.0e{exponent}"
        return text
    if isinstance(value, str):
        plain = PLAIN.fullmatch(value) and value.lower() not in WORDS
        return value if plain else json.dumps(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{scalar(str(k))}: {scalar(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(scalar(v) for v in value) + "]"
    return json.dumps(str(value))


Row = tuple[str, str, str]  # code, comment, anchor key (code "": a comment line)
COLUMN = 30  # where comments start, after shorter code


def _lines(rows: Sequence[Row]) -> list[str]:
    """Rows as lines, each comment ending with its pointer into docs/recipe.md."""
    out = []
    for code, comment, anchor in rows:
        text = f"{comment} ({DOCS}#{ANCHORS[anchor]})"
        if not code.strip():
            out.append(f"{code}# {text}")
        else:
            out.append(f"{code.ljust(COLUMN)}  # {text}")
    return out


def recipe_text(plan: Plan, name: str) -> str:
    """The recipe: every key a line with a comment pointing to its section of the docs."""
    rows: list[Row] = [
        (f"name: {scalar(name)}", "a display name (build/ takes the file's)", "top"),
        (f"description: {scalar(_description(plan.model))}", "free text", "top"),
        *_source(plan),
    ]
    if plan.via_onnx:
        why = "tf2onnx and the ONNX pipeline: the native path takes no source.state"
        rows.append(("convert: {via: onnx}", why, "tensorflow"))
    rows += [
        *_export(plan.model),
        *_datasets(plan),
        ("quantization:", "float32 to start with", "quantization"),
        ("  mode: none", "int8: with real calibration data, and a looser verify", "quantization"),
        (f"target: {scalar(plan.target)}", "a profile of targets/: `edgeflow list`", "top"),
        ("verify:", "a threshold missed makes `edgeflow run` exit 1", "verify"),
        (
            f"  max_relative_diff: {scalar(MAX_RELATIVE_DIFF)}",
            "max |artifact - model| / max |model|, per output: float32's",
            "verify",
        ),
        ("  latency_runs: 100", "timed runs", "verify"),
        ("  warmup_runs: 10", "untimed runs before them", "verify"),
    ]
    header = [f"# {line}" if line else "#" for line in plan.header]
    return "\n".join([*header, *_lines(rows)]) + "\n"


def _description(model: Model) -> str:
    what = {"onnx": "ONNX", "tensorflow": "TensorFlow", "pytorch": "PyTorch", "jax": "JAX"}
    return f"{what[model.kind]} model {model.what}, recipe written by edgeflow init"


def _source(plan: Plan) -> list[Row]:
    model = plan.model
    kind_anchor = {"tensorflow": "tensorflow", "jax": "jax"}.get(model.kind, "source")
    what = {
        "onnx": "an ONNX file, ingested as it is",
        "tensorflow": "Keras or a SavedModel",
        "pytorch": "a torch.nn.Module, exported to ONNX",
        "jax": "a function returning (apply_fn, params)",
    }[model.kind]
    rows: list[Row] = [
        ("source:", "the model to convert", "source"),
        (f"  kind: {model.kind}", what, kind_anchor),
    ]
    if model.reference and model.path is not None:
        said, anchor = "its code; the file relative to this one", "reference"
    elif model.reference:
        said, anchor = "its code, imported from its package", "reference"
    else:
        said, anchor = "relative to this file's folder", kind_anchor
    rows.append((f"  model: {scalar(plan.source)}", said, anchor))
    if model.reference:
        weights = {"pytorch": "model.pt", "jax": "params.msgpack"}.get(
            model.kind, "model.weights.h5"
        )
        rows += [
            (f"  init: {scalar(dict(model.init))}", "its keyword arguments (--init)", kind_anchor),
            (f"  # weights: {weights}", "trained weights; none: the initial ones", kind_anchor),
        ]
    rows.append(("  inputs:", "in the model's order", "inputs"))
    for t in model.inputs:
        given = t.name in plan.given
        dtype = "the model's"
        if model.kind in ("pytorch", "jax"):
            dtype = "from --input" if plan.given[t.name] else "float32: --input gave none"
        rows += [
            (f"    - name: {scalar(t.name)}", _input_said(model), "inputs"),
            (
                f"      shape: {scalar(list(t.shape))}",
                shape_note(t, given, plan.data_file),
                "inputs",
            ),
            (f"      dtype: {t.dtype}", dtype, "inputs"),
            (f"      batch_axis: {scalar(plan.axes[t.name])}", plan.axis_notes[t.name], "inputs"),
        ]
    names = [o.name for o in model.outputs]
    by = " and ".join(sorted({o.named_by for o in model.outputs}))
    rows.append((f"  outputs: {scalar(names)}", f"{by}; rename them here", "source"))
    if plan.links:
        rows += _state(plan)
    return rows


def _input_said(model: Model) -> str:
    return {
        "onnx": "a graph input",
        "tensorflow": "a model input",
        "pytorch": "a forward argument",
        "jax": "an apply_fn argument",
    }[model.kind]


def _state(plan: Plan) -> list[Row]:
    lead = "  " if plan.streaming else "  # "
    rows: list[Row] = []
    if plan.off:
        rows.append(("  ", plan.off, "state"))
    said = "proposed: a state carried from step to step; the data are sequences"
    rows.append((f"{lead}state:", said, "state"))
    for link in plan.links:
        rows += [
            (
                f"{lead}  - input: {scalar(link.input)}",
                "fed the output below, step by step",
                "state",
            ),
            (f"{lead}    output: {scalar(link.output)}", link.why, "state"),
            (f"{lead}    initial: 0", "the first step's state", "state"),
        ]
    return rows


def _export(model: Model) -> list[Row]:
    if model.kind != "pytorch":
        return []
    return [
        ("export:", "torch's ONNX export", "export"),
        ("  opset: 18", "18..23 with dynamo", "export"),
        ("  exporter: dynamo", "torch.export; torchscript where it fails", "export"),
    ]


def _datasets(plan: Plan) -> list[Row]:
    if plan.data_file:
        dataset = scalar(plan.data_file)
        said = "your samples (--data), for both"
        splits: tuple[str | None, ...] = (None, None)
    else:
        dataset = json.dumps(f"{plan.data_module}:samples")
        said = "RANDOM samples: REPLACE WITH YOUR DATA"
        splits = ("calibration", "test")
    rows: list[Row] = []
    for section, split, why in (
        ("calibration", splits[0], "int8's samples (unused while mode: none)"),
        ("evaluation", splits[1], "what verify runs the model and the artifact on"),
    ):
        rows.append((f"{section}:", why, "datasets"))
        rows.append((f"  dataset: {dataset}", said, "datasets"))
        if split:
            rows.append((f"  split: {split}", "passed to samples() as split=", "datasets"))
    rows.append(("  metric: agreement", "outputs against the model's; no labels", "datasets"))
    return rows


# ------------------------------------------------------------------------------ data file

BANNER = "#" * 92


def data_text(plan: Plan, recipe_name: str) -> str:
    """The data file: samples(split) under a banner, random arrays of the inputs' shapes and
    dtypes (sequences of steps for a stateful model's data inputs)."""
    count = "SEQUENCES" if plan.streaming else "SAMPLES"
    size = (
        f"SEQUENCES, STEPS = {SEQUENCES}, {STEPS}  # sequences per split, steps in each"
        if plan.streaming
        else f"SAMPLES = {SAMPLES}  # per split"
    )
    arrays = [_array(t, plan.axes[t.name], count, plan.streaming) for t in plan.data_inputs()]
    states = [link.input for link in plan.links] if plan.streaming else []
    if states:
        arrays.append(f"# no {', '.join(states)}: the model feeds its state back, step by step")
    body = "\n".join(f"        {line}" for line in arrays)
    layout = (
        "a dict of input name -> array of [sequences, steps, ...]\n# (a stateful model's data "
        "are sequences; it feeds its states back itself)."
        if plan.streaming
        else "a dict of input name -> array, the samples on its batch axis\n# (as below), "
        "its other sizes the recipe's shape."
    )
    return f'''"""Samples for {recipe_name}, written by `edgeflow init`: RANDOM data to replace.

The recipe's calibration and evaluation datasets call samples(split=...), with the splits
"calibration" and "test".
"""

from __future__ import annotations

import numpy as np

{size}


{BANNER}
###  REPLACE WITH YOUR REAL DATA
{BANNER}
# samples() returns RANDOM arrays of the model's input shapes and dtypes. With them a build
# shows only that the artifact computes what the model computes on random inputs: nothing
# about accuracy on real inputs (and int8 calibrated on noise is no int8 to ship).
# Return your own samples in the same form: {layout}
# Add a "label" array and set evaluation.metric: top1 in the recipe to measure accuracy.
{BANNER}
def samples(split: str | None = None) -> dict[str, np.ndarray]:
    """RANDOM samples of the model's inputs; each split its own."""
    rng = np.random.default_rng({{"calibration": 0, "test": 1}}.get(split or "", 2))
    return {{
{body}
    }}
'''


def _array(t: Tensor, axis: int | None, count: str, steps: bool) -> str:
    """One input's random array, as a line of the dict samples() returns."""
    if axis is None:
        shape: list[Any] = list(t.shape)
        said = "0-D: one value, fed whole to every batch"
    else:
        shape = [*t.shape[:axis], count, *(["STEPS"] if steps else []), *t.shape[axis + 1 :]]
        said = (
            "[" + ", ".join(str(d).lower() if isinstance(d, str) else str(d) for d in shape) + "]"
        )
    dims = "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"
    if t.dtype == "bool":
        value = f"rng.random({dims}) < 0.5"
    elif t.dtype.startswith(("int", "uint")):
        high = 256 if t.dtype == "uint8" else 4
        value = f"rng.integers(0, {high}, size={dims}).astype(np.{t.dtype})"
        said += f"; values 0..{high - 1}: keep ids below the model's limits" if high == 4 else ""
    else:
        value = f"rng.standard_normal({dims}).astype(np.{t.dtype})"
    if axis is None:
        value = f"np.asarray({value})"
    return f"{json.dumps(t.name)}: {value},  # {said}"
