"""`sqdist[d](Q, K)`: Σ_d (left − right)², the Gaussian-kernel distance between a query and a key
side (MGK). Its rules for every stage."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..check import CHECK, no_numbers
from ..evaluation import EVALUATE
from ..ir import SquaredDistance
from ..printing import DESCRIBE, PRINT, format_expr, nothing_to_describe
from ..render import RENDER
from ..render import draw as draw_node

if TYPE_CHECKING:
    import torch

    from ..reference import Frame
    from ..render import Drawing


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


@RENDER.register(SquaredDistance)
def draw(d: Drawing, e: SquaredDistance, env: dict[str, str], cluster: str | None) -> None:
    """A ‖−‖² node joining both sides' `over` legs, in a dotted cluster."""
    box = d.cluster(f"squared distance over {' '.join(e.over)}", "dotted", cluster)
    pair = d.node("q", 'shape=circle width=0.35 fixedsize=true fontsize=9 label="‖−‖²"', box)
    for side in (e.left, e.right):
        assert side is not None
        side_env = {leg: env[leg] for leg in side.legs if leg in env}
        for leg in e.over:
            side_env[leg] = d.leg(leg, box)
            d.attach(pair, side_env[leg])
        draw_node(d, side, side_env, box)


CHECK.register(SquaredDistance)(no_numbers)
