"""Softmax boxes fused with their consumer as scaled_dot_product_attention: q, k, v laid out
(heads, positions, features), key biases as one more feature (MGK P17), causal masks as
is_causal or a boolean attn_mask, padding masks and biases along the queries as a float
attn_mask, query heads that share key heads (MQA, GQA) grouped with enable_gqa or folded into
the query rows. Whether a box is fused, and how, is decided by the forms (forms/sdpa.py,
forms/sdpa_grouped.py); these functions emit the chosen form through the lowering, passed as
`ctx`."""

from __future__ import annotations

import dataclasses

import sympy

from ..ir import (
    SoftmaxBox,
)
from .boxes import expand_broadcast, materialize
from .combine import as_missing_legs, combine
from .context import Leaf, Lowering
from .contraction import arrange, group_size, scale_value
from .distance import squared_norm
from .legs import value_leaves
from .program import (
    BATCH,
    Attention,
    Concat,
    Expand,
    LiveRows,
    Operand,
    ScoreMask,
    Step,
    Value,
    VisibleMask,
    align,
    causal_kernel_flops,
    sdpa_causal_block,
    show_legs,
)
from .regions import contract
from .sdpa_match import MatchedAttention


def fuse(ctx: Lowering, box: SoftmaxBox, ren, others: list[Leaf], fused: MatchedAttention) -> list[Leaf]:
    """Emit q, k, v and the SDPA call; return the region's leaves with the attention output
    standing in for the box and its value side."""
    heads, queries, keys, latent, features = (fused.heads, fused.queries, fused.keys, fused.latent, fused.features)
    emit_prelude(ctx, fused)
    with ctx.box():
        q, k, latent = query_and_key(ctx, fused)
        bias = key_bias(ctx, fused) if fused.biases else None
        score_bias = [additive_bias(ctx, fused, weight, e) for _, weight, e in fused.score_biases]
        sink = ctx.lower(box.sink, ren, None) if box.sink is not None else None
    v = contract(ctx, fused.value, tuple(heads + keys + features), sympy.Integer(1), "v")
    v = expand_broadcast(ctx, v, set(keys))  # values tied across a key leg (MGK's r, P17)
    # a lone batch leg stays 3-D: SDPA then runs its math kernel (bmm, softmax), which at one
    # wide head (single-head, F features) is faster on CPU than the fused kernel of a unit
    # head axis (1.07-2.3x slower measured at N = F = 256, batch 8)
    grouped = fused.grouped
    if grouped:  # query heads over key heads, head-major: query head i reads key head i // G
        sequence = fused.sequence
        query_heads = [leg for leg in queries if leg != sequence]
        lead = [[BATCH]] if BATCH in heads else []
        rest = [leg for leg in heads if leg != BATCH]
        q_groups = [*lead, rest + query_heads, [sequence]]
        k_groups = [*lead, rest]
        legs = tuple([*(g[0] for g in lead), *rest, *query_heads, sequence, *features])
        score_groups = [*lead, rest + query_heads, [sequence], keys]
    else:
        flat = [[h] for h in heads]
        q_groups, k_groups = [*flat, queries], flat
        legs = tuple(heads + queries + features)
        score_groups = [*flat, queries, keys]
    bias_operand, pad_value, pad_query_key, width = None, 0, 0, None
    if bias is not None:
        bias_operand = arrange(ctx, bias, [*k_groups, keys])
    if fused.widened or sink is not None or fused.padded:
        # the fused kernels want one head width for q, k and v: zero features change nothing
        query_width = ctx.numel_number(latent) + (1 if bias is not None else 0) + (1 if sink is not None else 0)
        value_width = ctx.numel_number(features)
        if value_width < query_width:
            pad_value, width = query_width - value_width, value_width
        elif value_width > query_width:
            pad_query_key = value_width - query_width
    causal, visible, live, future = False, None, None, None
    if fused.pads or score_bias:
        padded, hidden_future = hidden_operands(ctx, fused, score_groups)
        visible = score_mask(ctx, padded, hidden_future, score_groups, score_bias, q)
    if fused.pads:
        if sink is None:  # beside a sink a row whose keys are all hidden is 0, as the kernel gives it
            live = live_rows(ctx, [*padded, *([hidden_future] if hidden_future is not None else [])], score_groups)
            future = seen_operand(ctx, fused, score_groups, hidden_future)
    elif fused.masks and fused.window is None and (keys == [fused.masks[0][1]] or fused.repeated):
        causal = True
    elif fused.masks and visible is None:  # a score bias's mask holds the band already (-inf outside it)
        visible = causal_attention_mask(ctx, fused, fused.masks[0][0], keys)
    repeat = ctx.numel(keys[1:]) if fused.repeated else sympy.Integer(1)
    name = ctx.names.fresh("attended")
    regrouped = grouped and (len(q_groups[len(lead)]) != 1 or len(features) != 1)
    attention = Attention(
        arrange(ctx, q, [*q_groups, latent]),
        arrange(ctx, k, [*k_groups, keys, latent]),
        arrange(ctx, v, [*k_groups, keys, features]),
        ctx.runtime(fused.scale),
        causal=causal,
        mask=visible,
        bias=bias_operand,
        pad_value=pad_value,
        pad_query_key=pad_query_key,
        width=width,
        shape=ctx.shape(legs) if (len(queries) != 1 and not grouped) or len(features) != 1 or regrouped else None,
        grouped=grouped,
        group=ctx.runtime(ctx.numel(query_heads)) if grouped else sympy.Integer(1),
        live=live,
        future=future,
        repeat=ctx.runtime(repeat),
        sink=score_operand(ctx, sink, q_groups) if sink is not None else None,
    )
    # a sink is one more key per row (the sink key) and one more latent feature
    entries = ctx.numel([*heads, *queries]) * (ctx.numel(keys) + (1 if sink is not None else 0))
    latent_size = ctx.numel(latent) + (1 if bias is not None else 0) + (1 if sink is not None else 0)
    # the padded form's kernel multiplies the zero features of q and k (or v) too; the single
    # feature a key bias or a sink adds, and the pad of concatenated sides, stay uncounted
    padding = pad_query_key + pad_value if fused.padded else 0
    flops = 2 * entries * (latent_size + ctx.numel(features) + padding)
    description = f"scaled_dot_product_attention over {' '.join(show_legs(keys))}, heads {' '.join(show_legs(heads))}"
    notes = []
    if len(fused.sides) > 1:
        parts = " | ".join(" ".join(show_legs(s[2])) for s in fused.sides)
        notes.append(
            f"{len(fused.sides)} query·key products over {parts} as one: q and k concatenated along the features"
        )
    if grouped:
        notes.append(f"query heads {' '.join(show_legs(query_heads))} grouped over the key heads (enable_gqa)")
    elif len(queries) > 1:
        notes.append(f"query legs {' '.join(show_legs(queries))} folded into the query rows")
    if bias is not None:
        notes.append("key bias as one more feature (MGK P17)")
    if sink is not None:
        notes.append("the sink as one more key whose logit is the sink" + (", one query put first" if causal else ""))
    if score_bias:
        notes.append("additive bias as a float attn_mask")
    if fused.pads:
        notes.append("padding mask as attn_mask")
    if fused.repeated:
        notes.append(f"each query repeated over the {' '.join(show_legs(keys[1:]))} keys of a position, is_causal")
    elif causal:
        notes.append("is_causal")
    elif fused.window is not None:
        notes.append("window as attn_mask")
    elif fused.masks:
        notes.append("causal mask as attn_mask")
    description += "".join(", " + note for note in notes)
    value = ctx.emit(
        Step(
            "sdpa",
            attention,
            Value(name, legs),
            description,
            tuple(keys),
            flops,
            exps=entries,
            divisions=entries,
            entries=entries,
            inputs=tuple(x for x in (q, k, v, bias, visible, live, sink) if x is not None),
            paper=entries * (2 * latent_size - 1) + ctx.numel(legs) * (2 * ctx.numel(keys) - 1),
            score_flops=2 * entries * latent_size,
            score_paper=entries * (2 * latent_size - 1),
            kernel_flops=causal_kernel_flops(flops * repeat, ctx.numel(keys), sdpa_causal_block(ctx.numel(keys)))
            if causal and visible is None  # with an attn_mask, the triangle is in the mask: no skipping
            else None,
            # a key bias column holds absolute values (FoX's running sum of log-gates grows with the
            # position): in bfloat16 its 8 significant bits lose the differences between nearby
            # keys (22% error at N = 512), so the call runs in float32 under autocast
            wide=bias is not None,
        )
    )
    if not ctx.trialing:
        notes = ["with the key bias as a feature (MGK P17)" if "P17" in note else note for note in notes]
        how = f" ({'; '.join(notes)})" if notes else ""
        ctx.lowered.append(f"softmax box over {' '.join(show_legs(keys))} lowered to scaled_dot_product_attention{how}")
    rest = [o for o in others if o not in fused.value]
    return [*rest, *value_leaves(value)]  # type: ignore[arg-type]


