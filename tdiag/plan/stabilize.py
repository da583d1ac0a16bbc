"""exp factors of a normalize box computed without overflow. In normalize[m](Π_i exp(z_i) · rest)
a factor exp(z_i) may be divided by exp(c) for any c constant along the legs the box does not
keep (its normalized legs and the legs summed inside it): c cancels between the numerator and
the denominator, as the max cancels in a softmax. So each exp(z_i) is computed as exp(z_i − c_i),
c_i the max of z_i over those legs; where z_i shares a summed leg with a later exp factor, only
its own legs are maxed out and the rest of c_i, along the shared leg, is added to that factor's
argument instead (exp(a − c[r]) exp(b + c[r]) = exp(a) exp(b)). For Performer's positive random
features (Choromanski et al. 2021, FAVOR+) that is a max over the keys per feature, handed to the
queries, then a max over the features per query: the FAVOR+ authors' stabilizer, with the key
side's max kept per feature, so that every query's denominator (without a mask) has a term
exp(0) · Σ_m exp(≤ 0) ≥ 1 and neither overflows nor underflows to 0 / 0.
Guarantees: exact in exact arithmetic (the shifts cancel); applied only to a box without eps
(num / (den + eps) does not cancel) and without masks (a max over keys a mask hides, the future
keys of a causal box, would make every visible term underflow in early rows: silently wrong
rows, where the unshifted box overflows or divides 0 by 0 loudly); the numerator and denominator
of the linear-time order read the same shifted factors."""

from __future__ import annotations

from .combine import combine
from .context import Leaf, Lowering
from .legs import renamed_value
from .program import BATCH, Map, Reduce, Step, Value, show_legs


def stabilize_exponents(ctx: Lowering, leaves: list[Leaf], kept: frozenset[str]) -> list[Leaf]:
    """`leaves` with each exponent leaf (exp of its value, collected under a normalize box
    whose region legs `kept` it keeps) replaced by the shifted exp, computed once per box."""
    exponents = [leaf for leaf in leaves if leaf.exponent]
    if not exponents:
        return leaves
    ctx.count_stabilization()
    legs = tuple(leg for leaf in exponents for leg in leaf.legs)
    pattern = tuple(legs.index(leg) for leg in legs)
    key = ("stabilized", tuple(leaf.value.var for leaf in exponents), pattern, tuple(leg in kept for leg in legs))  # type: ignore[union-attr]
    if key not in ctx.memo:
        shifted = shifted_exponents(ctx, [leaf.value for leaf in exponents], kept)  # type: ignore[misc]
        ctx.memo[key] = (shifted, legs)  # type: ignore[assignment]
    earlier_values, earlier = ctx.memo[key]
    rename = dict(zip(earlier, legs, strict=True))
    values = iter([renamed_value(value, rename) for value in earlier_values])  # type: ignore[attr-defined]
    out: list[Leaf] = []
    for leaf in leaves:
        if not leaf.exponent:
            out.append(leaf)
            continue
        value = next(values)
        out.append(Leaf(value.legs, value=value))  # its broadcast legs have their leaf already
    return out


def shifted_exponents(ctx: Lowering, arguments: list[Value], kept: frozenset[str]) -> list[Value]:
    """exp(z_i − c_i) for each argument z_i, in order; the factors whose own legs (summed, in
    no later factor) can be maxed out go first, handing the rest of their max on."""
    free = [{leg for leg in z.legs if leg not in kept and leg != BATCH} for z in arguments]
    carried: dict[int, list[Value]] = {k: [] for k in range(len(arguments))}
    order = sorted(range(len(arguments)), key=lambda k: not free[k] - _others(free, k))
    results: dict[int, Value] = {}
    for position, k in enumerate(order):
        z = arguments[k]
        if carried[k]:
            z = combine(ctx, "sum", [(1, z)] + [(1, c) for c in carried[k]], _union(z, carried[k]), None)
        later = [j for j in order[position + 1 :]]
        summed = {leg for leg in z.legs if leg not in kept and leg != BATCH}
        shared = summed & {leg for j in later for leg in free[j]}
        own = summed - shared
        target = next((j for j in later if shared <= free[j]), None)
        if not own or target is None:
            own, target = summed, None
        shift = maximum(ctx, z, own) if own else None
        if shift is not None and target is not None:
            carried[target].append(shift)
        results[k] = shifted_exp(ctx, z, shift)
    return [results[k] for k in range(len(arguments))]


def maximum(ctx: Lowering, z: Value, over: set[str]) -> Value:
    """max of z over the legs `over`, kept as a value over its other legs."""
    legs = tuple(leg for leg in z.legs if leg not in over)
    dims = tuple(z.legs.index(leg) for leg in z.legs if leg in over)
    out = Value(ctx.names.fresh(f"{z.var}_max"), legs, z.broadcast)
    shown = " ".join(show_legs(leg for leg in z.legs if leg in over))
    step = Step(
        "reduction",
        Reduce(z, "amax", dims),
        out,
        f"max over {shown}",
        tuple(leg for leg in z.legs if leg in over),
        elementwise=ctx.numel(z.legs),
        inputs=(z,),
    )
    return ctx.emit(step)  # type: ignore[return-value]


def shifted_exp(ctx: Lowering, z: Value, shift: Value | None) -> Value:
    """exp(z − shift): the shift is the max of z along the legs it does not have."""
    if shift is not None:
        z = combine(ctx, "sum", [(1, z), (-1, shift)], z.legs, None)
    name = ctx.names.fresh("exp")
    step = Step(
        "map",
        Map(z, "exp", ()),
        Value(name, z.legs, z.broadcast),
        "exp" if shift is None else "exp, shifted by its max (cancels in the normalize box)",
        elementwise=ctx.numel(z.legs),
        inputs=(z,),
    )
    return ctx.emit(step)  # type: ignore[return-value]


def _others(free: list[set[str]], k: int) -> set[str]:
    return {leg for j, legs in enumerate(free) if j != k for leg in legs}


def _union(z: Value, values: list[Value]) -> tuple[str, ...]:
    return tuple(dict.fromkeys([*z.legs, *(leg for v in values for leg in v.legs)]))
