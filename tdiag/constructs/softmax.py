"""The softmax box (Tuformer's dotted box with a filled ball on the normalized legs, labelled with
the scale α), the normalize box x / Σ x of linear attention, their masks and a sink logit
(gpt-oss). Its rules in every stage's table."""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

import sympy

from .. import decode_rules as decode
from .. import parse as syn
from ..check import CHECK, NumberRule
from ..decode_linear import unboxed
from ..decode_rules import (
    STATE_STATEMENT,
    STATE_WHAT,
    StatementRewrite,
    StatePlanner,
)
from ..evaluation import EVALUATE
from ..graph import position_rules as pos
from ..graph.call_masks import box_heads, call_mask_ref, is_call_mask
from ..graph.calls import BUILD
from ..graph.position_rules import Bias, Hidden, Mixing, Pairs, Site
from ..graph.vocabulary import BOXES
from ..ir import ONE, POSITION_MASKS, Contraction, Expr, PaddingMask, SoftmaxBox, Statement, SumNode, TensorRef
from ..plan.base import LOWER
from ..plan.boxes import lower_box
from ..printing import DESCRIBE, PRINT, format_expr, format_mask
from ..render import RENDER, draw_tensor, math_text, position_masks
from ..render import draw as draw_node
from ..render_notation import SCALED

if TYPE_CHECKING:
    import torch

    from ..graph.calls import BoxesAndMaps
    from ..reference import Frame
    from ..render import Drawing


@EVALUATE.register(SoftmaxBox)
def evaluate(node: SoftmaxBox, frame: Frame) -> torch.Tensor:
    """softmax (is_exp): softmax of scale * content jointly over the normalized legs, logits a
    padding mask hides set to the dtype's lowest finite value (a row of them averages the values)
    and those a causal mask hides to -inf (the future never takes weight). normalize: content
    with masked entries 0, divided by its sum over the normalized legs plus eps."""
    import torch

    from ..reference import align, leg_dims, masks_allowed

    assert node.content is not None
    x = align(frame.evaluate(node.content), node.content.legs, node.legs)
    dims = leg_dims(node.normalized, node.legs)
    if node.is_exp:
        x = frame.number(node.scale) * x
        padded = masks_allowed([m for m in node.masks if isinstance(m, PaddingMask)], node.legs, frame)
        causal = masks_allowed([m for m in node.masks if isinstance(m, POSITION_MASKS)], node.legs, frame)
        if padded is not None:
            x = torch.where(padded, x, torch.finfo(x.dtype).min)
        if causal is not None:  # the future takes no weight, even in a row whose past is all padding
            x = torch.where(causal, x, float("-inf"))
        if node.sink is not None:
            sink = align(frame.evaluate(node.sink), node.sink.legs, node.legs)
            return _sink_softmax(x, sink, dims)
        return _joint_softmax(x, dims)
    allowed = masks_allowed(node.masks, node.legs, frame)
    if allowed is not None:
        x = torch.where(allowed, x, 0.0)
    return x / (x.sum(dim=dims, keepdim=True) + frame.number(node.eps))


def _sink_softmax(x: torch.Tensor, sink: torch.Tensor, dims: list[int]) -> torch.Tensor:
    """The softmax of x over `dims` with the logit `sink` (constant along `dims`) one more entry
    of each row's denominator, as gpt-oss's eager attention computes it: the row's logits and its
    sink concatenated, softmaxed, the sink's weight dropped. No mask hides the sink, so a row
    whose keys are all hidden gives weights ≈ 0 (a padded row) or exactly 0 (a causal one)."""
    import torch

    dims = [d % x.dim() for d in dims]
    end = list(range(x.dim() - len(dims), x.dim()))
    moved = x.movedim(dims, end)
    flat = moved.flatten(x.dim() - len(dims))
    row = sink.expand(x.shape).movedim(dims, end).flatten(x.dim() - len(dims))[..., :1]
    weights = torch.cat([flat, row], dim=-1).softmax(dim=-1)[..., :-1]
    return weights.reshape(moved.shape).movedim(end, dims)


