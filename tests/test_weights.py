"""PyTorch checkpoints as projects ship them (edgeflow.checkpoint): a state_dict under a key,
nested, behind DataParallel's `module.` prefix, picked by source.weights_key; refusals that
name what the file holds, with hints that work as printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from edgeflow.checkpoint import FIT_HINT, WeightsError, load_weights
from edgeflow.core.errors import EdgeflowError, RecipeError
from edgeflow.engine.keys import recipe_slice
from edgeflow.recipe import load_recipe
from edgeflow.report.markdown import load_lines
from edgeflow.source import build_module
from edgeflow.stages import STAGES
from edgeflow.stages.base import WARNINGS_FILE, StageContext


class Net(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


X = torch.rand(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))

RECIPE = """
source:
  kind: pytorch
  model: tests.test_weights:Net
  weights: ckpt.pt
  inputs: [{name: image, shape: [1, 1, 8, 8]}]
evaluation: {dataset: "edgeflow.datasets:sklearn_digits", split: test}
target: onnxruntime_micro
"""


def trained(seed: int, classes: int = 10) -> Net:
    """A Net whose weights and BatchNorm statistics differ from a fresh one's."""
    torch.manual_seed(seed)
    net = Net(classes)
    with torch.no_grad():
        net.bn.running_mean.uniform_(-1, 1)
        net.bn.running_var.uniform_(0.5, 2)
        net.bn.num_batches_tracked.fill_(seed + 10)
    return net.eval()


def optimizer_state(net: Net) -> dict:
    """An Adam optimizer's state_dict after one step: its per-parameter tensors keyed by number."""
    opt = torch.optim.Adam(net.parameters())
    net(X).sum().backward()
    opt.step()
    return opt.state_dict()


def loads_as(path: Path, original: Net, weights_key: str | None = None) -> str:
    """Load `path` into a fresh Net; its outputs are the original's exactly. The note."""
    fresh = Net(original.fc.out_features).eval()
    assert not torch.equal(fresh(X), original(X))
    note = load_weights(fresh, path, weights_key, "tests.test_weights:Net")
    assert torch.equal(fresh(X), original(X))
    assert all(
        torch.equal(a, b)
        for a, b in zip(fresh.state_dict().values(), original.state_dict().values(), strict=True)
    )
    return note


def test_a_plain_state_dict_loads_as_before(tmp_path: Path) -> None:
    net = trained(1)
    torch.save(net.state_dict(), tmp_path / "w.pt")
    assert loads_as(tmp_path / "w.pt", net) == ""


@pytest.mark.parametrize(
    "key", ["state_dict", "model_state_dict", "model", "net", "ema", "state", "weights", "params"]
)
def test_a_state_dict_under_a_common_key_loads_with_a_note(tmp_path: Path, key: str) -> None:
    net = trained(2)
    checkpoint = {key: net.state_dict(), "epoch": 7, "optimizer": optimizer_state(trained(3))}
    torch.save(checkpoint, tmp_path / "ckpt.pt")
    note = loads_as(tmp_path / "ckpt.pt", net)
    assert note.startswith(f"weights ckpt.pt: loaded the state_dict under '{key}' (the file holds ")
    assert f"{key} (state_dict of {len(net.state_dict())} tensors), epoch (int)" in note


def test_a_state_dict_nested_two_deep_loads_with_weights_key(tmp_path: Path) -> None:
    net, other = trained(4), trained(5)
    checkpoint = {"checkpoint": {"model": net.state_dict(), "step": 3}, "ema": other.state_dict()}
    torch.save(checkpoint, tmp_path / "ckpt.pt")
    assert loads_as(tmp_path / "ckpt.pt", net, "checkpoint.model") == ""
    assert loads_as(tmp_path / "ckpt.pt", other, "ema") == ""


def test_dataparallels_prefix_is_stripped_with_a_note(tmp_path: Path) -> None:
    net = trained(6)
    wrapped = nn.DataParallel(net).state_dict()
    assert all(k.startswith("module.") for k in wrapped)
    torch.save({"model": wrapped, "epoch": 1}, tmp_path / "ckpt.pt")
    note = loads_as(tmp_path / "ckpt.pt", net)
    assert "under 'model'" in note
    n = len(net.state_dict())
    assert note.endswith(
        f"the prefix 'module.' (DataParallel/DistributedDataParallel) stripped from its {n} keys"
    )
    torch.save(wrapped, tmp_path / "plain.pt")
    assert loads_as(tmp_path / "plain.pt", net) == (
        f"weights plain.pt: loaded the prefix 'module.' (DataParallel/DistributedDataParallel) "
        f"stripped from its {n} keys"
    )


