"""The sum node: terms added (or subtracted) elementwise, each broadcast along the legs it lacks
(biases, noise, MGK's key-norm term). Its rules in every stage's table."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import decode_rules as decode
from ..check import CHECK, no_numbers
from ..evaluation import EVALUATE
from ..graph import position_rules as pos
from ..graph.calls import BUILD
from ..graph.position_rules import Hidden, Pairs
from ..ir import SumNode
from ..plan.base import LOWER
from ..plan.elementwise import lower_sum
from ..printing import DESCRIBE, PRINT, format_expr, nothing_to_describe, parenthesized
from ..render import RENDER, draw_joined

if TYPE_CHECKING:
    import torch

    from ..reference import Frame
    from ..render import Drawing


@EVALUATE.register(SumNode)
def evaluate(node: SumNode, frame: Frame) -> torch.Tensor:
    """Σ sign * term, each term broadcast along the legs it lacks."""
    from ..reference import align

    terms = [sign * align(frame.evaluate(t), t.legs, node.legs) for t, sign in zip(node.terms, node.signs, strict=True)]
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    return total


@PRINT.register(SumNode)
def text(e: SumNode) -> str:
    """`a + b - c`: each term after its sign."""
    parts = [
        ("- " if s < 0 else ("+ " if i else "")) + format_expr(t)
        for i, (t, s) in enumerate(zip(e.terms, e.signs, strict=True))
    ]
    return " ".join(parts)


DESCRIBE.register(SumNode)(nothing_to_describe)
parenthesized(SumNode)


@RENDER.register(SumNode)
def draw(d: Drawing, e: SumNode, env: dict[str, str], cluster: str | None) -> None:
    """A + node joining the terms, a subtracted one marked −."""
    marks = ["" if s > 0 else "−" for s in e.signs]
    draw_joined(d, e, env, cluster, "+", list(e.terms), marks)


CHECK.register(SumNode)(no_numbers)


BUILD.unsupported(SumNode, "not a call: a sum node is written a + b (graph/expressions.py)")


# Positions (graph/position_rules.py): a sum is zero (or hidden by a call mask) where every term
# is, and −inf where a term added is.
@pos.ZEROS.register(SumNode)
def zeros(node: SumNode, hidden: Hidden) -> Pairs:
    return pos.all_zeros(node.terms, lambda t: pos.zeros(t, hidden))


@pos.MINUS_INFINITY.register(SumNode)
def minus_infinity(node: SumNode) -> Pairs:
    return set().union(*(pos.minus_infinity(t) for t, sign in zip(node.terms, node.signs, strict=True) if sign > 0))


@pos.CALL_HIDDEN.register(SumNode)
def call_hidden(node: SumNode, name: str, hidden: Hidden) -> Pairs:
    return pos.all_zeros(node.terms, lambda t: pos.call_hidden(t, name, hidden))


pos.plain(SumNode, but=(pos.ZEROS, pos.MINUS_INFINITY, pos.CALL_HIDDEN))


# ---- decoding (decode_rules.py): what the kind means to a cache

decode.plain(SumNode)


# lower (plan/base.LOWER): one elementwise step over its terms, smallest pair first (plan/elementwise.py)
LOWER.register(SumNode)(lower_sum)
