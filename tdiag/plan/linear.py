"""Normalize boxes in the linear-time order: Σ_m (x / Σ_m x) v = (Σ_m x v) / (Σ_m x) when the
content is multilinear (Tuformer §3.3, MGK P12); causal boxes take chunked prefix sums
(chunked.py). Whether it applies and pays is the form's decision (forms/linear.py); these
functions emit it through the lowering, passed as `ctx`."""

from __future__ import annotations

import functools

import sympy

from ..ir import (
    CausalMask,
    Contraction,
    ElementwiseMap,
    Expr,
    Scalar,
    SoftmaxBox,
    SumNode,
    TensorRef,
)
from .boxes import expand_broadcast, kept_by
from .chunked import causal_contract
from .combine import combine
from .constants import fill
from .context import Leaf, Lowering
from .legs import constant_along
from .program import (
    BATCH,
    OnesColumn,
    Operand,
    Ratio,
    Step,
    Value,
    align,
    show_legs,
)
from .regions import collect, contract
from .stabilize import stabilize_exponents


def prefix_legs(ctx: Lowering, box: SoftmaxBox, ren) -> tuple[str, str] | None:
    """(query, key) region legs when the box's only masks are causal ones over its single
    normalized leg, between legs of one size: then Σ_{m ≤ n} is a prefix sum."""
    normalized = tuple(p for leg in box.normalized for p in ren[leg])
    pairs = set()
    for mask in box.masks:
        if not isinstance(mask, CausalMask) or len(ren[mask.query]) != 1 or ren[mask.key] != normalized:
            return None
        pairs.add((ren[mask.query][0], normalized[0]))
    if len(pairs) != 1:
        return None
    query, key = pairs.pop()
    if sympy.simplify(ctx.g.expand(ctx.size(query) - ctx.size(key))) != 0:
        return None
    return query, key


def is_multilinear(e: Expr) -> bool:
    """A content the linear-time order can split: products of stored tensors and maps, and
    integer powers 1..4 of such products (expanded into copies)."""
    return not_multilinear(e) is None


def not_multilinear(e: Expr) -> str | None:
    """Why the linear-time order cannot split `e` into factors, or None when it can (see
    is_multilinear)."""
    if isinstance(e, ElementwiseMap) and e.name == "pow":
        exponent = e.params[0]
        if not (exponent.is_Integer and 1 <= int(exponent) <= 4):
            return f"a power {exponent} (integer powers 1 to 4 are expanded into products)"
        return not_multilinear(e.operand)  # type: ignore[arg-type]
    if isinstance(e, Contraction):
        found = (not_multilinear(f) for f in e.factors if isinstance(f, ElementwiseMap))
        return next((why for why in found if why is not None), None)
    if isinstance(e, TensorRef | Scalar | ElementwiseMap):
        return None
    return f"a {e.kind}, not a product"


def content_terms(e: Expr) -> list[tuple[Expr, int]]:
    """The signed terms of a box's content: a sum node's terms (nested sums flattened), else the
    content itself."""
    if not isinstance(e, SumNode):
        return [(e, 1)]
    return [(term, sign * inner) for t, sign in zip(e.terms, e.signs, strict=True) for term, inner in content_terms(t)]


def not_linear_content(e: Expr) -> str | None:
    """Why a normalize box's content has no linear-time order, naming the term of a sum that
    has none: Σ_m (Σ_i x_i / Σ_m Σ_i x_i) v = Σ_i Σ_m x_i v / Σ_i Σ_m x_i needs each x_i multilinear."""
    terms = content_terms(e)
    for k, (term, _) in enumerate(terms):
        why = not_multilinear(term)
        if why is not None:
            return (
                f"the box's content is not multilinear: {why}"
                if len(terms) == 1
                else (f"term {k + 1} of the box's content (a sum of {len(terms)}) is not multilinear: {why}")
            )
    return None


def collect_expanded(ctx: Lowering, e: Expr, ren, leaves: list[Leaf]) -> sympy.Expr:
    """Like collect, with x ^ p of a contraction written as p copies of it."""
    return collect(ctx, e, ren, leaves, expand_powers=True)


def collect_stabilized(ctx: Lowering, e, ren, leaves: list[Leaf], kept: frozenset[str] | None) -> sympy.Expr:
    """collect_expanded of a normalize box's content, its exp factors shifted (stabilize.py)."""
    found: list[Leaf] = []
    with ctx.scope(stabilized=kept, lazy_triangles=kept is None):  # a decay stays a factor for the chunks
        coefficient = collect_expanded(ctx, e, ren, found)
    leaves += found if kept is None else stabilize_exponents(ctx, found, kept)
    return coefficient