def emit_prelude(ctx: Lowering, fused: MatchedAttention) -> None:
    """The content's computed factors, which the match built on trial (kept once fused)."""
    prelude, memo = fused.prelude
    for step in prelude:
        ctx.emit(step)
    ctx.memo.update(memo)


def query_and_key(ctx: Lowering, fused: MatchedAttention) -> tuple[Value, Value, list[str]]:
    """q over (heads, queries, latent) and k over (heads, keys, latent), and the latent legs:
    one query·key product, or the concatenated sides of several."""
    if len(fused.sides) > 1:
        return concatenated_sides(ctx, fused)
    heads, latent = fused.heads, fused.latent
    sign = sympy.Integer(fused.query_sign)
    q = contract(ctx, fused.query, tuple(heads + fused.queries + latent), sign, "q")
    k = contract(ctx, fused.key, tuple(heads + fused.keys + latent), sympy.Integer(1), "k")
    return q, k, latent


def concatenated_sides(ctx: Lowering, fused: MatchedAttention) -> tuple[Value, Value, list[str]]:
    """Σ_i w_i q_i·k_i over contracted legs c_i (one product per term of the scores) as one
    product [w_1 q_1, w_2 q_2, ...]·[k_1, k_2, ...]: each side laid out (heads, positions,
    c_i) and concatenated along a feature leg of size Σ_i |c_i|, the first weight being the
    SDPA scale. Returns q, k and the one latent leg."""
    heads, queries, keys = fused.heads, fused.queries, fused.keys
    sides = fused.sides
    width = sympy.Add(*(ctx.numel(latent) for _, _, latent, _, _ in sides))
    feature = ctx.new_leg("joined", width)
    result = []
    for position, stem in ((queries, "q"), (keys, "k")):
        # laid out (batch, positions, heads, features) as a projection is: SDPA's CPU kernel
        # lays its output out like q, and the output projection then reads it as a view
        order = [leg for leg in heads if leg == BATCH] + position + [leg for leg in heads if leg != BATCH]
        parts = []
        for query_side, key_side, latent, ratio, broadcast in sides:
            side, weight = (query_side, ratio) if stem == "q" else (key_side, sympy.Integer(1))
            own = [leg for leg in heads if stem == "q" or leg not in broadcast]
            value = contract(ctx, side, tuple(own + position + latent), weight, stem)
            if len(own) < len(heads):
                value = shared_key(ctx, value, [leg for leg in heads if leg not in own])
            parts.append(arrange(ctx, value, [*([leg] for leg in order), latent]))
        name = ctx.names.fresh(f"{stem}_joined")
        legs = tuple([*order, feature])
        shown = " | ".join(" ".join(show_legs(s[2])) for s in sides)
        step = Step("concat", Concat(tuple(parts)), Value(name, legs), f"{stem} sides over {shown} concatenated")
        result.append(ctx.emit(step))
    return result[0], result[1], [feature]  # type: ignore[return-value]


