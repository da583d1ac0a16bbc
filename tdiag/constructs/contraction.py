"""The Einstein product of factors (Tuformer Sec. 2.1): `summed` legs contracted, `batch` legs
kept and shared. Its rules in every stage's table."""

from __future__ import annotations

import string
from typing import TYPE_CHECKING

import sympy

from .. import parse as syn
from ..check import CHECK
from ..evaluation import EVALUATE
from ..graph.calls import BUILD
from ..graph.lone_sums import explicit_sum
from ..graph.vocabulary import SUMS
from ..ir import Contraction, Expr
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


# lower (plan/base.LOWER): collected as a leaf of its multilinear region (plan/regions.py)
LOWER.unsupported(Contraction, REGION_FACTOR)
