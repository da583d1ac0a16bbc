"""Weights from linear layers: a compiled design's leg-shaped tensors to and from the [out, in]
matrices that nn.Linear, Hugging Face checkpoints and LoRA tooling use (issue 25).

A design stores `WQ[f, h, d]`; a checkpoint stores `q_proj.weight` as a matrix whose rows are the
output features (head-major: h, then d) and whose columns are the input features f. Naming which
legs form the columns (and, if not the rest in axis order, the rows) is all it takes to move
between the two, checked against the module's shapes:

    tdiag.load_linear(module, "WQ", q_proj.weight, cols="f")             # rows: h d
    tdiag.load_linear(module, "WO", o_proj.weight, cols="h e")           # rows: g
    tdiag.load_linear(module, ["WQ", "WK", "WV"], c_attn.weight.T, cols="f")   # fused, GPT-2's Conv1D
    tdiag.load_linear(module, "bq", q_proj.bias, cols="")                # a bias: a vector
    q_proj.weight.copy_(tdiag.linear_weight(module, "WQ", cols="f"))    # and back

Rows and columns flatten their legs row-major, first leg slowest, as `view` does. Several names
stand for a fused matrix whose rows are each tensor's rows in turn (query, key, value); they share
the column legs, and a leg has one size in a design, so they share the columns too. Works on
the in-process module and on a `tdiag compile` file alike: both carry their tensors' legs as the
class attribute `tdiag_legs`. torch is imported on use only."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["linear_weight", "load_linear"]


@dataclass(frozen=True)
class MatrixLayout:
    """How one stored tensor lies in a matrix: its legs in axis order, the legs (in order) that
    flatten into rows and into columns, and their sizes."""

    name: str
    legs: tuple[str, ...]
    rows: tuple[str, ...]
    cols: tuple[str, ...]
    sizes: dict[str, int]

    @property
    def shape(self) -> tuple[int, ...]:
        """(out, in), or (out,) when no leg forms columns (a bias)."""
        row_count = math.prod(self.sizes[leg] for leg in self.rows)
        if not self.cols:
            return (row_count,)
        return (row_count, math.prod(self.sizes[leg] for leg in self.cols))

    def to_tensor_order(self) -> list[int]:
        """The permutation from (rows..., cols...) to the tensor's axis order."""
        written = (*self.rows, *self.cols)
        return [written.index(leg) for leg in self.legs]

    def to_matrix_order(self) -> list[int]:
        """The permutation from the tensor's axis order to (rows..., cols...)."""
        return [self.legs.index(leg) for leg in (*self.rows, *self.cols)]


def load_linear(
    module: torch.nn.Module,
    names: str | Sequence[str],
    weight: torch.Tensor,
    *,
    cols: str,
    rows: str | Sequence[str] | None = None,
) -> None:
    """Copy `weight` ([out, in], or a vector for `cols=""`) into the named stored tensor(s) of a
    compiled design, in place and without gradient; its dtype and device are the module's."""
    import torch

    layouts = _layouts(module, names, cols, rows)
    _check_weight(weight, layouts)
    pieces = torch.split(weight, [layout.shape[0] for layout in layouts], dim=0)
    with torch.no_grad():
        for layout, piece in zip(layouts, pieces, strict=True):
            grid = piece.reshape([layout.sizes[leg] for leg in (*layout.rows, *layout.cols)])
            _stored(module, layout.name).copy_(grid.permute(layout.to_tensor_order()))


def linear_weight(
    module: torch.nn.Module,
    names: str | Sequence[str],
    *,
    cols: str,
    rows: str | Sequence[str] | None = None,
) -> torch.Tensor:
    """The named stored tensor(s) as one [out, in] matrix (a vector for `cols=""`), detached: the
    inverse of load_linear, for writing a design's weights back into nn.Linear layers."""
    import torch

    layouts = _layouts(module, names, cols, rows)
    matrices = [
        _stored(module, layout.name).detach().permute(layout.to_matrix_order()).reshape(layout.shape)
        for layout in layouts
    ]
    return torch.cat(matrices, dim=0)


def _layouts(
    module: torch.nn.Module, names: str | Sequence[str], cols: str, rows: str | Sequence[str] | None
) -> list[MatrixLayout]:
    all_legs = getattr(module, "tdiag_legs", None)
    if not isinstance(all_legs, dict):
        raise TypeError(
            f"module: expected a module compiled by tdiag (it has no tdiag_legs), got {type(module).__name__}"
        )
    names = [names] if isinstance(names, str) else list(names)
    if not names:
        raise ValueError("names: expected at least one stored tensor's name")
    if rows is None or isinstance(rows, str):
        row_specs = [rows] * len(names)
    else:
        row_specs = list(rows)
        if len(row_specs) != len(names):
            raise ValueError(f"rows: {len(row_specs)} row specifications for {len(names)} names")
    if not isinstance(cols, str):
        raise TypeError(f"cols: expected a string of legs such as 'f', got {type(cols).__name__}")
    layouts = [_layout(module, all_legs, name, cols, spec) for name, spec in zip(names, row_specs, strict=True)]
    return layouts


def _layout(module: torch.nn.Module, all_legs: dict, name: str, cols: str, rows: str | None) -> MatrixLayout:
    if name not in all_legs:
        known = ", ".join(all_legs) or "none"
        raise KeyError(f"names: {name!r} is not a stored tensor of this design (it has {known})")
    legs = tuple(all_legs[name])
    sizes = dict(zip(legs, _stored(module, name).shape, strict=True))
    col_legs = _legs_of(cols, "cols", name, legs)
    if rows is None:
        row_legs = tuple(leg for leg in legs if leg not in col_legs)
    else:
        row_legs = _legs_of(rows, "rows", name, legs)
    both = set(row_legs) & set(col_legs)
    if both:
        raise ValueError(f"rows and cols: leg {sorted(both)[0]!r} of {name} is named in both")
    missing = [leg for leg in legs if leg not in row_legs and leg not in col_legs]
    if missing:
        raise ValueError(f"rows: {name}[{' '.join(legs)}] leaves leg {missing[0]!r} in neither rows nor cols")
    return MatrixLayout(name, legs, row_legs, col_legs, sizes)


def _legs_of(spec: str, argument: str, name: str, legs: tuple[str, ...]) -> tuple[str, ...]:
    written = tuple(spec.replace(",", " ").split())
    for leg in written:
        if leg not in legs:
            raise ValueError(f"{argument}: {name}[{' '.join(legs)}] has no leg {leg!r}")
    repeated = {leg for leg in written if written.count(leg) > 1}
    if repeated:
        raise ValueError(f"{argument}: leg {sorted(repeated)[0]!r} is named twice")
    return written


def _check_weight(weight: torch.Tensor, layouts: list[MatrixLayout]) -> None:
    import torch

    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight: expected a torch.Tensor, got {type(weight).__name__}")
    expected = (sum(layout.shape[0] for layout in layouts), *layouts[0].shape[1:])
    if tuple(weight.shape) != expected:
        parts = " + ".join(f"{layout.name} ({' '.join(layout.rows)}: {layout.shape[0]})" for layout in layouts)
        columns = f" and {expected[1]} columns ({' '.join(layouts[0].cols)})" if len(expected) == 2 else ""
        raise ValueError(f"weight: expected shape {expected} — rows {parts}{columns} — got {tuple(weight.shape)}")


def _stored(module: torch.nn.Module, name: str) -> torch.Tensor:
    return getattr(module, name)
