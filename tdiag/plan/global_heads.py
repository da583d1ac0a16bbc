"""The global-head form of a softmax box: one scaled_dot_product_attention whose key side holds
G global heads side by side and is shared by H local heads, which the queries and the values
carry and the keys do not.

FiSH's local scores are a mixture of global ones before the softmax (fishformer spec §3.3, eq. 10;
A1: the mixing acts on pre-softmax scores): A_h = softmax_m(Σ_k P[k,h] Q[n,k,d] K[m,k,d] / √D).
Per local head this is one attention with query [P[1,h] Q_1, …, P[M,h] Q_M] and key
[K_1, …, K_M], the same key for every local head (spec §7 T14), and the values V[m,h,e] of the
local head: SDPA over the local heads h with q (h, n, (k d)), k (m, (k d)) broadcast over h (a
view, no copy) and v (h, m, e). No N×N tensor is stored. The ordinary match (sdpa_match.py)
refuses this box: its key side lacks the local head h, so h is a query leg there, and the values
must not vary along a query leg.

The same form fuses talking-heads attention (Shazeer et al. 2020): its softmax heads are the
local heads, the key side holds every key head side by side (the logit mixing is on the query
side), and the values carry the weight mixing. It is not the post-softmax mixture
Σ_g c[h,g] softmax_g(...) V_h that issue 22 sketched for FiSH: FiSH mixes before the softmax, and
a post-softmax mixture with an n,m-free coefficient is already an SDPA form of sdpa_match.py (the
coefficient joins the value side).

The fused CPU kernel wants one head width for q, k and v: the narrower side is zero-padded (zero
features change no score and no output; the output is sliced back), and a last axis of stride 1
(q, k, v are copied into their order where the contraction chose another layout). Causal masks
go to `is_causal`; padding masks and additive biases are refused (the ordinary match handles
those). Cost: the padded width, 2·(heads·queries·keys)·width per product; the form competes with
the ordinary SDPA form (strictly cheaper) or else the materialized box (no dearer) under the
objective, under `memory` by the bytes kept for backward.

Where this form does not apply in the FiSH family, and why (the module refuses with a reason):
- noise on the scores (fish eq. 9, gfish eq. 12', mish eq. 11: eps[k n m] or eps[h n m]) varies
  along the queries and the keys; as SDPA's attn_mask it is an N×N tensor per head, and its
  gradient (for sigma and P) is the N×N score gradient, which no fused kernel returns, so SDPA
  runs its math kernel and keeps the attention: no saving. In eval mode (noise mode train) the
  noise is zero, but the plan is one program for both modes.
- a nonlinearity between the global scores and the softmax (GFiSH's ReLU network, eq. 12) needs
  every local score entry: there is no query·key product to fuse.

`recognise` and `emit` take the lowering as an explicit context `ctx` (the Lowering object of
build.py) and use its helpers: score_items, collect, fold_constants, scale_sign, contract,
materialize, arrange, emit, aside. The candidate form forms/global_heads.py wraps them; the
chooser (forms/choice.py) costs it against the other forms."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import sympy

from ..ir import CausalMask, PaddingMask, SoftmaxBox, TensorRef, walk
from .boxes import materialize
from .chooser import cheapest
from .constants import fold_constants
from .context import Leaf
from .contraction import arrange
from .legs import value_leaves
from .program import BATCH, Attention, Expand, Step, Value, causal_kernel_flops, sdpa_causal_block, show_legs
from .regions import collect, contract
from .sdpa_match import scale_sign, score_items


@dataclass(frozen=True)
class GlobalHeads:
    """A softmax box and its consumer matched as the global-head form.

    `query`: the score factors without a key leg (global queries and the mixing P); `key`: those
    with one (global keys); `value`: the consumer's factors along the keys. `heads`: legs all of
    q, k and v carry (the batch); `local`: legs the queries and values carry and the keys do not
    (the local heads h); `sequence`: the query position leg; `latent`: the legs q and k contract
    (global head and head width); `features`: the value legs the result keeps. `scale` is
    positive, `sign` the sign moved into q. `prelude`: the steps and memo entries the match
    built on trial, emitted only if the form is taken."""

    query: tuple[Leaf, ...]
    key: tuple[Leaf, ...]
    value: tuple[Leaf, ...]
    rest: tuple[Leaf, ...]
    heads: tuple[str, ...]
    local: tuple[str, ...]
    sequence: str
    keys: tuple[str, ...]
    latent: tuple[str, ...]
    features: tuple[str, ...]
    scale: sympy.Expr
    sign: int
    causal: bool
    prelude: tuple[list[Step], dict]


def recognise(ctx, box: SoftmaxBox, ren, others: list[Leaf], out: tuple[str, ...]) -> GlobalHeads | str:
    """The global-head form of `box` consumed by `others`, or why it does not apply: the scores
    are one query·key product (times constants) whose query side carries local heads that the
    key side lacks and the value side carries; the only masks are causal between the query leg
    and the key leg."""
    keys = tuple(p for leg in box.normalized for p in ren[leg])
    if not box.is_exp:
        return "not a softmax box"
    if any(k in out for k in keys):
        return "the normalized legs are kept in the result"
    noise = {
        f"{n.name}[{' '.join(n.legs)}]"
        for n in walk(box.content)
        if isinstance(n, TensorRef) and ctx.g.tensors[n.name].kind == "random"
    }
    if noise:
        return (
            f"random {', '.join(sorted(noise))} on the scores (train mode): along the queries and the keys it is, as "
            "SDPA's attn_mask, an N×N tensor per head whose gradient (for the noise scales) is the N×N score gradient, "
            "which no fused kernel returns"
        )
    items = score_items(ctx, box.content, ren, set(keys))
    if items is None:
        return (
            "the scores are not one query·key product: a term varies along the queries and the keys "
            "(noise eps[.. n m] or a nonlinearity of the scores)"
        )
    crosses, biases = items
    if biases or len(crosses) != 1 or crosses[0][0] != "term":
        return "the scores add terms to their query·key product (the ordinary SDPA match takes those)"
    if any(isinstance(m, PaddingMask) for m in box.masks):
        return "a padding mask (the ordinary SDPA match takes those)"
    _, weight, term = crosses[0]
    box_legs = tuple(p for leg in box.legs for p in ren[leg])
    with ctx.aside() as prelude:
        content: list[Leaf] = []
        weight *= collect(ctx, term, ren, content)
        memo = ctx.memo
    content, folded_legs, weight = fold_constants(ctx, content, box_legs, weight)
    if weight == 0 or folded_legs != box_legs:
        return "a constant of the scores is zero or joins two of their legs"
    if any(c.box is not None or (c.value is not None and c.value.broadcast) for c in content):
        return "the scores hold a box or a factor constant along some of their legs"
    split = _split(ctx, content, others, box_legs, keys, out)
    if isinstance(split, str):
        return split
    query_side, key_side, values, rest, heads, local, queries, latent, features = split
    sign = scale_sign(weight * box.scale)
    if sign is None:
        return "the scale of the query·key product is zero or of unknown sign"
    causal = False
    for mask in box.masks:
        if not isinstance(mask, CausalMask):
            return "a mask other than a causal one"
        if tuple(ren[mask.query]) != tuple(queries) or tuple(ren[mask.key]) != keys or len(keys) != 1:
            return "a causal mask that is not between the query leg and the one key leg"
        causal = True
    return GlobalHeads(
        query_side,
        key_side,
        values,
        rest,
        heads,
        local,
        queries[0],
        keys,
        latent,
        features,
        sign * weight * box.scale,
        sign,
        causal,
        (prelude, memo),
    )


def _split(ctx, content: list[Leaf], others: list[Leaf], box_legs, keys, out):
    """The cheapest assignment of the score factors without a key leg to the query or the key
    side, and of the consumer's factors without a key leg to the value side or the rest, such
    that the key side lacks some local heads that the queries and values carry; the reason of
    the first kind of failure otherwise. Cost: the kernel's multiply-adds at the padded width."""
    fixed_key = [c for c in content if set(keys) & set(c.legs)]
    fixed_value = [o for o in others if set(keys) & set(o.legs)]
    undecided = [c for c in content if c not in fixed_key]
    optional = [o for o in others if o not in fixed_value]
    if len(undecided) + len(optional) > 12:
        return "too many factors to split"
    if not fixed_key or not fixed_value:
        return "no key side or no value side"
    needed_out = set(out)
    reason, fits = "no local heads: the key side carries every head (the ordinary SDPA form)", []
    for choice in itertools.product((0, 1), repeat=len(undecided) + len(optional)):
        query_side = tuple(c for c, side in zip(undecided, choice, strict=False) if side == 0)
        key_side = tuple(fixed_key + [c for c, side in zip(undecided, choice, strict=False) if side == 1])
        values = tuple(
            fixed_value + [o for o, side in zip(optional, choice[len(undecided) :], strict=True) if side == 1]
        )
        rest = tuple(o for o in others if o not in values)
        q_legs = {leg for c in query_side for leg in c.legs}
        k_legs = {leg for c in key_side for leg in c.legs}
        v_legs = {leg for c in values for leg in c.legs}
        if not query_side:
            continue
        heads = tuple(leg for leg in (BATCH, *box_legs) if leg in q_legs and leg in k_legs)
        open_legs = [leg for leg in box_legs if leg in q_legs and leg not in k_legs and leg not in keys]
        local = tuple(leg for leg in open_legs if leg in v_legs)
        queries = tuple(leg for leg in open_legs if leg not in v_legs)
        if not local:
            continue
        if len(queries) != 1 or set(box_legs) != (set(heads) - {BATCH}) | set(local) | set(queries) | set(keys):
            reason = "not one query leg besides the local heads and the heads"
            continue
        if any(h not in v_legs for h in heads) or (BATCH in v_legs and BATCH not in heads):
            reason = "the values do not carry every head of the scores"
            continue
        if (v_legs - set(heads) - set(local) - set(keys)) & (q_legs | k_legs):
            reason = "the values share a contracted leg with the query or key side"
            continue
        shared = (q_legs & k_legs) - set(box_legs) - {BATCH}
        latent = tuple(leg for leg in dict.fromkeys(leg for c in key_side for leg in c.legs) if leg in shared)
        needed = needed_out | {leg for o in rest for leg in o.legs}
        features = tuple(
            leg
            for leg in dict.fromkeys(leg for c in values for leg in c.legs)
            if leg not in heads and leg not in local and leg not in keys and leg in needed
        )
        if not latent or not features:
            reason = "no contracted query·key legs or no value features"
            continue
        width = max(ctx.numel_number(latent), ctx.numel_number(features))
        cost = ctx.numel_number([*heads, *local, *queries, *keys]) * width
        fits.append(((query_side, key_side, values, rest, heads, local, queries, latent, features), cost))
    return cheapest(fits) if fits else reason


