"""The sum node: terms added (or subtracted) elementwise, each broadcast along the legs it lacks
(biases, noise, MGK's key-norm term). Its rules for every stage."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..evaluation import EVALUATE
from ..ir import SumNode

if TYPE_CHECKING:
    import torch

    from ..reference import Frame


@EVALUATE.register(SumNode)
def evaluate(node: SumNode, frame: Frame) -> torch.Tensor:
    """Σ sign * term, each term broadcast along the legs it lacks."""
    from ..reference import align

    terms = [sign * align(frame.evaluate(t), t.legs, node.legs) for t, sign in zip(node.terms, node.signs, strict=True)]
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    return total