def hoist(
    ctx: Lowering, box: SoftmaxBox, ren, values: list[Leaf], rest: list[Leaf], out: tuple[str, ...]
) -> list[Leaf]:
    """Emit numerator and denominator contractions and their quotient; return the region's
    leaves with the quotient standing in for the box and its value side."""
    normalized = {p for leg in box.normalized for p in ren[leg]}
    if len(content_terms(box.content)) > 1:
        return hoist_sum(ctx, box, ren, values, rest, out)
    kept_by_box, shifted = kept_by(ctx, box, ren), ctx.stabilizations
    content: list[Leaf] = []
    coefficient = collect_stabilized(ctx, box.content, ren, content, kept_by_box)
    kept = tuple(p for leg in box.legs for p in ren[leg] if p not in normalized)
    batch = (BATCH,) if any(BATCH in c.legs for c in [*content, *values]) else ()
    needed = set(out) | {leg for r in rest for leg in r.legs}
    extra = tuple(
        leg
        for leg in dict.fromkeys(leg for v in values for leg in v.legs)
        if leg in needed and leg not in kept and leg != BATCH
    )
    causal = prefix_legs(ctx, box, ren) if box.masks else None
    contract_with = (
        functools.partial(contract, ctx) if causal is None else functools.partial(causal_contract, ctx, *causal)
    )
    widened = widened_leg(values, content, extra) if causal is not None else None
    if widened is not None:
        value = folded_quotient(
            ctx, box, content, values, coefficient, (*batch, *kept, *extra), widened, contract_with, shifted
        )
        if value is not None:
            return [*rest, Leaf(value.legs, value=value)]
    numerator = contract_with([*content, *values], (*batch, *kept, *extra), coefficient, "numerator")
    den_content: list[Leaf] = []
    den_coefficient = collect_stabilized(ctx, box.content, ren, den_content, kept_by_box)
    denominator = contract_with(
        den_content,
        tuple(leg for leg in (BATCH, *kept) if any(leg in c.legs for c in den_content)),
        den_coefficient,
        "denominator",
    )
    present = tuple(leg for leg in numerator.legs)
    name = ctx.names.fresh("normalized")
    guard = ctx.stabilizations > shifted
    step = Step(
        "quotient",
        Ratio(numerator, align(denominator, present), ctx.runtime(box.eps), guard),
        Value(name, present),
        "numerator / denominator, 0 where both are 0" if guard else "numerator / (denominator + eps)",
        elementwise=ctx.numel(present),
        divisions=ctx.numel(present),
        inputs=(numerator, denominator),
    )
    value = ctx.emit(step)
    return [*rest, Leaf(value.legs, value=value)]  # type: ignore[union-attr]


def hoist_sum(
    ctx: Lowering, box: SoftmaxBox, ren, values: list[Leaf], rest: list[Leaf], out: tuple[str, ...]
) -> list[Leaf]:
    """hoist for a content that is a sum of multilinear terms x_i (cosFormer's cos and sin
    re-weightings, a Taylor feature map's 1 + s + s²/2): Σ_m (Σ_i x_i / Σ_m Σ_i x_i) v is
    Σ_i Σ_m x_i v / Σ_i Σ_m x_i, each Σ_m a contraction (or causal prefix sums) ordered so that
    N·M never appears. A term without a normalized leg (the constant 1) is summed along it as a
    factor 1 (Σ_m 1 = M, or m ≤ n under a causal mask). No exp factor is shifted: a shift per
    term would not cancel between the terms."""
    normalized = tuple(dict.fromkeys(p for leg in box.normalized for p in ren[leg]))
    kept = tuple(p for leg in box.legs for p in ren[leg] if p not in normalized)
    causal = prefix_legs(ctx, box, ren) if box.masks else None
    contract_with = (
        functools.partial(contract, ctx) if causal is None else functools.partial(causal_contract, ctx, *causal)
    )
    terms = []
    for term, sign in content_terms(box.content):
        content: list[Leaf] = []
        coefficient = collect_stabilized(ctx, term, ren, content, None)
        carried = {leg for c in content for leg in c.legs}
        missing = tuple(leg for leg in normalized if leg not in carried)
        if missing and causal is not None:  # the prefix sums split the key leg: a real axis of ones
            ones = expand_broadcast(ctx, fill(ctx, sympy.Integer(1), missing, None), set(missing))
            content.append(Leaf(ones.legs, value=ones))
        else:
            content += constant_along(missing)
        terms.append((sign, content, coefficient))
    batch = (BATCH,) if any(BATCH in c.legs for _, content, _ in terms for c in [*content, *values]) else ()
    needed = set(out) | {leg for r in rest for leg in r.legs}
    extra = tuple(
        leg
        for leg in dict.fromkeys(leg for v in values for leg in v.legs)
        if leg in needed and leg not in kept and leg != BATCH
    )
    legs = (*batch, *kept, *extra)
    numerators = [(sign, contract_with([*content, *values], legs, c, "numerator")) for sign, content, c in terms]
    denominators = []
    for sign, content, c in terms:
        carried = {leg for leaf in content for leg in leaf.legs} | set(causal or ())  # Σ_{m ≤ n} varies along n
        denominators.append(
            (sign, contract_with(content, tuple(leg for leg in (BATCH, *kept) if leg in carried), c, "denominator"))
        )
    numerator = combine(ctx, "sum", numerators, legs, "numerator")
    denominator = combine(ctx, "sum", denominators, (*batch, *kept), "denominator")
    present = tuple(numerator.legs)
    step = Step(
        "quotient",
        Ratio(numerator, align(denominator, present), ctx.runtime(box.eps), False),
        Value(ctx.names.fresh("normalized"), present, numerator.broadcast),
        f"numerator / (denominator + eps), each the sum of {len(terms)} terms' contractions",
        elementwise=ctx.numel(present),
        divisions=ctx.numel(present),
        inputs=(numerator, denominator),
    )
    value = ctx.emit(step)
    return [*rest, Leaf(value.legs, value=value)]  # type: ignore[union-attr]


