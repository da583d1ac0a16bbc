"""Prefix scans along a position leg: cumsum and logcumsumexp, exclusive or reversed, with masks
hiding entries. Their rules in every stage's table."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .. import decode_rules as decode
from .. import parse as syn
from ..check import CHECK, no_numbers
from ..decode_rules import (
    KV_ROWS,
    NEW,
    STATE_ROWS,
    RowRequests,
    StatePlanner,
)
from ..errors import Diagnostic, did_you_mean, one_of
from ..errors import hint as join_hint
from ..evaluation import EVALUATE
from ..graph import position_rules as pos
from ..graph.calls import BUILD
from ..graph.position_rules import Hidden, Pairs, Positions, Site
from ..graph.syntax import available_legs
from ..graph.vocabulary import SCAN_OPTIONS, SCANS
from ..ir import POSITION_MASKS, Expr, Mask, PaddingMask, Scan
from ..plan.base import LOWER
from ..plan.elementwise import lower_scan
from ..printing import DESCRIBE, PRINT, format_expr, format_mask
from ..render import RENDER, draw_tensor, position_masks
from ..render import draw as draw_node

if TYPE_CHECKING:
    import torch

    from ..graph.calls import BoxesAndMaps
    from ..reference import Frame
    from ..render import Drawing


@EVALUATE.register(Scan)
def evaluate(node: Scan, frame: Frame) -> torch.Tensor:
    """A prefix scan along `along`, entry by entry: entry i combines the operand's entries k ≤ i
    (k < i when exclusive; k ≥ i, k > i when reversed) by a running total (a sum, or log Σ exp
    for logcumsumexp); a hidden entry adds 0 to a sum, and to a log Σ exp the dtype's lowest
    number where padding hides it, −inf where a causal mask does."""
    import torch

    from ..reference import leg_dims, masks_allowed

    operand = node.operand
    assert operand is not None
    x = frame.evaluate(operand)
    empty = 0.0 if node.name == "cumsum" else -math.inf
    if node.name == "logcumsumexp":  # a padded entry is the dtype's lowest number, a future one −inf
        padding = masks_allowed([m for m in node.masks if isinstance(m, PaddingMask)], operand.legs, frame)
        if padding is not None:
            x, padding = torch.broadcast_tensors(x, padding)
            x = torch.where(padding, x, torch.finfo(x.dtype).min)
    allowed = masks_allowed(
        node.masks if node.name == "cumsum" else [m for m in node.masks if isinstance(m, POSITION_MASKS)],
        operand.legs,
        frame,
    )
    if allowed is not None:
        x, allowed = torch.broadcast_tensors(x, allowed)
    dim = leg_dims([node.along], operand.legs)[0]
    entries = list(x.unbind(dim))
    visible = list(allowed.unbind(dim)) if allowed is not None else [None] * len(entries)
    order = range(len(entries) - 1, -1, -1) if node.reverse else range(len(entries))
    total = torch.full_like(entries[0], empty)
    results: list[torch.Tensor] = [total] * len(entries)
    for i in order:
        entry = entries[i] if visible[i] is None else torch.where(visible[i], entries[i], empty)
        after = total + entry if node.name == "cumsum" else torch.logaddexp(total, entry)
        results[i] = total if node.exclusive else after
        total = after
    return torch.stack(results, dim)


@PRINT.register(Scan)
def text(e: Scan) -> str:
    """`cumsum[n, exclusive = 1, reverse = 1, mask = causal(n, m)](x)`, the flags only where set."""
    assert e.operand is not None
    flags = "".join(f", {word} = 1" for word, flag in (("exclusive", e.exclusive), ("reverse", e.reverse)) if flag)
    masks = "".join(f", mask = {format_mask(m)}" for m in e.masks)
    return f"{e.name}[{e.along}{flags}{masks}]({format_expr(e.operand)})"


@DESCRIBE.register(Scan)
def describe(node: Scan) -> str:
    return f"scan: {format_expr(node)} [{' '.join(node.legs)}]"


@RENDER.register(Scan)
def draw(d: Drawing, e: Scan, env: dict[str, str], cluster: str | None) -> None:
    """The leg passes through: a scan node sits on it, in a dotted cluster labelled as written."""
    assert e.operand is not None
    options = [word for word, flag in (("exclusive", e.exclusive), ("reverse", e.reverse)) if flag]
    masks = position_masks(e.masks)
    label = " ".join([e.name, *options, "along", e.along]) + (" · mask " + ", ".join(masks) if masks else "")
    box = d.cluster(label, "dotted", cluster)
    for mask in e.masks:
        if isinstance(mask, PaddingMask):
            draw_tensor(d, mask.tensor, env, box)
    node = d.node("scan", f'shape=rarrow width=0.3 height=0.2 label="" xlabel="{e.name}"', box)
    d.attach(node, env[e.along])
    draw_node(d, e.operand, {leg: env[leg] for leg in e.operand.legs}, box)


CHECK.register(Scan)(no_numbers)


@BUILD.register(Scan, names=SCANS)
def build(builder: BoxesAndMaps, e: syn.Call, keep: set[str]) -> Expr:
    """`cumsum[n, exclusive = 1, reverse = 1, mask = ...](x)`: a prefix scan of x along its
    position leg n, which stays in the result (docs/language.md, Scans)."""
    argument = builder.one_argument(e)
    if argument is None:
        return builder.poison(e)
    named = {leg for leg in builder.legs_of(e)}
    along_masks = {leg for option in e.options for leg in available_legs(option.value, builder.b.tensors)}
    operand = builder.inside(argument, keep | named | along_masks)
    builder.warn_lone_sums(e, argument, operand)
    along = builder.scan_leg(e, operand, 1, f"{e.name}[n](x[n h])")
    flags: dict[str, bool] = {}
    masks: list[Mask] = []
    for option in e.options:
        if option.name not in SCAN_OPTIONS:
            builder.b.error(
                f"unknown {e.name} option '{option.name}'",
                option.span,
                hint=join_hint(did_you_mean(option.name, SCAN_OPTIONS), one_of(SCAN_OPTIONS)),
            )
        elif option.name == "mask":
            mask = builder.mask_option(option.value, operand, f"{e.name} scan")
            if mask is not None:
                masks.append(mask)
        elif option.name in flags:
            builder.b.error(f"option '{option.name}' is given twice", option.span)
        else:
            value = builder.b.scalar_of(option.value)
            if value not in (0, 1):
                builder.b.error(
                    f"{e.name} option '{option.name}' is a flag: 0 or 1, got {value}",
                    option.value.span,
                    hint=f"{e.name}[n, {option.name} = 1](...)",
                )
            flags[option.name] = value == 1
    if along is None:
        return builder.poison(e)
    scan = Scan(
        operand.legs,
        e.span,
        e.name,
        along,
        operand,
        flags.get("exclusive", False),
        flags.get("reverse", False),
        tuple(masks),
    )
    return builder.restrict(scan, keep, e.span)


# Positions (graph/position_rules.py): a forward scan is a prefix, causal as it is; a reverse one
# (a suffix sum) sees the later positions: a mask over (query, key) joins the masks of one along
# the key that keeps the query, and one along another position leg is refused.
@pos.MASK_SITE.register(Scan)
def mask_site(node: Scan, query: str, key: str) -> Site | None:
    return "masks" if node.reverse and node.along == key and query in node.legs else None


@pos.SEEN.register(Scan)
def seen(node: Scan, query: str, key: str, hidden: Hidden) -> bool:
    """Whether a mask hides the later keys already, or a suffix sum adds entries zero past the query."""
    return pos.masks_hide(node.masks, query, key) or (node.name == "cumsum" and (query, key) in _zeros_of(node, hidden))


def _zeros_of(node: Scan, hidden: Hidden) -> Pairs:
    return pos.zeros(node.operand, hidden)  # type: ignore[arg-type]


@pos.FUTURE.register(Scan)
def future(node: Scan, positions: Positions) -> Diagnostic | None:
    """A reverse scan along a position leg that no causal mask limits to the keys a query may see:
    each position would see the later ones."""
    if not node.reverse or not pos.reads_an_input(node, positions.graph):
        return None
    leg, queries = node.along, positions.queries
    zeroed = node.name == "cumsum" and any((q, leg) in _zeros_of(node, positions.hidden) for q in queries)
    if not positions.positional(leg) or zeroed or any(pos.hides_future(m) and m.key == leg for m in node.masks):
        return None
    return Diagnostic(
        f"with_causal_mask cannot mask the reverse {node.name} along position leg '{leg}':"
        " each position would see the later ones",
        (node.span,),
        "scan forward (a prefix)"
        + (f", or beside the query leg with mask = causal({min(queries)}, {leg})" if leg not in queries else ""),
    )


@pos.HIDES.register(Scan)
def hides(node: Scan, query: str, key: str, diagonal: Hidden) -> bool:
    return pos.masks_hide(node.masks, query, key)


@pos.CALL_WORD.register(Scan)
def call_word(node: Scan) -> str:
    return f"a reverse {node.name}"


@pos.KEY_LEGS.register(Scan)
def key_legs(node: Scan, positional: set[str]) -> set[str]:
    return pos.mask_keys(node.masks, positional)


pos.plain(Scan, but=(pos.MASK_SITE, pos.SEEN, pos.FUTURE, pos.HIDES, pos.CALL_WORD, pos.KEY_LEGS))


# ---- decoding (decode_rules.py): what the kind means to a cache


@KV_ROWS.register(Scan)
def scanned_rows(requests: RowRequests, node: Scan, target: str, legs: Mapping[str, str]) -> str | None:
    """A scan along the positions of its result is a running total no cached row gives."""
    if legs.get(node.along) == NEW:
        return f"{target} scans along the positions of its result (a recurrent state)"
    return None


@STATE_ROWS.register(Scan)
def scanned_state_rows(planner: StatePlanner, node: Scan, target: str) -> str | None:
    """A scan along the positions is a running total outside a causal product."""
    if planner.positional(node.along):
        return f"{target} scans along the positions {node.along} (a running total outside a product)"
    return None


decode.plain(Scan, but=(KV_ROWS, STATE_ROWS))


# lower (plan/base.LOWER): its masks filled, then one scan step in float32 (plan/elementwise.py)
LOWER.register(Scan)(lower_scan)
