"""`sqdist[d](Q, K)`: Σ_d (left − right)², the Gaussian-kernel distance between a query and a key
side (MGK). Its rules for every stage."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..evaluation import EVALUATE
from ..ir import SquaredDistance
from ..printing import DESCRIBE, PRINT, format_expr, nothing_to_describe

if TYPE_CHECKING:
    import torch

    from ..reference import Frame


@EVALUATE.register(SquaredDistance)
def evaluate(node: SquaredDistance, frame: Frame) -> torch.Tensor:
    """Σ_over (left - right)², naively: both sides broadcast to the union of their legs."""
    from ..reference import align, leg_dims

    left, right = node.left, node.right
    assert left is not None and right is not None
    union = tuple(dict.fromkeys((*left.legs, *right.legs)))
    difference = align(frame.evaluate(left), left.legs, union) - align(frame.evaluate(right), right.legs, union)
    x = (difference**2).sum(dim=leg_dims(node.over, union))
    return align(x, [leg for leg in union if leg not in node.over], node.legs)


@PRINT.register(SquaredDistance)
def text(e: SquaredDistance) -> str:
    assert e.left is not None and e.right is not None
    return f"sqdist[{' '.join(e.over)}]({format_expr(e.left)}, {format_expr(e.right)})"


DESCRIBE.register(SquaredDistance)(nothing_to_describe)
