"""The banded form of a windowed softmax box (`mask = window(n, m, W)` or `window(n, m, L, R)`):
the queries in blocks of C, each block attending only the keys its window reaches.

With the window query − before < key < query + after, the queries c·C .. c·C + C − 1 of block c
see at most the keys c·C − (before − 1) .. c·C + C − 1 + (after − 1): a block of
C + before + after − 2 keys. The keys and values are padded and unfolded into those overlapping
blocks (`BandBlocks`), each block's scores are one (C × (C + W − 1)) matmul, masked by the band
(`BandMask`: outside the window or past the ends, −inf; a padding mask, the dtype's lowest number,
as the materialized box fills them), normalized and multiplied by the block's values, and the
blocks are joined back into the query positions. FLOPs and the scores kept for backward grow as
N·(C + before + after − 2), not N²: the cost formulas are linear in N at fixed widths.

C is the largest power of two at most half the window (from 16 to 256): a block's keys then
stay within 1.5 times its window while the blocks stay large enough for a matmul. Weighed by the one cost model against
SDPA with the band as its boolean attn_mask (which computes and, on CPU, keeps N² entries) and the
materialized box; `tdiag plan` lists it. A map of the scores (Gemma 2's softcap c · tanh(s / c),
score_maps.py) is applied to each block's scores before the band is masked."""

from __future__ import annotations

from typing import TYPE_CHECKING

import sympy

from ..boxes import expand_broadcast, materialize
from ..chunked import chunk_legs, chunk_value
from ..context import Leaf, Lowering
from ..contraction import scale_value
from ..positions import like_input
from ..program import (
    BATCH,
    BandBlocks,
    BandMask,
    JoinChunks,
    Map,
    MaskFill,
    Operand,
    Softmax,
    Step,
    Value,
    align,
    show_legs,
)
from ..regions import contract
from ..score_maps import MAPPED
from ..sdpa import emit_prelude, query_and_key
from .base import BoxSite, Form, Unfit

if TYPE_CHECKING:
    from ...plan.sdpa_match import MatchedAttention

SMALLEST_BLOCK, LARGEST_BLOCK = 16, 256


