"""`conv[n = n - i, m = m - j + P](S, theta)`: a zero-padded convolution along position legs
(Multi-Token Attention's key-query convolution), with masks zeroing the operand first. Its rules
in every stage's table."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import parse as syn
from ..check import CHECK, no_numbers
from ..evaluation import EVALUATE
from ..graph.calls import BUILD
from ..graph.convolutions import convolution
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


# lower (plan/base.LOWER): the shifted contraction of its operand and kernel (plan/convolution.py)
LOWER.register(Convolution)(lower_convolution)
