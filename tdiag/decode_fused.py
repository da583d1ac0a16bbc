"""The planner's fused nodes to decoding: a compiled module's graph (Plan.graph) has its layer
norms fused into LayerNormNode (plan/norms.py), a kind of the planner, not of the language, so
its decoding rules are constructs/norm.py's: a "kv" cache's rows and step programs take it as it
is (the planner lowers it again); the state analysis takes it written out in nodes the reference
evaluator takes (`written_out`, here), so its tables never meet it. Nothing here imports torch."""

from __future__ import annotations

import sympy

from .ir import Contraction, ElementwiseMap, Expr, Reduction, Scalar, SumNode, map_children
from .plan.norms import LayerNormNode

__all__ = ["align_legs", "written_out"]


def written_out(e: Expr) -> Expr:
    """`e` with each layer norm the planner fused (a compiled module's graph, plan/norms.py)
    written out again in nodes the reference evaluator takes:
    (Z − mean(Z)) (mean((Z − mean(Z))²) + eps)^(−1/2) [· weight] [+ bias]."""
    e = map_children(e, written_out)
    if not isinstance(e, LayerNormNode):
        return e
    z = e.operand
    assert z is not None
    rest = tuple(leg for leg in z.legs if leg not in e.over)
    centred = SumNode(
        z.legs, e.span, terms=(z, Reduction(rest, e.span, name="mean", over=e.over, operand=z)), signs=(1, -1)
    )
    square = ElementwiseMap(z.legs, e.span, name="pow", operand=centred, params=(sympy.Integer(2),))
    variance = Reduction(rest, e.span, name="mean", over=e.over, operand=square)
    shifted = SumNode(rest, e.span, terms=(variance, Scalar((), e.span, value=e.eps)), signs=(1, 1))
    root = ElementwiseMap(rest, e.span, name="pow", operand=shifted, params=(sympy.Rational(-1, 2),))
    factors = (centred, root) if e.weight is None else (centred, root, e.weight)
    normed = Contraction(z.legs, e.span, factors=factors)
    if e.bias is None:
        return align_legs(normed, e.legs)
    return SumNode(e.legs, e.span, terms=(normed, e.bias), signs=(1, 1))


def align_legs(e: Expr, legs: tuple[str, ...]) -> Expr:
    """`e` with its legs listed as `legs` (a product of it alone where they differ in order)."""
    return e if tuple(e.legs) == tuple(legs) else Contraction(tuple(legs), e.span, factors=(e,))
