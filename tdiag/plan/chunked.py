"""Causal Σ_{m ≤ n} of a product in chunks: a masked C×C product within a chunk and an
exclusive prefix sum of per-chunk states across them (MGK P12, spec mgk §6.6)."""

from __future__ import annotations

import itertools

import sympy

from .boxes import resolve_boxes
from .chooser import cheapest, within
from .combine import combine
from .context import Leaf, Lowering
from .decay import Decay, split_exponent
from .leaves import leaf_value
from .legs import renamed_value
from .program import (
    BATCH,
    ChunkEdge,
    DecayedPrefix,
    JoinChunks,
    Map,
    MaskFill,
    Operand,
    PrefixSum,
    SplitChunks,
    Step,
    Triangle,
    Value,
    align,
    show_legs,
)
from .regions import contract
from .trials import trial_cost


def union_legs(a: Value, b: Value) -> tuple[str, ...]:
    """The legs of a and of b, a's first, each once."""
    return tuple(dict.fromkeys((*a.legs, *b.legs)))


CHUNK_SIZES = (4, 8, 16, 32, 64, 128, 256)  # the chunk sizes tried, each a power of two
# the largest chunk size whose cost is within this factor of the least is taken: the roofline
# estimate misses much of what many small chunks cost (an add per chunk in the exclusive prefix
# sum, small matmuls below the device's peak; lfish at N = 4096 runs 1.2x slower at C = 32 than
# at C = 64, estimated 1.5% faster), and FLOPs fall as C shrinks down to a few positions
# (C = 4 at N = 4096 is 1,024 chunks)
TIME_SLACK = 1.05
FLOPS_SLACK = 1.1
# where a factor carrying neither the query nor the key leg may go: in both the within-chunk
# product and the query side of the across-chunk one, in the key side's per-chunk state, or
# applied once to the sum of the two parts (a factor common to both, contracted once: a core
# C[r s] in THSA's denominator)
PLACEMENTS = ("both", "state", "after")


def _cost(cost: float, objective: str) -> str:
    """A trial's cost for the plan note: seconds under `time` (3 significant digits), else FLOPs."""
    return f"{cost:.3g}" if objective == "time" else f"{int(cost):,}"


class NotPrefixSumError(Exception):
    """A causal box whose query and key legs meet on one factor: Σ_{m ≤ n} of it is no prefix
    sum (the factor is not split into a query side and a key side); its caller refuses the rewrite."""


def causal_contract(
    ctx: Lowering,
    query: str,
    key: str,
    leaves: list[Leaf],
    out: tuple[str, ...],
    coefficient: sympy.Expr,
    var: str | None,
) -> Value:
    """Σ_{m ≤ n} of a product, chunked (causal linear attention in O(N·C + N·D·E/C)): both
    legs split into chunks of C; within a chunk the product is masked by a C×C triangle,
    across chunks the key side is summed per chunk into a state whose exclusive prefix sum
    over chunks the query side reads (MGK P12, spec mgk §6.6; Katharopoulos et al. §3.3).
    C is chosen by the objective on trial (`choose_chunk_size`) at the pair's first
    contraction and shared by the later ones (the numerator's and the denominator's)."""
    leaves = resolve_boxes(ctx, leaves, out)
    both = [leaf for leaf in leaves if query in leaf.legs and key in leaf.legs]
    split = tuple(split_exponent(*leaf.decay, query, key) if leaf.decay is not None else None for leaf in both)
    if any(decay is None for decay in split):
        raise NotPrefixSumError(f"{' and '.join(show_legs([query, key]))} are legs of one factor")
    leaves = [leaf for leaf in leaves if all(leaf is not d for d in both)]
    if (query, key) not in ctx.chunk_pairs:
        choose_chunk_size(ctx, query, key, leaves, out, coefficient, var, split)  # type: ignore[arg-type]
    return cheapest_chunked(ctx, query, key, leaves, out, coefficient, var, split)  # type: ignore[arg-type]


