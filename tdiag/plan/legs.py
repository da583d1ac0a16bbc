"""Legs of expressions and values: every leg an expression names, a value with its legs called
by other names, and whether a contraction only scales one factor (shared by the passes)."""

from __future__ import annotations

from collections.abc import Mapping

from ..ir import Contraction, Expr, Reduction, Scalar, SquaredDistance, TensorRef, walk
from .program import Value


def _renamed(value: Value, rename: Mapping[str, str]) -> Value:
    """The same variable with its legs called by other names."""
    return Value(
        value.var,
        tuple(rename.get(leg, leg) for leg in value.legs),
        frozenset(rename.get(leg, leg) for leg in value.broadcast),
    )


def _is_scaling(e: Expr) -> bool:
    """A contraction that only multiplies one factor by a number."""
    if not isinstance(e, Contraction) or e.summed:
        return False
    return len([f for f in e.factors if not isinstance(f, Scalar)]) == 1


def _all_legs(e: Expr) -> set[str]:
    legs: set[str] = set()
    for node in walk(e):
        legs |= set(node.legs)
        if isinstance(node, Contraction):
            legs |= set(node.summed)
        if isinstance(node, Reduction | SquaredDistance):
            legs |= set(node.over)
        if isinstance(node, TensorRef):
            legs |= {leg for g in node.groups for leg in g}
    return legs
