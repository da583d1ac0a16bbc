"""A quotient of two causal products that share a decay, computed with the decay shifted by its
row max: xLSTM's stabilizer m_t (Beck et al. 2024, App. A.2), as a rule on the design's
expressions that lower_quotient (elementwise.py) applies before it lowers the quotient.

For A / B or A / max(|B|, c) (c > 0 a number or size), with A and B products summed over a key
leg m ≤ n (inline, or statements read only there) that share one factor exp(E[n, m]), E a decay
u[n] + w[m] (decay.py: a segment sum segsum[n, m](a) counts as c[n] − c[m], c its running sum),
any per-row shift s_n leaves the quotient as it is:

    A / max(|B|, c) = (A e^{−s}) / max(|B e^{−s}|, c e^{−s}).

The rule takes s_n = max(u_n + cummax_{m ≤ n}(w_m), log c), the largest exponent of row n (not
below log c): every shifted exponent is ≤ 0 for m ≤ n, so exp(E − s) ≤ 1 in the materialized
(n, m) block and in each factor the chunked form makes (its query side u − s is nonincreasing,
as a running sum of log-decays is), and the bound c e^{−s} ≤ 1 never overflows (xLSTM's own
exp(−m_t) does where every input gate is tiny; here s is then log c). s is per (row, head),
one running max over the positions: no extra asymptotic cost. The bound's max of two tensors is
k + max(|B'| − k, 0) (the map vocabulary bounds by a number only), equal to rounding.

The rewritten quotient is an expression of the design graph's kinds, lowered by the planner's
forms unchanged; the reference evaluator and the decoding states evaluate the design as written."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import sympy

from ..graph import DesignGraph
from ..ir import (
    CausalFactor,
    Contraction,
    ElementwiseMap,
    Expr,
    Quotient,
    Scan,
    SegmentSum,
    SumNode,
    TensorRef,
    WindowFactor,
    renamed,
    walk,
)
from .decay import additive_terms, running_sum
from .legs import all_legs, alpha_key

ROW_SHIFT_NOTE = (
    "{target}: the decay its numerator and denominator share shifted by its running row max"
    " (xLSTM's stabilizer m_t: each exponent ≤ 0, the bound scaled alike)"
)


@dataclasses.dataclass(frozen=True)
class _Product:
    """A causal product of the quotient: its expression, its query and key leg, and the index of
    its decay factor exp(E) among its factors."""

    expr: Contraction
    query: str
    key: str
    decay: int

    @property
    def exponent(self) -> Expr:
        return self.expr.factors[self.decay].operand  # type: ignore[attr-defined,return-value]


def shifted_quotient(e: Quotient, graph: DesignGraph, uses: Mapping[str, int]) -> Quotient | None:
    """`e` with its shared decay shifted by the row max, or None where the rule does not apply
    (a bound that is not a positive constant, a side that is no causal product read only here,
    no shared decay, a shift that would vary along a leg the products sum)."""
    numerator, bound = e.numerator, None
    denominator = e.denominator
    if isinstance(denominator, ElementwiseMap) and denominator.name == "maximum":
        inner = denominator.operand
        if not (isinstance(inner, ElementwiseMap) and inner.name == "abs") or not denominator.params[0].is_positive:
            return None
        denominator, bound = inner.operand, sympy.sympify(denominator.params[0])
    a = _causal_product(_definition(numerator, graph, uses), graph)  # type: ignore[arg-type]
    b = _causal_product(_definition(denominator, graph, uses), graph)  # type: ignore[arg-type]
    if a is None or b is None or not _same_decay(a, b):
        return None
    shift = _row_max(a, graph)
    if shift is None or not _legs(shift) <= set(a.expr.legs) & set(b.expr.legs):
        return None
    if bound is not None:
        shift = ElementwiseMap(shift.legs, shift.span, "maximum", shift, (sympy.log(bound),))
    shifted_a, shifted_b = _shifted(a, shift), _shifted(b, shift)
    if bound is None:
        return Quotient(e.legs, e.span, numerator=shifted_a, denominator=shifted_b)
    return Quotient(e.legs, e.span, numerator=shifted_a, denominator=_bounded(shifted_b, shift, bound))


def _definition(e: Expr, graph: DesignGraph, uses: Mapping[str, int]) -> Expr | None:
    """A product as the quotient reads it: written inline, or a statement that only the quotient
    reads, its legs renamed onto the reference's."""
    if isinstance(e, Contraction):
        return e
    if not isinstance(e, TensorRef) or e.is_sliced or e.is_reshaped:
        return None
    tensor = graph.tensors[e.name]
    statement = tensor.statement
    if statement is None or uses.get(e.name) != 1 or e.name in graph.outputs or statement.is_update:
        return None
    if not isinstance(statement.expr, Contraction) or len(statement.legs) != len(e.legs):
        return None
    names = dict(zip(statement.legs, e.legs, strict=True))
    inner = all_legs(statement.expr) - set(statement.legs)
    if inner & set(e.legs) or len(set(e.legs)) != len(e.legs):
        return None  # a summed leg of the definition has the name of one it is read with
    return renamed(statement.expr, names)


