"""`segsum[n, m](a)`: the segment sums Σ_{k=m+1..n} a_k over a position leg and a new key leg,
−inf where m > n; exp of it is Mamba-2's 1-semiseparable decay mask (Dao & Gu 2024, eq. 4). Its
rules in every stage's table."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .. import parse as syn
from ..check import CHECK, no_numbers
from ..evaluation import EVALUATE
from ..graph.calls import BUILD
from ..graph.vocabulary import SEGMENT_SUMS
from ..ir import Expr, SegmentSum
from ..plan.base import LOWER
from ..plan.elementwise import lower_segment_sum
from ..printing import DESCRIBE, PRINT, format_expr
from ..render import RENDER
from ..render import draw as draw_node

if TYPE_CHECKING:
    import torch

    from ..graph.calls import BoxesAndMaps
    from ..reference import Frame
    from ..render import Drawing


@EVALUATE.register(SegmentSum)
def evaluate(node: SegmentSum, frame: Frame) -> torch.Tensor:
    """S[.., n, m] = Σ_{k=m+1..n} a_k for m ≤ n and −inf for m > n, by its definition: a sum
    of the entries between, for every pair (n, m)."""
    import torch

    from ..reference import align

    operand = node.operand
    assert operand is not None
    a = frame.evaluate(operand)
    rest = [leg for leg in operand.legs if leg != node.along]
    a = align(a, operand.legs, (*rest, node.along))
    size = a.shape[-1]
    rows = []
    for n in range(size):
        row = []
        for m in range(size):
            if m > n:
                row.append(torch.full_like(a[..., 0], -math.inf))
            else:
                row.append(a[..., m + 1 : n + 1].sum(dim=-1))
        rows.append(torch.stack(row, -1))
    return align(torch.stack(rows, -2), (*rest, node.along, node.key), node.legs)


@PRINT.register(SegmentSum)
def text(e: SegmentSum) -> str:
    assert e.operand is not None
    return f"segsum[{e.along}, {e.key}]({format_expr(e.operand)})"


@DESCRIBE.register(SegmentSum)
def describe(node: SegmentSum) -> str:
    return f"segment sums along {node.along} over [{' '.join(node.legs)}]"


@RENDER.register(SegmentSum)
def draw(d: Drawing, e: SegmentSum, env: dict[str, str], cluster: str | None) -> None:
    """A scan node joining the position leg n and the new key leg m."""
    assert e.operand is not None
    box = d.cluster(f"segsum along {e.along} · ({e.along}, {e.key})", "dotted", cluster)
    node = d.node("scan", 'shape=rarrow width=0.3 height=0.2 label="" xlabel="segsum"', box)
    d.attach(node, env[e.along])
    d.attach(node, env[e.key])
    draw_node(d, e.operand, {leg: env[leg] for leg in e.operand.legs}, box)


CHECK.register(SegmentSum)(no_numbers)


@BUILD.register(SegmentSum, names=SEGMENT_SUMS)
def build(builder: BoxesAndMaps, e: syn.Call, keep: set[str]) -> Expr:
    """`segsum[n, m](a)`: the operand along n, the new key leg m."""
    return builder.segment_sum(e, keep)


# lower (plan/base.LOWER): one segment-sums step over (n, m) (plan/elementwise.py)
LOWER.register(SegmentSum)(lower_segment_sum)