def _joint_softmax(x: torch.Tensor, dims: list[int]) -> torch.Tensor:
    """Softmax over several dims at once: moved to the end, flattened, softmaxed, put back."""
    dims = [d % x.dim() for d in dims]
    end = list(range(x.dim() - len(dims), x.dim()))
    moved = x.movedim(dims, end)
    flat = moved.flatten(x.dim() - len(dims)).softmax(dim=-1)  # flatten: also for an empty batch
    return flat.reshape(moved.shape).movedim(end, dims)


@PRINT.register(SoftmaxBox)
def text(e: SoftmaxBox) -> str:
    """`softmax[m](...)`, `normalize[m](...)`, with a sink as written: `softmax[m, sink = s[h]](...)`."""
    assert e.content is not None
    sink = f", sink = {format_expr(e.sink)}" if e.sink is not None else ""
    return f"{e.box_name}[{' '.join(e.normalized)}{sink}]({format_expr(e.content)})"


@DESCRIBE.register(SoftmaxBox)
def describe(node: SoftmaxBox) -> str:
    """The box's legs, its normalized leg (the filled ball), its scale α, sink and masks."""
    masks = ", ".join(format_mask(m) for m in node.masks)
    scale = f", scale {node.scale}" if node.is_exp else ""
    sink = f", sink {format_expr(node.sink)}" if node.sink is not None else ""
    return (
        f"{node.box_name} box over [{' '.join(node.legs)}], normalized leg {' '.join(node.normalized)}{scale}"
        + sink
        + (f", masks {masks}" if masks else "")
    )


@RENDER.register(SoftmaxBox)
def draw(d: Drawing, e: SoftmaxBox, env: dict[str, str], cluster: str | None) -> None:
    """A dotted cluster with a filled ball on each normalized leg labelled α (Σ for normalize),
    its padding masks' tensors inside, and a sink in a cluster of its own."""
    assert e.content is not None
    masks = position_masks(e.masks)
    label = e.box_name + (" · mask " + ", ".join(masks) if masks else "")
    box = d.cluster(label, "dotted", cluster)
    scale = math_text(e.scale) if e.is_exp else "Σ"
    for leg in e.normalized:
        d.balls[env[leg]] = (box, scale)
    for mask in e.masks:
        if isinstance(mask, PaddingMask):
            draw_tensor(d, mask.tensor, env, box)
    draw_node(d, e.content, env, box)
    if e.sink is not None:  # the sink: a logit of each row's denominator, drawn in the box it joins
        sink = d.cluster("sink: + exp(·) in the denominator", SCALED, box)
        draw_node(d, e.sink, {leg: env[leg] for leg in e.sink.legs}, sink)


@CHECK.register(SoftmaxBox)
def numbers(node: SoftmaxBox) -> tuple[tuple[str, sympy.Expr, NumberRule | None], ...]:
    """Its scale, and its eps, a small number added to the sum (between 0 and 1)."""
    return (
        (f"the {node.box_name} box's scale", node.scale, None),
        (f"the {node.box_name} box's eps", node.eps, _eps_rule),
    )


def _eps_rule(x: float) -> str | None:
    return None if 0 <= x <= 1 else "must be between 0 and 1 (a small number added to the sum)"


@BUILD.register(SoftmaxBox, names=BOXES)
def build(builder: BoxesAndMaps, e: syn.Call, keep: set[str]) -> Expr:
    """`softmax[m, scale = ..., mask = ..., sink = ...](x)`, `normalize[m, eps = ...](x)`."""
    return builder.box(e, keep)


# Positions (graph/position_rules.py): a mask over (query, key) joins the masks of a box normalized
# over the key beside the query; its content may hide the later keys itself. A call bias adds to
# a softmax box's scores; a normalize box takes none.
@pos.MASK_SITE.register(SoftmaxBox)
def mask_site(node: SoftmaxBox, query: str, key: str) -> Site | None:
    return "masks" if key in node.normalized and query in node.legs else None


@pos.SEEN.register(SoftmaxBox)
def seen(node: SoftmaxBox, query: str, key: str, hidden: Hidden) -> bool:
    """Whether a mask hides the later keys already, or the content does (a decay of segment sums)."""
    return pos.masks_hide(node.masks, query, key) or (query, key) in zeroed_content(node, hidden)


