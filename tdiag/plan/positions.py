"""Positions in the forward: `index(n)` as 0 .. N − 1 made from the run-time size, a stored table
read at its first N entries (a maximum-length table at the run-time length), and a table read
along one axis at an integer position of legs (relative position bias) as a gather, never as a
one-hot contraction.
Guarantees: each is made once per program and size; nothing is stored at a maximum length
unless the design declares it so; a gather's cost is one read per result entry."""

from __future__ import annotations

from itertools import pairwise

import sympy

from ..errors import Diagnostic, TdiagError
from ..graph import DesignGraph
from ..ir import Gather, Position, Statement, Tensor, TensorRef, walk
from .context import Lowering
from .legs import all_legs, renamed_value
from .program import (
    BATCH,
    BATCH_SIZE,
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


def like_input(ctx: Lowering) -> str | None:
    inputs = [t.name for t in ctx.g.inputs]
    return ctx.input_vars[inputs[0]] if inputs else None


def positions(ctx: Lowering, legs: tuple[str, ...]) -> Value:
    """index(n) over region legs `legs` (the pieces of n, head-major, when it is split)."""
    key = ("positions", tuple(ctx.size(leg) for leg in legs))
    if key not in ctx.memo:
        name = ctx.names.fresh("index")
        out = Value(name, legs)
        sizes = " ".join(str(ctx.size(leg)) for leg in legs)
        ctx.emit(
            Step(
                "positions",
                Positions(ctx.shape(legs), like_input(ctx)),
                out,
                f"positions 0 .. {sizes} - 1",
                elementwise=ctx.numel(legs),
            )
        )
        ctx.memo[key] = (out, legs)
    value, earlier = ctx.memo[key]
    return renamed_value(value, dict(zip(earlier, legs, strict=True)))


def sliced(ctx: Lowering, tensor: Tensor, ref: TensorRef, axes: tuple[tuple[str, ...], ...]) -> Value:
    """`P[n: N, f]`: the first N entries of P's axis, a view of the stored table; an axis the
    design splits into pieces (RoPE's `(s p)` on a slice of a fused weight) is cut first, then
    viewed as its pieces, head-major, as an unsliced table is."""
    legs = tuple(p for axis in axes for p in axis)
    whole = table_slice(ctx, tensor, ref)
    if all(len(axis) == 1 for axis in axes):
        return renamed_value(whole, dict(zip(whole.legs, legs, strict=True)))
    key = ("slice pieces", tensor.name, ref.slices, ref.offsets, tuple(ctx.shape(axis) for axis in axes))
    if key not in ctx.memo:
        out = Value(ctx.names.fresh(f"{tensor.name}_view"), legs)
        shown = " ".join(show_legs(legs))
        ctx.emit(Step("view", Reshape(whole, ctx.shape(legs)), out, f"view {tensor.name} with legs {shown}"))
        ctx.memo[key] = (out, legs)
    value, earlier = ctx.memo[key]
    return renamed_value(value, dict(zip(earlier, legs, strict=True)))


def table_slice(ctx: Lowering, tensor: Tensor, ref: TensorRef) -> Value:
    """The slice of a stored table that `ref` reads (its first entries, or a range a..b at an
    offset), one leg per axis, made once per program: a view, never a copy."""
    key = ("slice", tensor.name, ref.slices, ref.offsets)
    if key not in ctx.memo:
        base = ctx.tensor_var(tensor)
        cut = [k for k, extent in enumerate(ref.slices) if extent is not None]
        dims = tuple((k, ctx.runtime(ref.slices[k]), ctx.runtime(tensor.axes[k].size)) for k in cut)
        starts = tuple(ctx.runtime(ref.offset(k)) for k in cut) if ref.offsets else ()
        legs = tuple(
            ctx.new_leg(axis.leg, axis.size if extent is None else extent)
            for extent, axis in zip(ref.slices, tensor.axes, strict=True)
        )
        name = ctx.names.fresh(f"{tensor.name}_{'part' if ref.offsets else 'first'}")
        shown = ", ".join(f"{tensor.axes[k].leg}: {_cut_text(ref, k)}" for k in cut)
        labels = tuple((tensor.axes[k].leg, _cut_text(ref, k), str(tensor.axes[k].size)) for k in cut)
        out = Value(name, legs)
        parts = table_pieces(ctx, tensor, cut[0], ref) if len(cut) == 1 else None
        source, piece = parts if parts is not None else (Value(base, ()), None)
        op = Slice(source, dims, tensor.name, labels, starts, piece)
        ctx.emit(Step("slice", op, out, f"{tensor.name}[{shown}]"))
        ctx.memo[key] = (out, legs)
    return ctx.memo[key][0]


def computed_slice(ctx: Lowering, statement: Statement, ref: TensorRef, axes: tuple[tuple[str, ...], ...]) -> Value:
    """`QKV[n, h, d: a..b]` of a computed tensor: the tensor computed once (never inlined into
    this use), read in its ranges (a view), then viewed in the pieces the use's legs are split
    into (RoPE's `(s p)` of a range), as a stored table's slice is."""
    if ref.name not in ctx.values:
        ctx.values[ref.name] = ctx.lower(
            statement.expr, ctx.identity_renaming(all_legs(statement.expr)), var=statement.target
        )
    value = ctx.values[ref.name]
    rename: dict[str, tuple[str, ...]] = {}
    for group, use in zip(statement.groups, axes, strict=True):
        pieces = [p for leg in group for p in ctx.expand(leg)]
        if len(pieces) != 1 and tuple(pieces) != tuple(use):
            raise TdiagError(
                Diagnostic(
                    f"{ref.name} is sliced where its definition splits the axis; slice a whole axis", (ref.span,)
                )
            )
        rename[pieces[0]] = use
    stored = [leg for leg in value.legs if leg not in value.broadcast]
    dims, starts, labels = [], [], []
    for k, (group, extent) in enumerate(zip(statement.groups, ref.slices, strict=True)):
        piece = ctx.expand(group[0])[0]
        if extent is None or piece not in stored:
            continue  # a broadcast axis is constant along its range: renamed, nothing cut
        dims.append((stored.index(piece), ctx.runtime(extent), ctx.runtime(ctx.size(piece))))
        starts.append(ctx.runtime(ref.offset(k)))
        axis = ctx.g.tensors[ref.name].axes[k]
        labels.append((axis.leg, _cut_text(ref, k), str(axis.size)))
    broadcast = frozenset(p for leg in value.broadcast for p in rename.get(leg, (leg,)))
    key = (
        "computed slice",
        value.var,
        tuple(dims),
        tuple(starts),
        tuple(len(rename.get(leg, ())) for leg in stored),
    )
    if key not in ctx.memo:
        source = Value(value.var, tuple(stored))
        whole = tuple(rename.get(leg, (leg,))[0] if len(rename.get(leg, (leg,))) == 1 else leg for leg in stored)
        cut = source
        if dims:
            cut = Value(ctx.names.fresh(f"{ref.name}_part"), whole)
            shown = ", ".join(label[0] + ": " + label[1] for label in labels)
            tensor, sliced = ctx.g.tensors[ref.name], [k for k, extent in enumerate(ref.slices) if extent]
            parts = table_pieces(ctx, tensor, sliced[0], ref, source, dims[0][0]) if len(dims) == 1 else None
            held, piece = parts if parts is not None else (source, None)
            at = tuple(starts) if any(starts) else ()
            op = Slice(held, tuple(dims), ref.name, tuple(labels), at, piece)
            ctx.emit(Step("slice", op, cut, f"{ref.name}[{shown}]", inputs=(source,)))
        legs = tuple(p for leg in stored for p in rename.get(leg, (leg,)))
        if any(len(rename.get(leg, ())) > 1 for leg in stored):
            viewed = Value(ctx.names.fresh(f"{ref.name}_view"), legs)
            shape = tuple(BATCH_SIZE if leg == BATCH else ctx.runtime(ctx.size(leg)) for leg in legs)
            shown = " ".join(show_legs(legs))
            ctx.emit(Step("view", Reshape(cut, shape), viewed, f"view {ref.name} with legs {shown}", inputs=(cut,)))
            cut = viewed
        ctx.memo[key] = (Value(cut.var, legs), legs)
    stored_value, earlier = ctx.memo[key]
    current = tuple(p for leg in stored for p in rename.get(leg, (leg,)))
    renamed = renamed_value(stored_value, dict(zip(earlier, current, strict=True)))
    return Value(renamed.var, renamed.legs, broadcast)


def table_pieces(
    ctx, tensor: Tensor, axis: int, ref: TensorRef, source: Value | None = None, dim: int | None = None
) -> tuple[Value, int] | None:
    """(the pieces, the index of `ref`'s range among them) where the design reads the table
    in two or more distinct ranges along `axis`, none overlapping another, at sizes known when
    planning (a fused QKV weight read as its parts): the table is split once, so its gradient
    is joined once. None otherwise (plain slices). `source` and `dim`: a computed tensor's
    value and the position of that axis in its layout (a stored table is split as declared)."""
    ranges = set()
    for use in _table_uses(ctx.g, tensor.name):
        cut = [k for k, extent in enumerate(use.slices) if extent is not None]
        if cut != [axis]:
            continue
        start, extent = ctx.runtime(use.offset(axis)), ctx.runtime(use.slices[axis])
        if not (start.is_Integer and extent.is_Integer):
            return None
        ranges.add((int(start), int(start) + int(extent)))
    size = ctx.runtime(tensor.axes[axis].size)
    ordered = sorted(ranges)
    if len(ordered) < 2 or not size.is_Integer or any(a[1] > b[0] for a, b in pairwise(ordered)):
        return None
    bounds = sorted({0, int(size), *(b for r in ordered for b in r)})
    key = ("table pieces", tensor.name, axis)
    if key not in ctx.memo:
        sizes = tuple(sympy.Integer(b - a) for a, b in pairwise(bounds))
        out = Value(ctx.names.fresh(f"{tensor.name}_parts"), ())
        shown = ", ".join(f"{a}..{b}" for a, b in pairwise(bounds))
        whole = source if source is not None else Value(ctx.tensor_var(tensor), ())
        op = SplitTable(whole, axis if dim is None else dim, sizes)
        ctx.emit(Step("split", op, out, f"{tensor.name} split along {tensor.axes[axis].leg}: {shown}"))
        ctx.memo[key] = (out, ())
    start = int(ctx.runtime(ref.offset(axis)))
    return ctx.memo[key][0], bounds.index(start)


def position_tensor(ctx: Lowering, position: Position, ren: dict[str, tuple[str, ...]]) -> Value:
    """The integer position over its region legs, made once per program and sizes: one
    elementwise operation per entry for each operation of the position that has legs."""
    renamed = rename_position(position, {leg: ren[leg][0] for leg in position.legs()}, ctx.runtime)
    legs = renamed.legs()
    return memo_position(ctx, renamed, legs, f"position {position}")


def memo_position(ctx: Lowering, position: Position, legs: tuple[str, ...], description: str) -> Value:
    """`position` over `legs` as a tensor, once per program and sizes."""
    key = ("position", _anonymous(position, legs), tuple(ctx.size(leg) for leg in legs))
    if key not in ctx.memo:
        out = Value(ctx.names.fresh("position"), legs)
        ctx.emit(
            Step(
                "positions",
                PositionTensor(position, legs, ctx.shape(legs), like_input(ctx)),
                out,
                description,
                elementwise=ctx.numel(legs) * max(1, _operations(position)),
            )
        )
        ctx.memo[key] = (out, legs)
    value, earlier = ctx.memo[key]
    return renamed_value(value, dict(zip(earlier, legs, strict=True)))


def offset_positions(ctx: Lowering, position: Position, ren: dict[str, tuple[str, ...]]) -> tuple[Value, Value] | None:
    """A position of legs a, b only through a − b, with more than three operations (T5's
    buckets: 17), as (its value at each offset d = i − (Nb − 1), i = 0 .. Na + Nb − 2; the
    offsets a − b + Nb − 1 over (a, b)): the position's own work is then per offset, and the
    (a, b) table costs two operations per entry. None for any other position."""
    renamed = rename_position(position, {leg: ren[leg][0] for leg in position.legs()}, ctx.runtime)
    pair = _difference(renamed)
    if pair is None or _operations(renamed) <= 3:
        return None
    a, b = pair
    shown = " - ".join(show_legs(pair))
    shift = Position("number", value=ctx.runtime(ctx.size(b)) - 1)
    key = ("offset leg", ctx.size(a), ctx.size(b))
    if key not in ctx.memo:
        ctx.memo[key] = (Value("", ()), (ctx.new_leg(a, ctx.size(a) + ctx.size(b) - 1),))
    offset = ctx.memo[key][1][0]
    per_offset = _substituted(renamed, pair, Position("-", operands=(Position("leg", name=offset), shift)))
    table = memo_position(ctx, per_offset, (offset,), f"position {position} at each offset {shown}")
    at = Position("+", operands=(Position("-", operands=(Position("leg", name=a), Position("leg", name=b))), shift))
    return table, memo_position(ctx, at, (a, b), f"offsets {shown}")


def lower_gather(ctx: Lowering, e: Gather, ren: dict[str, tuple[str, ...]], var: str | None) -> Value:
    """The table read along its axis at the position: one read per result entry. A position
    of one offset a − b (T5's buckets) reads the table at each offset first, then that
    (table's other legs × offsets) at a − b."""
    for leg in (e.axis, *e.position.legs()):  # type: ignore[union-attr]
        if len(ren[leg]) != 1:
            raise AssertionError("a gathered axis or position leg is never split into pieces")
    table = ctx.lower(e.source, ren)  # type: ignore[arg-type]
    axis = ren[e.axis][0]
    others = tuple(leg for leg in table.legs if leg != axis)
    name = e.source.name  # type: ignore[union-attr]
    check = (e.checked, name, e.axis)
    offsets = offset_positions(ctx, e.position, ren)  # type: ignore[arg-type]
    if offsets is not None:
        per_offset, index = offsets
        at_offsets = Value(ctx.names.fresh(f"{name}_offsets"), (*others, *per_offset.legs))
        gather_step(ctx, table, axis, per_offset, check, at_offsets, f"{name} at each offset")
        table, axis = at_offsets, per_offset.legs[0]
        check = (None, name, e.axis)
    else:
        index = position_tensor(ctx, e.position, ren)  # type: ignore[arg-type]
    out = Value(ctx.names.fresh(var or f"{name}_at"), (*others, *index.legs))
    return gather_step(ctx, table, axis, index, check, out, f"{name} at {e.position}")


def gather_step(ctx: Lowering, table: Value, axis: str, index: Value, check: tuple, out: Value, shown: str) -> Value:
    """`table` read along `axis` at the integer tensor `index`: one read per entry of `out`."""
    return ctx.emit(
        Step(
            "gather",
            GatherAt(Operand(table), table.legs.index(axis), index, *check),
            out,
            f"{shown} -> [{' '.join(show_legs(out.legs))}]",
            elementwise=ctx.numel(out.legs),
            inputs=(table, index),
        )
    )  # type: ignore[return-value]


def rename_position(position: Position, names: dict[str, str], runtime) -> Position:
    """The position over region legs, its sizes known at build time replaced by numbers."""
    if position.op == "leg":
        return Position("leg", name=names[position.name])
    if position.op == "number":
        return Position("number", value=runtime(position.value))
    operands = tuple(rename_position(o, names, runtime) for o in position.operands)
    return Position(position.op, position.name, position.value, operands)


def _operations(position: Position) -> int:
    """The operations of a position that run over its legs (a part of numbers and sizes alone is
    one Python number)."""
    if position.op == "leg" or not position.legs():
        return 0
    return 1 + sum(_operations(o) for o in position.operands)


def _anonymous(position: Position, legs: tuple[str, ...]) -> Position:
    """The position with its legs numbered by their place in `legs` (a memo key that does not
    depend on the region's leg names)."""
    if position.op == "leg":
        return Position("leg", name=str(legs.index(position.name)))
    operands = tuple(_anonymous(o, legs) for o in position.operands)
    return Position(position.op, position.name, position.value, operands)


def _difference(position: Position) -> tuple[str, str] | None:
    """(a, b) where every leg of the position occurs in a difference a − b of the same two legs."""
    pairs: set[tuple[str, str]] = set()
    stack = [position]
    while stack:
        p = stack.pop()
        if p.op == "-" and all(o.op == "leg" for o in p.operands) and p.operands[0].name != p.operands[1].name:
            pairs.add((p.operands[0].name, p.operands[1].name))
        elif p.op == "leg":
            return None
        else:
            stack.extend(p.operands)
    return pairs.pop() if len(pairs) == 1 else None


def _substituted(position: Position, pair: tuple[str, str], by: Position) -> Position:
    """The position with each a − b of `pair` replaced by `by`."""
    if position.op == "-" and tuple(o.name for o in position.operands if o.op == "leg") == pair:
        return by
    operands = tuple(_substituted(o, pair, by) for o in position.operands)
    return Position(position.op, position.name, position.value, operands)


def _cut_text(ref: TensorRef, k: int) -> str:
    """Axis k's slice as the .td writes it: `N` (the first N entries) or `a..b`."""
    extent, start = ref.slices[k], ref.offset(k)
    return str(extent) if start == 0 else f"{start}..{start + extent}"


def _table_uses(graph: DesignGraph, name: str) -> list[TensorRef]:
    """Every use of tensor `name` in the design's statements and updates."""
    exprs = [s.expr for s in [*graph.statements, *graph.updates]]
    return [e for expr in exprs for e in walk(expr) if isinstance(e, TensorRef) and e.name == name]
