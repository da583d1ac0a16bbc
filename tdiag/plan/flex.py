"""Softmax boxes fused with their consumer as torch's FlexAttention (`attention="flex"`): the
matched box of sdpa_match (a per-head query·key product plus terms of the scores) becomes one
`flex_attention` call whose score_mod computes each additive term at (batch, head, query index,
key index) inside the kernel, and whose block mask says the causal and padding masks.

Guarantees: a term of the scores that varies along both the queries and the keys is written as
score_mod arithmetic over tensors that vary along at most one of them (ALiBi's slope[h] times
|q − kv|, a relative bias table read at clamp(kv − q, −C, C) + C), so no bias over (heads,
queries, keys) is built unless the design stores one (a sliced absolute table is read in
place). Taken wherever the pattern allows when the plan is asked for FlexAttention (the form in
forms/flex.py); where it does not, the plan says why and another form is chosen. These functions
emit it through the lowering, passed as `ctx`."""

from __future__ import annotations

from functools import reduce

import sympy

from ..ir import (
    Contraction,
    ElementwiseMap,
    Expr,
    Gather,
    Position,
    PositionIndex,
    Quotient,
    Scalar,
    SoftmaxBox,
    SumNode,
)
from .boxes import expand_broadcast
from .combine import as_missing_legs
from .context import Leaf, Lowering
from .contraction import arrange, group_size
from .distance import squared_norm
from .legs import value_leaves
from .positions import like_input, rename_position
from .program import (
    BATCH,
    FLEX_BLOCK,
    BlockMask,
    FlexAttention,
    ScoreArgument,
    ScoreArith,
    ScoreIndex,
    ScoreMap,
    ScoreNumber,
    ScoreRead,
    ScoreTerm,
    Step,
    Value,
    causal_kernel_flops,
    score_reads,
    show_legs,
    window_kernel_flops,
)
from .regions import contract
from .sdpa import emit_prelude, hidden_operands, live_rows, query_and_key, seen_operand
from .sdpa_match import MatchedAttention

ATTENTION_KERNELS = ("sdpa", "flex")  # what a fusable softmax box is lowered to


def flex_roles(ctx: Lowering, fused: MatchedAttention) -> dict[str, int]:
    """The plan legs FlexAttention indexes: 0 batch, 1 head (one head leg, not grouped),
    2 query, 3 key."""
    heads = fused.heads
    roles = {fused.sequence: 2, fused.keys[0]: 3}
    if BATCH in heads:
        roles[BATCH] = 0
    rest = [leg for leg in heads if leg != BATCH]
    if len(rest) == 1 and not fused.grouped:
        roles[rest[0]] = 1
    return roles


def flex_refusal(ctx: Lowering, fused: MatchedAttention) -> str | None:
    """Why the matched box cannot be one flex_attention call, or None."""
    if len(fused.keys) != 1:
        keys = " ".join(show_legs(fused.keys))
        return f"several key legs {keys} (the kernel has one key index)"
    if len(fused.queries) != 1 and not fused.grouped:
        return "query legs folded into the query rows (the kernel's query index would not be the position)"
    roles = flex_roles(ctx, fused)
    ren = fused.ren
    terms = [e for kind, _, e in (*fused.biases, *fused.score_biases) if kind != "norm"]
    terms += [e for _, e in fused.score_map.outer] if fused.score_map is not None else []
    legs = [leg for e in terms for leg in e.legs]
    for leg in legs:
        if len(ren[leg]) != 1:
            return f"a term of the scores along {leg}, which the plan splits into pieces"
    legs = [ren[leg][0] for leg in legs] + [leg for _, pad in fused.pads for leg in pad]
    if any(kind == "norm" for kind, _, _ in fused.biases):
        key_value, over = fused.key_norm
        legs += [leg for leg in key_value.legs if leg not in over]
    for leg in legs:
        if leg not in roles:
            return (
                f"a term or mask of the scores along {' '.join(show_legs([leg]))}, which is not the batch, "
                "the one head leg, the query or the key"
            )
    return None


