"""`index(n)`: the constant over leg n whose entry i is i, made from the run-time size of n (RoPE's
angles, ALiBi's distances). Its rules in every stage's table."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import parse as syn
from ..check import CHECK, no_numbers
from ..evaluation import EVALUATE
from ..graph.calls import BUILD
from ..graph.vocabulary import POSITION_FUNCTIONS
from ..ir import Expr, PositionIndex
from ..plan.base import LOWER
from ..plan.positions import positions
from ..printing import DESCRIBE, PRINT, nothing_to_describe
from ..render import RENDER

if TYPE_CHECKING:
    import torch

    from ..graph.calls import BoxesAndMaps
    from ..plan.context import Lowering
    from ..plan.program import Value
    from ..reference import Frame
    from ..render import Drawing


@EVALUATE.register(PositionIndex)
def evaluate(node: PositionIndex, frame: Frame) -> torch.Tensor:
    """The leg's positions (from its start in a decoding step) in the compute dtype."""
    return frame.leg_indices(node.leg).to(frame.dtype)


@PRINT.register(PositionIndex)
def text(e: PositionIndex) -> str:
    return f"index({e.leg})"


DESCRIBE.register(PositionIndex)(nothing_to_describe)


@RENDER.register(PositionIndex)
def draw(d: Drawing, e: PositionIndex, env: dict[str, str], cluster: str | None) -> None:
    """A constant over one leg: entry i is i."""
    node = d.node("index", f'shape=cds label="index" tooltip="index({e.leg}): 0 .. size − 1"', cluster)
    d.attach(node, env[e.leg])


CHECK.register(PositionIndex)(no_numbers)


@BUILD.register(PositionIndex, names=POSITION_FUNCTIONS)
def build(builder: BoxesAndMaps, e: syn.Call, keep: set[str]) -> Expr:
    """`index(n)`, or `index(p, P)`, which also binds leg p to size P (graph/positions.py)."""
    return builder.position_index(e)  # type: ignore[attr-defined]


@LOWER.register(PositionIndex)
def lower(ctx: Lowering, e: PositionIndex, ren: dict[str, tuple[str, ...]], var: str | None) -> Value:
    """The positions along its region leg, made once per leg (plan/positions.py)."""
    return positions(ctx, ren[e.leg])