def _dense(ctx, leaves: list[Leaf], legs: tuple[str, ...], last: int, sign: int, stem: str) -> Value:
    """The contraction of `leaves` over `legs`, copied into that order where the contraction
    laid out its `last` legs (the features) other than trailing in that order: the fused kernel
    needs a last axis of stride 1, which a permuted view of such a layout lacks (it then runs
    the math kernel, which keeps the whole attention)."""
    value = contract(ctx, leaves, legs, sympy.Integer(sign), stem)
    return value if value.legs[-last:] == legs[-last:] else materialize(ctx, value, legs)


def emit(ctx, form: GlobalHeads) -> list[Leaf]:
    """Emit q (heads, local heads, queries, latent), k (heads, keys, latent) broadcast over the
    local heads as a view, v (heads, local heads, keys, features), the padding to one head width
    and the SDPA call; return the region's leaves with its output (heads, local heads, queries,
    features) standing in for the box and its value side."""
    prelude, memo = form.prelude
    for step in prelude:
        ctx.emit(step)
    ctx.memo.update(memo)
    heads, local, keys, latent, features = (
        list(x) for x in (form.heads, form.local, form.keys, form.latent, form.features)
    )
    queries = [form.sequence]
    with ctx.box():
        q = _dense(ctx, list(form.query), tuple(heads + local + queries + latent), len(latent), form.sign, "q")
        k = _dense(ctx, list(form.key), tuple(heads + keys + latent), len(latent), 1, "k")
    shared = ctx.emit(
        Step(
            "expand",
            Expand(k, ctx.shape(local)),
            Value(ctx.names.fresh("k_shared"), (*k.legs, *local)),
            f"k shared by the local heads {' '.join(show_legs(local))} (a view)",
            inputs=(k,),
        )
    )
    v = _dense(ctx, list(form.value), tuple(heads + local + keys + features), len(features), 1, "v")
    query_width, value_width = ctx.numel_number(latent), ctx.numel_number(features)
    pad_value = max(query_width - value_width, 0)
    pad_query_key = max(value_width - query_width, 0)
    width = max(query_width, value_width)
    padded = ctx.numel(latent) if query_width >= value_width else ctx.numel(features)  # width, as a formula
    flat = [[h] for h in heads]
    legs = tuple(heads + local + queries + features)
    attention = Attention(
        arrange(ctx, q, [*flat, local, queries, latent]),
        arrange(ctx, shared, [*flat, local, keys, latent]),
        arrange(ctx, v, [*flat, local, keys, features]),
        ctx.runtime(form.scale),
        causal=form.causal,
        pad_value=pad_value,
        pad_query_key=pad_query_key,
        width=value_width if pad_value else None,
        shape=ctx.shape(legs) if len(local) != 1 or len(features) != 1 else None,
    )
    entries = ctx.numel([*heads, *local, *queries, *keys])
    description = (
        f"scaled_dot_product_attention over {' '.join(show_legs(keys))}, heads {' '.join(show_legs([*heads, *local]))}:"
        f" global-head form, k over {' '.join(show_legs(latent))} shared by the local heads"
        + (f", v padded to {width} features" if pad_value else "")
        + (f", q and k padded to {width} features" if pad_query_key else "")
        + (", is_causal" if form.causal else "")
    )
    value = ctx.emit(
        Step(
            "sdpa",
            attention,
            Value(ctx.names.fresh("attended"), legs),
            description,
            tuple(keys),
            4 * entries * padded,
            exps=entries,
            divisions=entries,
            entries=entries,
            inputs=(q, shared, v),
            paper=entries * (2 * ctx.numel(latent) - 1) + ctx.numel(legs) * (2 * ctx.numel(keys) - 1),
            score_flops=2 * entries * padded,
            score_paper=entries * (2 * ctx.numel(latent) - 1),
            kernel_flops=causal_kernel_flops(4 * entries * padded, ctx.numel(keys), sdpa_causal_block(ctx.numel(keys)))
            if form.causal
            else None,
        )
    )
    if not ctx.trialing:
        ctx.lowered.append(
            f"softmax box over {' '.join(show_legs(keys))} lowered to scaled_dot_product_attention (global-head "
            f"form: k over {' '.join(show_legs(latent))} shared by the local heads {' '.join(show_legs(local))}, "
            "each operand dense with its features last, for the fused kernel)"
        )
    return [*form.rest, *value_leaves(value)]