def shared_key(ctx: Lowering, k: Value, heads: list[str]) -> Value:
    """A key side that no head of `heads` changes (MLA's one RoPE key, DeepSeek-V2 eq. 15)
    broadcast along them, a view that the concatenation copies."""
    return ctx.emit(
        Step(
            "expand",
            Expand(k, ctx.shape(heads)),
            Value(ctx.names.fresh("k_shared"), (*k.legs, *heads)),
            f"k shared by the heads {' '.join(show_legs(heads))} (a view)",
            inputs=(k,),
        )
    )  # type: ignore[return-value]


def additive_bias(ctx: Lowering, fused: MatchedAttention, weight: sympy.Expr, e) -> Value:
    """An additive term of the scores that varies along the queries (a relative or absolute
    position bias), times its weight and the box's scale: SDPA adds attn_mask after scaling."""
    value = as_missing_legs(ctx.lower(e, fused.ren))
    factor = sympy.simplify(weight * fused.box_scale)
    return scale_value(ctx, value, factor) if factor != 1 else value


def score_mask(
    ctx: Lowering,
    hidden: list[Operand],
    future: Operand | None,
    groups: list[list[str]],
    biases: list[Value],
    like: Value,
) -> Value:
    """The float attn_mask of the padding masks `hidden`, the causal triangle `future` that
    is_causal cannot say (with padding or a bias, SDPA takes one or the other) and additive
    biases, each read over SDPA's (batch, heads, queries, keys) axes as `groups`, broadcast
    where it lacks a group."""
    bias = [score_operand(ctx, b, groups) for b in biases]
    name = ctx.names.fresh("score_mask")
    read = (*hidden, *bias, *([future] if future is not None else []))
    legs = tuple(dict.fromkeys(leg for g in groups for leg in g if any(leg in o.value.legs for o in read)))
    entries = ctx.numel(legs)
    shown = (["lowest where padded"] if hidden else []) + (["the additive bias"] if bias else [])
    step = Step(
        "mask",
        ScoreMask(tuple(hidden), tuple(bias), like, future),
        Value(name, legs),
        "SDPA's float attn_mask: " + ", ".join(shown + (["-inf in the future"] if future is not None else [])),
        elementwise=entries * len(read),
        inputs=tuple(b.value for b in bias),
    )
    ctx.emit(step)
    return step.out  # type: ignore[return-value]


