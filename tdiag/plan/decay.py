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

from ..ir import Contraction, ElementwiseMap, Expr, Scan, SegmentSum, SumNode
from .legs import all_legs

Side = tuple[tuple[int, Expr, Mapping[str, tuple[str, ...]]], ...]  # ± term, read with its legs


@dataclass(frozen=True)
class Decay:
    """A decay factor exp(u + w) of a causal product: u over the query side, w over the key side,
    each a signed sum of expressions of the design, each read with its own region legs (a segment
    sum's running sum c is read at the query, and again, its position leg renamed, at the key)."""

    u: Side
    w: Side


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


def running_sum(e: SegmentSum) -> Scan:
    """c = cumsum along the segment sum's position leg of its operand: S[n, m] = c[n] − c[m]."""
    return Scan(e.operand.legs, e.span, name="cumsum", along=e.along, operand=e.operand)  # type: ignore[union-attr]


def may_be_decay(e: Expr) -> bool:
    """Could `e` be a decay of some pair of its legs: an exp with two legs that no term of its
    exponent carries together, or a segment sum's (which pair is the query and the key, the
    causal product decides; Performer's exp(q·w − |q|²/2) is none: its first term carries every
    leg)."""
    if not (isinstance(e, ElementwiseMap) and e.name == "exp" and len(e.legs) >= 2):
        return False
    terms = additive_terms(e.operand)  # type: ignore[arg-type]
    if any(isinstance(t, SegmentSum) for _, t in terms):
        return True
    legs = [all_legs(t) for _, t in terms]
    return any(not any({a, b} <= seen for seen in legs) for a, b in itertools.combinations(e.legs, 2))


def segment_pairs(e: ElementwiseMap, ren: Mapping[str, tuple[str, ...]]) -> set[tuple[str, str]]:
    """The (query, key) region legs of the segment sums in the exponent of `e`: a decay that is
    causal by itself (−inf above the diagonal), needing no causal factor beside it."""
    return {
        (ren[t.along][0], ren[t.key][0])
        for _, t in additive_terms(e.operand)  # type: ignore[arg-type]
        if isinstance(t, SegmentSum) and len(ren[t.along]) == 1 and len(ren[t.key]) == 1
    }


def has_segment_sum(e: ElementwiseMap) -> bool:
    return any(isinstance(t, SegmentSum) for _, t in additive_terms(e.operand))  # type: ignore[arg-type]


def split_exponent(e: ElementwiseMap, ren: Mapping[str, tuple[str, ...]], query: str, key: str) -> Decay | None:
    """The exponent of `e` split into (u, w): the terms without the key leg and the terms without
    the query leg (region legs `query`, `key` as `ren` names them), a segment sum S[n, m] over the
    pair as c[n] − c[m] (c its running sum); u carrying the query leg and w the key leg. None
    where a term carries both or a side is missing its leg."""
    queries = {leg for leg in all_legs(e) if tuple(ren.get(leg, ())) == (query,)}
    keys = {leg for leg in all_legs(e) if tuple(ren.get(leg, ())) == (key,)}
    u: list = []
    w: list = []
    for sign, term in additive_terms(e.operand):  # type: ignore[arg-type]
        if isinstance(term, SegmentSum) and term.along in queries and term.key in keys:
            running = running_sum(term)
            u.append((sign, running, ren))
            w.append((-sign, running, {**ren, term.along: (key,)}))
            continue
        legs = all_legs(term)
        if not legs & keys:
            u.append((sign, term, ren))
        elif not legs & queries:
            w.append((sign, term, ren))
        else:
            return None
    if not u or not w:
        return None
    if not any(set(_read_legs(t, r)) & {query} for _, t, r in u) or not any(key in _read_legs(t, r) for _, t, r in w):
        return None
    return Decay(tuple(u), tuple(w))


def _read_legs(e: Expr, ren: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
    return tuple(p for leg in e.legs for p in ren.get(leg, ()))
