"""The Einstein product of factors (Tuformer Sec. 2.1): `summed` legs contracted, `batch` legs
kept and shared. Its rules in every stage's table."""

from __future__ import annotations

import dataclasses
import string
from typing import TYPE_CHECKING

import sympy

from .. import decode_rules as decode
from .. import parse as syn
from ..check import CHECK
from ..decode_rules import (
    INNER_LEGS,
    STATE_FACTOR,
    STATE_WHAT,
    STEP_REWRITE,
    ProductParts,
    StepProgram,
)
from ..evaluation import EVALUATE
from ..graph import position_rules as pos
from ..graph.calls import BUILD
from ..graph.lone_sums import explicit_sum
from ..graph.position_rules import Hidden, Mixing, Pairs, Site
from ..graph.vocabulary import SUMS
from ..ir import CausalFactor, Contraction, Expr, Scalar
from ..plan.base import LOWER, REGION_FACTOR
from ..printing import DESCRIBE, PRINT, parenthesized, wrapped
from ..render import RENDER, math_text
from ..render import draw as draw_node
from ..render_notation import SCALED

if TYPE_CHECKING:
    import torch

    from ..graph.calls import BoxesAndMaps
    from ..reference import Frame
    from ..render import Drawing


@EVALUATE.register(Contraction)
def evaluate(node: Contraction, frame: Frame) -> torch.Tensor:
    """coefficient * einsum of the factors: `summed` legs are summed, the others kept."""
    inner = {leg for factor in node.factors for leg in factor.legs}
    assert inner == set(node.legs) | set(node.summed), f"contraction legs {inner} vs {node.legs} + {node.summed}"
    letters = dict(zip(sorted(inner | set(node.legs)), string.ascii_letters, strict=False))
    inputs = ",".join("..." + "".join(letters[leg] for leg in factor.legs) for factor in node.factors)
    spec = f"{inputs}->..." + "".join(letters[leg] for leg in node.legs)
    return frame.number(node.coefficient) * frame.einsum(spec, *(frame.evaluate(f) for f in node.factors))


@PRINT.register(Contraction)
def text(e: Contraction) -> str:
    """The factors side by side, after their coefficient: `1 / sqrt(D) * Q[n h d] K[m h d]`."""
    factors = " ".join(wrapped(f) for f in e.factors)
    if e.coefficient == 1:
        return factors
    coefficient = str(e.coefficient)
    if not (e.coefficient.is_Atom or e.coefficient.is_Pow):
        coefficient = f"({coefficient})"
    return f"{coefficient} * {factors}"


@DESCRIBE.register(Contraction)
def describe(node: Contraction) -> str | None:
    """What is contracted and which legs are batch legs (Tuformer Fig. 2), where any is."""
    if not (node.summed or node.batch):
        return None
    summed = ", ".join(node.summed) or "none"
    batch = ", ".join(node.batch) or "none"
    way = f"{len(node.factors)}-way " if len(node.factors) > 2 else ""
    return f"{way}contraction [{' '.join(node.legs)}]: contracted {summed}; batch legs {batch}"


parenthesized(Contraction)


@RENDER.register(Contraction)
def draw(d: Drawing, e: Contraction, env: dict[str, str], cluster: str | None) -> None:
    """The factors joined by their legs, a summed leg a new edge inside the product (in a cluster
    labelled ×c where there is a coefficient)."""
    inner = env | {leg: d.leg(leg, cluster) for leg in e.summed}
    if e.coefficient != 1:
        cluster = d.cluster(f"×{math_text(e.coefficient)}", SCALED, cluster)
    for factor in e.factors:
        draw_node(d, factor, {leg: inner[leg] for leg in factor.legs}, cluster)


@CHECK.register(Contraction)
def numbers(node: Contraction) -> tuple[tuple[str, sympy.Expr, None], ...]:
    return (("the coefficient", node.coefficient, None),)


@BUILD.register(Contraction, names=SUMS)
def build(builder: BoxesAndMaps, e: syn.Call, keep: set[str]) -> Expr:
    """`sum[k](x)`: the leg rule's sum written out (graph/lone_sums.py); a product of factors is
    built from the statement's syntax (graph/products.py), not a call."""
    return explicit_sum(builder, e, keep)  # type: ignore[arg-type]


