"""Recognizing a fusable attention: a softmax box whose content is a per-head dot product (or
squared distance) of a query side and a key side plus key biases, consumed by a value side.
Refuses (returns None) wherever the pattern does not hold."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import sympy

from ..ir import (
    ONE,
    POSITION_MASKS,
    CausalMask,
    Contraction,
    Expr,
    PaddingMask,
    Scalar,
    SoftmaxBox,
    SquaredDistance,
    SumNode,
    TensorRef,
    WindowMask,
    walk,
)
from .chooser import cheapest
from .combine import owns_parameter
from .constants import fold_constants
from .context import Leaf, Lowering
from .legs import is_scaling
from .program import (
    BATCH,
    Step,
    Value,
)
from .regions import collect, is_batched, with_fresh_legs

# a term of the scores: its kind ("term", or "norm" for the ‖k‖² of a squared distance), its
# weight and its expression (None for "norm")
ScoreTerm = tuple[str, sympy.Expr, Expr | None]


@dataclass(frozen=True)
class ScoreMapping:
    """A map of the scores (score_maps.py): the box's content is `weight` · name(scores, *params)
    plus `outer` terms (weight, expression), the weights times the box's scale, where the scores
    inside the map are the match's query·key product and its terms (Gemma 2's logit softcap
    c · tanh(q·k / c))."""

    name: str
    params: tuple[sympy.Expr, ...]
    weight: sympy.Expr
    outer: tuple[tuple[sympy.Expr, Expr], ...] = ()


@dataclass(frozen=True, eq=False)
class MatchedAttention:
    """A softmax box and its consumer read as one attention (what `AttentionMatch.fusable`
    finds): the query, key and value sides as the region's factors and the legs they meet in.
    The forms that fuse it (SDPA folded or grouped, FlexAttention) emit from this record;
    `grouped`, `repeated` and `padded` are the fields a form sets (`dataclasses.replace`), the rest is the
    match."""

    query: list[Leaf]  # the query side's factors (of the first query·key product)
    key: list[Leaf]  # the key side's factors
    value: list[Leaf]  # the consumer's factors joined with the box along the keys
    heads: list[str]  # legs of both sides, kept (BATCH first when batched)
    queries: list[str]  # legs of the query side only
    keys: list[str]  # the normalized legs
    latent: list[str]  # legs both sides carry and the product contracts
    # each query·key product: (query side, key side, its contracted legs, weight relative to the first)
    sides: list[tuple[list[Leaf], list[Leaf], list[str], sympy.Expr]]
    features: list[str]  # the value side's legs the result keeps
    scale: sympy.Expr  # SDPA's scale: positive, the sign moved into q
    query_sign: int
    box_scale: sympy.Expr  # the box's own scale (biases are multiplied by it)
    biases: list[ScoreTerm]  # terms along heads and keys only: one more feature (MGK P17)
    key_norm: tuple[Value | None, tuple[str, ...] | None]  # a squared distance's key side and its legs
    ren: dict[str, tuple[str, ...]]  # the box's renaming into region legs
    masks: list[tuple[str, str]]  # causal masks and windows as (query leg, key leg)
    pads: list[tuple[str, tuple[str, ...]]]  # padding masks as (variable, region legs)
    score_biases: list[ScoreTerm]  # terms along the queries too: an additive attn_mask
    sequence: str  # the query leg that is the position (the causal mask's, else the longest)
    prelude: tuple[list[Step], dict]  # the content's computed factors, built on trial, and their memo
    grouped: bool = False  # query legs other than `sequence` grouped over the key heads (enable_gqa)
    # each query repeated over the keys of one position, the causal mask is_causal on those rows
    # (forms/sdpa_repeated.py): keys[0] is the masked position leg, the rest its keys per position
    repeated: bool = False
    # a window on masks[0] (with any causal mask of that pair): keys query − before < key <
    # query + after visible, the widths as numbers; None without a window
    window: tuple[sympy.Expr, sympy.Expr] | None = None
    # a map of the scores: the match above is of the map's argument (FlexAttention only)
    score_map: ScoreMapping | None = None
    # q, k and v zero-padded to one head width, so that the flash kernel takes the call
    # (forms/sdpa_padded.py)
    padded: bool = False

    @property
    def widened(self) -> bool:
        """Whether the SDPA call pads q, k and v to one head width whatever the form: a key bias
        is one more feature of q and k (MGK P17), several query·key products are concatenated
        along the features; a sink adds one more, but a sink's box is matched apart."""
        return bool(self.biases) or len(self.sides) > 1


