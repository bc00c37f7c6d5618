"""What a converter really wrote into a .tflite: its operators, with the options that matter.

The precheck judges the ONNX graph, but the runtime loads the converter's output, and the two
differ: onnx2tf writes a Pad with a value other than 0 as PADV2 and fuses a following Clip
into a FULLY_CONNECTED as RELU_N1_TO_1, which Arm NN 22's parser refuses. So the TFLite-family
builds check the .tflite's operators against the ones the profile measured (targets/*.yaml
`builtins:`, from the probes' artifacts) after conversion and before the target's runtime
first loads it (precheck.check_builtins).

An operator is named by its builtin (CONV_2D, CUSTOM:FlexErf) and, where an option changes
which runtimes take it, by that option too: a fused activation, `FULLY_CONNECTED(RELU_N1_TO_1)`;
a mirror-pad mode, `MIRROR_PAD(REFLECT)`.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

SCHEMA = "ai_edge_litert.schema_py_generated"


def operators(artifact: Path, target: str) -> list[str]:
    """The builtin (or custom) operator names the .tflite uses, in first-use order."""
    schema = _schema(target)
    return operators_by_code(schema.Model.GetRootAs(artifact.read_bytes(), 0), schema)


def operators_by_code(model: Any, schema: ModuleType) -> list[str]:
    """The operator name of each operator code of a parsed .tflite (`schema.Model`)."""
    names = _names(schema.BuiltinOperator)
    found = []
    for i in range(model.OperatorCodesLength()):
        code = model.OperatorCodes(i)
        op = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        name = names.get(op, str(op))
        if name == "CUSTOM":
            name = f"CUSTOM:{code.CustomCode().decode()}"
        found.append(name)
    return found


def counts(artifact: Path, target: str) -> dict[str, int]:
    """How many operators of each name (with its option, see the module) the .tflite's
    subgraphs hold."""
    schema = _schema(target)
    model = schema.Model.GetRootAs(artifact.read_bytes(), 0)
    names = operators_by_code(model, schema)
    found: dict[str, int] = {}
    for g in range(model.SubgraphsLength()):
        graph = model.Subgraphs(g)
        for i in range(graph.OperatorsLength()):
            op = graph.Operators(i)
            name = names[op.OpcodeIndex()]
            found_option = option(op, schema)
            key = f"{name}({found_option})" if found_option else name
            found[key] = found.get(key, 0) + 1
    return found


def constant_bytes(artifact: Path, target: str) -> int:
    """The bytes of the .tflite's constants: its buffers, each stored once however many
    operators read it."""
    schema = _schema(target)
    model = schema.Model.GetRootAs(artifact.read_bytes(), 0)
    buffers = (model.Buffers(i) for i in range(model.BuffersLength()))
    return sum(b.Size() or b.DataLength() for b in buffers)


def base(name: str) -> str:
    """The builtin of an operator name: FULLY_CONNECTED of FULLY_CONNECTED(RELU_N1_TO_1)."""
    return name.split("(", 1)[0]


def _schema(target: str) -> ModuleType:
    """LiteRT's flatbuffer schema (ai-edge-litert), or how to install it."""
    import importlib

    from edgeflow.core.errors import MissingDependency

    try:
        return importlib.import_module(SCHEMA)
    except ImportError as exc:
        raise MissingDependency(f"target {target}", "ai-edge-litert", "tflite") from exc


def option(op: Any, schema: ModuleType) -> str:
    """The option of one operator that decides whether a runtime takes it, or ''."""
    kind = _names(schema.BuiltinOptions).get(op.BuiltinOptionsType())
    table = op.BuiltinOptions()
    if kind is None or table is None or not hasattr(schema, kind):
        return ""
    options = getattr(schema, kind)()
    options.Init(table.Bytes, table.Pos)
    if hasattr(options, "FusedActivationFunction"):
        activation = options.FusedActivationFunction()
        if activation != schema.ActivationFunctionType.NONE:
            return _names(schema.ActivationFunctionType)[activation]
    if kind == "MirrorPadOptions":
        return _names(schema.MirrorPadMode)[options.Mode()]
    return ""


def _names(enum: type) -> dict[int, str]:
    return {v: k for k, v in vars(enum).items() if not k.startswith("_")}
