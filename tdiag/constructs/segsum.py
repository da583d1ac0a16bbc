"""`segsum[n, m](a)`: the segment sums Σ_{k=m+1..n} a_k over a position leg and a new key leg,
−inf where m > n; exp of it is Mamba-2's 1-semiseparable decay mask (Dao & Gu 2024, eq. 4). Its
rules in every stage's table."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .. import decode_rules as decode
from .. import parse as syn
from ..check import CHECK, no_numbers
from ..decode_rules import (
    DECAY_TERM,
    KV_ROWS,
    STATE_ROWS,
    ProductParts,
    RowRequests,
    StatePlanner,
)
from ..evaluation import EVALUATE
from ..graph import position_rules as pos
from ..graph.calls import BUILD
from ..graph.position_rules import Hidden, Pairs
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
    """`segsum[n, m](a)`: S[.., n, m] = Σ_{k=m+1..n} a_k along a's position leg n, over n and
    the new key leg m of n's size; −inf where m > n (docs/language.md, Scans)."""
    argument = builder.one_argument(e)
    if argument is None:
        return builder.poison(e)
    named = builder.legs_of(e)
    for option in e.options:
        builder.b.error(
            f"unknown {e.name} option '{option.name}'",
            option.span,
            hint=f"{e.name} takes no options: {e.name}[n, m](a[n h])",
        )
    operand = builder.inside(argument, keep | set(named[:1]))
    builder.warn_lone_sums(e, argument, operand)
    along = builder.scan_leg(e, operand, 2, f"{e.name}[n, m](a[n h])")
    if along is None:
        return builder.poison(e)
    key, item = named[1], e.legs[1]  # type: ignore[index]
    if key in operand.legs:
        builder.b.error(
            f"{e.name}'s key leg '{key}' is a leg of its argument already",
            item.span,
            hint=f"name a new leg for the keys: {e.name}[{along}, m](...)",
        )
        return builder.poison(e)
    if along in builder.b.legs:
        builder.b.bind_leg(key, builder.b.legs[along].size, item.span, e.name)
    position = operand.legs.index(along) + 1
    legs = (*operand.legs[:position], key, *operand.legs[position:])
    return builder.restrict(SegmentSum(legs, e.span, along, key, operand), keep, e.span)


# Positions (graph/position_rules.py): segment sums are −inf past the query (their exp is zero
# there), causal as written.
@pos.MINUS_INFINITY.register(SegmentSum)
def minus_infinity(node: SegmentSum) -> Pairs:
    return {(node.along, node.key)}


@pos.HIDES.register(SegmentSum)
def hides(node: SegmentSum, query: str, key: str, diagonal: Hidden) -> bool:
    return (node.along, node.key) == (query, key)


pos.plain(SegmentSum, but=(pos.MINUS_INFINITY, pos.HIDES))


# ---- decoding (decode_rules.py): what the kind means to a cache


@KV_ROWS.register(SegmentSum)
def segment_rows(requests: RowRequests, node: SegmentSum, target: str, legs: Mapping[str, str]) -> str:
    """A segment sum along the positions is a recurrent state, never cached rows."""
    return f"{target} takes segment sums along the positions (a recurrent state)"


@STATE_ROWS.register(SegmentSum)
def segment_state_rows(planner: StatePlanner, node: SegmentSum, target: str) -> str:
    """A segment sum has a state only as the decay of a causal product (DECAY_TERM)."""
    return f"{target} takes segment sums outside the decay of a causal product"


decode.plain(SegmentSum, but=(KV_ROWS, STATE_ROWS, DECAY_TERM))


@DECAY_TERM.register(SegmentSum)
def running_sum(parts: ProductParts, sign: int, node: SegmentSum) -> None:
    """segsum[n, m](a) = c[n] − c[m] over the product's query and key legs counts on both sides
    (c the running sum of a, taken from the last position held)."""
    if (node.along, node.key) == (parts.query, parts.key):
        parts.running.append((sign, node))
    else:
        parts.split_term(sign, node)


# lower (plan/base.LOWER): one segment-sums step over (n, m) (plan/elementwise.py)
LOWER.register(SegmentSum)(lower_segment_sum)