def choose_chunk_size(
    ctx: Lowering,
    query: str,
    key: str,
    leaves: list[Leaf],
    out: tuple[str, ...],
    coefficient: sympy.Expr,
    var: str | None,
    decays: tuple[Decay, ...] = (),
) -> None:
    """The chunk size C for the pair (query, key): of the powers of two from 4 to 256 (none
    above the planned length's), the one whose chunked contraction costs least under the
    objective: the largest within TIME_SLACK of the least estimated time (FLOPS_SLACK of
    the fewest FLOPs). Larger chunks
    mean fewer, larger matmuls and fewer states to sum over chunks, at C·N entries within
    the chunks: the balance depends on the design's widths. The chunk counts of the sizes
    not taken are forgotten (no run-time binding of them)."""
    planned = ctx.number(query)
    candidates = [size for size in CHUNK_SIZES if size < 2 * planned] or [CHUNK_SIZES[0]]
    before = set(ctx.chunk_counts)
    asked = (query, key, repr(leaves), out, coefficient, repr(decays), var, ctx.objective)
    known = ctx.config.chunk_costs.get(asked)
    legs, costs = {}, {}
    for size in candidates:
        ctx.chunk_pairs[(query, key)] = legs[size] = chunk_legs(ctx, query, key, size)
        if known is None:
            costs[size] = trial_cost(
                ctx, lambda: cheapest_chunked(ctx, query, key, leaves, out, coefficient, var, decays)
            )
    if known is None:
        ctx.config.chunk_costs[asked] = costs
    costs = dict(known or costs)
    slack = TIME_SLACK if ctx.objective == "time" else FLOPS_SLACK
    size = max(within([(c, costs[c]) for c in candidates], slack))
    ctx.chunk_pairs[(query, key)] = legs[size]
    extent = ctx.runtime(ctx.size(query))
    for count_key in set(ctx.chunk_counts) - before - {(extent, size)}:
        symbol = ctx.chunk_counts.pop(count_key)
        del ctx.chunk_values[symbol], ctx.chunk_sizes[symbol]
    measure = "least estimated time (s)" if ctx.objective == "time" else "fewest FLOPs"
    tried = ", ".join(f"{c}: {_cost(costs[c], ctx.objective)}" for c in candidates)
    ctx.chunk_notes[(query, key)] = (
        f"causal prefix sums over {show_legs([query])[0]} in chunks of C = {size},"
        f" the largest within {slack}× the {measure} of the first contraction over them at C = {tried}"
    )


def cheapest_chunked(ctx: Lowering, query, key, leaves, out, coefficient, var, decays=()) -> Value:
    """chunked_contract with each factor carrying neither leg placed where the objective's
    cost is least, over every combination of PLACEMENTS for up to two such factors, of the
    first two for up to four (as many trials as the planning time allows, each size of
    chunk tried over them); more stay in both parts."""
    free = [leaf for leaf in leaves if key not in leaf.legs and query not in leaf.legs]
    places = PLACEMENTS if len(free) <= 2 else PLACEMENTS[:2] if len(free) <= 4 else PLACEMENTS[:1]
    choices = itertools.product(places, repeat=len(free))
    priced = []
    for choice in choices:
        placed = dict(zip(map(id, free), choice, strict=True))
        cost = trial_cost(
            ctx, lambda p=placed: placed_contract(ctx, query, key, leaves, p, out, coefficient, var, decays)
        )
        priced.append((placed, cost))
    best = cheapest(priced)
    if not ctx.trialing and (query, key) in ctx.chunk_notes:
        note = ctx.chunk_notes[(query, key)]
        if note not in ctx.lowered:
            ctx.lowered.append(note)
    return placed_contract(ctx, query, key, leaves, best, out, coefficient, var, decays)


def placed_contract(ctx: Lowering, query, key, leaves, placed, out, coefficient, var, decays=()) -> Value:
    """chunked_contract of `leaves` with the free factors placed as `placed` (by id) says."""
    joined = [leaf for leaf in leaves if placed.get(id(leaf)) == "state"]
    after = [leaf for leaf in leaves if placed.get(id(leaf)) == "after"]
    return chunked_contract(ctx, query, key, leaves, joined, out, coefficient, var, after, decays)


