"""Functions that rewritten code calls as `_edgeflow_rt.<name>(...)`.

Each has fixed output shapes (given its input shapes) and traces with torch.export and
torch.fx. Imported only by the rules' apply (it imports torch), never when recipes load.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Proxy

from edgeflow.core.errors import EdgeflowError

Shape = tuple[int | None, ...]


def check_shapes(
    owner: str, names: tuple[str, ...], tensors: tuple[Any, ...], shapes: tuple[Shape, ...]
) -> None:
    """The guard ast.specialize_shapes puts at the top of forward (None: any size)."""
    for name, tensor, shape in zip(names, tensors, shapes, strict=True):
        if isinstance(tensor, Proxy):
            return  # torch.fx symbolic tracing: shapes are not known, nothing to check
        got = tuple(tensor.shape)
        differ = len(got) != len(shape) or any(
            e is not None and g != e for g, e in zip(got, shape, strict=True)
        )
        if differ:
            wanted = tuple("*" if e is None else e for e in shape)
            raise EdgeflowError(
                f"{owner} was specialised by ast.specialize_shapes for {name} of shape "
                f"{wanted}; called with shape {got}",
                "declare this shape in source.inputs, or remove ast.specialize_shapes",
            )


def where(cond: Any, a: Any, b: Any) -> Any:
    """`a if cond else b` without branching on a tensor condition (ast.tensor_if_to_where)."""
    if not isinstance(cond, torch.Tensor | Proxy):
        return a if cond else b
    tensors = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
    # Checked when the rewrite stage runs the module eagerly; not under the TorchScript
    # tracer, where comparing traced sizes would only add warnings to the export.
    if tensors and not torch.jit.is_tracing() and (a.shape != b.shape or a.dtype != b.dtype):
        raise EdgeflowError(
            f"ast.tensor_if_to_where: the branches give {a.dtype}{list(a.shape)} and "
            f"{b.dtype}{list(b.shape)}; torch.where would broadcast or promote them",
            "make both branches produce the same shape and dtype, or remove the rule",
        )
    return torch.where(_as_bool(cond), a, b)


def all_of(*conds: Any) -> Any:
    """`c1 and c2 and ...` for tensor conditions, as one boolean tensor."""
    result = _as_bool(conds[0])
    for cond in conds[1:]:
        result = torch.logical_and(result, _as_bool(cond))
    return result


def any_of(*conds: Any) -> Any:
    """`c1 or c2 or ...` for tensor conditions, as one boolean tensor."""
    result = _as_bool(conds[0])
    for cond in conds[1:]:
        result = torch.logical_or(result, _as_bool(cond))
    return result


def not_(cond: Any) -> Any:
    """`not c` for a tensor condition."""
    return torch.logical_not(_as_bool(cond))


def _as_bool(cond: Any) -> Any:
    if isinstance(cond, torch.Tensor | Proxy):
        return cond.reshape(()).bool()
    return torch.tensor(bool(cond))


def _full_mask(x: Any, mask: Any, broadcast: bool) -> tuple[Any, Any]:
    """x and the mask expanded to x's shape: `x[mask]` masks x's leading dims;
    `torch.masked_select(x, mask)` (broadcast=True) broadcasts the two."""
    if broadcast:
        x, mask = torch.broadcast_tensors(x, mask)
        return x, mask.bool()
    if mask.dtype != torch.bool or tuple(mask.shape) != tuple(x.shape[: mask.dim()]):
        raise IndexError(
            f"boolean mask of shape {tuple(mask.shape)} does not match the leading dims of "
            f"a tensor of shape {tuple(x.shape)}"
        )
    trailing = (1,) * (x.dim() - mask.dim())
    return x, mask.reshape(*mask.shape, *trailing).expand(x.shape)


def masked_sum(x: Any, mask: Any, broadcast: bool = False) -> Any:
    """`x[mask].sum()` with a fixed shape."""
    x, full = _full_mask(x, mask, broadcast)
    return torch.where(full, x, torch.zeros((), dtype=x.dtype)).sum()


def masked_mean(x: Any, mask: Any, broadcast: bool = False) -> Any:
    """`x[mask].mean()` with a fixed shape (nan when nothing is selected, like the original)."""
    x, full = _full_mask(x, mask, broadcast)
    total = torch.where(full, x, torch.zeros((), dtype=x.dtype)).sum()
    return total / full.sum()


def masked_amax(x: Any, mask: Any, broadcast: bool = False) -> Any:
    """`x[mask].max()` with a fixed shape (the dtype's lowest value when nothing is selected,
    where the original raises)."""
    x, full = _full_mask(x, mask, broadcast)
    return torch.where(full, x, _extreme(x.dtype, lowest=True)).max()


def masked_amin(x: Any, mask: Any, broadcast: bool = False) -> Any:
    """`x[mask].min()` with a fixed shape (the dtype's highest value when nothing is selected)."""
    x, full = _full_mask(x, mask, broadcast)
    return torch.where(full, x, _extreme(x.dtype, lowest=False)).min()


def masked_any(x: Any, mask: Any, broadcast: bool = False) -> Any:
    """`x[mask].any()` with a fixed shape."""
    x, full = _full_mask(x, mask, broadcast)
    return torch.logical_and(full, x != 0).any()


def masked_all(x: Any, mask: Any, broadcast: bool = False) -> Any:
    """`x[mask].all()` with a fixed shape."""
    x, full = _full_mask(x, mask, broadcast)
    return torch.logical_or(torch.logical_not(full), x != 0).all()


def masked_numel(x: Any, mask: Any, broadcast: bool = False) -> Any:
    """`x[mask].numel()` as a 0-d int64 tensor."""
    x, full = _full_mask(x, mask, broadcast)
    return full.sum()


def count_nonzero(mask: Any) -> Any:
    """`len(x[mask])`, `len(torch.nonzero(mask))`: the number of selected rows, a 0-d tensor."""
    return torch.count_nonzero(mask)


def _extreme(dtype: torch.dtype, lowest: bool) -> Any:
    if dtype.is_floating_point:
        return torch.tensor(float("-inf") if lowest else float("inf"), dtype=dtype)
    if dtype == torch.bool:
        return torch.tensor(not lowest)
    info = torch.iinfo(dtype)
    return torch.tensor(info.min if lowest else info.max, dtype=dtype)


def _first_true(flat: Any, size: int) -> tuple[Any, Any]:
    """Positions of the first `size` True entries of a 1-D mask in order, padded with 0,
    and which of them are real: a top-k over descending position ranks (static k)."""
    n = flat.shape[0]
    if n < size:
        flat = torch.cat([flat, flat.new_zeros(size - n)])
    rank = torch.arange(flat.shape[0], 0, -1, dtype=torch.int64)
    values, index = torch.topk(torch.where(flat, rank, 0), size)
    valid = values > 0
    return torch.where(valid, index, 0), valid


def masked_select_padded(
    x: Any, mask: Any, size: int, fill: float = 0.0, broadcast: bool = False
) -> Any:
    """`x[mask]` padded to `size` rows: the selected rows in order, then rows of `fill`.
    More than `size` selected rows: the first `size` are kept."""
    x, full = _full_mask(x, mask, broadcast)
    depth = x.dim() if broadcast else mask.dim()
    rows = x.reshape(-1, *x.shape[depth:])
    index, valid = _first_true(full.reshape(-1) if broadcast else mask.reshape(-1), size)
    out = rows[index]
    valid = valid.reshape(size, *((1,) * (out.dim() - 1)))
    return torch.where(valid, out, torch.full((), fill, dtype=out.dtype))


def nonzero_padded(x: Any, size: int, fill: int = -1) -> Any:
    """`torch.nonzero(x)` padded to `size` rows of `fill`: a (size, x.dim()) int64 tensor.
    More than `size` nonzero elements: the first `size` are kept."""
    index, valid = _first_true((x != 0).reshape(-1), size)
    coords = []
    for dim in reversed(x.shape):
        coords.append(index % dim)
        index = index // dim
    stacked = torch.stack(coords[::-1], dim=1)
    return torch.where(valid.reshape(size, 1), stacked, fill)
