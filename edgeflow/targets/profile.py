"""The target profile model: what a target runtime accepts, as data (targets/<name>.yaml)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PositiveInt,
    field_validator,
    model_validator,
)

from edgeflow.core.islands import Island, IslandKind
from edgeflow.schema.sections import QuantizationMode

if TYPE_CHECKING:
    from edgeflow.targets.registry import Backend


class OpsetRange(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
    min: int = Field(7, ge=1)
    max: int = Field(23, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> OpsetRange:
        if self.min > self.max:
            raise ValueError(f"opset.min ({self.min}) is above opset.max ({self.max})")
        return self


class Kernel(BaseModel):
    """The runtime has a kernel for versions `since`..`until` of the op's schema."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
    since: int = Field(ge=1)
    until: int | None = None  # None: every later version
    dtypes: list[str] | None = None  # of the first input; None: not restricted
    expanded: bool = False  # no kernel: the runtime runs the op's ONNX function body instead

    @field_validator("dtypes")
    @classmethod
    def _known_dtypes(cls, dtypes: list[str] | None) -> list[str] | None:
        return _check_dtypes(dtypes)


class OperatorSpec(BaseModel):
    """What the runtime takes of one operator; an empty spec means: any version, any type."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
    kernels: list[Kernel] | None = None  # None: every version
    dtypes: list[str] | None = None  # of the first input, whatever the version
    checks: list[str] = []  # names of edgeflow.targets.checkers.CHECKERS
    # The quantization modes the runtime runs this op in; None: every mode the target offers.
    quantization: list[QuantizationMode] | None = None
    # Modes in which the op runs but was measured inaccurate (on a probe): mode -> what was
    # seen. A warning in the precheck, not a failure: it depends on the graph around the op.
    inaccurate: dict[QuantizationMode, str] = {}
    # Why an int8 build runs this op float (the runtime has no int8 kernel for a builtin it
    # becomes; targets/_tflite_traps.py keeps it float): a precheck warning in int8 builds.
    kept_float: str = ""
    note: str = ""  # restrictions the source states that no checker encodes (not checked)

    @field_validator("dtypes")
    @classmethod
    def _known_dtypes(cls, dtypes: list[str] | None) -> list[str] | None:
        return _check_dtypes(dtypes)

    @field_validator("checks")
    @classmethod
    def _known_checkers(cls, checks: list[str]) -> list[str]:
        from edgeflow.core.suggest import did_you_mean
        from edgeflow.targets.checkers import CHECKERS

        for name in checks:
            if name not in CHECKERS:
                raise ValueError(f"unknown checker '{name}'; {did_you_mean(name, CHECKERS)}")
        return checks


# ONNX's element types (TensorProto.DataType but UNDEFINED), lower case, in onnx 1.23's order:
# a profile is validated without importing onnx (0.1 s in every `edgeflow` process);
# tests/targets/test_profile_files.py checks the list against the installed onnx.
ONNX_DTYPES = (
    "float", "uint8", "int8", "uint16", "int16", "int32", "int64", "string", "bool",
    "float16", "double", "uint32", "uint64", "complex64", "complex128", "bfloat16",
    "float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "uint4", "int4",
    "float4e2m1", "float8e8m0", "uint2", "int2", "float6e2m3", "float6e3m2",
)  # fmt: skip


def _check_dtypes(dtypes: list[str] | None) -> list[str] | None:
    """Element types by their ONNX names, lower case (float, int64, float8e4m3fn, ...)."""
    for name in dtypes or []:
        if name not in ONNX_DTYPES:
            raise ValueError(f"unknown dtype '{name}' (valid: {', '.join(ONNX_DTYPES)})")
    return dtypes


def operator_list(value: Any) -> Any:
    """`operators: [Conv, Relu]` is short for `{Conv: {}, Relu: {}}`."""
    return {name: {} for name in value} if isinstance(value, list) else value


class Board(BaseModel):
    """A device class the target runs on: the memory a model may use there."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
    description: str = ""
    ram_bytes: PositiveInt | None = None  # for activations (the arena); None: not limited
    flash_bytes: PositiveInt | None = None  # for weights; None: not limited
    # the clock of the processor whose time the build estimates (an NPU's: ethos_u)
    clock_hz: PositiveInt | None = None


