"""`conv[n = n - i, m = m - j + P](S, theta)`: a zero-padded convolution along position legs
(Multi-Token Attention's key-query convolution), with masks zeroing the operand first. Its rules
in every stage's table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from .. import decode_rules as decode
from .. import parse as syn
from ..check import CHECK, no_numbers
from ..decode_rules import (
    KV_ROWS,
    NEW,
    STATE_ROWS,
    RowRequests,
    StatePlanner,
)
from ..errors import Diagnostic
from ..evaluation import EVALUATE
from ..graph import position_rules as pos
from ..graph.calls import BUILD
from ..graph.convolutions import convolution
from ..graph.position_rules import Hidden, Positions, Site
from ..graph.vocabulary import CONVOLUTIONS
from ..ir import Convolution, Expr
from ..plan.base import LOWER
from ..plan.convolution import lower_convolution
from ..printing import DESCRIBE, PRINT, format_expr, format_mask
from ..render import RENDER, escape, position_masks
from ..render import draw as draw_node

if TYPE_CHECKING:
    import torch

    from ..graph.calls import BoxesAndMaps
    from ..reference import Frame
    from ..render import Drawing


@EVALUATE.register(Convolution)
def evaluate(node: Convolution, frame: Frame) -> torch.Tensor:
    """Σ over the offset legs of kernel · operand at the shifted positions, by the definition: the
    operand's hidden entries zeroed, then for each shift the operand read at leg + sign·k + start
    for every offset k (0 where that is outside the leg), stacked along the offset leg, and the
    product with the kernel summed over the offsets."""
    import torch

    from ..reference import align, leg_dims, masks_allowed

    operand, kernel = node.operand, node.kernel
    assert operand is not None and kernel is not None
    x = frame.evaluate(operand)
    allowed = masks_allowed(node.masks, operand.legs, frame)
    if allowed is not None:
        x, allowed = torch.broadcast_tensors(x, allowed)
        x = torch.where(allowed, x, torch.zeros((), dtype=x.dtype, device=x.device))
    legs = list(operand.legs)
    for shift in node.shifts:
        dim = x.dim() - len(legs) + legs.index(shift.leg)
        size = x.shape[dim]
        copies = []
        for k in range(frame.leg_size(shift.offset)):
            source = torch.arange(size, device=x.device) + shift.sign * k + int(frame.number(shift.start))
            inside = ((source >= 0) & (source < size)).to(x.dtype)
            read = x.index_select(dim, source.clamp(0, size - 1))
            copies.append(read * inside.reshape((size, *([1] * (x.dim() - dim - 1)))))
        x = torch.stack(copies, -1)
        legs.append(shift.offset)
    product = x * align(frame.evaluate(kernel), kernel.legs, legs)
    return align(product.sum(dim=leg_dims(node.taps, legs)), operand.legs, node.legs)


@PRINT.register(Convolution)
def text(e: Convolution) -> str:
    """`conv[n = n - i, m = m - j + P, mask = causal(n, m)](S[h n m], theta[h i j])`."""
    assert e.operand is not None and e.kernel is not None
    options = [f"{s.leg} = {s.source()}" for s in e.shifts] + [f"mask = {format_mask(m)}" for m in e.masks]
    return f"conv[{', '.join(options)}]({format_expr(e.operand)}, {format_expr(e.kernel)})"


@DESCRIBE.register(Convolution)
def describe(node: Convolution) -> str:
    return f"convolution: {format_expr(node)} [{' '.join(node.legs)}], summed {' '.join(node.taps)}"


@RENDER.register(Convolution)
def draw(d: Drawing, e: Convolution, env: dict[str, str], cluster: str | None) -> None:
    """A shift node joining each shifted leg to the kernel's offset leg, in a dotted cluster."""
    assert e.operand is not None and e.kernel is not None
    masks = position_masks(e.masks)
    shifts = ", ".join(f"{s.leg} = {s.source()}" for s in e.shifts)
    box = d.cluster(f"conv[{shifts}]" + (" · mask " + ", ".join(masks) if masks else ""), "dotted", cluster)
    inner = env | {s.offset: d.leg(s.offset, box) for s in e.shifts}
    draw_node(d, e.kernel, {leg: inner[leg] for leg in e.kernel.legs}, box)
    for shift in e.shifts:
        label = escape(shift.source())
        node = d.node("shift", f'shape=rarrow width=0.3 height=0.2 label="" xlabel="{label}"', box)
        d.attach(node, env[shift.leg])
        d.attach(node, inner[shift.offset])
    draw_node(d, e.operand, {leg: env[leg] for leg in e.operand.legs}, box)


