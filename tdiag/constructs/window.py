"""`window(n, m, W)` (or `window(n, m, L, R)`) as a factor: 1 where the key is inside the query's
window, else 0. Its rules in every stage's table."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import decode_rules as decode
from .. import parse as syn
from ..check import CHECK, no_numbers
from ..decode_rules import (
    STATE_WHAT,
    STEP_REWRITE,
    StepProgram,
)
from ..evaluation import EVALUATE
from ..graph import position_rules as pos
from ..graph.calls import BUILD
from ..graph.position_rules import Hidden, Pairs
from ..ir import Expr, WindowFactor
from ..plan.base import LOWER, REGION_FACTOR
from ..printing import DESCRIBE, PRINT, nothing_to_describe
from ..render import RENDER

if TYPE_CHECKING:
    import torch

    from ..graph.calls import BoxesAndMaps
    from ..reference import Frame
    from ..render import Drawing


@EVALUATE.register(WindowFactor)
def evaluate(node: WindowFactor, frame: Frame) -> torch.Tensor:
    """The window mask's 1s and 0s in the compute dtype."""
    from ..reference import window_mask

    return window_mask(node.mask, node.legs, frame).to(frame.dtype)


@PRINT.register(WindowFactor)
def text(e: WindowFactor) -> str:
    return str(e.mask)


DESCRIBE.register(WindowFactor)(nothing_to_describe)


@RENDER.register(WindowFactor)
def draw(d: Drawing, e: WindowFactor, env: dict[str, str], cluster: str | None) -> None:
    """A dashed box on the query and key legs, labelled as written."""
    node = d.node("mask", f'shape=box style=dashed label="{e.mask}"', cluster)
    for leg in e.legs:
        d.attach(node, env[leg])


CHECK.register(WindowFactor)(no_numbers)


@BUILD.register(WindowFactor, names=("window",))
def build(builder: BoxesAndMaps, e: syn.Call, keep: set[str]) -> Expr:
    """`window(n, m, W)` or `window(n, m, L, R)` as a factor (read as a mask option too)."""
    return builder.window_factor(e)


# Positions (graph/position_rules.py): a one-sided window is zero past the query, as causal(n, m);
# any window is read at every key.
@pos.ZEROS.register(WindowFactor)
def zeros(node: WindowFactor, hidden: Hidden) -> Pairs:
    return {(node.query, node.key)} if node.mask.is_causal else set()


@pos.HIDES.register(WindowFactor)
def hides(node: WindowFactor, query: str, key: str, diagonal: Hidden) -> bool:
    return node.mask.is_causal and (node.query, node.key) == (query, key)


@pos.KEY_LEGS.register(WindowFactor)
def key_legs(node: WindowFactor, positional: set[str]) -> set[str]:
    return {node.key}


pos.plain(WindowFactor, but=(pos.ZEROS, pos.HIDES, pos.KEY_LEGS))


# ---- decoding (decode_rules.py): what the kind means to a cache

decode.plain(WindowFactor, but=(STATE_WHAT, STEP_REWRITE))


@STATE_WHAT.register(WindowFactor)
def what(node: WindowFactor) -> str:
    return f"{node.kind}({node.query}, {node.key})"


@STEP_REWRITE.register(WindowFactor)
def step_mask(program: StepProgram, node: WindowFactor) -> Expr:
    """A mask input over the absolute positions of its query and key legs."""
    return program.mask_ref(node.mask)


# lower (plan/base.LOWER): collected as a leaf of its multilinear region (plan/regions.py)
LOWER.unsupported(WindowFactor, REGION_FACTOR)