def hidden_operands(
    ctx: Lowering, fused: MatchedAttention, groups: list[list[str]]
) -> tuple[list[Operand], Operand | None]:
    """The boolean operands that are True where a score is hidden, read over SDPA's axes
    `groups` once per box: each padding mask inverted, and the causal triangle (True where the
    key is in the query's future) or None without a causal mask."""
    padded = [score_operand(ctx, Value(var, (BATCH, *legs)), groups, invert=True) for var, legs in fused.pads]
    future = None
    for query, key in fused.masks[:1]:
        future = score_operand(ctx, Value(hidden_positions(ctx, fused, query, key), (query, key)), groups)
    return padded, future


def seen_operand(
    ctx: Lowering, fused: MatchedAttention, groups: list[list[str]], future: Operand | None
) -> Operand | None:
    """The causal triangle for the mean of the values a row may see: a [queries, keys] matrix
    where the rows and keys are one leg each (matmul then keeps no per-head copy of it), else
    `future`, the triangle read over all of `groups`."""
    for query, key in fused.masks[:1]:
        if groups[-2:] == [[query], [key]]:
            return align(Value(hidden_positions(ctx, fused, query, key), (query, key)), (query, key))
    return future


def live_rows(ctx: Lowering, hidden: list[Operand], groups: list[list[str]]) -> Value:
    """The rows of the scores that keep a visible key (LiveRows) where the boolean operands
    `hidden` hide scores, over every group but the keys, where a hidden operand varies."""
    rows = groups[:-1]
    legs = tuple(dict.fromkeys(leg for g in rows for leg in g if any(leg in h.value.legs for h in hidden)))
    step = Step(
        "mask",
        LiveRows(tuple(hidden)),
        Value(ctx.names.fresh("live"), legs),
        "rows with a visible key (a row whose keys are all hidden averages the values it may see)",
        elementwise=ctx.numel([leg for g in groups for leg in g if any(leg in h.value.legs for h in hidden)])
        * len(hidden),
        inputs=(),
    )
    ctx.emit(step)
    return step.out  # type: ignore[return-value]


