"""The reference evaluator: a design graph run statement by statement with `torch.einsum` on fully
materialized tensors. It is the test oracle for the compiler, so it does no planning and no
optimization: every node of every statement is evaluated as written, in the semantics of
docs/language.md. Every value carries arbitrary leading batch dims; its trailing axes are the
legs of the node that computed it, in that node's order."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import sympy
import torch

from .evaluation import EVALUATE
from .graph import DesignGraph
from .ir import (
    CausalMask,
    Expr,
    Mask,
    PaddingMask,
    Statement,
    Tensor,
    TensorRef,
    WindowMask,
)

# ---- sizes and inputs ----------------------------------------------------------------------


def known_sizes(graph: DesignGraph, given: Mapping[str, int]) -> dict[str, int]:
    """Every size that is a number once `given` is substituted (derived sizes recomputed)."""
    for name in given:
        if name not in graph.sizes:
            raise ValueError(f"design {graph.name} has no size {name} (its sizes: {', '.join(graph.sizes)})")
    values = {}
    for name, size in graph.sizes.items():
        value = graph.evaluate(size.symbol, **given)
        if not value.is_number:
            continue
        if not (value.is_Integer and value > 0):
            raise ValueError(f"size {name} = {size.definition} is {value}; a size is a whole positive number")
        if name in given and int(value) != given[name]:
            raise ValueError(f"size {name} = {size.definition} = {value} cannot be set to {given[name]}")
        values[name] = int(value)
    return values


def batch_dims(x: torch.Tensor, tensor: Tensor) -> torch.Size:
    return x.shape[: x.dim() - len(tensor.axes)]


def bind_sizes(graph: DesignGraph, sizes: Mapping[str, int], given: Mapping[str, torch.Tensor]) -> dict[str, int]:
    """Bind free sizes (N) from the inputs' shapes, then check every input axis against its size."""
    bound = dict(sizes)
    for name, x in given.items():
        tensor = graph.tensors[name]
        if x.dim() < len(tensor.axes):
            legs = " ".join(tensor.legs)
            raise ValueError(
                f"{tensor.kind} {name}: expected at least {len(tensor.axes)} dims [..., {legs}], "
                f"got shape {tuple(x.shape)}"
            )
        for axis, actual in zip(tensor.axes, x.shape[x.dim() - len(tensor.axes) :], strict=True):
            if isinstance(axis.size, sympy.Symbol) and axis.size.name not in bound:
                if actual == 0:
                    raise ValueError(f"{tensor.kind} {name}: leg {axis.leg} (size {axis.size}) has no entries")
                bound[axis.size.name] = actual
    bound = known_sizes(graph, bound)
    for name, x in given.items():
        tensor = graph.tensors[name]
        for axis, actual in zip(tensor.axes, x.shape[x.dim() - len(tensor.axes) :], strict=True):
            expected = graph.evaluate(axis.size, **bound)
            if not expected.is_number:
                raise ValueError(f"{tensor.kind} {name}: cannot bind leg {axis.leg} of size {axis.size} from its shape")
            if int(expected) != actual:
                size = str(expected) if axis.size == expected else f"{axis.size} = {expected}"
                raise ValueError(f"{tensor.kind} {name}: leg {axis.leg} has size {size}, got {actual}")
    return bound


# ---- evaluating expressions ----------------------------------------------------------------


@dataclass
class Frame:
    """What one forward pass evaluates against: sizes (with run-time ones bound) and the values
    of every tensor so far, by name."""

    graph: DesignGraph
    sizes: dict[str, int]
    values: dict[str, torch.Tensor]
    dtype: torch.dtype
    device: torch.device
    _leg_sizes: dict[str, int] = field(default_factory=dict)

    def number(self, expr: sympy.Expr) -> float:
        return float(self.graph.evaluate(expr, **self.sizes))

    def leg_size(self, leg: str) -> int:
        if leg not in self._leg_sizes:
            self._leg_sizes[leg] = int(self.graph.evaluate(self.graph.legs[leg].size, **self.sizes))
        return self._leg_sizes[leg]

    def leg_start(self, leg: str) -> int:
        """The position of a leg's first entry: 0 in a whole forward pass; a decoding step
        (tdiag.decode) runs the new queries from the cached length on."""
        return 0

    def leg_indices(self, leg: str) -> torch.Tensor:
        """The positions a leg runs over, int64: leg_start .. leg_start + leg_size − 1."""
        start = self.leg_start(leg)
        return torch.arange(start, start + self.leg_size(leg), device=self.device)

    def value(self, ref: TensorRef) -> torch.Tensor:
        """The value `ref` reads, before slicing and reshaping (a decoding step joins cached rows)."""
        return self.values[ref.name]

    def einsum(self, spec: str, *operands: torch.Tensor) -> torch.Tensor:
        return torch.einsum(spec, *operands)

    def slice_window(self, ref: TensorRef, axis: int, extent: sympy.Expr) -> tuple[int, int]:
        """The first entry and the count that axis `axis` of `ref` reads."""
        return int(self.number(ref.offset(axis))), int(self.number(extent))

    def evaluate(self, node: Expr) -> torch.Tensor:
        """A sub-expression's value in this frame (what a construct's evaluate rule recurses by)."""
        return evaluate(node, self)


