"""`causal(n, m)` as a factor: 1 where the key index m <= the query index n, else 0 (a map's
causal mask, `with_causal_mask` on an un-normalized attention). Its rules for every stage."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..check import CHECK, no_numbers
from ..evaluation import EVALUATE
from ..ir import CausalFactor, CausalMask
from ..printing import DESCRIBE, PRINT, nothing_to_describe
from ..render import RENDER

if TYPE_CHECKING:
    import torch

    from ..reference import Frame
    from ..render import Drawing


@EVALUATE.register(CausalFactor)
def evaluate(node: CausalFactor, frame: Frame) -> torch.Tensor:
    """The causal mask's 1s and 0s in the compute dtype."""
    from ..reference import causal_mask

    return causal_mask(CausalMask(node.query, node.key, node.span), node.legs, frame).to(frame.dtype)


@PRINT.register(CausalFactor)
def text(e: CausalFactor) -> str:
    return f"causal({e.query}, {e.key})"


DESCRIBE.register(CausalFactor)(nothing_to_describe)


@RENDER.register(CausalFactor)
def draw(d: Drawing, e: CausalFactor, env: dict[str, str], cluster: str | None) -> None:
    """A dashed box on the query and key legs."""
    node = d.node("mask", f'shape=box style=dashed label="causal({e.query}, {e.key})"', cluster)
    for leg in e.legs:
        d.attach(node, env[leg])


CHECK.register(CausalFactor)(no_numbers)
