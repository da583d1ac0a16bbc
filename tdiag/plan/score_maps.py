"""A map of the scores (issue 24): a softmax box whose content is an elementwise map of an
attention's scores, `softmax[m](c tanh(S / c))` with S = q·k plus its terms (Gemma 2's logit
softcapping, `attn_logit_softcapping`), plus terms outside the map. The map's argument is
matched as any box's content (sdpa_match.py); the map, its weight and the outer terms ride on the
match as a `ScoreMapping`, which FlexAttention applies in its score_mod (forms/flex.py, flex.py)
and the banded form of a windowed box to each block's scores (forms/banded.py): SDPA adds nothing
but a mask to its scores, so it refuses the match."""

from __future__ import annotations

import dataclasses

import sympy

from ..ir import ONE, Contraction, ElementwiseMap, Expr, Scalar, SoftmaxBox, SumNode
from .combine import owns_parameter
from .context import Leaf, Lowering
from .legs import is_scaling
from .sdpa_match import MatchedAttention, ScoreMapping, fusable

MAPPED = (
    "a map of the scores (FlexAttention's score_mod applies it under attention='flex', the banded form under a window)"
)


def terms(e: Expr, weight: sympy.Expr = ONE) -> list[tuple[sympy.Expr, Expr]]:
    """`e` as Σ weight · term: sums and scalings taken apart, as sdpa_match.score_items does."""
    if isinstance(e, SumNode):
        return [t for term, sign in zip(e.terms, e.signs, strict=True) for t in terms(term, weight * sign)]
    if isinstance(e, Contraction) and is_scaling(e):
        factor = next(f for f in e.factors if not isinstance(f, Scalar))
        scalars = [f.value for f in e.factors if isinstance(f, Scalar)]
        return terms(factor, weight * e.coefficient * sympy.Mul(*scalars))
    return [(weight, e)] if weight != 0 else []


def match_map(
    ctx: Lowering, box: SoftmaxBox, ren, leaf: Leaf, others: list[Leaf], out: tuple[str, ...]
) -> MatchedAttention | None:
    """The attention under a map of the box's scores, with the map on the match; None where the
    content is not one map (along the keys and every leg of the box) of a fusable attention's
    scores plus terms outside it."""
    if box.sink is not None:
        return None
    keys = {p for leg in box.normalized for p in ren[leg]}
    found = terms(box.content)  # type: ignore[arg-type]
    maps = [(w, e) for w, e in found if isinstance(e, ElementwiseMap) and set(e.legs) == set(box.legs)]
    if len(maps) != 1:
        return None
    (weight, mapped), outer = maps[0], []
    for w, e in found:
        if e is mapped:
            continue
        if {p for leg in e.legs for p in ren[leg]} & keys:
            outer.append((w * box.scale, e))
        elif owns_parameter(ctx, e):  # constant along the keys: dropped, its parameter would go unused
            return None
    inner = SoftmaxBox(box.legs, box.span, mapped.operand, box.normalized, ONE, box.masks)
    match = fusable(ctx, inner, ren, leaf, others, out)
    if isinstance(match, str):
        return None
    mapping = ScoreMapping(mapped.name, mapped.params, weight * box.scale, tuple(outer))
    return dataclasses.replace(match, score_map=mapping)
