"""A convolution along position legs (`conv[n = n - i, m = m - j + P](S, theta)`, Multi-Token
Attention's key-query convolution) lowered to one `torch.nn.functional.conv1d/2d/3d` call: the
operand's legs the kernel shares are its channels (groups = channels, one kernel each: a
per-head kernel is a depthwise convolution), its other legs the convolution's batch, and each
shift a zero padding of its position leg. N² · c_q · c_k multiply-adds per head, no N × N shift
tensor; the kernel is reversed along an axis whose offset counts backwards (`n - i`), since
torch's convolution is a cross-correlation."""

from __future__ import annotations

import sympy

from ..ir import Convolution
from .boxes import apply_mask, expand_broadcast, maskable
from .context import Lowering
from .program import Convolve, Step, Value, align, show_legs


def lower_convolution(ctx: Lowering, e: Convolution, ren: dict[str, tuple[str, ...]], var: str | None) -> Value:
    """One Convolve step: the operand (masked entries zeroed: Mask_0), the kernel read as
    (shared legs, offset legs), a pad of (before, after) per shifted leg such that the output
    keeps the leg's length; FLOPs 2 per multiply-add, the operand's entries times the taps."""
    operand = ctx.lower(e.operand, ren)  # type: ignore[arg-type]
    shifted = tuple(_one(ren, s.leg) for s in e.shifts)
    operand = maskable(ctx, operand, e, ren, set(operand.broadcast) | set(shifted))  # type: ignore[arg-type]
    for mask in e.masks:
        operand = apply_mask(ctx, operand, mask, ren, is_exp=False)
    kernel = ctx.lower(e.kernel, ren)  # type: ignore[arg-type]
    kernel = expand_broadcast(ctx, kernel, set(kernel.broadcast))
    taps = tuple(_one(ren, s.offset) for s in e.shifts)
    channels = tuple(leg for leg in kernel.legs if leg not in taps)
    operand = expand_broadcast(ctx, operand, set(operand.broadcast) & set(channels))
    widths = tuple(ctx.runtime(ctx.size(leg)) for leg in taps)
    pads = tuple(_pad(s.sign, ctx.runtime(s.start), width) for s, width in zip(e.shifts, widths, strict=True))
    name = ctx.names.fresh(var or "conv")
    taps_count = sympy.Mul(*(ctx.size(leg) for leg in taps))
    shifts = ", ".join(f"{leg} = {s.source()}" for leg, s in zip(show_legs(shifted), e.shifts, strict=True))
    return ctx.emit(
        Step(
            "conv",
            Convolve(
                operand,
                align(kernel, (*channels, *taps)),
                tuple(operand.legs.index(leg) for leg in shifted),
                tuple(operand.legs.index(leg) for leg in channels),
                pads,
                tuple(k for k, s in enumerate(e.shifts) if s.sign < 0),
            ),
            Value(name, operand.legs, operand.broadcast),
            f"conv[{shifts}] over {' '.join(show_legs(taps))} (groups {' '.join(show_legs(channels)) or '1'})",
            taps,
            flops=2 * ctx.numel(operand.legs) * taps_count,
            inputs=(operand, kernel),
        )
    )  # type: ignore[return-value]


def _one(ren: dict[str, tuple[str, ...]], leg: str) -> str:
    (piece,) = ren[leg]
    return piece


def _pad(sign: int, start: sympy.Expr, width: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr]:
    """(before, after) zeros around a leg read at p + sign·k + start, k = 0 .. width − 1, so that
    a cross-correlation of the padded leg with the kernel (reversed when sign < 0) keeps its
    length: before = −(the lowest offset), after = the highest. A negative pad crops."""
    low, high = (start, start + width - 1) if sign > 0 else (start - width + 1, start)
    return sympy.simplify(-low), sympy.simplify(high)
