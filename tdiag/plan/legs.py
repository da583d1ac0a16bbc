"""Legs of expressions and values: every leg an expression names, a value with its legs called
by other names, whether a contraction only scales one factor, and computed values as factors
of a region (shared by the passes)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

import sympy

from ..errors import Span
from ..ir import Contraction, Expr, Position, Reduction, Scalar, SquaredDistance, TensorRef, walk
from .context import Leaf
from .program import BATCH, Value


def renamed_value(value: Value, rename: Mapping[str, str]) -> Value:
    """The same variable with its legs called by other names."""
    return Value(
        value.var,
        tuple(rename.get(leg, leg) for leg in value.legs),
        frozenset(rename.get(leg, leg) for leg in value.broadcast),
    )


def is_scaling(e: Expr) -> bool:
    """A contraction that only multiplies one factor by a number."""
    if not isinstance(e, Contraction) or e.summed:
        return False
    return len([f for f in e.factors if not isinstance(f, Scalar)]) == 1


def all_legs(e: Expr) -> set[str]:
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


def constant_along(legs: Iterable[str]) -> list[Leaf]:
    """A factor 1 over the broadcast legs of a computed value (legs it is constant along and has
    no axis for): a region that sums one of them multiplies by its size (Σ_g c = G c)."""
    legs = tuple(sorted(leg for leg in legs if leg != BATCH))
    return [Leaf(legs, constant=sympy.Integer(1))] if legs else []


def value_leaves(value: Value) -> list[Leaf]:
    """A computed value as factors of a region: itself over its axes, and 1 over its broadcast legs."""
    return [Leaf(value.legs, value=value), *constant_along(value.broadcast)]


def alpha_key(e: Expr) -> tuple[object, tuple[str, ...], tuple[str, ...]]:
    """`e` up to the names of its legs: a key equal for two sub-expressions that compute the same
    thing with their legs renamed consistently (`cos(Ang[n p])` and `cos(Ang[m p])`, RoPE on
    the queries and on the keys) where the legs' sizes agree too (the caller compares them), its
    result legs in the order that key numbers them, and every leg it numbered in that order. Spans
    are left out; a string is a leg wherever it names one of `e`'s legs, except in the fields
    that name tensors, maps and reductions (`name`) or a position's operation (`op`)."""
    universe = all_legs(e)
    order: dict[str, int] = {}

    def convert(value: object, field: str, owner: object) -> object:
        if isinstance(value, Span):
            return None
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return node(value)
        if isinstance(value, tuple):
            return tuple(convert(v, field, owner) for v in value)
        if isinstance(value, str) and value in universe and field not in ("name", "op"):
            return ("leg", order.setdefault(value, len(order)))
        if isinstance(value, str) and field == "name" and isinstance(owner, Position) and owner.op == "leg":
            return ("leg", order.setdefault(value, len(order)))
        return value

    def node(n: object) -> tuple:
        return (type(n).__name__, *(convert(getattr(n, f.name), f.name, n) for f in dataclasses.fields(n)))

    key = node(e)
    return key, tuple(sorted(dict.fromkeys(e.legs), key=lambda leg: order.get(leg, len(order)))), tuple(order)
