"""Maps, reductions, scans, segment sums, sum nodes and quotients: elementwise ops over aligned
operands (combine.py); a sum's terms meet smallest pair first, and terms constant along a
surrounding softmax's legs drop out. Each `lower_*` is its kind's lower rule (base.LOWER,
registered in tdiag/constructs)."""

from __future__ import annotations

import sympy

from ..ir import (
    POSITION_MASKS,
    Contraction,
    ElementwiseMap,
    Expr,
    Quotient,
    Reduction,
    Scalar,
    Scan,
    SegmentSum,
    SquaredDistance,
    SumNode,
)
from .boxes import apply_mask, expand_broadcast, hidden_operand, maskable
from .combine import as_missing_legs, combine, owns_parameter
from .context import Lowering
from .distance import distance_parts
from .program import (
    CumulativeScan,
    Map,
    Reduce,
    SegmentSums,
    Step,
    Value,
    show_legs,
)
from .quotient_shift import ROW_SHIFT_NOTE, shifted_quotient


def lower_map(ctx: Lowering, e: ElementwiseMap, ren, var: str | None) -> Value:
    operand = ctx.lower(e.operand, ren)  # type: ignore[arg-type]
    name = ctx.names.fresh(var or e.name)
    return ctx.emit(
        Step(
            "map",
            Map(operand, e.name, tuple(ctx.runtime(p) for p in e.params)),
            Value(name, operand.legs, operand.broadcast),
            e.name,
            elementwise=ctx.numel(operand.legs),
            inputs=(operand,),
        )
    )  # type: ignore[return-value]


def lower_reduction(ctx: Lowering, e: Reduction, ren, var: str | None) -> Value:
    operand = ctx.lower(e.operand, ren)  # type: ignore[arg-type]
    over = tuple(p for leg in e.over for p in ren[leg])
    operand = maskable(ctx, operand, e, ren, set(over))
    hidden = []
    for mask in e.masks:
        operand = apply_mask(ctx, operand, mask, ren, is_exp=e.name != "mean", future="lowest")
        hidden.append(hidden_operand(ctx, mask, ren, operand.legs))
    dims = tuple(operand.legs.index(leg) for leg in over)
    name = ctx.names.fresh(var or e.name)
    method = {"max": "amax", "logsumexp": "logsumexp", "mean": "mean"}[e.name]
    legs = tuple(leg for leg in operand.legs if leg not in over)
    return ctx.emit(
        Step(
            "reduction",
            Reduce(operand, method, dims, tuple(hidden) if e.name == "mean" else ()),
            Value(name, legs, operand.broadcast),
            f"{e.name} over {' '.join(show_legs(over))}",
            over,
            elementwise=ctx.numel(operand.legs),
            inputs=(operand,),
        )
    )  # type: ignore[return-value]


def lower_scan(ctx: Lowering, e: Scan, ren, var: str | None) -> Value:
    """A prefix scan along its leg: hidden entries filled with what adds nothing (0, or −inf
    in log space), then one scan step, computed in float32 under autocast (a running sum of
    log-gates loses its small terms in bfloat16). Costs one elementwise operation per entry."""
    operand = ctx.lower(e.operand, ren)  # type: ignore[arg-type]
    (along,) = ren[e.along]
    operand = maskable(ctx, operand, e, ren, {along})
    for mask in sorted(e.masks, key=lambda m: isinstance(m, POSITION_MASKS)):  # the future is −inf, padded or not
        operand = apply_mask(ctx, operand, mask, ren, is_exp=e.name == "logcumsumexp")
    name = ctx.names.fresh(var or e.name)
    options = [word for word, flag in (("exclusive", e.exclusive), ("reverse", e.reverse)) if flag]
    return ctx.emit(
        Step(
            "scan",
            CumulativeScan(operand, e.name, operand.legs.index(along), e.exclusive, e.reverse),
            Value(name, operand.legs, operand.broadcast),
            " ".join([e.name, *options, "along", *show_legs([along])]),
            elementwise=ctx.numel(operand.legs),
            inputs=(operand,),
            wide=True,
        )
    )  # type: ignore[return-value]


def lower_segment_sum(ctx: Lowering, e: SegmentSum, ren, var: str | None) -> Value:
    """Σ_{k=m+1..n} a_k over (n, m): one step whose result has the operand's other legs, then
    n and m; one addition per result entry (the masked cumulative sum), in float32 under
    autocast as a scan is."""
    operand = ctx.lower(e.operand, ren)  # type: ignore[arg-type]
    (along,), (key,) = ren[e.along], ren[e.key]
    operand = expand_broadcast(ctx, operand, {along})
    legs = (*(leg for leg in operand.legs if leg != along), along, key)
    name = ctx.names.fresh(var or "segsum")
    return ctx.emit(
        Step(
            "segsum",
            SegmentSums(operand, operand.legs.index(along)),
            Value(name, legs, operand.broadcast),
            f"segment sums along {' '.join(show_legs([along]))} over {' '.join(show_legs([along, key]))}",
            elementwise=ctx.numel(legs),
            inputs=(operand,),
            wide=True,
        )
    )  # type: ignore[return-value]


