"""Positions in the forward: `index(n)` as 0 .. N − 1 made from the run-time size, a stored table
read at its first N entries (a maximum-length table at the run-time length), and a table read
along one axis at an integer position of legs (relative position bias) as a gather, never as a
one-hot contraction.
Guarantees: each is made once per program and size; nothing is stored at a maximum length
unless the design declares it so; a gather's cost is one read per result entry."""

from __future__ import annotations

from itertools import pairwise

import sympy

from ..graph import DesignGraph
from ..ir import Gather, Position, Tensor, TensorRef, walk
from .base import _renamed
from .program import (
    GatherAt,
    Operand,
    Positions,
    PositionTensor,
    Reshape,
    Slice,
    SplitTable,
    Step,
    Value,
    show_legs,
)


class PositionLowering:
    """Lowers index(n), sliced tables and gathers."""

    def like_input(self) -> str | None:
        inputs = [t.name for t in self.g.inputs]
        return self.input_vars[inputs[0]] if inputs else None

    def positions(self, legs: tuple[str, ...]) -> Value:
        """index(n) over region legs `legs` (the pieces of n, head-major, when it is split)."""
        key = ("positions", tuple(self.size(leg) for leg in legs))
        if key not in self.memo:
            name = self.names.fresh("index")
            out = Value(name, legs)
            sizes = " ".join(str(self.size(leg)) for leg in legs)
            self.emit(
                Step(
                    "positions",
                    Positions(self.shape(legs), self.like_input()),
                    out,
                    f"positions 0 .. {sizes} - 1",
                    elementwise=self.numel(legs),
                )
            )
            self.memo[key] = (out, legs)
        value, earlier = self.memo[key]
        return _renamed(value, dict(zip(earlier, legs, strict=True)))

    def sliced(self, tensor: Tensor, ref: TensorRef, axes: tuple[tuple[str, ...], ...]) -> Value:
        """`P[n: N, f]`: the first N entries of P's axis, a view of the stored table; an axis the
        design splits into pieces (RoPE's `(s p)` on a slice of a fused weight) is cut first, then
        viewed as its pieces, head-major, as an unsliced table is."""
        legs = tuple(p for axis in axes for p in axis)
        whole = self.table_slice(tensor, ref)
        if all(len(axis) == 1 for axis in axes):
            return _renamed(whole, dict(zip(whole.legs, legs, strict=True)))
        key = ("slice pieces", tensor.name, ref.slices, ref.offsets, tuple(self.shape(axis) for axis in axes))
        if key not in self.memo:
            out = Value(self.names.fresh(f"{tensor.name}_view"), legs)
            shown = " ".join(show_legs(legs))
            self.emit(Step("view", Reshape(whole, self.shape(legs)), out, f"view {tensor.name} with legs {shown}"))
            self.memo[key] = (out, legs)
        value, earlier = self.memo[key]
        return _renamed(value, dict(zip(earlier, legs, strict=True)))

    def table_slice(self, tensor: Tensor, ref: TensorRef) -> Value:
        """The slice of a stored table that `ref` reads (its first entries, or a range a..b at an
        offset), one leg per axis, made once per program: a view, never a copy."""
        key = ("slice", tensor.name, ref.slices, ref.offsets)
        if key not in self.memo:
            base = self.tensor_var(tensor)
            cut = [k for k, extent in enumerate(ref.slices) if extent is not None]
            dims = tuple((k, self.runtime(ref.slices[k]), self.runtime(tensor.axes[k].size)) for k in cut)
            starts = tuple(self.runtime(ref.offset(k)) for k in cut) if ref.offsets else ()
            legs = tuple(
                self.new_leg(axis.leg, axis.size if extent is None else extent)
                for extent, axis in zip(ref.slices, tensor.axes, strict=True)
            )
            name = self.names.fresh(f"{tensor.name}_{'part' if ref.offsets else 'first'}")
            shown = ", ".join(f"{tensor.axes[k].leg}: {_cut_text(ref, k)}" for k in cut)
            labels = tuple((tensor.axes[k].leg, _cut_text(ref, k), str(tensor.axes[k].size)) for k in cut)
            out = Value(name, legs)
            parts = self.table_pieces(tensor, cut[0], ref) if len(cut) == 1 else None
            source, piece = parts if parts is not None else (Value(base, ()), None)
            op = Slice(source, dims, tensor.name, labels, starts, piece)
            self.emit(Step("slice", op, out, f"{tensor.name}[{shown}]"))
            self.memo[key] = (out, legs)
        return self.memo[key][0]

    def table_pieces(self, tensor: Tensor, axis: int, ref: TensorRef) -> tuple[Value, int] | None:
        """(the pieces, the index of `ref`'s range among them) where the design reads the table
        in two or more distinct ranges along `axis`, none overlapping another, at sizes known when
        planning (a fused QKV weight read as its parts): the table is split once, so its gradient
        is joined once. None otherwise (plain slices)."""
        ranges = set()
        for use in _table_uses(self.g, tensor.name):
            cut = [k for k, extent in enumerate(use.slices) if extent is not None]
            if cut != [axis]:
                continue
            start, extent = self.runtime(use.offset(axis)), self.runtime(use.slices[axis])
            if not (start.is_Integer and extent.is_Integer):
                return None
            ranges.add((int(start), int(start) + int(extent)))
        size = self.runtime(tensor.axes[axis].size)
        ordered = sorted(ranges)
        if len(ordered) < 2 or not size.is_Integer or any(a[1] > b[0] for a, b in pairwise(ordered)):
            return None
        bounds = sorted({0, int(size), *(b for r in ordered for b in r)})
        key = ("table pieces", tensor.name, axis)
        if key not in self.memo:
            sizes = tuple(sympy.Integer(b - a) for a, b in pairwise(bounds))
            out = Value(self.names.fresh(f"{tensor.name}_parts"), ())
            shown = ", ".join(f"{a}..{b}" for a, b in pairwise(bounds))
            op = SplitTable(Value(self.tensor_var(tensor), ()), axis, sizes)
            self.emit(Step("split", op, out, f"{tensor.name} split along {tensor.axes[axis].leg}: {shown}"))
            self.memo[key] = (out, ())
        start = int(self.runtime(ref.offset(axis)))
        return self.memo[key][0], bounds.index(start)

    def position_tensor(self, position: Position, ren: dict[str, tuple[str, ...]]) -> Value:
        """The integer position over its region legs."""
        renamed = _rename_position(position, {leg: ren[leg][0] for leg in position.legs()}, self.runtime)
        legs = renamed.legs()
        name = self.names.fresh("position")
        out = Value(name, legs)
        self.emit(
            Step(
                "positions",
                PositionTensor(renamed, legs, self.shape(legs), self.like_input()),
                out,
                f"position {position}",
                elementwise=self.numel(legs),
            )
        )
        return out

    def lower_gather(self, e: Gather, ren: dict[str, tuple[str, ...]], var: str | None) -> Value:
        """The table read along its axis at the position: one read per result entry."""
        for leg in (e.axis, *e.position.legs()):  # type: ignore[union-attr]
            if len(ren[leg]) != 1:
                raise AssertionError("a gathered axis or position leg is never split into pieces")
        table = self.lower(e.source, ren)  # type: ignore[arg-type]
        axis = ren[e.axis][0]
        index = self.position_tensor(e.position, ren)  # type: ignore[arg-type]
        others = tuple(leg for leg in table.legs if leg != axis)
        out = Value(self.names.fresh(var or f"{e.source.name}_at"), (*others, *index.legs))  # type: ignore[union-attr]
        return self.emit(
            Step(
                "gather",
                GatherAt(Operand(table), table.legs.index(axis), index),
                out,
                f"{e.source.name} at {e.position} -> [{' '.join(show_legs(out.legs))}]",  # type: ignore[union-attr]
                elementwise=self.numel(out.legs),
                inputs=(table, index),
            )
        )  # type: ignore[return-value]


def _rename_position(position: Position, names: dict[str, str], runtime) -> Position:
    """The position over region legs, its sizes known at build time replaced by numbers."""
    if position.op == "leg":
        return Position("leg", name=names[position.name])
    if position.op == "number":
        return Position("number", value=runtime(position.value))
    operands = tuple(_rename_position(o, names, runtime) for o in position.operands)
    return Position(position.op, position.name, position.value, operands)


def _cut_text(ref: TensorRef, k: int) -> str:
    """Axis k's slice as the .td writes it: `N` (the first N entries) or `a..b`."""
    extent, start = ref.slices[k], ref.offset(k)
    return str(extent) if start == 0 else f"{start}..{start + extent}"


def _table_uses(graph: DesignGraph, name: str) -> list[TensorRef]:
    """Every use of tensor `name` in the design's statements and updates."""
    exprs = [s.expr for s in [*graph.statements, *graph.updates]]
    return [e for expr in exprs for e in walk(expr) if isinstance(e, TensorRef) and e.name == name]