def fuse_flex(ctx: Lowering, box: SoftmaxBox, ren, others: list[Leaf], fused: MatchedAttention) -> list[Leaf]:
    """Emit q, k, v, the block mask and the flex_attention call; return the region's leaves
    with the attention output standing in for the box and its value side."""
    heads, queries, keys, latent, features = (fused.heads, fused.queries, fused.keys, fused.latent, fused.features)
    emit_prelude(ctx, fused)
    with ctx.box():
        q, k, latent = query_and_key(ctx, fused)
        arguments = tuple(ctx.names.fresh(stem) for stem in ("score", "b", "h", "q_idx", "kv_idx"))
        roles = {leg: arguments[1 + r] for leg, r in flex_roles(ctx, fused).items()}
        score = score_mod(ctx, fused, roles)
    v = contract(ctx, fused.value, tuple(heads + keys + features), sympy.Integer(1), "v")
    v = expand_broadcast(ctx, v, set(keys))
    grouped = fused.grouped
    sequence = fused.sequence
    batch = [BATCH] if BATCH in heads else []
    rest = [leg for leg in heads if leg != BATCH]
    query_heads = [*rest, *(leg for leg in queries if leg != sequence)] if grouped else rest
    legs = tuple([*batch, *query_heads, sequence, *features])
    pads = fused.pads
    block_mask = causal_block_mask(ctx, fused) if fused.masks and not pads else None
    visible = tuple(
        ScoreRead(Value(var, (BATCH, *legs)), tuple(Position("leg", name=roles[leg]) for leg in (BATCH, *legs)))
        for var, legs in pads
    )
    tensors = tuple(dict.fromkeys([*(r.value for r in score_reads(score)), *(r.value for r in visible)]))
    score_groups = [batch, query_heads, [sequence], keys]
    live = future = None
    if pads:
        padded, hidden_future = hidden_operands(ctx, fused, score_groups)
        live = live_rows(ctx, [*padded, *([hidden_future] if hidden_future is not None else [])], score_groups)
        future = seen_operand(ctx, fused, score_groups, hidden_future)
    group = ctx.runtime(ctx.numel([leg for leg in queries if leg != sequence])) if grouped else sympy.Integer(1)
    attention = FlexAttention(
        arrange(ctx, q, [batch, query_heads, [sequence], latent]),
        arrange(ctx, k, [batch, rest, keys, latent]),
        arrange(ctx, v, [batch, rest, keys, features]),
        ctx.runtime(fused.scale),
        score,
        block_mask,
        arguments,  # type: ignore[arg-type]
        tensors,
        grouped,
        ctx.shape(legs) if not batch or len(query_heads) != 1 or len(features) != 1 else None,
        visible,
        bool(fused.masks) and bool(pads),
        group,
        live,
        future,
        fused.window,
        fused.score_map is not None,
    )
    entries = ctx.numel([*heads, *queries, *keys])
    latent_size = ctx.numel(latent)
    flops = 2 * entries * (latent_size + ctx.numel(features))
    notes = []
    if fused.score_map is not None:
        notes.append(f"score_mod applies {fused.score_map.name} to the scores per entry")
    elif score is not None:
        read = ", ".join(f"{r.value.var}[{' '.join(show_legs(r.value.legs))}]" for r in score_reads(score))
        notes.append(f"score_mod adds the terms of the scores per entry{' from ' + read if read else ''}")
    if len(fused.sides) > 1:
        notes.append(f"{len(fused.sides)} query·key products as one: q and k concatenated along the features")
    if grouped:
        notes.append("query heads grouped over the key heads (enable_gqa)")
    position_mask = "causal mask" if fused.window is None else "window"
    if block_mask is not None:
        notes.append(f"{position_mask} as a block mask")
    if pads:
        masks = (
            ("padding and causal masks" if fused.window is None else "padding mask and window")
            if fused.masks
            else "padding mask"
        )
        notes.append(f"{masks} in score_mod (a row whose keys are all masked averages the values)")
    how = f" ({'; '.join(notes)})" if notes else ""
    description = f"flex_attention over {' '.join(show_legs(keys))}, heads {' '.join(show_legs(heads))}{how}"
    value = ctx.emit(
        Step(
            "flex",
            attention,
            Value(ctx.names.fresh("attended"), legs),
            description,
            tuple(keys),
            flops,
            exps=entries,
            divisions=entries,
            entries=entries,
            elementwise=entries * _arithmetic(score),
            inputs=tuple(x for x in (q, k, v, *tensors, block_mask) if x is not None),
            paper=entries * (2 * latent_size - 1) + ctx.numel(legs) * (2 * ctx.numel(keys) - 1),
            score_flops=2 * entries * latent_size,
            score_paper=entries * (2 * latent_size - 1),
            kernel_flops=_kernel_flops(ctx, fused, flops) if block_mask is not None else None,
        )
    )
    if not ctx.trialing:
        ctx.lowered.append(f"softmax box over {' '.join(show_legs(keys))} lowered to flex_attention{how}")
    rest_leaves = [o for o in others if o not in fused.value]
    return [*rest_leaves, *value_leaves(value)]  # type: ignore[arg-type]