def block_size(before: int, after: int) -> int:
    """C: the largest power of two at most half the window's width (16 ≤ C ≤ 256), so that a
    block's C + W − 1 keys are at most 1.5 W."""
    width = before + after - 1
    size = SMALLEST_BLOCK
    while size * 2 <= min(width // 2, LARGEST_BLOCK):
        size *= 2
    return size


class Banded(Form):
    name = "banded"

    def label(self, site: BoxSite) -> str:
        return "the banded form (queries in blocks, each with the keys of its window)"

    def refusal(self, ctx: Lowering, site: BoxSite) -> str | None:
        if site.kind != "softmax":
            return Unfit("a normalize box (the banded form is a windowed softmax's)")
        match = site.attention or site.found.get(MAPPED)
        if match is None:
            return Unfit(f"no attention match ({site.mismatch})")
        if match.score_map is not None and match.score_map.outer:
            return "terms of the scores outside their map (the banded form maps the query·key products alone)"
        if match.window is None:
            return Unfit("no window mask")
        if len(match.keys) != 1:
            return "several key legs (the band runs along one key position)"
        if (match.sequence, match.keys[0]) != match.masks[0]:
            return "the window is not between the query position and the key leg"
        if match.biases or match.score_biases:
            return "an additive term of the scores (the banded form takes query·key products alone)"
        for _, legs in match.pads:
            if tuple(legs) != tuple(match.keys):
                return "a padding mask over legs other than the key"
        if ctx.size(match.sequence) != ctx.size(match.keys[0]):
            return "query and key positions of different lengths"
        return None

    def emit(self, ctx: Lowering, site: BoxSite) -> list[Leaf]:
        match = site.attention or site.found[MAPPED]
        before, after = (int(w) for w in match.window)  # type: ignore[union-attr]
        emit_prelude(ctx, match)
        with ctx.box():
            q, k, _ = query_and_key(ctx, match)
        keys, features, sequence = match.keys, match.features, match.sequence
        (key,) = keys
        v = contract(ctx, match.value, tuple(match.heads + keys + features), sympy.Integer(1), "v")
        size = block_size(before, after)
        width = size + before + after - 2
        chunks, within, _, _ = chunk_legs(ctx, sequence, key, size)
        band = ctx.new_leg(key, sympy.Integer(width))
        blocks = Blocks(ctx, key, chunks, band, size, width, before - 1)
        q_blocks, k_blocks = chunk_value(ctx, q, sequence, chunks, within), blocks.of(k)
        query_heads = [leg for leg in match.queries if leg != sequence]
        rows = (*match.heads, *query_heads, chunks, within)
        scores = contract(
            ctx,
            [Leaf(q_blocks.legs, value=q_blocks), Leaf(k_blocks.legs, value=k_blocks)],
            (*rows, band),
            ctx.runtime(match.scale),
            "scores",
        )
        if match.score_map is not None:
            scores = mapped_scores(ctx, match, scores)
        scores = masked_scores(ctx, match, scores, blocks, within, before, after)
        weights = block_softmax(ctx, scores, band)
        v_blocks = blocks.of(v)
        out = contract(
            ctx,
            [Leaf(weights.legs, value=weights), Leaf(v_blocks.legs, value=v_blocks)],
            (*rows, *features),
            sympy.Integer(1),
            None,
        )
        joined = join_blocks(ctx, out, chunks, within, sequence)
        if not ctx.trialing:
            ctx.lowered.append(
                f"softmax box over {' '.join(show_legs(keys))} in blocks of C = {size} queries,"
                f" each with its {width} keys of the window"
            )
        rest = [o for o in site.others if o not in match.value]
        return [*rest, Leaf(joined.legs, value=joined)]


class Blocks:
    """Values along the key leg as the overlapping blocks of keys each query block sees."""

    def __init__(self, ctx: Lowering, key: str, chunks: str, band: str, size: int, width: int, lead: int):
        self.ctx, self.key, self.chunks, self.band = ctx, key, chunks, band
        self.size, self.width, self.lead = size, width, lead

    def of(self, value: Value) -> Value:
        ctx = self.ctx
        value = expand_broadcast(ctx, value, {self.key})
        physical = [leg for leg in value.legs if leg not in value.broadcast]
        axis = physical.index(self.key)
        legs = tuple(p for leg in value.legs for p in ((self.chunks, self.band) if leg == self.key else (leg,)))
        op = BandBlocks(
            value,
            axis,
            len(physical) - 1 - axis,
            ctx.leg_sizes[self.chunks],
            self.size,
            self.width,
            self.lead,
            ctx.runtime(ctx.size(self.key)),
        )
        name = ctx.names.fresh(f"{value.var}_blocks")
        shown = show_legs([self.key])[0]
        step = Step(
            "view", op, Value(name, legs, value.broadcast), f"{shown} in blocks of {self.width}", inputs=(value,)
        )
        return ctx.emit(step)  # type: ignore[return-value]


def mapped_scores(ctx: Lowering, match: MatchedAttention, scores: Value) -> Value:
    """The block scores through the box's map of the scores, times its weight (Gemma 2's
    c · tanh(s / c), score_maps.py), before the band is masked, as the materialized box does."""
    mapping = match.score_map
    assert mapping is not None
    params = tuple(ctx.runtime(p) for p in mapping.params)
    mapped = Value(ctx.names.fresh(mapping.name), scores.legs, scores.broadcast)
    step = Step(
        "map",
        Map(scores, mapping.name, params),
        mapped,
        mapping.name,
        elementwise=ctx.numel(scores.legs),
        inputs=(scores,),
    )
    mapped = ctx.emit(step)  # type: ignore[assignment]
    weight = ctx.runtime(sympy.simplify(mapping.weight))
    return mapped if weight == 1 else scale_value(ctx, mapped, weight)


def masked_scores(
    ctx: Lowering, match: MatchedAttention, scores: Value, blocks: Blocks, within: str, before: int, after: int
) -> Value:
    """The block scores with padded keys at the dtype's lowest number, then the keys outside the
    window (or past the ends) at −inf, as the materialized box fills them."""
    if match.pads and BATCH not in scores.legs:
        scores = materialize(ctx, scores, (BATCH, *scores.legs))  # a padding mask differs per sequence
    for var, legs in match.pads:
        padded = blocks.of(Value(var, (BATCH, *legs)))
        scores = fill(ctx, scores, align(padded, scores.legs, invert=True), "lowest")
    length = ctx.runtime(ctx.size(blocks.key))
    op = BandMask(ctx.leg_sizes[blocks.chunks], blocks.size, blocks.width, before, after, length, like_input(ctx))
    legs = (blocks.chunks, within, blocks.band)
    shown = f"window band: key {1 - before} .. {after - 1} from the query, inside 0 .. N - 1"
    mask = ctx.emit(Step("mask", op, Value(ctx.names.fresh("band"), legs), shown, elementwise=ctx.numel(legs)))
    return fill(ctx, scores, align(mask, scores.legs), "-inf")  # type: ignore[arg-type]


def fill(ctx: Lowering, scores: Value, hidden: Operand, how: str) -> Value:
    masked = Value(ctx.names.fresh("masked"), scores.legs, scores.broadcast)
    return ctx.emit(Step("mask", MaskFill(scores, hidden, how), masked, inputs=(scores,)))  # type: ignore[return-value]


def block_softmax(ctx: Lowering, scores: Value, band: str) -> Value:
    """Softmax over each query's block of keys."""
    legs = (*(leg for leg in scores.legs if leg != band), band)
    permutation = None if legs == scores.legs else tuple(scores.legs.index(leg) for leg in legs)
    entries = ctx.numel(scores.legs)
    step = Step(
        "softmax",
        Softmax(Operand(scores, permutation), 1, ctx.shape([band])),
        Value(ctx.names.fresh("attention"), legs, scores.broadcast),
        f"softmax over {' '.join(show_legs([band]))} (the keys of each block)",
        exps=entries,
        divisions=entries,
        entries=entries,
        flops=sympy.Integer(0),
        inputs=(scores,),
    )
    return ctx.emit(step)  # type: ignore[return-value]


def join_blocks(ctx: Lowering, value: Value, chunks: str, within: str, sequence: str) -> Value:
    """The blocks of queries joined back into the query positions, cut to the length."""
    order = [leg for leg in value.legs if leg != within]
    position = order.index(chunks)
    order.insert(position + 1, within)
    permutation = None if list(value.legs) == order else tuple(value.legs.index(leg) for leg in order)
    legs = tuple(sequence if leg == chunks else leg for leg in order if leg != within)
    op = JoinChunks(Operand(value, permutation), position, ctx.runtime(ctx.size(sequence)))
    step = Step("view", op, Value(ctx.names.fresh("banded"), legs, value.broadcast), "blocks joined", inputs=(value,))
    return ctx.emit(step)  # type: ignore[return-value]
