"""What a rule fixes: the vocabulary of a rule's `fixes` declaration, which the precheck and
`edgeflow explain` ask the registry about (`edgeflow.rules.rules_fixing`).

A Fix names one thing a rule can remove from a model, in the words of the tool that reports it:

- `Fix.op("Erf")`: an ONNX operator type (the precheck's "not supported", an operator
  `edgeflow explain` flags in an exported graph);
- `Fix.check("Conv", "not_grouped")`: an operator failing one of the precheck's named
  checkers (edgeflow/targets/checkers.py);
- `Fix.finding("float64")`: a precheck finding about the model (FINDINGS; the precheck's
  table spells it "(float64)");
- `Fix.capture("nonzero")`: a class of capture failure that `edgeflow explain` reports
  (CAPTURES).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from edgeflow.core.suggest import did_you_mean

FixKind = Literal["op", "check", "finding", "capture"]

# The precheck's findings that are not about one operator (its table writes "(name)").
FINDINGS: dict[str, str] = {
    "model": "the ONNX checker or strict shape inference rejects the model",
    "opset": "the opset, or an operator's version, has no kernel in the target",
    "inputs": "dynamic input shapes",
    "rank": "tensors above the most dimensions the target's kernels take",
    "float64": "float64 tensors, or an operator without a float64 kernel",
    "float16": "float16 tensors",
    "int64": "an operator without a kernel for its int64 inputs",
    "ram": "the arena does not fit the board's RAM",
    "flash": "the weights do not fit the board's flash",
    "memory": "tensors without a static size: the arena cannot be estimated",
}

# The classes of capture failure `edgeflow explain` reports, with the cause it prints.
CAPTURES: dict[str, str] = {
    "nonzero": "nonzero / boolean-mask indexing gives a data-dependent size",
    "item": "a tensor value is turned into a Python number (.item(), int(), float())",
    "float64": "float64 values",
    "shape": "a branch or size decided by a tensor's shape",
    "loop": "a loop over a traced value or a module list",
    "tensor_if": "data-dependent control flow (a Python if/while on tensor values)",
    "unsupported": "an operator the exporter does not support",
    "baked_branch": "traced, but a Python branch on a tensor value was baked in as a constant",
}


@dataclass(frozen=True)
class Fix:
    """One operator, failed check, precheck finding or capture failure a rule removes."""

    kind: FixKind
    name: str  # the operator (op, check), the finding, or the capture failure class
    constraint: str = ""  # the checker (check only)

    def __post_init__(self) -> None:
        if self.kind not in get_args(FixKind):
            raise ValueError(
                f"unknown Fix kind '{self.kind}': {did_you_mean(self.kind, get_args(FixKind))}"
            )
        known = {"finding": FINDINGS, "capture": CAPTURES}.get(self.kind)
        if known is not None and self.name not in known:
            raise ValueError(f"unknown {self.kind} '{self.name}': {did_you_mean(self.name, known)}")
        if not self.name:
            raise ValueError(f"a {self.kind} Fix needs a name")
        if (self.kind == "check") != bool(self.constraint):
            raise ValueError("a constraint goes with a check Fix, and only with one")

    @classmethod
    def op(cls, op_type: str) -> Fix:
        return cls("op", op_type)

    @classmethod
    def check(cls, op_type: str, constraint: str) -> Fix:
        return cls("check", op_type, constraint)

    @classmethod
    def finding(cls, name: str) -> Fix:
        return cls("finding", name)

    @classmethod
    def capture(cls, name: str) -> Fix:
        return cls("capture", name)

    def __str__(self) -> str:
        if self.kind == "check":
            return f"{self.name}: {self.constraint}"
        return f"({self.name})" if self.kind == "finding" else self.name