def fusable(ctx, box: SoftmaxBox, ren, leaf: Leaf, others: list[Leaf], out: tuple[str, ...]) -> MatchedAttention | str:
    """The query, key and value sides of an attention, or why the pattern does not hold:
    content = per-head dot product (or squared distance) of a query side and a key side, or a
    sum of such products over different contracted legs (Σ_i q_i·k_i = [q_1, q_2]·[k_1, k_2]:
    partial RoPE's rotated and passed-through dims, GPT-NeoX §2.1.1), plus bias terms that
    vary only along heads and keys (carried by one more latent feature, MGK P17) or that vary
    along the queries too (passed as SDPA's additive attn_mask); causal masks and padding
    masks over legs of the scores; values joined along the normalized legs, or tied across
    some. Several query legs (query heads sharing one key head: multi-query
    and grouped-query attention) name a `sequence` leg: the causal mask's query leg, else the
    longest; the others become query heads grouped over the key heads."""
    keys = tuple(p for leg in box.normalized for p in ren[leg])

    if any(k in out for k in keys):
        return "the normalized legs are kept in the result"
    items = score_items(ctx, box.content, ren, set(keys), keep_constant=box.sink is not None)  # type: ignore[arg-type]
    if items is None:
        if box.sink is not None:
            return (
                "the scores are not query·key products plus terms along heads and keys"
                " (beside a sink, a term constant along the keys counts)"
            )
        return "the scores are not query·key products plus terms along heads and keys"
    crosses, biases = items
    if len(crosses) > 1 and any(kind != "term" for kind, _, _ in crosses):
        return "the scores add a squared distance to another query·key product"
    (kind, coefficient, cross) = crosses[0]
    distance_weight = coefficient  # of Σ_d (q − k)², whose ‖k‖² becomes a bias
    contents: list[tuple[list[Leaf], sympy.Expr]] = []
    key_value = over = None
    with ctx.aside() as prelude:  # the content's computed factors; kept only if fused
        if kind == "term":
            for _, weight, term in crosses:
                content: list[Leaf] = []
                weight *= collect(ctx, term, ren, content)
                contents.append((content, weight))
        else:
            inner = with_fresh_legs(ctx, ren, cross.over)
            sides = [ctx.lower(cross.left, inner), ctx.lower(cross.right, inner)]
            if set(keys) & set(sides[0].legs):
                sides.reverse()
            # Σ_d (q − k)² = −2 q·k + ‖k‖² (+ ‖q‖², constant along the keys)
            contents.append(([Leaf(v.legs, value=v) for v in sides], coefficient * -2))
            key_value, over = sides[1], tuple(p for leg in cross.over for p in inner[leg])
        memo = ctx.memo
    box_legs = tuple(p for leg in box.legs for p in ren[leg])
    folded = []
    for content, weight in contents:
        content, folded_legs, weight = fold_constants(ctx, content, box_legs, weight)
        if weight == 0:
            return "a query·key product times 0 (the scores are their other terms)"
        if folded_legs != box_legs:
            return "a constant of the scores joins two of their legs"
        if any(c.box is not None or (c.value is not None and c.value.broadcast) for c in content):
            return "the scores hold a box or a factor constant along some of their legs"
        folded.append((content, weight))
    splits = [split_sides(ctx, content, box_legs, keys, others, out) for content, _ in folded]
    if len(folded) > 1:
        # a key side without some head of another product (MLA's one RoPE key for all heads,
        # DeepSeek-V2 eq. 15) is that product's key shared by those heads: a broadcast
        shared = max((s[3] for s in splits if s is not None), key=len, default=())
        splits = [split_sides(ctx, content, box_legs, keys, others, out, shared) for content, _ in folded]
    terms = []
    for (content, weight), split in zip(folded, splits, strict=True):
        if split is None:
            return "no split into query, key and value sides that meet only in heads"
        if not set(keys) <= {leg for c in split[1] for leg in c.legs}:
            return "a normalized leg that only a bias carries, not the key side"
        if terms and (split[2], split[3], split[4], split[6]) != tuple(terms[0][1][k] for k in (2, 3, 4, 6)):
            return "its query·key products split into different heads, queries or values"
        terms.append((content, split, weight))
    content, split, coefficient = terms[0]
    query_side, key_side, values, heads, queries, latent, features, _ = split
    if kind == "sqdist" and (query_side, key_side) != (content[:1], content[1:]):
        return "the squared distance's sides are not a query side and a key side"
    # SDPA's kernels mask with -inf before or after scaling: a scale of either sign other than
    # positive turns masked scores into NaN (CPU, is_causal), so the sign goes into q
    sign = scale_sign(coefficient * box.scale)
    if sign is None:
        return "the scale of its query·key product is zero or of unknown sign"
    # several products Σ_i q_i·k_i (partial RoPE: rotated and passed-through dims) are one
    # product of the concatenated sides; each q_i carries its weight relative to the first
    sides = [(s[0], s[1], s[5], sign * w / coefficient, s[7]) for _, s, w in terms]
    batched = any(is_batched(ctx, e) for _, _, e in biases) or any(isinstance(m, PaddingMask) for m in box.masks)
    if batched and BATCH not in heads:
        return "a term or mask of the scores varies along the batch, the query·key product does not"
    bias_items, score_biases = [], []
    for bias_kind, weight, e in biases:
        legs = {p for leg in e.legs for p in ren[leg]}
        if not legs <= set(heads) | set(queries) | set(keys):
            return "a term of the scores varies along a leg that is not a head, query or key"
        (bias_items if legs <= set(heads) | set(keys) else score_biases).append((bias_kind, weight, e))
    if kind == "sqdist":
        bias_items.append(("norm", distance_weight, None))
    causal = [m for m in box.masks if isinstance(m, POSITION_MASKS)]
    for mask in causal:
        if len(ren[mask.query]) != 1 or ren[mask.query][0] not in queries:
            return "a causal mask whose query leg is not a query leg of the scores"
        if len(ren[mask.key]) != 1 or ren[mask.key][0] not in keys:
            return "a causal mask that is not between the query leg and a key leg"
    if len({ren[m.query][0] for m in causal}) > 1:
        return "causal masks over two different query legs"
    window = matched_window(ctx, causal)
    if isinstance(window, str):
        return window
    pads = []
    for mask in box.masks:
        if isinstance(mask, PaddingMask):
            legs = tuple(p for leg in mask.tensor.legs for p in ren[leg])
            if not set(legs) <= set(heads) | set(queries) | set(keys):
                return "a padding mask over a leg that is not a head, query or key of the scores"
            pads.append((ctx.input_vars[mask.tensor.name], legs))
    sequence = (
        ren[causal[0].query][0] if causal else max(queries, key=lambda leg: (ctx.number(leg), queries.index(leg)))
    )
    return MatchedAttention(
        query=query_side,
        key=key_side,
        value=values,
        heads=heads,
        queries=queries,
        keys=list(keys),
        latent=latent,
        sides=sides,
        features=features,
        scale=sign * coefficient * box.scale,
        query_sign=sign,
        box_scale=box.scale,
        biases=bias_items,
        key_norm=(key_value, over),
        ren=ren,
        masks=[(ren[m.query][0], ren[m.key][0]) for m in causal],
        pads=pads,
        score_biases=score_biases,
        sequence=sequence,
        prelude=(prelude, memo),
        window=window,
    )


