"""`sqdist[d](Q, K)`: Σ_d (left − right)², the Gaussian-kernel distance between a query and a key
side (MGK). Its rules in every stage's table."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import decode_rules as decode
from .. import parse as syn
from ..check import CHECK, no_numbers
from ..evaluation import EVALUATE
from ..graph import position_rules as pos
from ..graph.calls import BUILD
from ..graph.position_rules import Mixing
from ..graph.syntax import ordered_union
from ..graph.vocabulary import PAIRINGS
from ..ir import Expr, SquaredDistance
from ..plan.base import LOWER
from ..plan.distance import lower_distance
from ..printing import DESCRIBE, PRINT, format_expr, nothing_to_describe
from ..render import RENDER
from ..render import draw as draw_node

if TYPE_CHECKING:
    import torch

    from ..graph.calls import BoxesAndMaps
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


@BUILD.register(SquaredDistance, names=PAIRINGS)
def build(builder: BoxesAndMaps, e: syn.Call, keep: set[str]) -> Expr:
    """`sqdist[d](Q[n h d], K[m h d])`: both sides carry the summed legs; the result has the
    others of both."""
    over = builder.legs_of(e)
    if e.keywords or len(e.args) != 2:
        builder.b.error(
            "sqdist takes two arguments, a query side and a key side",
            e.span,
            hint="sqdist[d](Q[n h d], K[m h d])",
        )
        return builder.poison(e)
    if not over:
        builder.b.error("sqdist needs the leg it sums over", e.name_span, hint="e.g. sqdist[d](Q[n h d], K[m h d])")
    left, right = builder.elementwise(list(e.args), keep | set(over))
    for side, name in ((left, "query"), (right, "key")):
        for leg in over:
            if leg not in side.legs:
                builder.b.error(f"sqdist leg '{leg}' is missing from the {name} side", side.span)
    legs = tuple(leg for leg in ordered_union([left.legs, right.legs]) if leg not in over)
    return builder.restrict(SquaredDistance(legs, e.span, over, left, right), keep, e.span)


# Positions (graph/position_rules.py): a distance sums over its legs.
@pos.MIXING.register(SquaredDistance)
def mixing(node: SquaredDistance) -> Mixing:
    return Mixing(node.over, "the sqdist")


pos.plain(SquaredDistance, but=(pos.MIXING,))


# ---- decoding (decode_rules.py): what the kind means to a cache

decode.plain(SquaredDistance)


# lower (plan/base.LOWER): expanded into norms and a product, or its differences squared, by cost (plan/distance.py)
LOWER.register(SquaredDistance)(lower_distance)
