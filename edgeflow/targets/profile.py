"""The target profile model: what a target runtime accepts, as data (targets/<name>.yaml)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

BACKENDS = ("onnxruntime_micro", "tflite", "tflite_micro")


class OpsetRange(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    min: int = Field(7, ge=1)
    max: int = Field(23, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> OpsetRange:
        if self.min > self.max:
            raise ValueError(f"opset.min ({self.min}) is above opset.max ({self.max})")
        return self


class Board(BaseModel):
    """A device class the target runs on: the memory a model may use there."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    description: str = ""
    ram_bytes: PositiveInt | None = None  # for activations (the arena); None: not limited
    flash_bytes: PositiveInt | None = None  # for weights; None: not limited


class TargetProfile(BaseModel):
    """One edge target: which backend builds for it and what its runtime supports."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    backend: Literal["onnxruntime_micro", "tflite", "tflite_micro"]
    source: str = Field("", description="where the support data comes from, with versions")
    artifact: str = Field("", description="what the build produces")
    opset: OpsetRange = OpsetRange()
    quantization: list[Literal["none", "fp16", "int8"]] = ["none", "fp16", "int8"]
    dynamic_shapes: bool = True
    control_flow: bool = True
    float64: bool = True  # float64 tensors allowed
    float16: bool = True  # float16 tensors allowed
    operators: list[str] | None = Field(
        None, description="supported ONNX op types (default domain); None means not restricted"
    )
    max_rank: PositiveInt | None = None  # the largest tensor rank the runtime's kernels take
    boards: dict[str, Board] = {}  # memory presets, chosen with --board / precheck.board
    default_board: str | None = None  # the board checked when none is chosen

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
            from edgeflow.errors import EdgeflowError
            from edgeflow.recipe.suggest import did_you_mean

            raise EdgeflowError(
                f"target {self.name} has no board '{name}'",
                did_you_mean(name, list(self.boards)) or "boards: none; add one to the profile",
            )
        return name, self.boards[name]