def test_a_lightning_modules_prefix_is_stripped_where_the_keys_then_fit(tmp_path: Path) -> None:
    net = trained(7)
    state = {f"model.{k}": v for k, v in net.state_dict().items()}
    torch.save({"state_dict": state, "global_step": 9}, tmp_path / "ckpt.pt")
    note = loads_as(tmp_path / "ckpt.pt", net)
    assert "under 'state_dict'" in note and "the prefix 'model.' stripped" in note


def test_two_state_dicts_that_fit_are_refused_naming_both(tmp_path: Path) -> None:
    torch.save({"model": trained(8).state_dict(), "ema": trained(9).state_dict()}, tmp_path / "c")
    with pytest.raises(WeightsError) as info:
        load_weights(Net(), tmp_path / "c", None, "Net")
    n = len(Net().state_dict())
    assert info.value.message == (
        f"weights c hold 2 state_dicts: 'model' (state_dict of {n} tensors), 'ema' (state_dict "
        f"of {n} tensors); which one "
        "is the model's is not clear"
    )
    assert info.value.hint == "source.weights_key: model" and info.value.key == "source.weights"


def test_the_ambiguity_hint_works_as_printed(tmp_path: Path, write_recipe) -> None:
    """The load stage locates the refusal at source.weights; the hint, pasted into the
    recipe's source section, loads the state_dict it names."""
    net, ema = trained(10), trained(11)
    torch.save({"model": net.state_dict(), "ema": ema.state_dict()}, tmp_path / "ckpt.pt")
    path = write_recipe(RECIPE)
    with pytest.raises(EdgeflowError) as info:
        run_load(path, tmp_path / "a")
    assert info.value.message.startswith(f"{path}:4:12: source.weights: weights ckpt.pt hold 2 ")
    assert info.value.hint == "source.weights_key: model"
    key, value = info.value.hint.split(": ")
    assert load_recipe(path, {key: value}).recipe.source.weights_key == "model"  # as an override
    section, name = key.split(".")  # and as a key of the recipe file
    fixed = write_recipe(RECIPE.replace(f"{section}:\n", f"{section}:\n  {name}: {value}\n"))
    module = build_module(load_recipe(fixed).recipe.source)
    assert torch.equal(module(X), net(X)) and not torch.equal(module(X), ema(X))
    out = run_load(fixed, tmp_path / "b")
    recorded = json.loads((out / "source.json").read_text())
    assert "weights_note" not in recorded and load_lines(recorded) == []
    assert not (out / WARNINGS_FILE).exists()


def test_a_wrong_weights_key_is_located_and_lists_the_keys(tmp_path: Path, write_recipe) -> None:
    net = trained(12)
    torch.save({"model_state_dict": net.state_dict(), "epoch": 4}, tmp_path / "ckpt.pt")
    text = RECIPE.replace("  weights: ckpt.pt\n", "  weights: ckpt.pt\n  weights_key: model\n")
    path = write_recipe(text)
    with pytest.raises(EdgeflowError) as info:
        run_load(path, tmp_path / "a")
    n = len(net.state_dict())
    assert info.value.message == (
        f"{path}:5:16: source.weights_key: weights ckpt.pt have no key 'model' (got 'model'): "
        f"the file holds keys model_state_dict (state_dict of {n} tensors), epoch (int)"
    )
    assert info.value.hint == "source.weights_key: model_state_dict"
    fixed = write_recipe(text.replace("model\n", "model_state_dict\n", 1))
    assert torch.equal(build_module(load_recipe(fixed).recipe.source)(X), net(X))
    # a key further down that is missing: the part not found, and what holds it
    torch.save({"checkpoint": {"net": net.state_dict()}}, tmp_path / "deep.pt")
    with pytest.raises(WeightsError) as deep:
        load_weights(Net(), tmp_path / "deep.pt", "checkpoint.model", "Net")
    assert deep.value.message == (
        "weights deep.pt have no key 'model' (got 'checkpoint.model'): 'checkpoint' holds "
        f"keys net (state_dict of {n} tensors)"
    )
    assert deep.value.hint == "source.weights_key: checkpoint.net"
    assert deep.value.key == "source.weights_key"


