"""ast.tensor_if_to_where: ifs on tensor values become both branches blended by where."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgeflow.core.errors import EdgeflowError
from edgeflow.rules.ast.tensor_if import TensorIfToWhere
from tests.rules.ast._helpers import apply, check, inputs, specs
from tests.rules.sites import line_of, outcomes

SPECS = specs((2, 4))


class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.fc(x)
        if y.mean().item() > 0:
            z = y * 2
            y = z + 1
        else:
            y = -y
        if x.sum() > 0 and not (x < -2).any():
            y = y / 2
        y = y if x.max() > 0.5 else y * 0.5
        if self.training:
            y = y + 1
        return self.head(y)

    def head(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if (y > 0).any():
            return y.relu(), y
        return y.sigmoid(), -y


AFTER = {
    "Gate.forward": """\
def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = self.fc(x)
    cond = y.mean() > 0
    z_then = y * 2
    y_then = z_then + 1
    y_else = -y
    y = _edgeflow_rt.where(cond, y_then, y_else)
    cond_1 = _edgeflow_rt.all_of(x.sum() > 0, _edgeflow_rt.not_((x < -2).any()))
    y_then_1 = y / 2
    y = _edgeflow_rt.where(cond_1, y_then_1, y)
    y = _edgeflow_rt.where(x.max() > 0.5, y, y * 0.5)
    if self.training:
        y = y + 1
    return self.head(y)
""",
    "Gate.head": """\
def head(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    cond = (y > 0).any()
    return (_edgeflow_rt.where(cond, y.relu(), y.sigmoid()), _edgeflow_rt.where(cond, y, -y))
""",
}


def test_source_before_after_and_numbers() -> None:
    torch.manual_seed(0)
    result = check(TensorIfToWhere, Gate(), SPECS, seeds=20)
    assert result.sources == AFTER
    assert result.matches == 4


@pytest.mark.filterwarnings("ignore")
def test_export_fails_before_and_passes_after() -> None:
    torch.manual_seed(0)
    model = Gate().eval()
    with pytest.raises(Exception, match="data-dependent"):
        torch.export.export(model, inputs(SPECS))
    program = torch.export.export(apply(TensorIfToWhere, model, SPECS).model, inputs(SPECS))
    for seed in range(10):  # both sides of every branch, through the exported graph
        args = inputs(SPECS, seed)
        torch.testing.assert_close(program.module()(*args), model(*args))


class Effects(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hits = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            self.hits.append(1)
        if x.mean() > 0:
            x = x.clamp_(0, 1)
        if x.max() > 1:
            fresh = x * 2
        return x + fresh if x.min() > 0 else x


def test_branches_with_effects_are_kept() -> None:
    result = apply(TensorIfToWhere, Effects(), SPECS)
    assert result.changed  # only the conditional expression
    assert outcomes(result) == [
        ("kept", line_of(Effects, "if x.sum() > 0")),  # a statement other than an assignment
        ("kept", line_of(Effects, "if x.mean() > 0")),  # x.clamp_() changes x in place
        ("kept", line_of(Effects, "if x.max() > 1")),  # fresh is bound in one branch only
        ("changed", "Effects.forward"),  # the conditional expression
    ]


class Shapes(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # noqa: SIM108 - the if statement is what the rule rewrites
            y = x
        else:
            y = x.sum(0)
        return y


def test_branches_of_different_shapes_fail_clearly() -> None:
    model = apply(TensorIfToWhere, Shapes(), SPECS).model
    with pytest.raises(EdgeflowError, match=r"torch.float32\[2, 4\] and torch.float32\[4\]"):
        model(*inputs(SPECS))
