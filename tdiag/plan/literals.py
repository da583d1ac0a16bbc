"""Small literal constants unrolled: a `const` whose entries the design writes out (`values(...)`)
and whose axes are small (each at most LITERAL_AXIS entries) is never a matmul operand. Its
contraction with a tensor over one of its legs becomes a signed linear combination of that
tensor's slices: RoPE's generator R[s t] = values(0, −1, 1, 0) applied to Q[... (p t)] is the pair
swap (−Q[..., p, 1], Q[..., p, 0]) (RoFormer eq. 34), and the products with cos and sin around it
stay broadcast multiplies.

Guarantees: the region's value is unchanged (the constant's legs are summed exactly as in the
contraction); each result entry costs one elementwise operation per nonzero entry of the
constant's row, counted in `elementwise`, never in `flops`; zero entries have no term; autograd
saves nothing for the combination (slices, negations, numbers times slices, one stack), so a
batched matmul that torch would expand across batch and heads never happens. A constant whose
summed legs no single other factor carries alone is left to the contraction."""

from __future__ import annotations

import itertools
import math

import sympy

from .context import Leaf, Lowering
from .leaves import leaf_value
from .program import BATCH, LiteralCombination, Step, Value, show_legs

LITERAL_AXIS = 4  # a literal constant unrolls when each of its axes has at most this many entries
LITERAL_ENTRIES = 16  # ... and it has at most this many entries in all


def literal_entries(ctx: Lowering, leaf: Leaf) -> dict[tuple[int, ...], sympy.Expr] | None:
    """The entries of a small `values(...)` constant over its region legs, by index; None for
    any other factor."""
    tensor = leaf.tensor
    if tensor is None or tensor.kind != "const" or tensor.init is None or tensor.init.name != "values":
        return None
    if len(set(leaf.legs)) != len(leaf.legs) or BATCH in leaf.legs:
        return None
    shape = [ctx.number(leg) for leg in leaf.legs]
    if any(n > LITERAL_AXIS for n in shape) or math.prod(shape) > LITERAL_ENTRIES:
        return None
    entries = [ctx.runtime(sympy.sympify(v)) for v in tensor.init.values]
    if len(entries) != math.prod(shape) or not all(v.is_number for v in entries):
        return None
    return dict(zip(itertools.product(*(range(n) for n in shape)), entries, strict=True))


def unroll_literals(ctx: Lowering, leaves: list[Leaf], out: tuple[str, ...]) -> list[Leaf]:
    """Each small literal constant of the region applied to the factor it reads (see the
    module doc), until none is left that can be."""
    changed = True
    while changed:
        changed = False
        for k, leaf in enumerate(leaves):
            entries = literal_entries(ctx, leaf)
            if entries is None:
                continue
            others = [other for j, other in enumerate(leaves) if j != k]
            combined = apply_literal(ctx, leaf, entries, others, out)
            if combined is not None:
                target, value = combined
                leaves = [other for other in others if other is not target] + [value]
                changed = True
                break
    return leaves


def apply_literal(
    ctx, leaf: Leaf, entries: dict[tuple[int, ...], sympy.Expr], others: list[Leaf], out: tuple[str, ...]
) -> tuple[Leaf, Leaf] | None:
    """The literal applied to the factor among `others` that gives the smallest result and
    carries, alone among them, at least one of the literal's summed legs; None if none does.
    Returns that factor and the leaf that replaces the two."""
    best = None
    for target in others:
        if target.box is not None or target.constant is not None or literal_entries(ctx, target) is not None:
            continue
        broadcast = target.value.broadcast if target.value is not None else frozenset()
        real = tuple(leg for leg in target.legs if leg not in broadcast)
        if len(set(real)) != len(real):
            continue
        rest = [o for o in others if o is not target]
        needed = set(out) | {leg for o in rest for leg in o.legs}
        summed = [leg for leg in leaf.legs if leg in real and leg not in needed]
        if not summed:
            continue
        size = math.prod(ctx.number(leg) for leg in real if leg not in summed) * math.prod(
            ctx.number(leg) for leg in leaf.legs if leg not in real and (leg in needed)
        )
        if best is None or size < best[0]:
            best = (size, target, summed, needed)
    if best is None:
        return None
    _, target, summed, needed = best
    value = leaf_value(ctx, target)
    x = Value(value.var, tuple(leg for leg in value.legs if leg not in value.broadcast), value.broadcast)
    return target, unrolled(ctx, leaf, entries, x, summed, needed)


def unrolled(
    ctx,
    leaf: Leaf,
    entries: dict[tuple[int, ...], sympy.Expr],
    x: Value,
    summed: list[str],
    needed: set[str],
) -> Leaf:
    """Emit the unrolled combination Σ_summed C[...] x[...]; its result has x's legs less the
    literal's, then the literal's kept legs (those in x and needed, then the new ones)."""
    legs = leaf.legs
    # a leg the literal alone carries and nobody needs is summed into its entries
    alone = [leg for leg in legs if leg not in x.legs and leg not in needed]
    kept = [leg for leg in legs if leg not in summed and leg not in alone]
    diagonal = [leg for leg in kept if leg in x.legs]
    new = [leg for leg in kept if leg not in x.legs]
    trailing = diagonal + new
    read = diagonal + summed  # the axes of x read at fixed positions
    dims = tuple(x.legs.index(leg) for leg in read)
    sizes = tuple(ctx.number(leg) for leg in trailing)
    rows = []
    for i in itertools.product(*(range(n) for n in sizes)):
        at = dict(zip(trailing, i, strict=True))
        terms = []
        for j in itertools.product(*(range(ctx.number(leg)) for leg in summed)):
            at_summed = dict(zip(summed, j, strict=True))
            coefficient = sympy.Integer(0)
            for a in itertools.product(*(range(ctx.number(leg)) for leg in alone)):
                index = at | at_summed | dict(zip(alone, a, strict=True))
                coefficient += entries[tuple(index[leg] for leg in legs)]
            if coefficient != 0:
                terms.append((coefficient, tuple((at | at_summed)[leg] for leg in read)))
        rows.append(tuple(terms))
    result_legs = tuple(leg for leg in x.legs if leg not in read) + tuple(trailing)
    name = ctx.names.fresh(f"{leaf.tensor.name}_{x.var}")  # type: ignore[union-attr]
    nonzero = sum(len(r) for r in rows)
    rest = [leg for leg in x.legs if leg not in read]
    step = Step(
        "literal",
        LiteralCombination(x, dims, sizes, tuple(rows)),
        Value(name, result_legs),
        f"{leaf.tensor.name}[{' '.join(show_legs(legs))}] · {ctx.show_value(x)} unrolled: "  # type: ignore[union-attr]
        f"{nonzero} signed slice(s) over {' '.join(show_legs(summed))}, no matmul",
        elementwise=max(nonzero, 1) * ctx.numel(rest),
        inputs=(x,),
    )
    value = ctx.emit(step)
    legs_with_broadcast = (*result_legs, *sorted(x.broadcast))
    return Leaf(legs_with_broadcast, value=Value(value.var, legs_with_broadcast, x.broadcast))  # type: ignore[union-attr]