def widened_leg(values: list[Leaf], content: list[Leaf], extra: tuple[str, ...]) -> str | None:
    """The value side's leg that takes the denominator as one more entry: the last leg the
    output keeps that the box's content does not carry (the value width e), or None."""
    inside = {leg for c in content for leg in c.legs}
    found = [leg for leg in extra if leg not in inside and any(leg in v.legs for v in values)]
    return found[-1] if found else None


def folded_quotient(
    ctx: Lowering,
    box: SoftmaxBox,
    content: list[Leaf],
    values: list[Leaf],
    coefficient: sympy.Expr,
    legs: tuple[str, ...],
    widened: str,
    contract_with,
    shifted: int,
) -> Value | None:
    """The quotient with numerator and denominator from one contraction: the value side v laid
    out with `widened` last and widened to [v, 1], so that Σ_m x [v, 1] holds the numerator and,
    in its last entry, the denominator Σ_m x (Katharopoulos et al. §3.2). Under causal prefix
    sums the chunked factors, the triangle, the within-chunk scores and the prefix sum of the
    states are then shared. The value side's legs are those the numerator keeps or the content
    carries, so the column of ones is summed over exactly the legs the denominator is. None
    where `widened` is a broadcast leg of v (nothing to append to). `shifted`: the lowering's
    count of stabilized exponents before the content was collected (a shift means the guard)."""
    inside = {leg for c in content for leg in c.legs} | set(legs)
    side = [leg for leg in dict.fromkeys(leg for v in values for leg in v.legs) if leg in inside and leg != widened]
    value = contract(ctx, values, (*side, widened), sympy.Integer(1), "values")
    if widened in value.broadcast:
        return None
    stored = [leg for leg in value.legs if leg not in value.broadcast]
    axis = stored.index(widened)
    wide = ctx.new_leg(widened, ctx.size(widened) + 1)
    ones = ctx.emit(
        Step(
            "concat",
            OnesColumn(value, axis, len(stored) - 1 - axis),
            Value(
                ctx.names.fresh("values_ones"),
                tuple(wide if leg == widened else leg for leg in value.legs),
                value.broadcast,
            ),
            f"values [v, 1] over {show_legs([widened])[0]}: the denominator as one more column",
            elementwise=ctx.numel(value.legs),
            inputs=(value,),
        )
    )
    numerator = contract_with(
        [*content, Leaf(ones.legs, value=ones)],  # type: ignore[union-attr]
        tuple(wide if leg == widened else leg for leg in legs),
        coefficient,
        "numerator",
    )
    guard = ctx.stabilizations > shifted
    stored = [leg for leg in numerator.legs if leg not in numerator.broadcast]
    present = tuple(widened if leg == wide else leg for leg in numerator.legs)
    step = Step(
        "quotient",
        Ratio(numerator, Operand(numerator), ctx.runtime(box.eps), guard, stored.index(wide)),
        Value(ctx.names.fresh("normalized"), present),
        ("numerator / denominator, 0 where both are 0" if guard else "numerator / (denominator + eps)")
        + f", the denominator the last entry over {show_legs([widened])[0]}",
        elementwise=ctx.numel(present),
        divisions=ctx.numel(present),
        inputs=(numerator,),
    )
    return ctx.emit(step)  # type: ignore[return-value]
