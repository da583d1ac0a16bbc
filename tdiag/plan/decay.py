"""Decays in causal products: an exponential factor exp(u + w) whose exponent is the sum of a
query-side part u (without the key leg) and a key-side part w (without the query leg). RetNet's
decay γ^(n−m) = exp(log γ · n − log γ · m) (Sun et al. 2023, eq. 5), a forget gate's
exp(c[n] − c[m]) with c a cumulative log-gate (FoX; Mamba-2's 1-semiseparable mask, Dao & Gu
2024 eq. 4; GLA's per-feature gates) are such factors. They do not stop the chunked prefix-sum
order (chunked.py): within a chunk the factor is computed on the C×C block with its exponent
masked before the exp, across chunks each chunk's state is referred to its end and carried
with the decay across a chunk, so that no exp of a growth is ever taken."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from ..ir import Contraction, ElementwiseMap, Expr, SumNode
from .base import _all_legs


@dataclass(frozen=True)
class Decay:
    """A decay factor exp(u + w) of a causal product: u over the query side, w over the key side,
    both expressions of the design read with the region's legs `ren`."""

    u: Expr
    w: Expr
    ren: Mapping[str, tuple[str, ...]]


def additive_terms(e: Expr) -> list[tuple[int, Expr]]:
    """`e` as a signed sum of terms: a sum's terms, and a product with one factor that is a sum
    distributed over it (`lg[h] (index(n) − index(m))` is `lg[h] index(n) − lg[h] index(m)`)."""
    if isinstance(e, SumNode):
        return [(sign * s, term) for sign, t in zip(e.signs, e.terms, strict=True) for s, term in additive_terms(t)]
    if isinstance(e, Contraction) and not e.summed:
        split = [k for k, factor in enumerate(e.factors) if len(additive_terms(factor)) > 1]
        if len(split) == 1:
            k = split[0]
            return [
                (sign, _product(e, (*e.factors[:k], term, *e.factors[k + 1 :])))
                for sign, term in additive_terms(e.factors[k])
            ]
    return [(1, e)]


def _product(like: Contraction, factors: tuple[Expr, ...]) -> Contraction:
    """The product of `factors` with nothing summed, at `like`'s place and coefficient."""
    legs = tuple(dict.fromkeys(leg for f in factors for leg in f.legs))
    uses = Counter(leg for f in factors for leg in dict.fromkeys(f.legs))
    batch = tuple(leg for leg in legs if uses[leg] > 1)
    return Contraction(legs, like.span, factors=factors, coefficient=like.coefficient, summed=(), batch=batch)


def _sum(terms: list[tuple[int, Expr]], like: Expr) -> Expr:
    if len(terms) == 1 and terms[0][0] == 1:
        return terms[0][1]
    legs = tuple(dict.fromkeys(leg for _, t in terms for leg in t.legs))
    return SumNode(legs, like.span, terms=tuple(t for _, t in terms), signs=tuple(s for s, _ in terms))


def may_be_decay(e: Expr) -> bool:
    """Could `e` be a decay of some pair of its legs: an exp with two legs that no term of its
    exponent carries together (which pair is the query and the key, the causal product decides;
    Performer's exp(q·w − |q|²/2) is none: its first term carries every leg)."""
    if not (isinstance(e, ElementwiseMap) and e.name == "exp" and len(e.legs) >= 2):
        return False
    terms = [_all_legs(t) for _, t in additive_terms(e.operand)]  # type: ignore[arg-type]
    return any(not any({a, b} <= legs for legs in terms) for a, b in itertools.combinations(e.legs, 2))


def split_exponent(e: ElementwiseMap, ren: Mapping[str, tuple[str, ...]], query: str, key: str) -> Decay | None:
    """The exponent of `e` split into (u, w): the terms without the key leg and the terms without
    the query leg (region legs `query`, `key` as `ren` names them), u carrying the query leg and
    w the key leg; None where a term carries both or a side is missing its leg."""
    queries = {leg for leg in _all_legs(e) if tuple(ren.get(leg, ())) == (query,)}
    keys = {leg for leg in _all_legs(e) if tuple(ren.get(leg, ())) == (key,)}
    u: list[tuple[int, Expr]] = []
    w: list[tuple[int, Expr]] = []
    for sign, term in additive_terms(e.operand):  # type: ignore[arg-type]
        legs = _all_legs(term)
        if not legs & keys:
            u.append((sign, term))
        elif not legs & queries:
            w.append((sign, term))
        else:
            return None
    if not u or not w:
        return None
    left, right = _sum(u, e), _sum(w, e)
    if not set(left.legs) & queries or not set(right.legs) & keys:
        return None
    return Decay(left, right, ren)