def chunked_contract(ctx: Lowering, query, key, leaves, joined, out, coefficient, var, after=(), decays=()) -> Value:
    """causal_contract with the factors `joined` (carrying neither leg) in the key side's
    state and the factors `after` applied once to the sum of the within- and across-chunk
    parts."""
    chunks, within_query, within_key, size = ctx.chunk_pairs[(query, key)]
    rename = {query: (chunks, within_query), key: (chunks, within_key)}
    chunked = [chunk_leaf(ctx, leaf, rename) for leaf in leaves if all(leaf is not a for a in after)]
    leaves = [leaf for leaf in leaves if all(leaf is not a for a in after)]
    out_chunked = tuple(p for leg in out for p in rename.get(leg, (leg,)))
    final = out_chunked
    if after:
        inner = {g for leaf in chunked for g in leaf.legs}
        out_chunked = (
            *out_chunked,
            *dict.fromkeys(g for a in after for g in a.legs if g in inner and g not in final),
        )
    key_side = [c for c, leaf in zip(chunked, leaves, strict=True) if key in leaf.legs or leaf in joined]
    rest = [c for c in chunked if c not in key_side]
    if decays:
        block, query_decay, key_decay, start, end = decay_factors(ctx, decays, query, key)
        within = contract(ctx, [*chunked, block], out_chunked, coefficient, None)
        key_side, rest = [*key_side, key_decay], [*rest, query_decay]
    else:
        some = leaf_value(ctx, chunked[0])
        triangle = ctx.names.fresh("triangle")
        ctx.emit(
            Step(
                "const",
                Triangle(size, some),
                Value(triangle, (within_query, within_key)),
                "causal triangle within a chunk",
            )
        )
        mask = Leaf((within_query, within_key), value=Value(triangle, (within_query, within_key)))
        within = contract(ctx, [*chunked, mask], out_chunked, coefficient, None)
    needed = set(out_chunked) | {leg for leaf in rest for leg in leaf.legs}
    state_legs = tuple(
        dict.fromkeys(leg for leaf in key_side for leg in leaf.legs if leg in needed or leg in (chunks, BATCH))
    )
    state = contract(ctx, key_side, state_legs, sympy.Integer(1), None)
    name = ctx.names.fresh("earlier")
    if chunks not in state.legs:
        raise NotPrefixSumError("no factor of the key side varies along the key position")
    axis = state.legs.index(chunks)
    if decays:
        if not set(start.legs) <= set(state.legs):
            raise NotPrefixSumError("the decay has a leg that the state of a chunk does not")
        op = DecayedPrefix(state, align(start, state.legs), align(end, state.legs), axis)
        what = "states of the earlier chunks, each decayed to the start of this one (causal)"
    else:
        op = PrefixSum(state, axis)
        what = f"state of the earlier chunks: exclusive prefix sum over {show_legs([chunks])[0]} (causal)"
    earlier = ctx.emit(
        Step(
            "prefix",
            op,
            Value(name, state.legs, state.broadcast),
            what,
            (chunks,),
            flops=ctx.numel(state.legs) * (3 if decays else 1),
            inputs=(state,),
        )
    )
    across = contract(ctx, [*rest, Leaf(earlier.legs, value=earlier)], out_chunked, coefficient, None)  # type: ignore[union-attr]
    total = combine(ctx, "sum", [(1, within), (1, across)], out_chunked, None)
    if after:
        total = contract(ctx, [Leaf(total.legs, value=total), *after], final, sympy.Integer(1), None)
    order = [leg for leg in total.legs if leg != within_query]
    position = order.index(chunks)
    order.insert(position + 1, within_query)
    permutation = None
    if list(total.legs) != order:
        permutation = tuple(total.legs.index(leg) for leg in order)
    legs = tuple(query if leg == chunks else leg for leg in order if leg != within_query)
    name = ctx.names.fresh(var or "causal_sum")
    return ctx.emit(
        Step(
            "view",
            JoinChunks(Operand(total, permutation), position, ctx.runtime(ctx.size(query))),
            Value(name, legs, total.broadcast),
            "chunks joined",
            inputs=(total,),
        )
    )  # type: ignore[return-value]


