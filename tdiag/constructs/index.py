"""`index(n)`: the constant over leg n whose entry i is i, made from the run-time size of n (RoPE's
angles, ALiBi's distances). Its rules in every stage's table."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import decode_rules as decode
from .. import parse as syn
from ..check import CHECK, no_numbers
from ..decode_rules import (
    NEW,
    STEP_REWRITE,
    StepProgram,
)
from ..evaluation import EVALUATE
from ..graph import position_rules as pos
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
    return builder.positions.position_index(e)  # type: ignore[attr-defined]


# Positions (graph/position_rules.py): it takes no mask, hides nothing and mixes no positions.
pos.plain(PositionIndex)


# ---- decoding (decode_rules.py): what the kind means to a cache

decode.plain(PositionIndex, but=(STEP_REWRITE,))


@STEP_REWRITE.register(PositionIndex)
def step_index(program: StepProgram, node: PositionIndex) -> Expr:
    """`index(n)` of a new position, read from the input of absolute positions P .. P + T − 1."""
    if program.roles.get(node.leg) == NEW:
        return program.positions_ref(node)
    return program.finish(node)


@LOWER.register(PositionIndex)
def lower(ctx: Lowering, e: PositionIndex, ren: dict[str, tuple[str, ...]], var: str | None) -> Value:
    """The positions along its region leg, made once per leg (plan/positions.py)."""
    return positions(ctx, ren[e.leg])