# Positions (graph/position_rules.py): a causal or call mask is a factor of a product that sums the
# key beside the query; the product is zero wherever a factor is.
@pos.MASK_SITE.register(Contraction)
def mask_site(node: Contraction, query: str, key: str) -> Site | None:
    return "factor" if key in node.summed and query in node.legs else None


@pos.SEEN.register(Contraction)
def seen(node: Contraction, query: str, key: str, hidden: Hidden) -> bool:
    """Whether a factor over the key hides the later keys already (causal(n, m) written in)."""
    return any((query, key) in pos.zeros(f, hidden) for f in node.factors if key in f.legs)


@pos.ZEROS.register(Contraction)
def zeros(node: Contraction, hidden: Hidden) -> Pairs:
    return set().union(*(pos.zeros(f, hidden) for f in node.factors))


@pos.MIXING.register(Contraction)
def mixing(node: Contraction) -> Mixing:
    return Mixing(node.summed, "the sum")


@pos.CALL_HIDDEN.register(Contraction)
def call_hidden(node: Contraction, name: str, hidden: Hidden) -> Pairs:
    return set().union(*(pos.call_hidden(f, name, hidden) for f in node.factors))


@pos.HEADS.register(Contraction)
def heads(node: Contraction, query: str, key: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The legs its query side and its key side share (each in a factor with the query leg and in
    one with the key leg), other than the features they contract (a summed leg of a factor with
    the query leg and not the key leg and of one with the key leg and not the query leg): h in
    sigmoid attention's A[h n m] V[m h e] WO[h e g] and in gla's Q[n h d] K[m h d] V[m h e], not
    d; in the order the contraction's legs, then its factors', name them. And its kept legs that
    only its factors with the query leg hold (the query heads r of grouped heads written
    Q[g r n d] K[g m d] V[g m e]), over which no mask per head can be laid."""

    def side(has: str, lacks: str | None = None) -> set[str]:
        return {leg for f in node.factors if has in f.legs and lacks not in f.legs for leg in f.legs}

    features = side(query, key) & side(key, query) & set(node.summed)
    legs = dict.fromkeys(leg for f in (node, *node.factors) for leg in f.legs if leg not in (query, key))
    shared = tuple(leg for leg in legs if leg in side(query) and leg in side(key) and leg not in features)
    key_side = {leg for f in node.factors if key in f.legs for leg in f.legs}
    query_side = {leg for f in node.factors if query in f.legs for leg in f.legs}
    alone = tuple(leg for leg in node.legs if leg != query and leg in query_side and leg not in key_side)
    return shared, alone


pos.plain(Contraction, but=(pos.MASK_SITE, pos.SEEN, pos.ZEROS, pos.MIXING, pos.CALL_HIDDEN, pos.HEADS))


# ---- decoding (decode_rules.py): what the kind means to a cache

decode.plain(Contraction, but=(INNER_LEGS, STATE_WHAT, STATE_FACTOR, STEP_REWRITE))


@INNER_LEGS.register(Contraction)
def summed_legs(node: Contraction) -> set[str]:
    """The legs it sums."""
    return set(node.summed)


@STATE_WHAT.register(Contraction)
def what(node: Contraction) -> str:
    return "a product over " + ", ".join(node.summed)


@STATE_FACTOR.register(Contraction)
def multiplied_out(parts: ProductParts, node: Contraction) -> None:
    """A product among a causal product's factors is multiplied out (its summed legs renamed apart)."""
    parts.multiply_out(node)


@STEP_REWRITE.register(Contraction)
def step_product(program: StepProgram, node: Contraction) -> Expr:
    """The causal factors left among its factors hide nothing in the step (those that hide keys are
    mask inputs by then): dropped, a product of nothing left its coefficient."""
    if any(isinstance(f, CausalFactor) for f in node.factors):
        factors = tuple(f for f in node.factors if not isinstance(f, CausalFactor))
        node = dataclasses.replace(node, factors=factors) if factors else Scalar(node.legs, node.span, node.coefficient)
    return program.finish(node)


# lower (plan/base.LOWER): collected as a leaf of its multilinear region (plan/regions.py)
LOWER.unsupported(Contraction, REGION_FACTOR)
