"""Positions in an expression: a slice `P[n: N, f]` that reads a table's first entries, a gather
`Rel[h, r = clamp(m - n, -K, K) + K]` that reads an axis at an integer position of legs (proved in
range before anything runs), and `index(n)`, a leg's positions as a tensor."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import sympy

from .. import parse as syn
from ..errors import a_or_an, did_you_mean
from ..ir import Axis, Expr, Gather, Position, PositionIndex, Tensor, TensorRef
from .sizes import expand_sizes, size_values
from .syntax import UnboundedError, position_bounds, syntax_text
from .vocabulary import POISON_SIZE

if TYPE_CHECKING:
    from .protocols import ExpressionBuilder, GraphBuilder

POSITION_CALLS = {"clamp": 3, "min": 2, "max": 2, "abs": 1, "floor": 1, "log": 1}  # name: arguments
POSITION_HINT = "e.g. Rel[h, r = clamp(m - n, -K, K) + K], or floor(a / b) for integer division"


class Positions:
    """Slices, gathers and index(...) of one statement's expression builder (`owner`,
    expressions.py), whose builder, stand-ins (`poison`) and gathered legs it uses: a part of the
    expression builder, not a base class of it."""

    def __init__(self, owner: ExpressionBuilder):
        self.owner = owner
        self.b = owner.b

    def slice_of(self, item: syn.SlicedLeg, axis: Axis, tensor: Tensor) -> tuple[sympy.Expr, sympy.Expr] | None:
        """`P[n: N, f]`: leg n reads the first N entries of P's axis (a table over a maximum
        length read at the run-time length); `W[h, j: a..b, f]` reads entries a .. b − 1 (a fused
        weight's part at an offset). Gives (start, number of entries). A range that is empty,
        reversed or past a known axis is an error; one that depends on a run-time size is checked
        when the module runs."""
        stop = self.b.scalar_of(item.size, sizes_only=True)
        start = sympy.Integer(0) if item.start is None else self.b.scalar_of(item.start, sizes_only=True)
        if POISON_SIZE in stop.free_symbols | start.free_symbols:
            return None
        if tensor.kind == "derived" and expand_sizes(axis.size, self.b.sizes).free_symbols - set(subs_known(self.b)):
            self.b.error(
                f"a computed tensor is sliced only along an axis of a size known before any input; "
                f"axis {axis.leg} of {tensor.name} is {axis.size}",
                item.span,
                hint=f"slice the stored tables {tensor.name} is computed from, e.g. T[{item.name}: a..b]",
            )
            return None
        if tensor.kind not in ("param", "const", "buffer", "derived"):
            self.b.error(
                f"only a stored table (param, const or buffer) or a computed tensor is sliced; "
                f"{tensor.name} is {a_or_an(tensor.kind)}",
                item.span,
                hint=f"use it with its legs: {tensor.name}[{' '.join(tensor.legs)}]",
            )
            return None
        values = size_values(self.b.sizes)
        subs = {self.b.sizes[k].symbol: v for k, v in values.items()}
        have = expand_sizes(axis.size, self.b.sizes).xreplace(subs)
        want = expand_sizes(stop, self.b.sizes).xreplace(subs)
        first = expand_sizes(start, self.b.sizes).xreplace(subs)
        if item.start is not None:
            return self._range(item, axis, tensor, (start, stop), (first, want, have))
        if want.is_number and not (want.is_integer and want > 0):
            self.b.error(
                f"slice {item.name}: {stop if stop == want else f'{stop} = {want}'} is not a whole positive "
                "number of entries",
                item.span,
                hint=f"a slice reads the first entries of the axis: 1 .. {have}",
            )
            return None
        if have.is_number and want.is_number and want > have:
            self.b.error(
                f"slice {item.name}: {stop} = {want} is longer than axis {axis.leg} of {tensor.name} "
                f"({axis.size} = {have})",
                item.span,
                hint=f"a slice reads the first entries of the axis; at most {have}",
            )
            return None
        return start, stop

    def _range(
        self,
        item: syn.SlicedLeg,
        axis: Axis,
        tensor: Tensor,
        written: tuple[sympy.Expr, sympy.Expr],
        known: tuple[sympy.Expr, sympy.Expr, sympy.Expr],
    ) -> tuple[sympy.Expr, sympy.Expr] | None:
        """`j: a..b`: entries a .. b − 1 of the axis; `written` is (a, b) as sizes, `known` is
        (a, b, the axis's size) at the sizes known before any input."""
        (start, stop), (first, end, have) = written, known
        shown = f"{item.name}: {syntax_text(item.start)}..{syntax_text(item.size)}"  # type: ignore[arg-type]
        at = item.start.span if item.start is not None else item.span
        if first.is_number and not (first.is_integer and first >= 0):
            self.b.error(
                f"slice {shown} starts at {first}, not at a whole number of entries >= 0",
                at,
                hint="a range a..b reads entries a .. b - 1 of the axis, a >= 0",
            )
            return None
        if end.is_number and not end.is_integer:
            self.b.error(f"slice {shown} ends at {end}, not at a whole number", item.size.span)
            return None
        if (end - first).is_number and end - first <= 0:
            what = "empty" if end == first else "reversed"
            self.b.error(
                f"slice {shown} is {what}: it reads {end} - {first} = {end - first} entries",
                item.span,
                hint="a range a..b reads entries a .. b - 1 (b - a of them); write the smaller end first",
            )
            return None
        if have.is_number and first.is_number and first >= have:
            self.b.error(
                f"slice {shown} starts at {first}, beyond axis {axis.leg} of {tensor.name} "
                f"({_known(axis.size, have)} entries: 0 .. {have - 1})",
                at,
            )
            return None
        if have.is_number and end.is_number and end > have:
            self.b.error(
                f"slice {shown} ends at {end}, past the end of axis {axis.leg} of {tensor.name} "
                f"({_known(axis.size, have)} entries)",
                item.size.span,
                hint=f"a range a..b reads entries a .. b - 1; b is at most {have}",
            )
            return None
        return start, sympy.simplify(stop - start)

    def gather(self, e: syn.Indexed, tensor: Tensor) -> Expr:
        """`Rel[h, r = clamp(m - n, -K, K) + K]`: the axis named by `r = ...` of a stored table or
        a computed tensor is read at an integer position computed from legs; the result has the
        other legs and the position's."""
        items = e.items or (*e.legs, *e.options)
        if len(items) != len(tensor.axes):
            return self.owner.wrong_axis_count(e, tensor, str(len(items)))
        if len(e.options) > 1:
            self.b.error(
                f"one axis of {e.name} may be read at a position; this use gives {len(e.options)}",
                e.options[1].span,
                hint="gather one axis per use",
            )
            return self.owner.poison(e)
        if tensor.kind not in ("param", "const", "buffer", "derived"):
            self.b.error(
                f"only a stored table (param, const or buffer) or a computed tensor is read at a position; "
                f"{e.name} is {a_or_an(tensor.kind)}",
                e.options[0].span,
                hint=f"declare the table (param {e.name}[...]), or compute a tensor from {e.name} and read that",
            )
            return self.owner.poison(e)
        option = e.options[0]
        checked: int | None = None
        groups: list[tuple[str, ...]] = []
        outer: list[str] = []
        for item, axis in zip(items, tensor.axes, strict=True):
            if isinstance(item, syn.Option):
                self.b.bind_leg(item.name, axis.size, item.span, e.name)
                groups.append((item.name,))
                position = self.position(item.value)
                if position is None:
                    return self.owner.poison(e)
                for leg in position.legs():
                    if leg in outer or leg == item.name:
                        self.b.error(f"leg '{leg}' names two axes of {e.name}", item.value.span)
                        return self.owner.poison(e)
                outer += [leg for leg in position.legs() if leg not in outer]
                checked = self._check_position_range(position, axis, item, tensor)
            elif isinstance(item, syn.LegGroup):
                self.b.error("a use read at a position takes leg names, not a reshape", item.span)
                return self.owner.poison(e)
            else:
                if isinstance(item, syn.SlicedLeg):
                    self.b.error("a use read at a position is not sliced too", item.span)
                    return self.owner.poison(e)
                self.b.bind_leg(item.name, axis.size, item.span, e.name)
                groups.append((item.name,))
                if item.name in outer:
                    self.b.error(f"leg '{item.name}' names two axes of {e.name}", item.span)
                    return self.owner.poison(e)
                outer.append(item.name)
        source = TensorRef(tuple(g[0] for g in groups), e.span, e.name, tuple(groups))
        self.owner.gathered.append((option.name, option.span))
        return Gather(tuple(outer), e.span, source, option.name, position, checked)

    def position(self, e: syn.Expr) -> Position | None:
        """An integer position of legs, whole numbers and sizes with + - *, clamp(x, lo, hi),
        min(a, b), max(a, b), abs(x), and floor(x) of a real part made with / and log(x)."""
        if isinstance(e, syn.Number):
            return Position(
                "number", value=sympy.Integer(e.value) if isinstance(e.value, int) else sympy.Float(e.value)
            )
        if isinstance(e, syn.Name):
            if e.name in self.b.sizes:
                return Position("number", value=self.b.scalar_of(e, sizes_only=True))
            if self.b.find_leg(e.name):
                return Position("leg", name=e.name)
            self.b.error(
                f"position leg '{e.name}' is not bound to a size",
                e.span,
                hint=did_you_mean(e.name, [*self.b.legs, *self.b.sizes]) or "use legs of this statement's tensors",
            )
            return None
        if isinstance(e, syn.Neg):
            inner = self.position(e.operand)
            return None if inner is None else Position("neg", operands=(inner,))
        if isinstance(e, syn.BinOp) and e.op in ("+", "-", "*", "/"):
            left, right = self.position(e.left), self.position(e.right)
            if left is None or right is None:
                return None
            if e.op == "*" and left.legs() and right.legs():
                self.b.error("a position multiplies a leg by a number or size only", e.span)
                return None
            return Position(e.op, operands=(left, right))
        if isinstance(e, syn.Call) and e.name in POSITION_CALLS and e.legs is None and not e.keywords:
            if len(e.args) != POSITION_CALLS[e.name]:
                self.b.error(
                    f"{e.name} in a position takes {POSITION_CALLS[e.name]} argument"
                    f"{'s' if POSITION_CALLS[e.name] > 1 else ''}, got {len(e.args)}",
                    e.span,
                    hint=POSITION_HINT,
                )
                return None
            parts = [self.position(a) for a in e.args]
            if any(p is None for p in parts):
                return None
            if e.name == "clamp" and (parts[1].legs() or parts[2].legs()):  # type: ignore[union-attr]
                self.b.error("clamp's bounds in a position are numbers or sizes", e.span)
                return None
            return Position(e.name, operands=tuple(parts))  # type: ignore[arg-type]
        if isinstance(e, syn.Call):
            self.b.error(
                f"'{e.name}' is not a function of positions: they take clamp, min, max, abs, floor and log",
                e.span,
                hint=did_you_mean(e.name, list(POSITION_CALLS)) or POSITION_HINT,
            )
            return None
        self.b.error(
            "expected a position: legs, whole numbers and sizes with + - * / and clamp, min, max, abs, floor, log",
            e.span,
            hint=POSITION_HINT,
        )
        return None

    def _check_position_range(self, position: Position, axis: Axis, item: syn.Option, tensor: Tensor) -> int | None:
        """A position must be whole and stay in 0 .. size − 1 at every index of its legs, proved
        before anything runs (interval arithmetic, graph/syntax.py; a run-time size is
        unbounded), so no read wraps around. Against an axis of run-time length the proven
        largest position is returned, for the module to check when it runs."""
        if position.is_real():
            self.b.error(
                f"position {item.name} = {position} of {tensor.name} is real (a quotient or log); a position is whole",
                item.value.span,
                hint="floor(...) makes it whole; floor(a / b) is integer division",
            )
            return None
        values = size_values(self.b.sizes)
        subs = {self.b.sizes[k].symbol: v for k, v in values.items()}

        def number(expr: sympy.Expr) -> float:
            value = expand_sizes(expr, self.b.sizes).xreplace(subs)
            return float(value) if value.is_number else math.inf

        try:
            low, high = position_bounds(position, lambda leg: number(self.b.legs[leg].size) - 1, number)
        except UnboundedError as reason:
            self.b.error(
                f"cannot bound position {item.name} = {position} of {tensor.name}: {reason.args[0]}",
                item.value.span,
                hint=reason.args[1],
            )
            return None
        size = number(axis.size)
        if low < 0 or high > size - 1 or math.isinf(high):
            shown = lambda v: ("-inf" if v < 0 else "+inf") if math.isinf(v) else str(int(v))  # noqa: E731
            unbounded = "; a run-time size is unbounded here" if math.isinf(low) or math.isinf(high) else ""
            self.b.error(
                f"position {item.name} = {position} of {tensor.name} ranges over {shown(low)} .. {shown(high)}, "
                f"outside its axis {axis.leg} ({axis.size}: 0 .. {shown(size - 1)}){unbounded}",
                item.value.span,
                hint="clamp it into the table, e.g. clamp(m - n, -K, K) + K for a table of 2K + 1 entries",
            )
            return None
        return int(high) if math.isinf(size) else None

    def position_index(self, e: syn.Call) -> Expr:
        """`index(n)`: entry i is i, over leg n; `index(p, P)` also binds leg p to size P."""
        if e.legs is not None or e.keywords or not 1 <= len(e.args) <= 2 or not isinstance(e.args[0], syn.Name):
            self.b.error(
                "index takes a leg, and optionally its size", e.span, hint="index(n), or index(p, P) to size leg p"
            )
            return self.owner.poison(e)
        leg = e.args[0].name
        if leg in self.b.sizes or leg in self.b.tensors:
            what = "a size" if leg in self.b.sizes else "a tensor"
            self.b.error(f"index takes a leg; '{leg}' is {what}", e.args[0].span, hint="e.g. index(n)")
            return self.owner.poison(e)
        if len(e.args) == 2:
            self.b.bind_leg(leg, self.b.scalar_of(e.args[1], sizes_only=True), e.args[0].span, "index")
        elif not self.b.find_leg(leg):
            self.b.error(
                f"leg '{leg}' of index(...) is not bound to a size",
                e.args[0].span,
                hint=did_you_mean(leg, self.b.legs)
                or f"use a leg that a declared tensor has, or give its size: index({leg}, SIZE)",
            )
            return self.owner.poison(e)
        return PositionIndex((leg,), e.span, leg)


def subs_known(builder: GraphBuilder) -> set[sympy.Symbol]:
    """The symbols of the sizes known before any input (all but the run-time ones)."""
    return {builder.sizes[k].symbol for k in size_values(builder.sizes)}


def _known(size: sympy.Expr, value: sympy.Expr) -> str:
    """`L = 16`, or `16` where the size is written as the number."""
    return str(value) if size == value else f"{size} = {value}"