# The Ethos-U configurations Arm's Vela 5.2 compiles for (`vela --accelerator-config`).
Accelerator = Literal[
    "ethos-u55-32",
    "ethos-u55-64",
    "ethos-u55-128",
    "ethos-u55-256",
    "ethos-u65-256",
    "ethos-u65-512",
    "ethos-u85-128",
    "ethos-u85-256",
    "ethos-u85-512",
    "ethos-u85-1024",
    "ethos-u85-2048",
]
# Vela's own defaults per generation (what it uses when given none), from its Arm/vela.ini:
# (system configuration, memory mode). Vela does not check that a system configuration is
# one of the accelerator's generation (measured: an ethos-u85-256 compiles against
# Ethos_U55_High_End_Embedded); the profile does.
NPU_DEFAULTS = {
    "u55": ("Ethos_U55_High_End_Embedded", "Shared_Sram"),
    "u65": ("Ethos_U65_Client_Server", "Dedicated_Sram_384KB"),
    "u85": ("Ethos_U85_SYS_DRAM_Mid", "Dedicated_Sram_384KB"),
}


class Npu(BaseModel):
    """The NPU a target's artifact is compiled for (Backend.npu: the ethos_u family, with
    Vela): the accelerator, and the system configuration and memory mode of Vela's
    Arm/vela.ini (clocks, buses; where the arena and the weights live), by default Vela's
    own for the accelerator's generation."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    accelerator: Accelerator
    system_config: str | None = None
    memory_mode: str | None = None

    @property
    def generation(self) -> str:
        return self.accelerator.split("-")[1]  # ethos-u55-128 -> u55

    @property
    def system(self) -> str:
        return self.system_config or NPU_DEFAULTS[self.generation][0]

    @property
    def memory(self) -> str:
        return self.memory_mode or NPU_DEFAULTS[self.generation][1]

    @model_validator(mode="after")
    def _system_of_its_generation(self) -> Npu:
        prefix = f"Ethos_{self.generation.upper()}_"
        if self.system_config is not None and not self.system_config.startswith(prefix):
            raise ValueError(
                f"system_config {self.system_config} is not one of the {self.accelerator}'s "
                f"(Vela's are named {prefix}*; it would compile against it without a word)"
            )
        return self


Where = Literal["npu", "cpu", "partly", "fails"]


class Placement(BaseModel):
    """Where an NPU compiler put what a probe graph became (targets/ethos_u/derive.py: the
    tflite_micro int8 .tflite of the probe, compiled by Vela): all on the NPU, all on the
    CPU, partly, or the compiler failed on it."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    placed: Where
    cpu: list[str] = []  # the TFLite builtins it left for the CPU
    why: str = ""  # the compiler's words (cpu, partly, fails)
    # data movement the compiler added on the NPU: lowered op -> count (Transpose, Reshape,
    # MemoryCopy), from operators that are not themselves a transpose or reshape
    moves: dict[str, int] = {}
    # fails: the non-float types of the probe's graph inputs and outputs (bool, int64), where
    # it had any: the failure was measured with such a tensor at the graph's edge
    io: list[str] = []


class OpPlacement(Placement):
    """An ONNX operator's placement: its float32 probe's, and where another input type or a
    variant (a probe failing a checker) was placed otherwise."""

    dtypes: dict[str, Placement] = {}  # first input of this type (int32, int64, bool, ...)
    checks: dict[str, Placement] = {}  # a node failing this checker (checkers.CHECKERS)