def decay_factors(
    ctx: Lowering, decays: tuple[Decay, ...], query: str, key: str
) -> tuple[Leaf, Leaf, Leaf, Value, Value]:
    """The chunkwise pieces of the decays exp(U[n] + W[m]) (U, W the sums of their query and
    key parts, decay.py), each exponent ≤ 0 for a decay: the within-chunk block
    exp(U[i] + W[j]) with j > i masked to −inf before the exp; the query side's
    exp(U[i] − U[start]) and the key side's exp(U[end] + W[j]), referred to the start and the
    end of their chunk; and U at those two points, across which DecayedPrefix carries the
    states. U and W are padded with their last entry, so a padded position decays no further."""
    chunks, within_query, within_key, _ = ctx.chunk_pairs[(query, key)]
    u = decay_side(ctx, [term for d in decays for term in d.u])
    w = decay_side(ctx, [term for d in decays for term in d.w])
    if query not in u.legs or key in u.legs or key not in w.legs or query in w.legs:
        raise NotPrefixSumError("the decay's query part or key part lacks its position leg")
    uc = chunk_value(ctx, u, query, chunks, within_query, edge=True)
    wc = chunk_value(ctx, w, key, chunks, within_key, edge=True)
    exponent = combine(ctx, "sum", [(1, uc), (1, wc)], union_legs(uc, wc), None)
    block = masked_decay_exp(ctx, exponent, within_query, within_key, "decay within a chunk")
    start, end = (chunk_edge(ctx, uc, within_query, last) for last in (False, True))
    query_side = decay_exp(
        ctx, combine(ctx, "sum", [(1, uc), (-1, start)], uc.legs, None), "decay since the chunk's start"
    )
    key_side = decay_exp(
        ctx, combine(ctx, "sum", [(1, end), (1, wc)], union_legs(end, wc), None), "decay to the chunk's end"
    )
    return (*(Leaf(v.legs, value=v) for v in (block, query_side, key_side)), start, end)  # type: ignore[return-value]


def decay_side(ctx: Lowering, terms: list) -> Value:
    """Σ ± terms of one side of the decays (decay.Decay), each read with its own legs; once
    for the causal products that share it (a numerator's and its denominator's query side)."""
    parts = [(sign, ctx.lower(expr, dict(ren))) for sign, expr, ren in terms]
    if len(parts) == 1 and parts[0][0] == 1:
        return parts[0][1]
    legs = tuple(dict.fromkeys(g for _, p in parts for g in p.legs))
    key = ("decay side", tuple((sign, p.var, p.legs, p.broadcast) for sign, p in parts))
    if key not in ctx.memo:
        ctx.memo[key] = (combine(ctx, "sum", parts, legs, None), legs)
    return ctx.memo[key][0]


def masked_decay_exp(ctx: Lowering, exponent: Value, query: str, key: str, what: str) -> Value:
    """exp of a decay's exponent with its entries above the (query, key) diagonal set to −inf
    first: the future's exp(growth) is never taken (an unmasked one overflows, and inf · 0
    is NaN)."""
    future = align(Value(ctx.causal_mask(query, key), (query, key)), exponent.legs)
    masked = ctx.emit(
        Step(
            "mask",
            MaskFill(exponent, future, "-inf"),
            Value(ctx.names.fresh("decay_exponent"), exponent.legs, exponent.broadcast),
            "the decay's exponent, the future −inf",
            inputs=(exponent,),
        )
    )
    return decay_exp(ctx, masked, what)  # type: ignore[arg-type]