def test_a_mismatch_lists_missing_and_unexpected_keys_and_what_the_file_holds(
    tmp_path: Path,
) -> None:
    state = trained(13).state_dict()
    state["head.weight"], state["head.bias"] = state.pop("fc.weight"), state.pop("fc.bias")
    torch.save({"model": state, "epoch": 2}, tmp_path / "ckpt.pt")
    with pytest.raises(WeightsError) as info:
        load_weights(Net(), tmp_path / "ckpt.pt", None, "tests.test_weights:Net")
    n = len(state)
    assert info.value.message == (
        "weights ckpt.pt (under 'model') do not fit tests.test_weights:Net: 2 of the model's "
        f"{n} keys missing (fc.weight, fc.bias); 2 unexpected keys (head.weight, head.bias); "
        f"the file holds keys model (state_dict of {n} tensors), epoch (int)"
    )
    assert info.value.hint == FIT_HINT
    # another size: named with both shapes; where another state_dict in the file fits, the
    # hint names it (one that does not fit, "ema" here, is no fix)
    small = trained(14, classes=5).state_dict()
    torch.save({"model": small, "ema": state}, tmp_path / "c5.pt")
    with pytest.raises(WeightsError) as sized:
        load_weights(Net(), tmp_path / "c5.pt", "model", "Net")
    assert sized.value.hint == FIT_HINT
    torch.save({"model": small, "ema": trained(15).state_dict()}, tmp_path / "c5.pt")
    with pytest.raises(WeightsError) as sized:
        load_weights(Net(), tmp_path / "c5.pt", "model", "Net")
    assert (
        "2 tensors of another shape (fc.weight: file [5, 4], model [10, 4], fc.bias: file [5], "
        "model [10])" in sized.value.message
    )
    assert sized.value.hint == "source.weights_key: ema" and sized.value.key == "source.weights_key"


def test_a_file_without_a_state_dict_says_what_it_holds(tmp_path: Path) -> None:
    torch.save({"epoch": 3, "losses": [0.5, 0.25]}, tmp_path / "c.pt")
    with pytest.raises(WeightsError) as info:
        load_weights(Net(), tmp_path / "c.pt", None, "Net")
    assert info.value.message == (
        "weights c.pt hold no state_dict (a dict of tensors by name): the file holds keys "
        "epoch (int), losses (list)"
    )


def test_weights_key_is_validated_and_part_of_the_load_key(tmp_path: Path, write_recipe) -> None:
    torch.save({"a": {"b": trained(15).state_dict()}}, tmp_path / "ckpt.pt")
    with_key = RECIPE.replace("  weights: ckpt.pt\n", "  weights: ckpt.pt\n  weights_key: a.b\n")
    reads = STAGES["load"].reads
    one = recipe_slice(load_recipe(write_recipe(with_key)), reads)
    other = recipe_slice(load_recipe(write_recipe(with_key.replace("a.b", "a"))), reads)
    assert one["source"]["weights_key"] == "a.b" and one != other
    for bad, says in (
        ("a..b", "5:16: source.weights_key: an empty key or part of a dotted key (got 'a..b')"),
        ("''", "5:16: source.weights_key: an empty key or part of a dotted key (got '')"),
    ):
        with pytest.raises(RecipeError) as info:
            load_recipe(write_recipe(with_key.replace("a.b", bad)))
        assert says in info.value.message, info.value.message
    without = with_key.replace("  weights: ckpt.pt\n", "")
    with pytest.raises(RecipeError) as info:
        load_recipe(write_recipe(without))
    assert "source.weights_key: weights_key: picks the state_dict inside source.weights; no " in (
        info.value.message
    )


def test_the_load_stage_warns_and_records_the_note(tmp_path: Path, write_recipe) -> None:
    net = trained(16)
    torch.save({"net": nn.DataParallel(net).state_dict()}, tmp_path / "ckpt.pt")
    out = run_load(write_recipe(RECIPE), tmp_path / "out")
    [warning] = json.loads((out / WARNINGS_FILE).read_text())
    assert warning.startswith("weights ckpt.pt: loaded the state_dict under 'net' (the file ")
    assert "the prefix 'module.' (DataParallel/DistributedDataParallel) stripped" in warning
    recorded = json.loads((out / "source.json").read_text())
    assert recorded["weights_note"] == warning
    assert load_lines(recorded) == [f"- load: {warning}"]  # the report's line


def run_load(path: Path, out: Path) -> Path:
    out.mkdir()
    stage = STAGES["load"]
    stage.run(StageContext(stage, load_recipe(path), {}, out))
    return out