class Builtins(BaseModel):
    """The TFLite builtins measured in one quantization mode (targets/derive.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    runs: list[str] = []  # in probe artifacts that ran
    fails: dict[str, str] = {}  # builtin -> the runtime's words where a probe with it failed


class TargetProfile(BaseModel):
    """One edge target: which backend builds for it and what its runtime supports."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    # names the build folder (build/<recipe>/<name>-<mode>): a plain file name
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)
    description: str = ""
    backend: str  # a registered family (edgeflow.targets.registry)
    source: str = Field("", description="where the support data comes from, with versions")
    artifact: str = Field("", description="what the build produces")
    opset: OpsetRange = OpsetRange()
    quantization: list[QuantizationMode] = ["none", "fp16", "int8"]
    dynamic_shapes: bool = True
    control_flow: bool = True
    float64: bool = True  # float64 tensors allowed
    float16: bool = True  # float16 tensors allowed
    # Supported op types (`domain.Op` outside the default domain); None: not restricted.
    operators: Annotated[dict[str, OperatorSpec] | None, BeforeValidator(operator_list)] = None
    # int8 settings the runtime requires, applied over the recipe's (and reported), e.g.
    # {symmetric: true} for TensorRT's zero-point-0 QDQ or {per_channel: false}.
    int8: dict[str, bool] = {}
    # Whether the runtime's int8 fully-connected kernels take per-channel weights; where not
    # (Arm NN aborts on them), per-channel builds quantize those per-tensor, the rest per-channel.
    per_channel_dense: bool = True
    # the float islands (edgeflow.core.islands) an int8 build keeps float unless the recipe
    # sets quantization.keep_float: the kinds measured to keep a model's decisions here
    int8_keep_float: list[IslandKind] = []
    # An input type the runtime computes in another when a kernel lacks it ({float16: float}).
    dtype_fallbacks: dict[str, str] = {}
    max_rank: PositiveInt | None = None  # the largest tensor rank the runtime's kernels take
    boards: dict[str, Board] = {}  # memory presets, chosen with --board / precheck.board
    default_board: str | None = None  # the board checked when none is chosen
    # onnx.* rules every build for this target gets after the recipe's own (as `rewrites:`
    # entries); a recipe turns them off with target_rewrites: false, or replaces one by
    # listing the same rule itself.
    rewrites: list[dict[str, Any]] = []
    # TFLite targets: the builtins a .tflite may hold, by measured mode (none, int8); what
    # the precheck of TensorFlow's own converter (convert.via: native) checks
    builtins: dict[str, Builtins] = {}
    # the NPU the artifact is compiled for (a backend with Backend.npu: ethos_u)
    npu: Npu | None = None
    # where the NPU compiler puts each ONNX operator, per generation (u55, u65, u85), as
    # measured on the probe graphs: what the precheck says before converting
    npu_placement: dict[str, dict[str, OpPlacement]] = {}
    # int8 kernels' traps that the build avoids, as precheck warnings: op -> {checker (of
    # edgeflow.targets.checkers.CHECKERS): what the runtime does with such a node in int8
    # and what the build does about it}, e.g. a DIV by a computed divisor
    int8_warnings: dict[str, dict[str, str]] = {}

    @field_validator("backend")
    @classmethod
    def _registered(cls, name: str) -> str:
        from edgeflow.core.suggest import did_you_mean
        from edgeflow.targets.registry import backends

        if name not in backends():
            hint = did_you_mean(name, backends()) or f"have: {', '.join(backends())}"
            raise ValueError(f"unknown backend '{name}'; {hint}")
        return name

    @model_validator(mode="after")
    def _modes_the_family_builds(self) -> TargetProfile:
        refused = self.family.refused_modes
        for mode in self.quantization:
            if mode in refused:
                raise ValueError(
                    f"quantization: the {self.backend} backend cannot build {mode}: {refused[mode]}"
                )
        return self

    @model_validator(mode="after")
    def _npu_where_the_family_compiles_for_one(self) -> TargetProfile:
        if self.family.npu and self.npu is None:
            raise ValueError(
                f"npu: the {self.backend} backend compiles for an NPU: name it "
                "(npu: {accelerator: ethos-u55-128})"
            )
        if not self.family.npu and (self.npu is not None or self.npu_placement):
            raise ValueError(f"npu: the {self.backend} backend compiles for no NPU")
        unknown = sorted(set(self.npu_placement) - set(NPU_DEFAULTS))
        if unknown:
            raise ValueError(
                f"npu_placement: unknown generation {', '.join(unknown)} "
                f"(have: {', '.join(NPU_DEFAULTS)})"
            )
        return self

    def with_accelerator(self, accelerator: str) -> TargetProfile:
        """This profile compiling for another accelerator (a recipe's `accelerator:`), named
        `<name>.<accelerator>` so that its builds have a folder of their own. An accelerator
        of another generation gets Vela's system configuration and memory mode for it, and
        none of the profile's boards (systems of the other generation: their clock would
        time it). Raises ValueError for an unknown accelerator or a profile without an NPU."""
        if self.npu is None:
            raise ValueError(f"target {self.name} compiles for no NPU")
        if accelerator == self.npu.accelerator:
            return self
        npu = self.npu.model_dump()
        npu["accelerator"] = accelerator
        update: dict[str, Any] = {"name": f"{self.name}.{accelerator}"}
        if Npu.model_validate({"accelerator": accelerator}).generation != self.npu.generation:
            npu["system_config"] = npu["memory_mode"] = None
            update |= {"boards": {}, "default_board": None}
        return self.model_copy(update={**update, "npu": Npu.model_validate(npu)})

    @property
    def family(self) -> Backend:
        """What this profile's backend can do (its registered Backend)."""
        from edgeflow.targets.registry import get

        return get(self.backend)

    @field_validator("rewrites")
    @classmethod
    def _onnx_rules(cls, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        from edgeflow.core.suggest import did_you_mean
        from edgeflow.rules import builtin_rules

        known = builtin_rules()
        for entry in entries:
            name = entry.get("rule")
            rule = known.get(str(name))
            if rule is None:
                raise ValueError(f"unknown rule '{name}' {did_you_mean(str(name), known) or ''}")
            if rule.level != "onnx":
                raise ValueError(
                    f"'{name}' is an {rule.level} rule: a target's rewrites are onnx.* rules, "
                    "which run after the export its builds share"
                )
            rule.Options.model_validate({k: v for k, v in entry.items() if k != "rule"})
        return entries

    def rewrite_specs(self) -> list[Any]:
        """The target's rewrites as RuleSpecs (validated when the profile loaded)."""
        if not self.rewrites:  # without importing every rule (a tenth of a second)
            return []
        from edgeflow.rules import builtin_rules
        from edgeflow.rules.base import RuleSpec

        known = builtin_rules()
        specs = []
        for entry in self.rewrites:
            rule = known[entry["rule"]]
            options = rule.Options.model_validate({k: v for k, v in entry.items() if k != "rule"})
            specs.append(RuleSpec(rule, options, entry["rule"]))
        return specs

    @field_validator("int8_warnings")
    @classmethod
    def _known_int8_checkers(cls, warnings: dict[str, dict[str, str]]) -> dict[str, Any]:
        for checks in warnings.values():
            OperatorSpec._known_checkers(list(checks))
        return warnings

    @field_validator("int8")
    @classmethod
    def _int8_settings(cls, settings: dict[str, bool]) -> dict[str, bool]:
        allowed = ("per_channel", "symmetric", "reduce_range")
        for key in settings:
            if key not in allowed:
                raise ValueError(f"int8 can set {', '.join(allowed)} (got '{key}')")
        return settings

    def quantization_for(self, quantization: Any) -> Any:
        """The recipe's quantization with the int8 settings this target requires."""
        if quantization.mode != "int8" or not self.int8:
            return quantization
        return quantization.model_copy(update=self.int8)

    def keep_float(self, quantization: Any, found: Sequence[Island]) -> list[str]:
        """The island kinds an int8 build keeps float: the recipe's quantization.keep_float,
        else this target's default for a transformer (a graph with attention scores among
        the islands `found`) where the build calibrates int8 activations itself."""
        if quantization.keep_float is not None:
            return list(quantization.keep_float)
        calibrated = quantization.activations == "int8" and quantization.method != "qat"
        attention = any(island.kind == "attention_scores" for island in found)
        if quantization.mode == "int8" and calibrated and attention:
            return list(self.int8_keep_float)
        return []

    @model_validator(mode="after")
    def _default_board_exists(self) -> TargetProfile:
        if self.default_board is not None and self.default_board not in self.boards:
            known = ", ".join(self.boards) or "none"
            raise ValueError(f"default_board '{self.default_board}' is not in boards ({known})")
        return self

    def board(self, name: str | None) -> tuple[str, Board] | None:
        """The named board, or the default one; None when the profile has neither."""
        name = name or self.default_board
        if name is None:
            return None
        if name not in self.boards:
            from edgeflow.core.errors import EdgeflowError
            from edgeflow.core.suggest import did_you_mean

            raise EdgeflowError(
                f"target {self.name} has no board '{name}'",
                did_you_mean(name, list(self.boards)) or "boards: none; add one to the profile",
            )
        return name, self.boards[name]