@pos.ZEROS.register(SoftmaxBox)
def zeros(node: SoftmaxBox, hidden: Hidden) -> Pairs:
    return {(m.query, m.key) for m in node.masks if pos.hides_future(m)} | zeroed_content(node, hidden)


def zeroed_content(box: SoftmaxBox, hidden: Hidden) -> Pairs:
    """The pairs along which a box's entries are zero past the query by its content alone: a
    normalize box of a content zero there, a softmax of one −inf there."""
    if box.content is None:
        return set()
    if box.is_exp:
        return pos.minus_infinity(box.content)
    return pos.zeros(box.content, hidden)


@pos.MIXING.register(SoftmaxBox)
def mixing(node: SoftmaxBox) -> Mixing:
    return Mixing(node.normalized, "the box", normalizes=True)


@pos.HIDES.register(SoftmaxBox)
def hides(node: SoftmaxBox, query: str, key: str, diagonal: Hidden) -> bool:
    return pos.masks_hide(node.masks, query, key)


@pos.CALL_HIDDEN.register(SoftmaxBox)
def call_hidden(node: SoftmaxBox, name: str, hidden: Hidden) -> Pairs:
    """The pairs the call mask masks, and those whose scores hold the call bias as a term."""
    masked = {(m.tensor.legs[-2], m.tensor.legs[-1]) for m in node.masks if is_call_mask(m, name)}
    terms = node.content.terms if isinstance(node.content, SumNode) else ()
    biased = {(t.legs[-2], t.legs[-1]) for t in terms if isinstance(t, TensorRef) and t.name == name}
    return masked | biased


@pos.HEADS.register(SoftmaxBox)
def heads(node: SoftmaxBox, query: str, key: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return box_heads(node, query), ()


@pos.CALL_WORD.register(SoftmaxBox)
def call_word(node: SoftmaxBox) -> str:
    return "a softmax box" if node.is_exp else "a normalize box"


@pos.BIAS.register(SoftmaxBox)
def biased(box: SoftmaxBox, bias: Bias) -> SoftmaxBox | None:
    """The box softmax(scale·content + S[query key]) with scale 1 (S[heads query key] per head):
    S after the scale, as SDPA adds it, never multiplied (a hidden entry is the dtype's lowest
    number, which any factor > 1 would overflow to −inf). None for a normalize box."""
    content = box.content
    if not box.is_exp or content is None:
        return None
    scaled = content
    if box.scale != ONE:
        scaled = Contraction(legs=content.legs, span=content.span, factors=(content,), coefficient=box.scale)
    heads = box_heads(box, bias.query) if bias.per_head else ()
    ref = call_mask_ref(bias.name, bias.query, bias.key, bias.span, heads)
    term = SumNode(legs=content.legs, span=content.span, terms=(scaled, ref), signs=(1, 1))
    return dataclasses.replace(box, content=term, scale=ONE)


@pos.KEY_LEGS.register(SoftmaxBox)
def key_legs(node: SoftmaxBox, positional: set[str]) -> set[str]:
    return (set(node.normalized) & positional) | pos.mask_keys(node.masks, positional)


pos.plain(
    SoftmaxBox,
    but=(
        pos.MASK_SITE,
        pos.SEEN,
        pos.ZEROS,
        pos.MIXING,
        pos.HIDES,
        pos.CALL_HIDDEN,
        pos.HEADS,
        pos.CALL_WORD,
        pos.BIAS,
        pos.KEY_LEGS,
    ),
)


# ---- decoding (decode_rules.py): what the kind means to a cache

decode.plain(SoftmaxBox, but=(STATE_WHAT, STATE_STATEMENT))


@STATE_WHAT.register(SoftmaxBox)
def what(node: SoftmaxBox) -> str:
    return f"{node.box_name} over {', '.join(node.normalized)}"


@STATE_STATEMENT.register(SoftmaxBox)
def linear_order(planner: StatePlanner, statement: Statement) -> StatementRewrite:
    """A causal normalize box over positions and its one reader in the box's linear order
    (decode_linear.py); a softmax over positions has no state."""
    return functools.partial(unboxed, planner, statement)


# lower (plan/base.LOWER): the box computed as such (plan/boxes.py); a region that reads it
# weighs its other forms first (plan/forms/)
LOWER.register(SoftmaxBox)(lower_box)
