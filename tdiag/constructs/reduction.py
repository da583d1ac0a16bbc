"""Reductions over legs: max, logsumexp and mean (MGK's hard and soft E-step, its M-step), with
masks hiding entries. Their rules in every stage's table."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import decode_rules as decode
from .. import parse as syn
from ..check import CHECK, no_numbers
from ..decode_rules import (
    INNER_LEGS,
    STATE_WHAT,
)
from ..evaluation import EVALUATE
from ..graph import position_rules as pos
from ..graph.calls import BUILD
from ..graph.position_rules import Hidden, Mixing, Site
from ..graph.vocabulary import BOUNDS, REDUCTIONS
from ..ir import Expr, PaddingMask, Reduction
from ..plan.base import LOWER
from ..plan.elementwise import lower_reduction
from ..printing import DESCRIBE, PRINT, format_expr, format_mask
from ..render import RENDER, draw_tensor, position_masks
from ..render import draw as draw_node

if TYPE_CHECKING:
    import torch

    from ..graph.calls import BoxesAndMaps
    from ..reference import Frame
    from ..render import Drawing


@EVALUATE.register(Reduction)
def evaluate(node: Reduction, frame: Frame) -> torch.Tensor:
    """max, logsumexp or mean over the `over` legs."""
    import torch

    from ..reference import align, leg_dims, masks_allowed

    operand = node.operand
    assert operand is not None
    x = frame.evaluate(operand)
    dims = leg_dims(node.over, operand.legs)
    allowed = masks_allowed(node.masks, operand.legs, frame)
    if allowed is not None:
        x, allowed = torch.broadcast_tensors(x, allowed)
        x = torch.where(allowed, x, torch.finfo(x.dtype).min if node.name != "mean" else 0.0)
    if node.name == "max":
        x = x.amax(dim=dims)
    elif node.name == "logsumexp":
        x = x.logsumexp(dim=dims)
    elif node.name == "mean" and allowed is not None:
        x = x.sum(dim=dims) / allowed.sum(dim=dims).clamp(min=1).to(x.dtype)
    elif node.name == "mean":
        x = x.mean(dim=dims)
    else:
        raise ValueError(f"unknown reduction {node.name}")
    return align(x, [leg for leg in operand.legs if leg not in node.over], node.legs)


@PRINT.register(Reduction)
def text(e: Reduction) -> str:
    """`logsumexp[m, mask = causal(n, m)](x)`."""
    assert e.operand is not None
    masks = "".join(f", mask = {format_mask(m)}" for m in e.masks)
    return f"{e.name}[{' '.join(e.over)}{masks}]({format_expr(e.operand)})"


@DESCRIBE.register(Reduction)
def describe(node: Reduction) -> str | None:
    """A masked reduction's legs and masks (an unmasked one reads plainly as written)."""
    if not node.masks:
        return None
    masks = ", ".join(format_mask(m) for m in node.masks)
    return f"{node.name} over {' '.join(node.over)} [{' '.join(node.legs)}], masks {masks}"


@RENDER.register(Reduction)
def draw(d: Drawing, e: Reduction, env: dict[str, str], cluster: str | None) -> None:
    """A dotted cluster labelled with the reduction and its masks, a diamond closing each leg it
    reduces over, its padding masks' tensors inside."""
    assert e.operand is not None
    masks = position_masks(e.masks)
    label = f"{e.name} over {' '.join(e.over)}" + (" · mask " + ", ".join(masks) if masks else "")
    box = d.cluster(label, "dotted", cluster)
    inner = env | {leg: d.leg(leg, box) for leg in e.over}
    for mask in e.masks:
        if isinstance(mask, PaddingMask):
            draw_tensor(d, mask.tensor, inner, box)
    end = d.node("r", f'shape=diamond width=0.25 height=0.25 label="" xlabel="{e.name}"', box)
    for leg in e.over:
        d.attach(end, inner[leg])
    draw_node(d, e.operand, {leg: inner[leg] for leg in e.operand.legs}, box)


CHECK.register(Reduction)(no_numbers)


@BUILD.register(Reduction, names=dict.fromkeys((*REDUCTIONS, *BOUNDS)))
def build(builder: BoxesAndMaps, e: syn.Call, keep: set[str]) -> Expr:
    """`max[r](x)`, `logsumexp[r](x)`, `mean[r](x)`; a call of max or min with no legs and two
    arguments is the elementwise bound `max(x, c)` (a map), and min has no reduction."""
    if e.name in BOUNDS and e.legs is None and not e.options and len(e.args) == 2:
        return builder.bound(e, keep)
    if e.name not in REDUCTIONS:
        builder.b.error(
            f"{e.name} takes a tensor and a bound: {e.name}(x, c) with c a number or size",
            e.span,
            hint="a minimum over a leg r is -max[r](-x)",
        )
        return builder.poison(e)
    return builder.reduction(e, keep)


# Positions (graph/position_rules.py): a mask over (query, key) joins the masks of a reduction over
# the key that keeps the query.
@pos.MASK_SITE.register(Reduction)
def mask_site(node: Reduction, query: str, key: str) -> Site | None:
    return "masks" if key in node.over and query in node.legs else None


@pos.SEEN.register(Reduction)
def seen(node: Reduction, query: str, key: str, hidden: Hidden) -> bool:
    return pos.masks_hide(node.masks, query, key)


@pos.MIXING.register(Reduction)
def mixing(node: Reduction) -> Mixing:
    return Mixing(node.over, f"the {node.name}")


pos.HIDES.register(Reduction)(seen)


@pos.CALL_WORD.register(Reduction)
def call_word(node: Reduction) -> str:
    return f"a {node.name} reduction"


@pos.KEY_LEGS.register(Reduction)
def key_legs(node: Reduction, positional: set[str]) -> set[str]:
    return pos.mask_keys(node.masks, positional)


pos.plain(Reduction, but=(pos.MASK_SITE, pos.SEEN, pos.MIXING, pos.HIDES, pos.CALL_WORD, pos.KEY_LEGS))


# ---- decoding (decode_rules.py): what the kind means to a cache

decode.plain(Reduction, but=(INNER_LEGS, STATE_WHAT))


@INNER_LEGS.register(Reduction)
def reduced_legs(node: Reduction) -> set[str]:
    """The legs it reduces over."""
    return set(node.over)


@STATE_WHAT.register(Reduction)
def what(node: Reduction) -> str:
    return f"{node.name} over {', '.join(node.over)}"


# lower (plan/base.LOWER): its masks filled, then one reduction step (plan/elementwise.py)
LOWER.register(Reduction)(lower_reduction)
