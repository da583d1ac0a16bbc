"""A quotient `a / b` of two expressions, each broadcast along the legs it lacks (linear
attention's normalization written out). Its rules for every stage."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..evaluation import EVALUATE
from ..ir import Quotient
from ..printing import DESCRIBE, PRINT, nothing_to_describe, parenthesized, wrapped

if TYPE_CHECKING:
    import torch

    from ..reference import Frame


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
