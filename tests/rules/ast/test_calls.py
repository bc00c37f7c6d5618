"""ast.replace_call: a call to one function becomes a call to another, by import path."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgeflow.core.errors import EdgeflowError
from edgeflow.rules.ast.calls import ReplaceCall
from tests.rules.ast._helpers import apply, check, inputs, specs
from tests.rules.sites import outcomes

SPECS = specs((2, 6))
HERE = "tests.rules.ast.test_calls"


def dynamic_count(x: torch.Tensor) -> torch.Tensor:
    """Scale by the number of positive entries: a Python int from a data-dependent size."""
    return x * len(torch.nonzero(x > 0))


def static_count(x: torch.Tensor) -> torch.Tensor:
    return x * torch.count_nonzero(x > 0)


def two_args(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


count = dynamic_count  # an alias: the rule matches the object, not the spelling


class Counting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(count(self.linear(x)))

    def head(self, y: torch.Tensor) -> torch.Tensor:
        return dynamic_count(y) - 1


AFTER = {
    "Counting.forward": """\
def forward(self, x: torch.Tensor) -> torch.Tensor:
    return self.head(static_count(self.linear(x)))
""",
    "Counting.head": """\
def head(self, y: torch.Tensor) -> torch.Tensor:
    return static_count(y) - 1
""",
}
OPTIONS = {"from": f"{HERE}.dynamic_count", "to": f"{HERE}:static_count"}


def test_source_before_after_and_numbers() -> None:
    torch.manual_seed(0)
    result = check(ReplaceCall, Counting(), SPECS, **OPTIONS)
    assert result.sources == AFTER
    assert result.matches == 2


@pytest.mark.filterwarnings("ignore")
def test_export_fails_before_and_passes_after() -> None:
    torch.manual_seed(0)
    model = Counting().eval()
    with pytest.raises(Exception, match="data-dependent"):
        torch.export.export(model, inputs(SPECS))
    rewritten = apply(ReplaceCall, model, SPECS, **OPTIONS).model
    program = torch.export.export(rewritten, inputs(SPECS))
    x = inputs(SPECS, seed=3)
    torch.testing.assert_close(program.module()(*x), model(*x))


def test_replacement_that_cannot_be_imported() -> None:
    options = {"from": OPTIONS["from"], "to": "edgeflow.nowhere:nms_fixed"}
    with pytest.raises(EdgeflowError, match=r"cannot import to 'edgeflow\.nowhere:nms_fixed'"):
        apply(ReplaceCall, Counting(), SPECS, **options)


def test_call_that_does_not_fit_the_replacement_names_the_line() -> None:
    with pytest.raises(EdgeflowError) as info:
        apply(ReplaceCall, Counting(), SPECS, **{"from": OPTIONS["from"], "to": f"{HERE}.two_args"})
    assert "test_calls.py:" in info.value.message
    assert "Counting.forward: the call count(self.linear(x)) does not fit" in info.value.message


def test_no_call_found_is_not_applicable() -> None:
    result = apply(ReplaceCall, Counting(), SPECS, **{"from": "torch.nonzero", "to": OPTIONS["to"]})
    assert not result.changed
    assert outcomes(result) == [("not_applicable", "")]
    assert "Counting.head" in result.sites[0].message  # it names the methods it read
