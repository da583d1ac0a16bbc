"""Reductions over legs: max, logsumexp and mean (MGK's hard and soft E-step, its M-step), with
masks hiding entries. Their rules for every stage."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..evaluation import EVALUATE
from ..ir import Reduction
from ..printing import DESCRIBE, PRINT, format_expr, format_mask

if TYPE_CHECKING:
    import torch

    from ..reference import Frame


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
