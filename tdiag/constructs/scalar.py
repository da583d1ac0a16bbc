"""A number or size as a term or factor (`2`, `1 / sqrt(D)`): its rules in every stage's table."""

from __future__ import annotations

from typing import TYPE_CHECKING

import sympy

from .. import decode_rules as decode
from ..check import CHECK
from ..evaluation import EVALUATE
from ..graph import position_rules as pos
from ..graph.calls import BUILD
from ..ir import Scalar
from ..plan.base import LOWER, REGION_FACTOR
from ..printing import DESCRIBE, PRINT, nothing_to_describe
from ..render import RENDER, math_text

if TYPE_CHECKING:
    import torch

    from ..reference import Frame
    from ..render import Drawing


@EVALUATE.register(Scalar)
def evaluate(node: Scalar, frame: Frame) -> torch.Tensor:
    """The number at the frame's sizes, a 0-dim tensor in the compute dtype."""
    import torch

    return torch.tensor(frame.number(node.value), dtype=frame.dtype, device=frame.device)


@PRINT.register(Scalar)
def text(e: Scalar) -> str:
    return str(e.value)


DESCRIBE.register(Scalar)(nothing_to_describe)


@RENDER.register(Scalar)
def draw(d: Drawing, e: Scalar, env: dict[str, str], cluster: str | None) -> None:
    """A coefficient other than 1 as a plain label beside the network it scales."""
    if e.value != 1:
        d.node("c", f'shape=plaintext label="{math_text(e.value)}"', cluster)


@CHECK.register(Scalar)
def numbers(node: Scalar) -> tuple[tuple[str, sympy.Expr, None], ...]:
    return (("the number", node.value, None),)


BUILD.unsupported(Scalar, "not a call: a number or size is read where it is written (graph/builder.py)")


# Positions (graph/position_rules.py): it takes no mask, hides nothing and mixes no positions.
pos.plain(Scalar)


# ---- decoding (decode_rules.py): what the kind means to a cache

decode.plain(Scalar)


# lower (plan/base.LOWER): collected as a leaf of its multilinear region (plan/regions.py)
LOWER.unsupported(Scalar, REGION_FACTOR)
