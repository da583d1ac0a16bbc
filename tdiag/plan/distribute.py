"""A product of a sum of softmax boxes with values, distributed over the sum: (A1 − λ A2) V =
A1 V − λ (A2 V), so that each box meets the values alone and can be one fused attention
(differential attention, Ye et al. 2024, eq. 1) instead of materialized H·N² boxes summed first.
The distribution costs one value product per term; the lowering takes it where its objective
says it is cheaper (regions.py `lower_region`, on trial), so FLOP counts (cost reports) keep the
undistributed form wherever it has fewer FLOPs."""

from __future__ import annotations

from collections.abc import Callable

from ..ir import Contraction, Expr, SoftmaxBox, SumNode, TensorRef, walk


def distributed_over_boxes(e: Expr, box_statement: Callable[[str], bool]) -> SumNode | None:
    """Σ_i ±(term_i · the other factors) for the one factor of contraction `e` that is a sum
    whose terms reach a softmax box (directly, or through a statement `box_statement` says is a
    box folded into its consumer), every term over the sum's own legs; None where no such sum."""
    if not isinstance(e, Contraction):
        return None
    sums = [k for k, f in enumerate(e.factors) if isinstance(f, SumNode)]
    if len(sums) != 1:
        return None
    k = sums[0]
    total: SumNode = e.factors[k]  # type: ignore[assignment]
    if any(set(term.legs) != set(total.legs) for term in total.terms):
        return None
    if not any(_reaches_box(term, box_statement) for term in total.terms):
        return None
    others = e.factors[:k] + e.factors[k + 1 :]
    products = tuple(
        Contraction(
            legs=e.legs,
            span=e.span,
            factors=(*others, term),
            coefficient=e.coefficient,
            summed=e.summed,
            batch=e.batch,
        )
        for term in total.terms
    )
    return SumNode(legs=e.legs, span=e.span, terms=products, signs=total.signs)


def _reaches_box(term: Expr, box_statement: Callable[[str], bool]) -> bool:
    return any(
        isinstance(node, SoftmaxBox) or (isinstance(node, TensorRef) and box_statement(node.name))
        for node in walk(term)
    )
