"""Layout assignment: the axis order of each intermediate, chosen so that its consumers read it
without copies where an order allows it. The planner picks contractions by FLOPs and lays each
result out in a default order; eager PyTorch then pays for every `permute(...).reshape(...)`
that merges legs not adjacent in memory, and for every softmax over a permuted tensor.

Guarantees (the FLOPs and the values computed are unchanged; only axis orders move):
- A value whose order may move is the result of a matmul, a broadcast multiply, a softmax or
  normalize box, or an elementwise sum or quotient, and every reader of it is one of those or
  a step whose result follows its input's order (a scaling, a map, a mask fill, a sum or
  reduction over some axes). Values read by any other op (SDPA, einsum, chunking, state
  updates) and the outputs keep the order the planner gave them.
- Each such value is laid out as its first consumer asks, where that costs no copy elsewhere:
  a softmax wants its content with the normalized legs last in its own order; a matmul wants
  each operand as (batch legs, free legs, summed legs) adjacent in memory, so that the operand
  is a view; a multiply or a sum wants its operands in its own order.
- Each matmul, multiply, box and sum then picks, among the order its consumer asked for and
  the planner's, the one whose operands are views and whose result is what its consumer reads,
  by the bytes a copy would move (a copy costs the elements of the tensor it copies).
  A matrix times a batched operand (a head mix of scores by a parameter) costs what torch
  pays for it: the batched operand folded as rows and the result copied back.

Values are assumed dense in their legs' order: true of matmul, softmax and elementwise results
on dense inputs, the forms this pass produces; where torch decides otherwise a reshape copies,
which costs time and never changes a value."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import sympy

from .chooser import cheapest
from .footprint import SHORT_ROW
from .program import (
    Binary,
    Elementwise,
    Map,
    MaskFill,
    Matmul,
    Multiply,
    Normalize,
    Operand,
    Permute,
    Reduce,
    Scale,
    Softmax,
    Step,
    SumAxes,
    Value,
    align,
    operands,
    read_groups,
    reads,
    show_legs,
)

CHOOSERS = (Matmul, Multiply, Softmax, Normalize, Elementwise)  # ops whose result order is free
FOLLOWERS = (Scale, Map, MaskFill, SumAxes, Reduce)  # ops whose result order follows their input


@dataclass
class Sizes:
    """Leg sizes as the pass needs them: `number` at the planned sizes (to weigh copies), `shape`
    as the forward computes them (for reshapes)."""

    number: Callable[[str], int]
    shape: Callable[[str], sympy.Expr]

    def numel(self, legs: Iterable[str]) -> int:
        total = 1
        for leg in legs:
            total *= self.number(leg)
        return total

    def group(self, legs: Iterable[str]) -> sympy.Expr:
        return sympy.Mul(*(self.shape(leg) for leg in legs))


def assign_layouts(steps: list[Step], keep: set[str], sizes: Sizes) -> None:
    """Reorder the axes of the intermediates of `steps` in place (see the module docstring);
    `keep`: variables whose order must not change (outputs, values read by state updates)."""
    movable = _movable(steps, keep)
    wanted = _wanted(steps, movable, sizes)
    moved: dict[str, tuple[int, ...]] = {}  # variable -> new axis k is old axis moved[var][k]
    for step in steps:
        _relayout(step, moved, movable, wanted, sizes)


# ---- which values may move --------------------------------------------------------------------


def _movable(steps: list[Step], keep: set[str]) -> set[str]:
    """Results of choosers and followers that only choosers and followers read (through a
    follower, the whole chain must be movable)."""
    fixed = set(keep)
    for step in steps:
        if not isinstance(step.op, CHOOSERS + FOLLOWERS + (Permute,)):
            fixed |= {v.var for v in reads(step.op)}
        elif isinstance(step.op, Permute) or (isinstance(step.op, Matmul) and len(step.inputs) != 2):
            fixed |= {v.var for v in reads(step.op)}
    produced = {s.out.var: s for s in steps if s.out is not None and isinstance(s.op, CHOOSERS + FOLLOWERS)}
    movable = set(produced) - fixed
    changed = True
    while changed:  # a follower moves with its input: both move or neither
        changed = False
        for step in steps:
            if isinstance(step.op, FOLLOWERS) and step.out is not None:
                source = _follower_input(step.op).var
                if (source in movable) != (step.out.var in movable):
                    movable.discard(source)
                    movable.discard(step.out.var)
                    changed = True
    return movable


def _follower_input(op) -> Value:
    return op.x


# ---- what the consumers ask for (backward) ----------------------------------------------------


def _wanted(steps: list[Step], movable: set[str], sizes: Sizes) -> dict[str, tuple[str, ...]]:
    """For each movable value, the order (in its producer's leg names) its first consumer would
    read without a copy, given the order that consumer's own result is asked for."""
    wanted: dict[str, tuple[str, ...]] = {}
    names = {s.out.var: s.out.legs for s in steps if s.out is not None}

    def ask(value: Value, order: Iterable[str]) -> None:
        if value.var not in movable:
            return
        order = tuple(order)
        position = {leg: k for k, leg in enumerate(value.legs)}
        wanted[value.var] = tuple(names[value.var][position[leg]] for leg in order)

    for step in reversed(steps):
        op, out = step.op, step.out
        target = None
        if out is not None and out.var in wanted:
            target = wanted[out.var]
        if isinstance(op, FOLLOWERS):
            source = _follower_input(op)
            if target is not None:
                kept = [leg for leg in source.legs if _kept(op, source, leg)]
                renaming = dict(zip(out.legs, kept, strict=True))  # type: ignore[union-attr]
                order = [renaming[leg] for leg in target]
                ask(source, _summed_placed(order, [leg for leg in source.legs if leg not in order], sizes))
            elif isinstance(op, SumAxes | Reduce):
                summed = [source.legs[d] for d in op.dims]
                kept = [leg for leg in source.legs if leg not in summed]
                ordered = _summed_placed(kept, summed, sizes)
                if ordered != [*kept, *summed]:  # a short sum, asked for even where nothing else asks
                    ask(source, ordered)
        elif isinstance(op, Softmax | Normalize):
            order = _box_order(out.legs, op.count, target)  # type: ignore[union-attr]
            ask(op.x.value, order)
        elif isinstance(op, Multiply):
            a, b = step.inputs
            order = [*(target or out.legs), *step.summed]  # type: ignore[union-attr]
            for value in (a, b):
                ask(value, [leg for leg in order if leg in value.legs])
        elif isinstance(op, Elementwise):
            order = target or out.legs  # type: ignore[union-attr]
            for leaf in operands(op.tree):
                ask(leaf.value, [leg for leg in order if leg in leaf.value.legs])
        elif isinstance(op, Matmul) and len(step.inputs) == 2:
            a, b = step.inputs
            free = {v.var for v in (a, b) if v.var in movable}
            orders = dict.fromkeys([target or out.legs, out.legs])  # type: ignore[union-attr]
            options = [
                (r.copies(sizes, free) + (sizes.numel(order) if rank else 0), rank, r)
                for rank, order in enumerate(orders)
                for r in _realizations(a, b, order, sizes)
            ]
            best = cheapest([(r, (copies, rank)) for copies, rank, r in options])
            ask(best.x, best.x_order)
            ask(best.y, best.y_order)
    return wanted


def _summed_placed(kept: list[str], summed: list[str], sizes: Sizes) -> list[str]:
    """A reduction's input order: the kept legs in order, the summed ones last, unless those hold
    fewer than SHORT_ROW entries and a long kept leg would follow them: then just before the last
    kept leg, so that the sum adds whole rows instead of summing many short ones (a CPU sums a
    short innermost row several times below the bandwidth, footprint.py SHORT_ROW)."""
    if summed and kept and sizes.numel(summed) < SHORT_ROW <= sizes.number(kept[-1]):
        return [*kept[:-1], *summed, kept[-1]]
    return [*kept, *summed]


def _kept(op, source: Value, leg: str) -> bool:
    """Does a follower's result keep this leg of its input?"""
    if isinstance(op, SumAxes | Reduce):
        return source.legs.index(leg) not in op.dims
    return True


def _box_order(legs: tuple[str, ...], count: int, target: tuple[str, ...] | None) -> tuple[str, ...]:
    """A softmax's result order: the one asked for if it keeps the normalized legs last."""
    normalized = set(legs[len(legs) - count :])
    if target is not None and set(target[len(target) - count :]) == normalized:
        return target
    return legs


# ---- matmul realizations ----------------------------------------------------------------------


@dataclass
class _Realization:
    """x @ y with x read as (lead, M, K) and y as (lead, K, N), the result laid out as `order`
    = lead + M + N. Lead legs absent from an operand are unit axes (broadcast); an operand with
    no lead leg at all is read as a matrix, which torch folds into the other's rows."""

    x: Value
    y: Value
    lead: list[str]
    m: list[str]
    k: list[str]
    n: list[str]

    @property
    def order(self) -> tuple[str, ...]:
        return tuple(self.lead + self.m + self.n)

    @property
    def x_order(self) -> list[str]:
        return [leg for leg in self.lead if leg in self.x.legs] + self.m + self.k

    @property
    def y_order(self) -> list[str]:
        """The order y is asked for: (lead, K, N), or (lead, N, K) for a transposed fold, whose
        yᵀ is then a view of (lead·N) rows."""
        lead = [leg for leg in self.lead if leg in self.y.legs]
        return lead + self.n + self.k if self.transposed_fold else lead + self.k + self.n

    @property
    def transposed_fold(self) -> bool:
        """Is x a matrix against a batched y? torch.matmul then computes (yᵀ xᵀ)ᵀ."""
        return not any(leg in self.x.legs for leg in self.lead) and any(leg in self.y.legs for leg in self.lead)

    @property
    def folds(self) -> bool:
        """Is y a matrix, x's axes before the summed ones folded into its rows?"""
        return not any(leg in self.y.legs for leg in self.lead)

    def x_groups(self) -> list[list[str]]:
        if self.folds:
            return [*([leg] for leg in self.lead + self.m), self.k] if self.lead or self.m else [[], self.k]
        # a matrix x against a batched y gets unit lead axes; torch 2.13 drops them again and
        # folds y's transpose into rows (a transposed fold, costed by `_transposed_fold_copies`)
        return [*([leg] if leg in self.x.legs else [] for leg in self.lead), self.m, self.k]

    def raw(self) -> list[list[str]]:
        """The result's axes as the matmul returns them, before the reshape to `order`."""
        if self.folds:
            return [[leg] for leg in self.lead + self.m] + [self.n] if self.lead or self.m else [[], self.n]
        return [[leg] for leg in self.lead] + [self.m, self.n]

    def y_groups(self) -> list[list[str]]:
        lead = [leg for leg in self.lead if leg in self.y.legs]
        if not lead:
            return [self.k, self.n]
        return [*([leg] if leg in self.y.legs else [] for leg in self.lead), self.k, self.n]

    def copies(self, sizes: Sizes, free: set[str] = frozenset()) -> int:
        """Elements copied to run it: an operand that is not a view of its layout, and an
        operand broadcast along lead legs only the other has (torch expands and copies it).
        Operands in `free` are assumed laid out as asked."""
        total = 0
        if not self.m and not self.n:  # 1×K by K×1 per lead element: far below matmul speed
            total += 4 * (sizes.numel(self.x.legs) + sizes.numel(self.y.legs))
        if self.transposed_fold:
            return total + self._transposed_fold_copies(sizes, free)
        x_lead = [leg for leg in self.lead if leg in self.x.legs]
        y_lead = [leg for leg in self.lead if leg in self.y.legs]
        for value, lead, fold, mk, other in (
            (self.x, x_lead, not y_lead, [self.m, self.k], y_lead),
            (self.y, y_lead, not x_lead, [self.k, self.n], x_lead),
        ):
            if value.var not in free:
                groups = [lead + mk[0], mk[1]] if fold and value is self.x else [lead, *mk]
                if not _is_view(value.legs, groups, sizes):
                    total += sizes.numel(value.legs)
            if other and set(other) - set(lead) and (lead or value is self.x):
                total += sizes.numel(value.legs) * sizes.numel(set(other) - set(lead))
        return total

    def _transposed_fold_copies(self, sizes: Sizes, free: set[str]) -> int:
        """A matrix x against a batched y: torch.matmul computes (yᵀ x ᵀ)ᵀ, folding yᵀ into
        (lead·N, K) rows (a copy unless y's lead and free legs merge in memory) and returning
        the product as a contiguous copy in (lead, M, N) order (footprint.py `matmul`; measured
        on torch 2.13: copy, mm, copy). Both copies are N²-sized for a head mix of scores."""
        y_lead = [leg for leg in self.lead if leg in self.y.legs]
        viewed = self.y.var in free or _is_view(self.y.legs, [y_lead + self.n, self.k], sizes)
        copied = 0 if viewed else sizes.numel(self.y.legs)  # a free y is laid out as asked: y_order
        return sizes.numel(self.order) + copied


def _realizations(a: Value, b: Value, order: tuple[str, ...], sizes: Sizes) -> list[_Realization]:
    """The ways to compute a @ b with its result in `order`: either operand on the left, the
    summed legs in either operand's memory order."""
    found = []
    for x, y in ((a, b), (b, a)):
        n = _suffix(order, lambda leg, x=x, y=y: leg in y.legs and leg not in x.legs)
        rest = order[: len(order) - len(n)]
        m = _suffix(rest, lambda leg, x=x, y=y: leg in x.legs and leg not in y.legs)
        lead = list(rest[: len(rest) - len(m)])
        summed_by = [[leg for leg in v.legs if leg in x.legs and leg in y.legs and leg not in order] for v in (x, y)]
        for k in dict.fromkeys(tuple(s) for s in summed_by):
            found.append(_Realization(x, y, lead, m, list(k), n))
    return found


def _suffix(order: tuple[str, ...], test: Callable[[str], bool]) -> list[str]:
    count = 0
    while count < len(order) and test(order[len(order) - 1 - count]):
        count += 1
    return list(order[len(order) - count :])


def _is_view(layout: tuple[str, ...], groups: list[list[str]], sizes: Sizes) -> bool:
    """Can a dense tensor of legs `layout` be read as `groups` (each group merged into one axis,
    in this order up to a transpose of the last two) without a copy? Each group's legs must be
    adjacent in memory in the group's order, and one of the last two groups innermost (BLAS
    reads a matrix or its transpose). Legs of size 1 are ignored."""
    real = [leg for leg in layout if sizes.number(leg) != 1]
    position = {leg: k for k, leg in enumerate(real)}
    for group in groups:
        kept = [position[leg] for leg in group if leg in position]
        if kept and kept != list(range(kept[0], kept[0] + len(kept))):
            return False
    if not real:
        return True
    innermost = real[-1]
    return any(innermost in g for g in groups[-2:])


# ---- rewriting (forward) ----------------------------------------------------------------------


def _relayout(
    step: Step, moved: dict[str, tuple[int, ...]], movable: set[str], wanted: dict[str, tuple[str, ...]], sizes: Sizes
) -> None:
    touched = any(v.var in moved for v in reads(step.op))
    step.inputs = tuple(_move_value(v, moved) for v in step.inputs)
    op, out = step.op, step.out
    unchanged = out is not None and (out.var not in movable or wanted.get(out.var, out.legs) == out.legs)
    if isinstance(op, CHOOSERS) and out is not None and (touched or not unchanged):
        candidates = [out.legs] if out.var not in movable else [wanted.get(out.var, out.legs), out.legs]
        new_op, order = _choose(step, op, candidates, moved, sizes)
    elif isinstance(op, FOLLOWERS) and out is not None and touched:
        new_op, order = _follow(op, moved, out)
    else:
        step.op = _move_fields(op, moved)
        return
    step.op = new_op
    if order != out.legs:
        moved[out.var] = tuple(out.legs.index(leg) for leg in order)
        step.out = Value(out.var, tuple(order), out.broadcast)
        step.description = re.sub(r"-> \[[^\]]*\]$", f"-> [{' '.join(show_legs(order))}]", step.description)


def _move_value(value: Value, moved: dict[str, tuple[int, ...]]) -> Value:
    if value.var not in moved:
        return value
    return Value(value.var, tuple(value.legs[k] for k in moved[value.var]), value.broadcast)


def _move_operand(operand: Operand, moved: dict[str, tuple[int, ...]]) -> Operand:
    """The same read of a value whose axes moved: its permutation composed with the move."""
    if operand.value.var not in moved:
        return operand
    new = moved[operand.value.var]
    axes = operand.permutation if operand.permutation is not None else tuple(range(len(new)))
    permutation = tuple(new.index(k) for k in axes)
    value = _move_value(operand.value, moved)
    identity = permutation == tuple(range(len(permutation)))
    return dataclasses.replace(operand, value=value, permutation=None if identity else permutation)


def _move_fields(op, moved: dict[str, tuple[int, ...]]):
    """An op whose layout is kept, reading moved values through composed permutations."""
    changes = {}
    for name in op.__dataclass_fields__:
        item = getattr(op, name)
        if isinstance(item, Operand):
            changes[name] = _move_operand(item, moved)
        elif isinstance(item, Binary):
            changes[name] = _move_tree(item, moved)
        elif isinstance(item, Value) and item.var in moved:
            raise AssertionError(f"layout: {item.var} moved under an op that reads it whole")
    return dataclasses.replace(op, **changes) if changes else op


def _move_tree(tree: Binary | Operand, moved: dict[str, tuple[int, ...]]) -> Binary | Operand:
    if isinstance(tree, Operand):
        return _move_operand(tree, moved)
    return Binary(tree.op, _move_tree(tree.left, moved), _move_tree(tree.right, moved))


def _follow(op, moved: dict[str, tuple[int, ...]], out: Value):
    """A follower rebuilt over its moved input; its result takes the input's order."""
    x = _move_value(op.x, moved)
    if isinstance(op, SumAxes | Reduce):
        summed = [op.x.legs[d] for d in op.dims]
        dims = tuple(x.legs.index(leg) for leg in summed)
        kept = tuple(leg for leg in x.legs if leg not in summed)
        names = dict(zip([leg for leg in op.x.legs if leg not in summed], out.legs, strict=True))
        changes = {"x": x, "dims": dims}
        if isinstance(op, Reduce) and op.hidden:  # a masked mean's masks, read over the moved input
            changes["hidden"] = tuple(align(h.value, x.legs, invert=h.invert) for h in op.hidden)
        return dataclasses.replace(op, **changes), tuple(names[leg] for leg in kept)
    names = dict(zip(op.x.legs, out.legs, strict=True))
    if isinstance(op, MaskFill):
        mask = align(op.mask.value, x.legs, invert=op.mask.invert)
        return dataclasses.replace(op, x=x, mask=mask), tuple(names[leg] for leg in x.legs)
    return dataclasses.replace(op, x=x), tuple(names[leg] for leg in x.legs)


def _choose(step: Step, op, candidates: list[tuple[str, ...]], moved, sizes: Sizes):
    """The cheapest way to compute a chooser over its (moved) inputs: each candidate result
    order is weighed by the elements copied to run it, plus the result's elements when the
    order is not the first candidate (its consumer would copy it)."""
    options = []
    for rank, order in enumerate(dict.fromkeys(candidates)):
        for cost, new_op in _build(step, op, order, moved, sizes):
            penalty = sizes.numel(order) if rank else 0
            options.append((cost + penalty, rank, new_op, order))
    return cheapest([((new_op, order), (cost, rank)) for cost, rank, new_op, order in options])


def _build(step: Step, op, order: tuple[str, ...], moved, sizes: Sizes):
    """(copies, op) for each way to compute `op` with its result in `order`."""
    if isinstance(op, Matmul):
        a, b = step.inputs
        for r in _realizations(a, b, order, sizes):
            yield r.copies(sizes), _matmul(r, sizes)
    elif isinstance(op, Multiply):
        a, b = step.inputs
        full = (*order, *step.summed)
        dims = tuple(full.index(leg) for leg in step.summed)
        reads = [align(v, full) for v in (a, b)]
        same = op.a == op.b
        new = Multiply(reads[0], reads[0] if same else reads[1], dims)
        yield _scattered(reads, full, sizes), new
    elif isinstance(op, Softmax | Normalize):
        x = _move_operand(op.x, moved).value
        if set(order[len(order) - op.count :]) != set(step.out.legs[len(order) - op.count :]):  # type: ignore[union-attr]
            return
        read = align(x, order)
        copies = 0 if read.permutation is None else sizes.numel(x.legs)
        changes: dict[str, object] = {"x": read}
        if isinstance(op, Softmax):
            normalized = dict(zip(step.out.legs[len(order) - op.count :], op.normalized, strict=True))  # type: ignore[union-attr]
            changes["normalized"] = tuple(normalized[leg] for leg in order[len(order) - op.count :])
            if op.sink is not None:  # over the rows in their new order and one unit axis
                sink = _move_operand(op.sink, moved).value
                changes["sink"] = align(sink, (*order[: len(order) - op.count], order[len(order) - op.count]))
        yield copies, dataclasses.replace(op, **changes)
    elif isinstance(op, Elementwise):
        leaves = list(operands(op.tree))
        reads = [align(_move_value(leaf.value, moved), order, invert=leaf.invert) for leaf in leaves]
        mapping = dict(zip(map(id, leaves), reads, strict=True))
        yield _scattered(reads, order, sizes), Elementwise(_replace_leaves(op.tree, mapping), op.negate)


def _scattered(reads: list[Operand], order: tuple[str, ...], sizes: Sizes) -> int:
    """A broadcast elementwise op lays its result out as its first permuted operand's memory
    (torch's TensorIterator): when the largest operand is read permuted, the result is not in
    `order`, and its consumer will copy it."""
    largest = max(reads, key=lambda o: sizes.numel(o.value.legs))
    return sizes.numel(order) if largest.permutation is not None else 0


def _replace_leaves(tree: Binary | Operand, mapping: dict[int, Operand]) -> Binary | Operand:
    if isinstance(tree, Operand):
        return mapping[id(tree)]
    return Binary(tree.op, _replace_leaves(tree.left, mapping), _replace_leaves(tree.right, mapping))


def _matmul(r: _Realization, sizes: Sizes) -> Matmul:
    x, y = read_groups(r.x, r.x_groups(), sizes.group), read_groups(r.y, r.y_groups(), sizes.group)
    shape = None
    if any(len(g) != 1 for g in r.raw()):
        shape = tuple(sizes.group([leg]) for leg in r.order)
    return Matmul(x, y, shape)


__all__ = ["Sizes", "align", "assign_layouts"]
