"""A causal normalize box in its linear order, for the state analysis (decode_products.py): the
box `A[h n m] = normalize[m, mask = causal(n, m)](x)` read by one product that sums its key leg
(`Y = A[h n m] V[m h e] …`) is rewritten as Σ_m A V = (Σ_{m ≤ n} x V) / (Σ_{m ≤ n} x + eps),
each term of a sum content (cosFormer, Based) a causal product of its own (plan/linear.py's
hoist and hoist_sum, Tuformer §3.3). The softmax box's STATE_STATEMENT rule
(constructs/softmax.py) calls `unboxed`; nothing here imports torch."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from .decode_rules import NoStateError, legs_in
from .ir import (
    CausalFactor,
    CausalMask,
    Contraction,
    Expr,
    PaddingMask,
    Quotient,
    Scalar,
    SoftmaxBox,
    Statement,
    SumNode,
    TensorRef,
    renamed,
    walk,
)

if TYPE_CHECKING:
    from .decode_products import StatePlanner

__all__ = ["box_reader", "content_terms", "linear_order", "unboxed"]


def unboxed(planner: StatePlanner, statement: Statement, statements: list[Statement]) -> list[Statement]:
    """`statements` with the box of `statement`, where it normalizes over positions, and its one
    reader rewritten as the quotient of two sums of causal products (the box's statement
    dropped); a softmax over positions has no such form."""
    box = statement.expr
    assert isinstance(box, SoftmaxBox)
    if not any(planner.positional(leg) for leg in box.normalized):
        return statements
    name = statement.target
    if box.is_exp:
        raise NoStateError(
            f"{name} is a softmax over positions {', '.join(box.normalized)}: its weights need every"
            " key's score (no running sum of a fixed size holds them)"
        )
    out = list(statements)
    readers = [s for s in out if any(isinstance(n, TensorRef) and n.name == name for n in walk(s.expr))]
    reader = box_reader(planner, statement, box, readers)
    out[out.index(reader)] = linear_order(planner, statement, box, reader)
    out.remove(statement)
    return out


def box_reader(planner: StatePlanner, statement: Statement, box: SoftmaxBox, readers: list[Statement]) -> Statement:
    """The one statement that reads the box, as a factor of its product summing the key leg."""
    name = statement.target
    if len(box.normalized) != 1 or any(len(g) != 1 for g in statement.groups):
        raise NoStateError(f"{name} normalizes over several legs or merges legs")
    key = box.normalized[0]
    positions = [m for m in box.masks if not isinstance(m, PaddingMask)]  # a cache takes no design mask
    causal = [m for m in positions if isinstance(m, CausalMask) and m.key == key and planner.positional(m.query)]
    if len(causal) != len(positions) or len(positions) > 1:
        raise NoStateError(f"{name}'s masks are not one causal mask over {key}: no running sum serves them")
    if len([leg for leg in statement.legs if planner.positional(leg)]) != 2:
        raise NoStateError(f"{name} normalizes over {key} without one query position beside it")
    if box.sink is not None:
        raise NoStateError(f"{name} has a sink")
    if name in planner.graph.outputs or len(readers) != 1:
        raise NoStateError(f"{name} is an output or read by {len(readers)} statements (its linear order needs one)")
    reader = readers[0]
    refs = [n for n in walk(reader.expr) if isinstance(n, TensorRef) and n.name == name]
    expr = reader.expr
    if (
        len(refs) != 1
        or not isinstance(expr, Contraction)
        or refs[0] not in expr.factors
        or refs[0].is_reshaped
        or refs[0].is_sliced
    ):
        raise NoStateError(f"{reader.target} reads {name} other than once as a factor of its product")
    ren = dict(zip(statement.legs, refs[0].legs, strict=True))
    if ren[key] not in expr.summed:
        raise NoStateError(f"{reader.target} does not sum {name}'s key leg")
    return reader


def linear_order(planner: StatePlanner, statement: Statement, box: SoftmaxBox, reader: Statement) -> Statement:
    """`reader` with A·(its factors reading the key) replaced by (Σ_{m ≤ n} x ·those) /
    (Σ_{m ≤ n} x + eps), in the reader's leg names (Tuformer §3.3; a sum content term by term)."""
    expr = reader.expr
    assert isinstance(expr, Contraction) and box.content is not None
    ref = next(f for f in expr.factors if isinstance(f, TensorRef) and f.name == statement.target)
    names = dict(zip(statement.legs, ref.legs, strict=True))
    for leg in legs_in(box.content) - set(names):
        names[leg] = planner.fresh(leg, statement.target)
    key = box.normalized[0]
    query = next(leg for leg in statement.legs if planner.positional(leg) and leg != key)
    query, key = names[query], names[key]
    beside = [f for f in expr.factors if f is not ref and key in f.legs]
    rest = [f for f in expr.factors if f is not ref and key not in f.legs]
    if any(query in f.legs for f in beside):
        raise NoStateError(f"{reader.target} reads {query} and {key} together beside {statement.target}")
    outside = set(reader.legs) | {leg for f in rest for leg in f.legs}
    kept = [leg for leg in ref.legs if leg != key]
    kept += [leg for f in beside for leg in f.legs if leg in outside and leg not in kept and leg != key]
    causal = [
        CausalFactor((query, key), box.span, query=query, key=key) for m in box.masks if isinstance(m, CausalMask)
    ]

    def product(factors: list[Expr], legs: list[str]) -> Contraction:
        inner = list(dict.fromkeys(leg for f in factors for leg in f.legs))
        legs = [leg for leg in legs if leg in inner]
        return Contraction(
            tuple(legs), box.span, factors=tuple(factors), summed=tuple(x for x in inner if x not in legs)
        )

    numerators, denominators, signs = [], [], []
    terms = content_terms(box.content)
    for k, (term, sign) in enumerate(terms):
        term = renamed(term, names)
        numerators.append(product([*causal, term, *beside], kept))
        denominators.append(product([*causal, term], [leg for leg in ref.legs if leg != key]))
        signs.append(sign)
        number = str(k + 1) if len(terms) > 1 else ""
        planner.labels[id(numerators[-1])] = f"{statement.target}.numerator{number}"
        planner.labels[id(denominators[-1])] = f"{statement.target}.denominator{number}"
    legs = tuple(kept)
    den_legs = tuple(leg for leg in ref.legs if leg != key)
    numerator = SumNode(legs, box.span, terms=tuple(numerators), signs=tuple(signs))
    denominator = SumNode(
        den_legs,
        box.span,
        terms=(*denominators, Scalar((), box.span, value=box.eps)),
        signs=(*signs, 1),
    )
    quotient = Quotient(legs, box.span, numerator=numerator, denominator=denominator)
    factors = (quotient, *rest)
    inner = list(dict.fromkeys(leg for f in factors for leg in f.legs))
    summed = tuple(leg for leg in inner if leg not in expr.legs)
    rebuilt = dataclasses.replace(expr, factors=factors, summed=summed, batch=())
    return dataclasses.replace(reader, expr=rebuilt)


# -- causal products


def content_terms(e: Expr) -> list[tuple[Expr, int]]:
    """The terms of a sum content with their signs (a nested sum's multiplied through)."""
    if not isinstance(e, SumNode):
        return [(e, 1)]
    return [(term, sign * inner) for t, sign in zip(e.terms, e.signs, strict=True) for term, inner in content_terms(t)]