def decay_exp(ctx: Lowering, x: Value, what: str) -> Value:
    return ctx.emit(
        Step(
            "map",
            Map(x, "exp"),
            Value(ctx.names.fresh("decay"), x.legs, x.broadcast),
            what,
            elementwise=ctx.numel(x.legs),
            inputs=(x,),
        )
    )  # type: ignore[return-value]


def chunk_edge(ctx: Lowering, value: Value, within: str, last: bool) -> Value:
    """`value` at the first (last) position of each chunk along `within`: a view."""
    physical = [leg for leg in value.legs if leg not in value.broadcast]
    legs = tuple(leg for leg in value.legs if leg != within)
    return ctx.emit(
        Step(
            "view",
            ChunkEdge(value, physical.index(within), last),
            Value(ctx.names.fresh("chunk_end" if last else "chunk_start"), legs, value.broadcast),
            f"the decay at the {'last' if last else 'first'} position of each chunk",
            inputs=(value,),
        )
    )  # type: ignore[return-value]


def chunk_legs(ctx: Lowering, query: str, key: str, size: int) -> tuple[str, str, str, int]:
    """Legs for chunks of `size` positions: the chunk count, a run-time ⌈N / C⌉ bound in
    forward, and the query's and key's position within a chunk."""
    planned = ctx.number(query)
    extent = ctx.runtime(ctx.size(query))
    count_key = (extent, size)
    if count_key not in ctx.chunk_counts:
        var = ctx.names.fresh(f"chunks_{size}")
        symbol = sympy.Symbol(var, positive=True, integer=True)
        ctx.chunk_counts[count_key] = symbol
        ctx.chunk_values[symbol] = sympy.Integer(-(-int(planned) // size))
        ctx.chunk_sizes[symbol] = ctx.size(query) / size
    legs = (
        ctx.new_leg("chunk", ctx.chunk_counts[count_key]),
        ctx.new_leg(query, sympy.Integer(size)),
        ctx.new_leg(key, sympy.Integer(size)),
    )
    return (*legs, size)


def chunk_leaf(ctx: Lowering, leaf: Leaf, rename: dict[str, tuple[str, str]]) -> Leaf:
    """A factor with its query or key leg split into (chunk, position within the chunk),
    zero-padded to whole chunks (zeros add nothing to a sum)."""
    legs = tuple(p for leg in leaf.legs for p in rename.get(leg, (leg,)))
    split = [leg for leg in leaf.legs if leg in rename]
    if not split:
        return leaf
    (leg,) = split
    value = leaf_value(ctx, leaf)
    chunks, within = rename[leg]
    key = ("chunk", value.var, value.legs.index(leg), len(value.legs), chunks, within)
    if key not in ctx.memo:
        ctx.memo[key] = (chunk_value(ctx, value, leg, chunks, within), value.legs)
    chunked, earlier = ctx.memo[key]
    return Leaf(legs, value=renamed_value(chunked, dict(zip(earlier, value.legs, strict=True))))


def chunk_value(ctx: Lowering, value: Value, leg: str, chunks: str, within: str, edge: bool = False) -> Value:
    """`value` with `leg` split into (chunks, within), zero-padded to whole chunks (with
    `edge`, padded with its last entry)."""
    legs = tuple(p for old in value.legs for p in ((chunks, within) if old == leg else (old,)))
    if leg in value.broadcast:
        return Value(value.var, legs, (value.broadcast - {leg}) | {chunks, within})
    physical = [old for old in value.legs if old not in value.broadcast]
    axis = physical.index(leg)
    size = ctx.number(within)
    split = SplitChunks(
        value, axis, len(physical) - 1 - axis, ctx.leg_sizes[chunks], size, ctx.runtime(ctx.size(leg)), edge
    )
    name = ctx.names.fresh(f"{value.var}_chunks")
    return ctx.emit(
        Step(
            "view",
            split,
            Value(name, legs, value.broadcast),
            f"{show_legs([leg])[0]} in chunks of {size}",
            inputs=(value,),
        )
    )  # type: ignore[return-value]
