"""Squared distances as contractions, Σ_d (a − b)² = ‖a‖² + ‖b‖² − 2 a·b, with a sum side
expanded one level when cheaper (sMGK's shifted keys, MGK P11; spec mgk §6.3)."""

from __future__ import annotations

import sympy

from ..ir import (
    ONE,
    Expr,
    SquaredDistance,
    SumNode,
    TensorRef,
)
from .chooser import cheapest
from .combine import as_missing_legs, combine
from .context import Lowering
from .contraction import plan_contraction
from .program import (
    BATCH,
    Value,
)
from .regions import definition_renaming
from .trials import trial_cost


def lower_distance(ctx: Lowering, e: SquaredDistance, ren, var: str | None) -> Value:
    """Σ_d (a − b)² = Σ_d a² + Σ_d b² − 2 Σ_d a·b: contractions, no (a − b) tensor, added in
    one elementwise step."""
    out = tuple(p for leg in e.legs for p in ren[leg])
    return combine(ctx, "sqdist", distance_parts(ctx, e, ren), out, var)


def distance_parts(ctx: Lowering, e: SquaredDistance, ren, coefficient: sympy.Expr = ONE) -> list[tuple[int, Value]]:
    """The terms of coefficient · Σ_d (a − b)², the coefficient folded into each (onto the
    smallest operand of a contraction). A side that is a sum (sMGK's k_jr = k_j + b_r) may be
    expanded one level further, so that the N² contraction is paid once rather than once per
    shift (MGK P11, spec §6.3); the expansion is taken when it costs fewer FLOPs at the
    planned sizes."""
    plain = [[(1, e.left, ren)], [(1, e.right, ren)]]
    expanded = [summands(ctx, e.left, ren, e.over), summands(ctx, e.right, ren, e.over)]
    if expanded == plain or any(s is None for s in expanded):
        return distance_terms(ctx, e, plain, coefficient)
    forms = [(plain, trial_cost(ctx, lambda: distance_terms(ctx, e, plain, coefficient)))]
    forms.append((expanded, trial_cost(ctx, lambda: distance_terms(ctx, e, expanded, coefficient))))
    if cheapest(forms) is expanded:
        if not ctx.trialing:
            ctx.lowered.append("squared distance to shifted keys expanded (MGK P11): one N² contraction")
        return distance_terms(ctx, e, expanded, coefficient)
    ctx.refuse(f"squared distance to shifted keys: expansion (MGK P11) refused: {ctx.dearer} the plain form")
    return distance_terms(ctx, e, plain, coefficient)


def summands(ctx: Lowering, e: Expr, ren, over: tuple[str, ...]) -> list[tuple[int, Expr, dict]] | None:
    """The terms of a sum side (directly or through the statement defining it) with their leg
    renamings, or the side itself; None where a term lacks a distance leg (Σ_d of a constant
    is not a contraction)."""
    distance = {p for leg in over for p in ren[leg]}
    if isinstance(e, TensorRef) and ctx.g.tensors[e.name].statement is not None:
        statement = ctx.g.tensors[e.name].statement
        axes = tuple(tuple(p for leg in group for p in ren[leg]) for group in e.groups)
        inner = definition_renaming(ctx, statement, axes) if isinstance(statement.expr, SumNode) else None
        if inner is not None:
            e, ren = statement.expr, inner
    if not isinstance(e, SumNode):
        return [(1, e, ren)]
    terms = [(sign, term, ren) for term, sign in zip(e.terms, e.signs, strict=True)]
    if any(not distance <= {p for leg in term.legs for p in ren[leg]} for _, term, _ in terms):
        return None
    return terms


def distance_terms(ctx: Lowering, e: SquaredDistance, sides, coefficient: sympy.Expr) -> list[tuple[int, Value]]:
    """Σ_d (Σ_k c_k z_k)² = Σ_k ‖z_k‖² + 2 Σ_{k<l} c_k c_l z_k·z_l over the summands z of
    both sides (right ones negated), each times `coefficient`; a term constant along a
    surrounding softmax's legs is dropped (the query norm, MGK P2)."""
    (_, _, ren), *_ = sides[0]
    over = tuple(p for leg in e.over for p in ren[leg])
    out = tuple(p for leg in e.legs for p in ren[leg])
    vectors = [
        (sign * side_sign, term, r) for side_sign, side in zip((1, -1), sides, strict=True) for sign, term, r in side
    ]
    values = [ctx.lower(term, r) for _, term, r in vectors]
    parts = []
    for k, (a, value_a) in enumerate(zip(vectors, values, strict=True)):
        for j in range(k, len(vectors)):
            b, value_b = vectors[j], values[j]
            kept = tuple(leg for leg in (BATCH, *out) if leg in value_a.legs + value_b.legs and leg not in over)
            if ctx.shift_invariant is not None and not set(kept) & ctx.shift_invariant:
                continue  # the same for every key: it cancels in the softmax (MGK P2)
            weight = sympy.Integer(a[0] * b[0]) * coefficient
            if k == j:
                parts.append((1, squared_norm(ctx, value_a, kept, weight)))
            else:
                parts.append((1, plan_contraction(ctx, [value_a, value_b], kept, 2 * weight, None)))
    return [(sign, as_missing_legs(v)) for sign, v in parts]


def squared_norm(ctx: Lowering, value: Value, kept: tuple[str, ...], coefficient: sympy.Expr = ONE) -> Value:
    """coefficient · Σ value² over the legs not kept; its steps are "norm" steps, which the
    papers' counting leaves out (MGK App. B)."""
    start = len(ctx.target)
    result = plan_contraction(ctx, [value, value], kept, coefficient, None)
    for step in ctx.target[start:]:
        step.kind = "norm" if step.kind == "contraction" else step.kind
    return result
