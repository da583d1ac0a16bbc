"""Prefix scans along a position leg: cumsum and logcumsumexp, exclusive or reversed, with masks
hiding entries. Their rules in every stage's table."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .. import parse as syn
from ..check import CHECK, no_numbers
from ..evaluation import EVALUATE
from ..graph.calls import BUILD
from ..graph.vocabulary import SCANS
from ..ir import POSITION_MASKS, Expr, PaddingMask, Scan
from ..plan.base import LOWER
from ..plan.elementwise import lower_scan
from ..printing import DESCRIBE, PRINT, format_expr, format_mask
from ..render import RENDER, draw_tensor, position_masks
from ..render import draw as draw_node

if TYPE_CHECKING:
    import torch

    from ..graph.calls import BoxesAndMaps
    from ..reference import Frame
    from ..render import Drawing


@EVALUATE.register(Scan)
def evaluate(node: Scan, frame: Frame) -> torch.Tensor:
    """A prefix scan along `along`, entry by entry: entry i combines the operand's entries k ≤ i
    (k < i when exclusive; k ≥ i, k > i when reversed) by a running total (a sum, or log Σ exp
    for logcumsumexp); a hidden entry adds 0 to a sum, and to a log Σ exp the dtype's lowest
    number where padding hides it, −inf where a causal mask does."""
    import torch

    from ..reference import leg_dims, masks_allowed

    operand = node.operand
    assert operand is not None
    x = frame.evaluate(operand)
    empty = 0.0 if node.name == "cumsum" else -math.inf
    if node.name == "logcumsumexp":  # a padded entry is the dtype's lowest number, a future one −inf
        padding = masks_allowed([m for m in node.masks if isinstance(m, PaddingMask)], operand.legs, frame)
        if padding is not None:
            x, padding = torch.broadcast_tensors(x, padding)
            x = torch.where(padding, x, torch.finfo(x.dtype).min)
    allowed = masks_allowed(
        node.masks if node.name == "cumsum" else [m for m in node.masks if isinstance(m, POSITION_MASKS)],
        operand.legs,
        frame,
    )
    if allowed is not None:
        x, allowed = torch.broadcast_tensors(x, allowed)
    dim = leg_dims([node.along], operand.legs)[0]
    entries = list(x.unbind(dim))
    visible = list(allowed.unbind(dim)) if allowed is not None else [None] * len(entries)
    order = range(len(entries) - 1, -1, -1) if node.reverse else range(len(entries))
    total = torch.full_like(entries[0], empty)
    results: list[torch.Tensor] = [total] * len(entries)
    for i in order:
        entry = entries[i] if visible[i] is None else torch.where(visible[i], entries[i], empty)
        after = total + entry if node.name == "cumsum" else torch.logaddexp(total, entry)
        results[i] = total if node.exclusive else after
        total = after
    return torch.stack(results, dim)


@PRINT.register(Scan)
def text(e: Scan) -> str:
    """`cumsum[n, exclusive = 1, reverse = 1, mask = causal(n, m)](x)`, the flags only where set."""
    assert e.operand is not None
    flags = "".join(f", {word} = 1" for word, flag in (("exclusive", e.exclusive), ("reverse", e.reverse)) if flag)
    masks = "".join(f", mask = {format_mask(m)}" for m in e.masks)
    return f"{e.name}[{e.along}{flags}{masks}]({format_expr(e.operand)})"


@DESCRIBE.register(Scan)
def describe(node: Scan) -> str:
    return f"scan: {format_expr(node)} [{' '.join(node.legs)}]"


@RENDER.register(Scan)
def draw(d: Drawing, e: Scan, env: dict[str, str], cluster: str | None) -> None:
    """The leg passes through: a scan node sits on it, in a dotted cluster labelled as written."""
    assert e.operand is not None
    options = [word for word, flag in (("exclusive", e.exclusive), ("reverse", e.reverse)) if flag]
    masks = position_masks(e.masks)
    label = " ".join([e.name, *options, "along", e.along]) + (" · mask " + ", ".join(masks) if masks else "")
    box = d.cluster(label, "dotted", cluster)
    for mask in e.masks:
        if isinstance(mask, PaddingMask):
            draw_tensor(d, mask.tensor, env, box)
    node = d.node("scan", f'shape=rarrow width=0.3 height=0.2 label="" xlabel="{e.name}"', box)
    d.attach(node, env[e.along])
    draw_node(d, e.operand, {leg: env[leg] for leg in e.operand.legs}, box)


CHECK.register(Scan)(no_numbers)


@BUILD.register(Scan, names=SCANS)
def build(builder: BoxesAndMaps, e: syn.Call, keep: set[str]) -> Expr:
    """`cumsum[n, exclusive = 1, reverse = 1, mask = ...](x)`, `logcumsumexp[n](x)`."""
    return builder.scan(e, keep)


# lower (plan/base.LOWER): its masks filled, then one scan step in float32 (plan/elementwise.py)
LOWER.register(Scan)(lower_scan)
