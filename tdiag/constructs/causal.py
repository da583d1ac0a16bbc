"""`causal(n, m)` as a factor: 1 where the key index m <= the query index n, else 0 (a map's
causal mask, `with_causal_mask` on an un-normalized attention). Its rules in every stage's table."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import decode_rules as decode
from .. import parse as syn
from ..check import CHECK, no_numbers
from ..decode_rules import (
    STATE_FACTOR,
    STATE_WHAT,
    STEP_REWRITE,
    ProductParts,
    StepProgram,
)
from ..errors import did_you_mean
from ..evaluation import EVALUATE
from ..graph import position_rules as pos
from ..graph.calls import BUILD
from ..graph.position_rules import Hidden, Pairs
from ..ir import CausalFactor, CausalMask, Expr
from ..plan.base import LOWER, REGION_FACTOR
from ..printing import DESCRIBE, PRINT, nothing_to_describe
from ..render import RENDER

if TYPE_CHECKING:
    import torch

    from ..graph.calls import BoxesAndMaps
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


@BUILD.register(CausalFactor, names=("causal",))
def build(builder: BoxesAndMaps, e: syn.Call, keep: set[str]) -> Expr:
    """`causal(n, m)` as a factor: 1 where m <= n, 0 elsewhere (zeroing the future)."""
    legs = [a.name if isinstance(a, syn.Name) else None for a in e.args]
    if len(legs) != 2 or None in legs or e.legs is not None or e.keywords:
        builder.b.error("causal takes a query leg and a key leg", e.span, hint="causal(n, m)")
        return builder.poison(e)
    for leg, arg in zip(legs, e.args, strict=True):
        if not builder.b.find_leg(leg):
            builder.b.error(
                f"causal mask leg '{leg}' is not bound to a size",
                arg.span,
                hint=did_you_mean(leg, builder.b.legs) or "use legs that a tensor of this file has",
            )
            return builder.poison(e)
    if legs[0] == legs[1]:
        builder.b.error("a causal mask relates two different legs", e.span)
        return builder.poison(e)
    return CausalFactor((legs[0], legs[1]), e.span, legs[0], legs[1])  # type: ignore[arg-type]


# Positions (graph/position_rules.py): the factor is zero past the query, causal as written, and
# read at every key.
@pos.ZEROS.register(CausalFactor)
def zeros(node: CausalFactor, hidden: Hidden) -> Pairs:
    return {(node.query, node.key)}


@pos.HIDES.register(CausalFactor)
def hides(node: CausalFactor, query: str, key: str, diagonal: Hidden) -> bool:
    return (node.query, node.key) == (query, key)


@pos.KEY_LEGS.register(CausalFactor)
def key_legs(node: CausalFactor, positional: set[str]) -> set[str]:
    return {node.key}


pos.plain(CausalFactor, but=(pos.ZEROS, pos.HIDES, pos.KEY_LEGS))


# ---- decoding (decode_rules.py): what the kind means to a cache

decode.plain(CausalFactor, but=(STATE_WHAT, STATE_FACTOR, STEP_REWRITE))


@STATE_WHAT.register(CausalFactor)
def what(node: CausalFactor) -> str:
    return f"{node.kind}({node.query}, {node.key})"


@STATE_FACTOR.register(CausalFactor)
def causal_factor(parts: ProductParts, node: CausalFactor) -> None:
    """causal(n, m) over the product's query and key legs makes it a causal product (Σ_{m ≤ n})."""
    if (node.query, node.key) == (parts.query, parts.key):
        parts.mark_causal(node)
    else:
        parts.split(node)


@STEP_REWRITE.register(CausalFactor)
def step_mask(program: StepProgram, node: CausalFactor) -> Expr:
    """A mask input over absolute positions, unless it hides nothing (one new position against
    every key): then it stays, for its product to drop."""
    if not program.hides_nothing(node):
        return program.mask_ref(CausalMask(node.query, node.key, node.span))
    return program.finish(node)


# lower (plan/base.LOWER): collected as a leaf of its multilinear region (plan/regions.py)
LOWER.unsupported(CausalFactor, REGION_FACTOR)