def matched_window(ctx: Lowering, masks: list) -> tuple[sympy.Expr, sympy.Expr] | str | None:
    """The one band of a box's causal masks and windows, as numbers (before, after): a causal
    mask beside a window closes it at the query (after = 1); None without a window, a reason
    where the band is not one window over one pair of legs."""
    windows = [m for m in masks if isinstance(m, WindowMask)]
    if not windows:
        return None
    if len(windows) > 1:
        return "several windows on one box (one band mask says one)"
    if len({(m.query, m.key) for m in masks}) > 1:
        return "a window and a causal mask over different legs"
    (window,) = windows
    closed = any(isinstance(m, CausalMask) for m in masks)
    return ctx.runtime(window.before), ONE if closed else ctx.runtime(window.after)


def scale_sign(scale: sympy.Expr) -> int | None:
    """+1 or -1 for a scale known positive or negative (sizes are positive), None for zero or
    a sign that depends on values the plan cannot see: SDPA only takes a positive scale."""
    if scale.is_positive:
        return 1
    if scale.is_negative:
        return -1
    return None


def score_items(ctx: Lowering, e: Expr, ren, keys: set[str], weight: sympy.Expr = ONE, keep_constant: bool = False):
    """The box content as Σ weight·item: (cross items, bias items), the cross items those
    spanning every leg (several when the scores are a sum of query·key products over different
    contracted legs), terms constant along the keys dropped (softmax shift invariance); None
    when that shape does not hold, or with `keep_constant` (a box with a sink, which is not
    shift invariant) when there is a term constant along the keys."""
    items: list[tuple[str, sympy.Expr, Expr]] = []

    def walk_terms(e: Expr, weight: sympy.Expr) -> None:
        if isinstance(e, SumNode):
            for term, sign in zip(e.terms, e.signs, strict=True):
                walk_terms(term, weight * sign)
        elif isinstance(e, Contraction) and is_scaling(e):
            factor = next(f for f in e.factors if not isinstance(f, Scalar))
            scalars = [f.value for f in e.factors if isinstance(f, Scalar)]
            walk_terms(factor, weight * e.coefficient * sympy.Mul(*scalars))
        elif weight != 0:  # a term times 0 adds nothing (and no side may be divided by its weight)
            items.append(("sqdist" if isinstance(e, SquaredDistance) else "term", weight, e))

    walk_terms(e, weight)
    kept = []
    for item in items:
        legs = {p for leg in item[2].legs for p in ren[leg]}
        if legs & keys:
            kept.append(item)
        elif keep_constant or owns_parameter(ctx, item[2]):
            return None
    if not kept:
        return None
    widest = max(len(item[2].legs) for item in kept)
    crosses = [item for item in kept if len(item[2].legs) == widest]
    if len(crosses) > 1:  # a bias as wide as the scores: the cross items are those contracting
        crosses = [i for i in crosses if i[0] == "sqdist" or (isinstance(i[2], Contraction) and i[2].summed)]
    if not crosses or any(c[0] == "term" and not isinstance(c[2], Contraction | TensorRef) for c in crosses):
        return None
    biases = [item for item in kept if not any(item is c for c in crosses)]
    if any(not is_bias(ctx, item[2]) for item in biases):
        return None
    return crosses, biases


