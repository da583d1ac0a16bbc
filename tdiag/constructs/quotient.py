"""A quotient `a / b` of two expressions, each broadcast along the legs it lacks (linear
attention's normalization written out). Its rules in every stage's table."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import decode_rules as decode
from ..check import CHECK, no_numbers
from ..evaluation import EVALUATE
from ..graph import position_rules as pos
from ..graph.calls import BUILD
from ..graph.position_rules import Hidden, Pairs
from ..ir import Quotient
from ..plan.base import LOWER
from ..plan.elementwise import lower_quotient
from ..printing import DESCRIBE, PRINT, nothing_to_describe, parenthesized, wrapped
from ..render import RENDER, draw_joined

if TYPE_CHECKING:
    import torch

    from ..reference import Frame
    from ..render import Drawing


@EVALUATE.register(Quotient)
def evaluate(node: Quotient, frame: Frame) -> torch.Tensor:
    """numerator / denominator, broadcast along the legs each lacks."""
    from ..reference import align

    numerator, denominator = node.numerator, node.denominator
    assert numerator is not None and denominator is not None
    return align(frame.evaluate(numerator), numerator.legs, node.legs) / align(
        frame.evaluate(denominator), denominator.legs, node.legs
    )


@PRINT.register(Quotient)
def text(e: Quotient) -> str:
    assert e.numerator is not None and e.denominator is not None
    return f"{wrapped(e.numerator)} / {wrapped(e.denominator)}"


DESCRIBE.register(Quotient)(nothing_to_describe)
parenthesized(Quotient)


@RENDER.register(Quotient)
def draw(d: Drawing, e: Quotient, env: dict[str, str], cluster: str | None) -> None:
    """A ÷ node joining the numerator and the denominator (marked ÷ by)."""
    assert e.numerator is not None and e.denominator is not None
    draw_joined(d, e, env, cluster, "÷", [e.numerator, e.denominator], ["", "÷ by"])


CHECK.register(Quotient)(no_numbers)


BUILD.unsupported(Quotient, "not a call: a quotient is written a / b (graph/expressions.py)")


# Positions (graph/position_rules.py): a quotient is zero where its numerator is.
@pos.ZEROS.register(Quotient)
def zeros(node: Quotient, hidden: Hidden) -> Pairs:
    return pos.zeros(node.numerator, hidden)  # type: ignore[arg-type]


@pos.CALL_HIDDEN.register(Quotient)
def call_hidden(node: Quotient, name: str, hidden: Hidden) -> Pairs:
    return pos.call_hidden(node.numerator, name, hidden)  # type: ignore[arg-type]


pos.plain(Quotient, but=(pos.ZEROS, pos.CALL_HIDDEN))


# ---- decoding (decode_rules.py): what the kind means to a cache

decode.plain(Quotient)


# lower (plan/base.LOWER): numerator / denominator, a shared decay shifted by its row max (plan/elementwise.py)
LOWER.register(Quotient)(lower_quotient)