def score_mod(ctx: Lowering, fused: MatchedAttention, roles: dict[str, str]) -> ScoreTerm | None:
    """Σ weight · term over the additive terms of the scores (the key biases of MGK P17 and
    the position biases alike), each times the box's scale: score_mod adds after scaling."""
    positions = frozenset((fused.sequence, fused.keys[0]))  # what a score_mod term may span
    terms = []
    for kind, weight, e in (*fused.biases, *fused.score_biases):
        if kind == "norm":
            key_value, over = fused.key_norm
            kept = tuple(leg for leg in key_value.legs if leg not in over)
            term = score_read(ctx, squared_norm(ctx, key_value, kept), roles)
        else:
            term = score_term(ctx, e, fused.ren, roles, positions)
        factor = ctx.runtime(sympy.simplify(weight * fused.box_scale))
        terms.append(term if factor == 1 else ScoreArith("*", ScoreNumber(factor), term))
    if fused.score_map is not None:
        return mapped_scores(ctx, fused, roles, positions, terms)
    return reduce(lambda a, b: ScoreArith("+", a, b), terms) if terms else None


def mapped_scores(
    ctx: Lowering, fused: MatchedAttention, roles: dict[str, str], positions: frozenset[str], inner: list[ScoreTerm]
) -> ScoreTerm:
    """score_mod's whole value for a map of the scores: weight · map(score + the inner terms)
    plus the outer terms, each times its weight (score_maps.py)."""
    mapping = fused.score_map
    assert mapping is not None
    argument = reduce(lambda a, b: ScoreArith("+", a, b), [ScoreArgument(), *inner])
    params = tuple(ctx.runtime(p) for p in mapping.params)
    total: ScoreTerm = ScoreMap(mapping.name, argument, params)
    weight = ctx.runtime(sympy.simplify(mapping.weight))
    if weight != 1:
        total = ScoreArith("*", ScoreNumber(weight), total)
    for factor, e in mapping.outer:
        term = score_term(ctx, e, fused.ren, roles, positions)
        factor = ctx.runtime(sympy.simplify(factor))
        total = ScoreArith("+", total, term if factor == 1 else ScoreArith("*", ScoreNumber(factor), term))
    return total