def is_bias(ctx: Lowering, e: Expr) -> bool:
    """A term the fused form computes apart (O(keys)): no box inside, nothing random."""
    return not any(
        isinstance(node, SoftmaxBox) or (isinstance(node, TensorRef) and ctx.g.tensors[node.name].kind == "random")
        for node in walk(e)
    )


def split_sides(
    ctx: Lowering, content: list[Leaf], box_legs, keys, others: list[Leaf], out: tuple[str, ...], shared=()
):
    """Assign the content's factors to a query and a key side, and the consumer's factors to
    the value side or the rest, so that the sides meet only in head legs (kept) and latent
    legs (contracted) and the values carry every head; the cheapest valid split wins. A leg
    of `shared` (another product's heads) that only the query side has is a head too, the
    key side broadcast along it; the split's last item lists those legs."""
    fixed_key = [c for c in content if set(keys) & set(c.legs)]
    fixed_value = [o for o in others if set(keys) & set(o.legs)]
    undecided = [c for c in content if c not in fixed_key]
    optional = [o for o in others if o not in fixed_value]
    if len(undecided) + len(optional) > 12:
        return None
    present = {leg for c in content for leg in c.legs}
    queries_all = [leg for leg in box_legs if leg not in keys and leg in present]
    fits = []
    for choice in itertools.product((0, 1), repeat=len(undecided) + len(optional)):
        query_side = [c for c, side in zip(undecided, choice, strict=False) if side == 0]
        key_side = fixed_key + [c for c, side in zip(undecided, choice, strict=False) if side == 1]
        values = fixed_value + [o for o, side in zip(optional, choice[len(undecided) :], strict=True) if side == 1]
        rest = [o for o in others if o not in values]
        q_legs = {leg for c in query_side for leg in c.legs}
        k_legs = {leg for c in key_side for leg in c.legs}
        v_legs = {leg for c in values for leg in c.legs}
        broadcast = [leg for leg in shared if leg != BATCH and leg in q_legs and leg not in k_legs]
        heads = [leg for leg in (BATCH, *box_legs) if leg in q_legs and (leg in k_legs or leg in broadcast)]
        queries = [leg for leg in queries_all if leg in q_legs and leg not in k_legs and leg not in broadcast]
        latent = sorted((q_legs & k_legs) - set(box_legs) - {BATCH})
        needed = set(out) | {leg for o in rest for leg in o.legs}
        features = [
            leg
            for leg in dict.fromkeys(leg for c in values for leg in c.legs)
            if leg not in heads and leg not in keys and leg in needed
        ]
        if not query_side or not queries or set(queries_all) != (set(heads) - {BATCH}) | set(queries):
            continue
        if (
            any(h not in v_legs for h in heads)
            or (BATCH in v_legs and BATCH not in heads)  # values per sequence, one attention for all
            or v_legs & set(queries)
            or (v_legs - set(heads) - set(keys)) & (q_legs | k_legs)
        ):
            continue
        cost = ctx.numel_number([*heads, *queries, *keys]) * (ctx.numel_number(latent) + ctx.numel_number(features))
        fits.append(((query_side, key_side, values, heads, queries, latent, features, broadcast), cost))
    return cheapest(fits) if fits else None
