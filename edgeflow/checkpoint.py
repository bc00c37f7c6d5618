"""PyTorch checkpoints as projects ship them: find the state_dict in the file (under a key,
nested, behind a wrapper's `module.` prefix), fit it to the module, and say what was done."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeflow.core.errors import EdgeflowError, first_line

if TYPE_CHECKING:
    import torch

WEIGHTS_HINT = "save a state_dict with torch.save(model.state_dict(), path)"
FIT_HINT = "check source.init (sizes) and that the file is this model's state_dict"
# Prefixes a wrapper puts on every key of the state_dict it saves; stripped where the
# module's own keys do not start with them.
WRAPPERS = {"module.": "DataParallel/DistributedDataParallel", "_orig_mod.": "torch.compile"}
DEPTH = 3  # how deep a state_dict is looked for in a checkpoint's dicts
SHOWN = 5  # keys named per list in a message


class WeightsError(EdgeflowError):
    """A checkpoint that gives the module no weights; `key` is the recipe key to change."""

    def __init__(self, message: str, hint: str | None, key: str = "source.weights") -> None:
        super().__init__(message, hint)
        self.key = key


def load_weights(module: torch.nn.Module, path: Path, weights_key: str | None, what: str) -> str:
    """Load the state_dict in the checkpoint at `path` (torch.load, weights_only=True) into
    `module` (`what` names it in messages); a note of where it was found and what was
    stripped, "" for a plain state_dict that fits as it is."""
    import torch

    problem = checkpoint_problem(path)
    if problem:
        raise WeightsError(f"weights {path.name} {problem}", WEIGHTS_HINT)
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch's unpickler and zip reader: the file's fault
        raise WeightsError(
            f"cannot load weights {path.name} ({type(exc).__name__}): {first_line(exc)}",
            WEIGHTS_HINT,
        ) from exc
    expected = module.state_dict()
    state, where = find_state_dict(checkpoint, weights_key, path.name, set(expected))
    state, stripped = unwrapped(state, set(expected))
    try:  # the module judges first: its own loading hooks may resize buffers (FakeQuantize)
        module.load_state_dict(state, strict=True)
    except (RuntimeError, TypeError, ValueError, AttributeError, KeyError) as exc:
        misfit = fit_problems(state, expected) or str(exc)[:800]
        others = [
            p
            for p in state_dicts(checkpoint)
            if p != where and fits(lookup(checkpoint, p)[0], set(expected))
        ]
        hint = f"source.weights_key: {others[0]}" if others else FIT_HINT
        raise WeightsError(
            f"weights {path.name}{f' (under {where!r})' if where else ''} do not fit {what}: "
            f"{misfit}; the file holds {outline(checkpoint)}",
            hint,
            "source.weights_key" if weights_key else "source.weights",
        ) from exc
    notes = []
    if where and not weights_key:
        notes.append(f"the state_dict under {where!r} (the file holds {outline(checkpoint)})")
    for prefix in stripped:
        by = f" ({WRAPPERS[prefix]})" if prefix in WRAPPERS else ""
        notes.append(f"the prefix {prefix!r}{by} stripped from its {len(state)} keys")
    return f"weights {path.name}: loaded " + "; ".join(notes) if notes else ""


def checkpoint_problem(path: Path) -> str | None:
    """What makes `path` no PyTorch checkpoint, from its first bytes (None: it may be one):
    torch.save writes a zip archive, before PyTorch 1.6 a pickle."""
    from edgeflow.core.filekinds import ZIP_MAGICS, what_file

    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError as exc:
        return f"cannot be opened: {exc.strerror or first_line(exc)}"
    if head.startswith(ZIP_MAGICS) or head[:1] == b"\x80":
        return None
    return (
        "is not a PyTorch checkpoint (torch.save writes a zip archive, or before PyTorch 1.6 "
        f"a pickle): {what_file(head)}"
    )


def is_state_dict(value: object) -> bool:
    """A dict of tensors by name (a module's `_extra_state` may be anything)."""
    import torch

    return (
        isinstance(value, Mapping)
        and bool(value)
        and all(isinstance(k, str) for k in value)
        and all(isinstance(v, torch.Tensor) or k.endswith("_extra_state") for k, v in value.items())
        and any(isinstance(v, torch.Tensor) for v in value.values())
    )


def state_dicts(checkpoint: object, at: str = "", depth: int = DEPTH) -> list[str]:
    """The dotted keys of the state_dicts a checkpoint holds ("" for the file itself), through
    dicts with string keys only: an optimizer's per-parameter state is keyed by number."""
    if is_state_dict(checkpoint):
        return [at]
    if depth == 0 or not isinstance(checkpoint, Mapping):
        return []
    found = []
    for key, value in checkpoint.items():
        if isinstance(key, str):
            found += state_dicts(value, f"{at}.{key}" if at else key, depth - 1)
    return found


def lookup(checkpoint: object, dotted: str) -> tuple[object, str | None]:
    """The value at a dotted key, and None; or the last value reached and the part not found
    there. A key that holds dots itself is matched whole first."""
    value, rest = checkpoint, dotted
    while rest:
        if not isinstance(value, Mapping):
            return value, rest
        parts = rest.split(".")
        for n in range(len(parts), 0, -1):  # the longest key first
            key = ".".join(parts[:n])
            if key in value:
                value, rest = value[key], ".".join(parts[n:])
                break
        else:
            return value, parts[0]
    return value, None


def find_state_dict(
    checkpoint: object, weights_key: str | None, name: str, expected: set[str]
) -> tuple[Mapping[str, Any], str]:
    """The state_dict in a checkpoint and its dotted key ("" for the file itself): at
    `weights_key`, else the file's one state_dict, else of several the one whose keys are
    the module's (`expected`); several that fit as well are refused, named."""
    found = state_dicts(checkpoint)
    fitting = [p for p in found if fits(lookup(checkpoint, p)[0], expected)]
    if weights_key is not None:
        value, missing = lookup(checkpoint, weights_key)
        hint = (
            f"source.weights_key: {(fitting or found)[0]}"
            if found and (fitting or found)[0]
            else "remove source.weights_key (the file is a state_dict)"
        )
        if missing is not None:
            reached = weights_key[: -len(missing)].rstrip(".") if missing != weights_key else ""
            inside = f"'{reached}' holds" if reached else "the file holds"
            raise WeightsError(
                f"weights {name} have no key '{missing}' (got {weights_key!r}): {inside} "
                f"{outline(value)}",
                hint,
                "source.weights_key",
            )
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise WeightsError(
                f"weights {name}: '{weights_key}' holds {outline(value)}, not a state_dict",
                hint,
                "source.weights_key",
            )
        return value, weights_key
    if "" in found:
        assert isinstance(checkpoint, Mapping)
        return checkpoint, ""
    if len(found) == 1 or len(fitting) == 1:
        where = found[0] if len(found) == 1 else fitting[0]
        value = lookup(checkpoint, where)[0]
        assert isinstance(value, Mapping)
        return value, where
    if found:
        listed = ", ".join(f"'{p}' ({kind(lookup(checkpoint, p)[0], 0)})" for p in found)
        raise WeightsError(
            f"weights {name} hold {len(found)} state_dicts: {listed}; which one is the model's "
            "is not clear",
            f"source.weights_key: {(fitting or found)[0]}",
        )
    raise WeightsError(
        f"weights {name} hold no state_dict (a dict of tensors by name): the file holds "
        f"{outline(checkpoint)}",
        WEIGHTS_HINT,
    )


def fits(state: Any, expected: set[str]) -> bool:
    """Whether a state_dict's keys, unwrapped, are the module's."""
    return set(unwrapped(state, expected)[0]) == expected


def unwrapped(state: Mapping[str, Any], expected: set[str]) -> tuple[dict[str, Any], list[str]]:
    """`state` without the prefixes every one of its keys shares and the module's keys do
    not: a wrapper's (`module.`), or any that makes its keys the module's exactly (a
    Lightning module's `model.`). Returns the stripped prefixes too."""
    keys = list(state)
    chain: list[str] = []  # the leading name parts every key shares
    while keys:
        head = keys[0][len("".join(chain)) :].split(".")[0] + "."
        prefix = "".join(chain) + head
        if head == "." or not all(k.startswith(prefix) and len(k) > len(prefix) for k in keys):
            break
        chain.append(head)
    for n in range(len(chain) + 1):  # the fewest stripped that give the module's keys
        cut = len("".join(chain[:n]))
        if {k[cut:] for k in keys} == expected:
            return {k[cut:]: v for k, v in state.items()}, chain[:n]
    wrappers: list[str] = []
    for head in chain:  # no exact fit: strip the wrappers' prefixes at least
        if head not in WRAPPERS or any(k.startswith("".join(wrappers) + head) for k in expected):
            break
        wrappers.append(head)
    cut = len("".join(wrappers))
    return {k[cut:]: v for k, v in state.items()}, wrappers


def fit_problems(state: Mapping[str, Any], expected: Mapping[str, torch.Tensor]) -> str:
    """Why `state` does not fit a module whose state_dict is `expected`: its missing and
    unexpected keys and the tensors of another shape, counted, the first few named."""
    import torch

    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    shapes = [
        f"{k}: file {list(state[k].shape)}, model {list(v.shape)}"
        for k, v in expected.items()
        if k in state and isinstance(state[k], torch.Tensor) and state[k].shape != v.shape
    ]
    problems = []
    if missing:
        problems.append(
            f"{len(missing)} of the model's {len(expected)} keys missing {named(missing)}"
        )
    if unexpected:
        problems.append(f"{plural(len(unexpected), 'unexpected key')} {named(unexpected)}")
    if shapes:
        problems.append(f"{plural(len(shapes), 'tensor')} of another shape {named(shapes)}")
    return "; ".join(problems)


def plural(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def named(items: list[str]) -> str:
    more = f", ... {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    return "(" + ", ".join(items[:SHOWN]) + more + ")"


def outline(value: object) -> str:
    """What a checkpoint (or a value in it) holds, for messages: its keys and what each
    holds, two levels deep, a state_dict by its size."""
    if isinstance(value, Mapping) and value and not is_state_dict(value):
        return "keys " + entries(value, 1)
    return "a " + kind(value, 1)


def entries(mapping: Mapping[Any, Any], depth: int) -> str:
    shown = [f"{k} ({kind(v, depth)})" for k, v in list(mapping.items())[:12]]
    more = f", ... {len(mapping) - 12} more" if len(mapping) > 12 else ""
    return ", ".join(shown) + more


def kind(value: object, depth: int) -> str:
    import torch

    if is_state_dict(value):
        assert isinstance(value, Mapping)
        return f"state_dict of {len(value)} tensors"
    if isinstance(value, torch.Tensor):
        return f"tensor {list(value.shape)}"
    if isinstance(value, Mapping):
        if not value:
            return "empty dict"
        if depth == 0:
            keys = [str(k) for k in list(value)[:6]]
            return "dict: " + ", ".join(keys) + (", ..." if len(value) > 6 else "")
        return "dict: " + entries(value, depth - 1)
    return type(value).__name__