CHECK.register(Convolution)(no_numbers)


@BUILD.register(Convolution, names=CONVOLUTIONS)
def build(builder: BoxesAndMaps, e: syn.Call, keep: set[str]) -> Expr:
    """`conv[n = n - i, ...](x, kernel)` (graph/convolutions.py)."""
    return convolution(builder, e, keep)  # type: ignore[arg-type]


# Positions (graph/position_rules.py): a convolution that shifts the query or key leg of an operand
# with both is masked before the shift (zeroed above the diagonal, Multi-Token Attention's Mask_0);
# one whose shift reads a later query, or a later position of an operand without the query leg, is
# refused.
@pos.MASK_SITE.register(Convolution)
def mask_site(node: Convolution, query: str, key: str) -> Site | None:
    """Over an operand with both `query` and `key` legs that it shifts along either, so that a
    shifted read sees no key after its own query."""
    shifted = {s.leg for s in node.shifts}
    return "masks" if query in node.legs and key in node.legs and shifted & {query, key} else None


@pos.SEEN.register(Convolution)
def seen(node: Convolution, query: str, key: str, hidden: Hidden) -> bool:
    return pos.masks_hide(node.masks, query, key) or (query, key) in pos.zeros(node.operand, hidden)  # type: ignore[arg-type]


@pos.FUTURE.register(Convolution)
def future(node: Convolution, positions: Positions) -> Diagnostic | None:
    """A shift that reads a later position where nothing hides it: along a query leg, or along a
    position leg of an operand without a query leg beside its key (a token shift of the keys),
    any offset that reads ahead (n + i, or m - j + P with P > 0) would let a position see the
    ones after it. A shift along the key leg of an operand with the query leg reads ahead safely
    once the operand is zeroed above the diagonal (mask = causal(n, m), Mask_0)."""
    graph = positions.graph
    if not pos.reads_an_input(node, graph):
        return None
    for shift in node.shifts:
        leg = shift.leg
        if not positions.positional(leg):
            continue
        width = graph.evaluate(graph.legs[shift.offset].size)
        ahead = graph.evaluate(shift.start + (width - 1 if shift.sign > 0 else 0))
        masked = any(pos.hides_future(m) and m.key == leg and m.query in node.legs for m in node.masks)
        if ahead > 0 and not (masked and leg not in positions.queries):
            return Diagnostic(
                f"with_causal_mask cannot mask the conv's shift {leg} = {shift.source()}: it reads position"
                f" {leg} + {ahead}, after the one it computes",
                (node.span,),
                f"shift along the query leg backwards only ({leg} = {leg} - {shift.offset}); a centred shift"
                " of the keys needs the query leg beside them, as in conv[n = n - i, m = m - j + P](S[h n m], ...)",
            )
    return None


@pos.CALL_WORD.register(Convolution)
def call_word(node: Convolution) -> str:
    return "a convolution along the positions (its operand masked before the shift)"


@pos.KEY_LEGS.register(Convolution)
def key_legs(node: Convolution, positional: set[str]) -> set[str]:
    return pos.mask_keys(node.masks, positional)


pos.plain(Convolution, but=(pos.MASK_SITE, pos.SEEN, pos.FUTURE, pos.CALL_WORD, pos.KEY_LEGS))


# ---- decoding (decode_rules.py): what the kind means to a cache


@KV_ROWS.register(Convolution)
def convolved_rows(requests: RowRequests, node: Convolution, target: str, legs: Mapping[str, str]) -> str | None:
    """A convolution along the positions of its result reads earlier rows of its operand."""
    if any(legs.get(s.leg) == NEW for s in node.shifts):
        return f"{target} convolves along the positions of its result (it reads earlier rows)"
    return None


@STATE_ROWS.register(Convolution)
def convolved_state_rows(planner: StatePlanner, node: Convolution, target: str) -> str | None:
    """A convolution along the positions reads earlier rows of its operand."""
    if any(planner.positional(s.leg) for s in node.shifts):
        return f"{target} convolves along the positions (it reads earlier rows)"
    return None


decode.plain(Convolution, but=(KV_ROWS, STATE_ROWS))


# lower (plan/base.LOWER): the shifted contraction of its operand and kernel (plan/convolution.py)
LOWER.register(Convolution)(lower_convolution)