def score_operand(ctx: Lowering, value: Value, groups: list[list[str]], invert: bool = False) -> Operand:
    """`value` read over the SDPA axes `groups`: a group it has entirely stays, one it lacks
    is a unit axis; a group it has in part is filled in by a copy first."""
    partial = [g for g in groups if set(g) & set(value.legs) and not set(g) <= set(value.legs)]
    if partial:
        value = materialize(ctx, value, tuple(leg for g in groups for leg in g if leg in value.legs or g in partial))
    read = arrange(ctx, value, [g if set(g) <= set(value.legs) else [] for g in groups])
    return dataclasses.replace(read, invert=invert)


def key_bias(ctx: Lowering, fused: MatchedAttention) -> Value:
    """Σ of the bias terms (each along heads and keys only) divided by the SDPA scale, so that
    [q, 1]·[k, bias] = q·k + bias/scale: the augmented keys of MGK P17."""
    heads, keys = fused.heads, fused.keys
    parts = []
    for kind, weight, e in fused.biases:
        if kind == "norm":
            key_value, over = fused.key_norm
            kept = tuple(leg for leg in key_value.legs if leg not in over)
            value = squared_norm(ctx, key_value, kept)
        else:
            value = ctx.lower(e, fused.ren)
        factor = sympy.simplify(weight * fused.box_scale / fused.scale)
        if factor != 1:
            value = scale_value(ctx, value, factor)
        parts.append((1, as_missing_legs(value)))
    bias = combine(ctx, "bias", parts, tuple(heads + keys), "bias") if len(parts) > 1 else parts[0][1]
    missing = [leg for leg in (*heads, *keys) if leg not in bias.legs]
    if not missing:
        return bias
    return materialize(ctx, bias, tuple(leg for leg in (*heads, *keys)))


def hidden_positions(ctx: Lowering, fused: MatchedAttention, query: str, key: str) -> str:
    """The boolean [query, key] matrix, True where the box's causal mask or window hides a key:
    the causal triangle, or the window's band (built at entry, as the triangle is)."""
    if fused.window is None:
        return ctx.causal_mask(query, key)
    return ctx.window_mask(query, key, *fused.window)


def causal_attention_mask(ctx: Lowering, fused: MatchedAttention, query: str, keys: list[str]) -> Value:
    """The boolean SDPA mask (True = attend) of a causal mask or window, over one key leg or one
    of several flattened key legs: key (m, r) is visible from n when m ≤ n (in the window)."""
    mask_query, mask_key = fused.masks[0]
    causal = Value(hidden_positions(ctx, fused, mask_query, mask_key), (mask_query, mask_key))
    aligned = align(causal, (query, *keys), invert=True)
    visible = Value(ctx.names.fresh("visible"), (query, *keys))
    op = VisibleMask(aligned, ctx.shape([query, *keys]), group_size(ctx, [query]))
    ctx.emit(Step("mask", op, visible, inputs=()))
    return visible