def score_term(ctx: Lowering, e: Expr, ren, roles: dict[str, str], positions: frozenset[str]) -> ScoreTerm:
    """`e` as score_mod arithmetic: what varies along both the query and the key is taken
    apart into sums, products, quotients, maps, positions and gathers; everything else is
    lowered as usual to a tensor the kernel reads at its indices."""
    if isinstance(e, Scalar):
        return ScoreNumber(ctx.runtime(e.value))
    if isinstance(e, PositionIndex):
        return ScoreIndex(Position("leg", name=roles[ren[e.leg][0]]))
    legs = {p for leg in e.legs for p in ren[leg]}
    if not positions <= legs:  # along at most one of the query and the key
        return score_read(ctx, ctx.lower(e, ren), roles)
    if isinstance(e, Contraction) and not e.summed:
        factors = [score_term(ctx, f, ren, roles, positions) for f in e.factors]
        coefficient = ctx.runtime(e.coefficient)
        if coefficient != 1:
            factors.insert(0, ScoreNumber(coefficient))
        return reduce(lambda a, b: ScoreArith("*", a, b), factors)
    if isinstance(e, SumNode):
        total: ScoreTerm | None = None
        for term, sign in zip(e.terms, e.signs, strict=True):
            part = score_term(ctx, term, ren, roles, positions)
            if total is None:
                total = part if sign > 0 else ScoreArith("*", ScoreNumber(sympy.Integer(-1)), part)
            else:
                total = ScoreArith("+" if sign > 0 else "-", total, part)
        return total  # type: ignore[return-value]
    if isinstance(e, Quotient):
        one = ScoreNumber(sympy.Integer(1))
        numerator = score_term(ctx, e.numerator, ren, roles, positions) if e.numerator is not None else one
        return ScoreArith("/", numerator, score_term(ctx, e.denominator, ren, roles, positions))  # type: ignore[arg-type]
    if isinstance(e, ElementwiseMap):
        params = tuple(ctx.runtime(p) for p in e.params)
        return ScoreMap(e.name, score_term(ctx, e.operand, ren, roles, positions), params)  # type: ignore[arg-type]
    if isinstance(e, Gather):
        return score_gather(ctx, e, ren, roles)
    return score_read(ctx, ctx.lower(e, ren), roles)


def score_gather(ctx: Lowering, e: Gather, ren, roles: dict[str, str]) -> ScoreRead:
    """A table read along its axis at a position of the query and key indices, in the kernel:
    one read per entry, no table over (query, key) built."""
    table = as_missing_legs(ctx.lower(e.source, ren))  # type: ignore[arg-type]
    axis = ren[e.axis][0]
    names = {leg: roles[ren[leg][0]] for leg in e.position.legs()}  # type: ignore[union-attr]
    position = rename_position(e.position, names, ctx.runtime)  # type: ignore[arg-type]
    index = tuple(position if leg == axis else Position("leg", name=roles[leg]) for leg in table.legs)
    return ScoreRead(table, index)


def score_read(ctx: Lowering, value: Value, roles: dict[str, str]) -> ScoreRead:
    value = as_missing_legs(value)
    return ScoreRead(value, tuple(Position("leg", name=roles[leg]) for leg in value.legs))


def causal_block_mask(ctx: Lowering, fused: MatchedAttention) -> Value:
    """The block mask of the box's causal mask, made once per call: every query sees its first
    key, so no row is empty and skipping the blocks above the diagonal changes nothing."""
    arguments = tuple(ctx.names.fresh(stem) for stem in ("b", "h", "q_idx", "kv_idx"))
    sequence, key = fused.sequence, fused.keys[0]
    op = BlockMask(group_size(ctx, [sequence]), group_size(ctx, [key]), arguments, like_input(ctx), fused.window)  # type: ignore[arg-type]
    out = Value(ctx.names.fresh("block_mask"), ())
    what = "causal" if fused.window is None else "window"
    ctx.emit(Step("mask", op, out, f"FlexAttention block mask: {what}", inputs=()))
    return out


def _kernel_flops(ctx: Lowering, fused: MatchedAttention, flops: sympy.Expr) -> sympy.Expr:
    """The FLOPs of the blocks the block mask lets the kernel visit: below the diagonal, or
    along a window's band."""
    length, block = ctx.numel(fused.keys), sympy.Integer(FLEX_BLOCK)
    if fused.window is None:
        return causal_kernel_flops(flops, length, block)
    return window_kernel_flops(flops, length, block, *fused.window)


def _arithmetic(term: ScoreTerm | None) -> int:
    """The elementwise operations per entry of a score_mod term (a read counts one)."""
    if term is None:
        return 0
    if isinstance(term, ScoreMap):
        return 1 + _arithmetic(term.x)
    if isinstance(term, ScoreArith):
        return 1 + _arithmetic(term.left) + _arithmetic(term.right)
    return 1 if isinstance(term, ScoreRead) else 0