def statement_value(statement: Statement, frame: Frame) -> torch.Tensor:
    """`target[groups] = expr`: the expression with its legs in the target's order, each group of
    several legs merged into one axis (head-major)."""
    x = align(evaluate(statement.expr, frame), statement.expr.legs, statement.legs)
    batch = x.shape[: x.dim() - len(statement.legs)]
    return x.reshape((*batch, *(math.prod(frame.leg_size(leg) for leg in group) for group in statement.groups)))


def evaluate(node: Expr, frame: Frame) -> torch.Tensor:
    """A node's value: leading batch dims (possibly none), then one axis per leg of `node.legs`,
    by the evaluate rule of its kind (tdiag/constructs)."""
    return EVALUATE.lookup(node)(node, frame)


def align(x: torch.Tensor, legs: Sequence[str], to: Sequence[str]) -> torch.Tensor:
    """`x` (trailing axes `legs`) with trailing axes `to`: permuted, and a size-1 axis for each
    leg of `to` that `x` lacks, so that it broadcasts along it."""
    legs, to = tuple(legs), tuple(to)
    assert set(legs) <= set(to), f"legs {legs} do not fit in {to}"
    batch = x.dim() - len(legs)
    kept = [leg for leg in to if leg in legs]
    x = x.permute(tuple(range(batch)) + tuple(batch + legs.index(leg) for leg in kept))
    sizes = dict(zip(kept, x.shape[batch:], strict=True))
    return x.reshape((*x.shape[:batch], *(sizes.get(leg, 1) for leg in to)))


def leg_dims(legs: Sequence[str], of: Sequence[str]) -> list[int]:
    """The (negative) dims of `legs` in a tensor whose trailing axes are `of`, whatever its batch dims."""
    return [tuple(of).index(leg) - len(of) for leg in legs]


def masks_allowed(masks: Sequence[Mask], legs: Sequence[str], frame: Frame) -> torch.Tensor | None:
    """True where every mask lets an entry through, over `legs` (broadcast along the legs no
    mask has); None when there is no mask."""
    allowed = None
    for mask in masks:
        if isinstance(mask, CausalMask):
            part = causal_mask(mask, legs, frame)
        elif isinstance(mask, WindowMask):
            part = window_mask(mask, legs, frame)
        elif isinstance(mask, PaddingMask):
            if mask.tensor.name not in frame.values:  # not given: attend everywhere
                continue
            part = align(frame.values[mask.tensor.name], mask.tensor.legs, legs)
        else:
            raise TypeError(f"unknown mask {mask!r}")
        allowed = part if allowed is None else allowed & part
    return allowed


def causal_mask(mask: CausalMask, legs: Sequence[str], frame: Frame) -> torch.Tensor:
    """Key index <= query index, over `legs` (size 1 along the other legs)."""

    def index(leg: str) -> torch.Tensor:
        shape = [-1 if other == leg else 1 for other in legs]
        return frame.leg_indices(leg).reshape(shape)

    return index(mask.key) <= index(mask.query)


def window_mask(mask: WindowMask, legs: Sequence[str], frame: Frame) -> torch.Tensor:
    """query − before < key < query + after, over `legs` (size 1 along the other legs)."""

    def index(leg: str) -> torch.Tensor:
        shape = [-1 if other == leg else 1 for other in legs]
        return frame.leg_indices(leg).reshape(shape)

    offset = index(mask.key) - index(mask.query)
    return (offset > -int(frame.number(mask.before))) & (offset < int(frame.number(mask.after)))