def _causal_product(e: Contraction | None, graph: DesignGraph) -> _Product | None:
    """`e` as a product summed over a key leg m ≤ n with one decay factor exp(E[n, m]): the pair
    from a segment sum in E or a causal(n, m) factor of the product. None where a window or a
    mask input hides keys too: the row max could come from a hidden key, against which every
    visible term might underflow (a row silently 0, where as written it overflows loudly)."""
    if e is None or any(_hides_keys(node, graph) for node in walk(e)):
        return None
    causal = {(f.query, f.key) for f in e.factors if isinstance(f, CausalFactor)}
    found = []
    for k, factor in enumerate(e.factors):
        if not (isinstance(factor, ElementwiseMap) and factor.name == "exp"):
            continue
        terms = additive_terms(factor.operand)  # type: ignore[arg-type]
        pairs = causal | {(t.along, t.key) for _, t in terms if isinstance(t, SegmentSum)}
        for query, key in pairs:
            if key in e.summed and query in e.legs and {query, key} <= set(factor.legs):
                found.append(_Product(e, query, key, k))
    return found[0] if len(found) == 1 else None


def _hides_keys(node: Expr, graph: DesignGraph) -> bool:
    """Whether `node` hides keys a causal mask shows: a window, or a mask input read as a factor."""
    if isinstance(node, WindowFactor):
        return True
    return isinstance(node, TensorRef) and graph.tensors[node.name].kind == "mask"


def _same_decay(a: _Product, b: _Product) -> bool:
    """Whether the two products' decays are one factor: the same exponent, B's key leg read as A's."""
    if a.query != b.query or a.key in all_legs(b.exponent) - {b.key}:
        return False
    first, second = alpha_key(a.exponent), alpha_key(renamed(b.exponent, {b.key: a.key}))
    return first[0] == second[0] and first[2] == second[2]


def _row_max(p: _Product, graph: DesignGraph) -> Expr | None:
    """s_n = u_n + cummax_{m ≤ n} w_m, the max over the keys of row n of E = u + w; None where a
    term of E reads both positions, or n and m differ in size (a cache of other length)."""
    if graph.legs[p.query].size != graph.legs[p.key].size:
        return None
    query_terms: list[tuple[int, Expr]] = []
    key_terms: list[tuple[int, Expr]] = []  # read at the query position
    for sign, term in additive_terms(p.exponent):
        if isinstance(term, SegmentSum) and (term.along, term.key) == (p.query, p.key):
            running = running_sum(term)  # S[n, m] = c[n] − c[m]
            query_terms.append((sign, running))
            key_terms.append((-sign, running))
            continue
        legs = all_legs(term)
        if p.key not in legs:
            query_terms.append((sign, term))
        elif p.query not in legs:
            key_terms.append((sign, renamed(term, {p.key: p.query})))
        else:
            return None
    if not any(p.query in _legs(t) for _, t in key_terms):
        return None
    span = p.exponent.span
    keys = _sum(key_terms, span)
    running_max = Scan(keys.legs, span, name="cummax", along=p.query, operand=keys)
    return _sum([*query_terms, (1, running_max)], span)


def _shifted(p: _Product, shift: Expr) -> Contraction:
    """The product with its decay exp(E) as exp(E − s)."""
    exponent = p.exponent
    lowered = SumNode(exponent.legs, exponent.span, terms=(exponent, shift), signs=(1, -1))
    factor = p.expr.factors[p.decay]
    factors = list(p.expr.factors)
    factors[p.decay] = dataclasses.replace(factor, operand=lowered)
    return dataclasses.replace(p.expr, factors=tuple(factors))


def _bounded(b: Expr, shift: Expr, bound: sympy.Expr) -> Expr:
    """max(|B'|, k), k = c e^{−s} ≤ 1, as k + max(|B'| − k, 0)."""
    span = b.span
    negated = SumNode(shift.legs, span, terms=(shift,), signs=(-1,))
    scaled = ElementwiseMap(shift.legs, span, "exp", negated)
    k: Expr = scaled if bound == 1 else Contraction(shift.legs, span, factors=(scaled,), coefficient=bound)
    size = ElementwiseMap(b.legs, span, "abs", b)
    excess = SumNode(b.legs, span, terms=(size, k), signs=(1, -1))
    above = ElementwiseMap(b.legs, span, "maximum", excess, (sympy.Integer(0),))
    return SumNode(b.legs, span, terms=(above, k), signs=(1, 1))


def _sum(terms: list[tuple[int, Expr]], span) -> Expr:
    """Σ ± terms as one expression (the term itself for a lone positive one)."""
    if len(terms) == 1 and terms[0][0] == 1:
        return terms[0][1]
    legs = tuple(dict.fromkeys(leg for _, t in terms for leg in t.legs))
    return SumNode(legs, span, terms=tuple(t for _, t in terms), signs=tuple(s for s, _ in terms))


def _legs(e: Expr) -> set[str]:
    return set(e.legs)
