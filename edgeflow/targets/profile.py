"""The target profile model: what a target runtime accepts, as data (targets/<name>.yaml)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

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