def lower_sum(ctx: Lowering, e: SumNode, ren, var: str | None) -> Value:
    """Σ ± terms in one elementwise step. A term that is itself a sum node or a squared
    distance, scaled or not, is flattened in with the scaling folded into its own terms (onto
    the smallest operand of each contraction), so that MGK's log π − ‖q − k‖²/(2√D) is one
    pass over the logits, log π and the key norm meeting first, not three."""
    terms = varying(ctx, e.terms, e.signs, ren)
    out = tuple(p for leg in e.legs for p in ren[leg])
    if len(terms) == 1 and terms[0][1] > 0:
        value = ctx.lower(terms[0][0], ren, var)
        dropped = frozenset(out) - set(value.legs) - value.broadcast  # legs only a dropped term had
        return Value(value.var, value.legs, value.broadcast | dropped) if dropped else value
    parts: list[tuple[int, Value]] = []
    flattened: list[Expr] = []
    for term, sign in terms:
        inner, factor = _scaled(term)
        if isinstance(inner, SumNode | SquaredDistance):
            parts += sum_parts(ctx, inner, ren, sign * factor)
            flattened.append(inner)
        else:
            parts.append((sign, as_missing_legs(ctx.lower(term, ren))))
    kind = "sqdist" if any(isinstance(f, SquaredDistance) for f in flattened) else "sum"
    value = combine(ctx, kind, parts, out, var)
    if flattened:  # the papers count a sum node's additions at its result's size (App. B)
        ctx.target[-1].paper = ctx.numel(value.legs) * (len(terms) - 1)
    return value


def varying(ctx: Lowering, terms, signs, ren) -> list[tuple[Expr, int]]:
    """A sum's terms less those constant along a surrounding softmax's legs (they drop out)."""
    pairs = list(zip(terms, signs, strict=True))
    if ctx.shift_invariant is None:
        return pairs
    kept = [
        (t, s)
        for t, s in pairs
        if {p for leg in t.legs for p in ren[leg]} & ctx.shift_invariant or owns_parameter(ctx, t)
    ]
    return kept or pairs[:1]


def sum_parts(ctx: Lowering, e: SumNode | SquaredDistance, ren, coefficient: sympy.Expr) -> list[tuple[int, Value]]:
    """The signed terms of coefficient · e for a flattened sum."""
    if isinstance(e, SquaredDistance):
        return distance_parts(ctx, e, ren, coefficient)
    parts = []
    for term, sign in varying(ctx, e.terms, e.signs, ren):
        inner, factor = _scaled(term)
        if isinstance(inner, SumNode | SquaredDistance):
            parts += sum_parts(ctx, inner, ren, coefficient * sign * factor)
        elif abs(coefficient) == 1:
            parts.append((int(sign * coefficient), as_missing_legs(ctx.lower(term, ren))))
        else:
            parts.append((1, as_missing_legs(ctx.lower(term, ren, scale=sign * coefficient))))
    return parts


def lower_quotient(ctx: Lowering, e: Quotient, ren, var: str | None) -> Value:
    """numerator / denominator, elementwise; a quotient of causal products sharing a decay
    with that decay shifted by its row max first (quotient_shift.py), which cancels."""
    shifted = shifted_quotient(e, ctx.g, ctx.uses)
    if shifted is not None:
        note = ROW_SHIFT_NOTE.format(target=var or "a quotient")
        if ctx.target is ctx.steps and note not in ctx.lowered:
            ctx.lowered.append(note)
        e = shifted
    numerator = as_missing_legs(ctx.lower(e.numerator, ren))  # type: ignore[arg-type]
    denominator = as_missing_legs(ctx.lower(e.denominator, ren))  # type: ignore[arg-type]
    out = tuple(p for leg in e.legs for p in ren[leg])
    return combine(ctx, "quotient", [(1, numerator), (1, denominator)], out, var, operator="/")


def _scaled(e: Expr) -> tuple[Expr, sympy.Expr]:
    """(x, c) for a term c · x that only scales one factor by numbers; (e, 1) otherwise."""
    if not isinstance(e, Contraction) or e.summed:
        return e, sympy.Integer(1)
    factors = [f for f in e.factors if not isinstance(f, Scalar)]
    if len(factors) != 1 or set(factors[0].legs) != set(e.legs):
        return e, sympy.Integer(1)
    coefficient = e.coefficient * sympy.Mul(*(f.value for f in e.factors if isinstance(f, Scalar)))
    return factors[0], coefficient
