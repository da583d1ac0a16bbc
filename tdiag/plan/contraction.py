"""Contraction order: a region's leaves contracted pairwise in opt_einsum's order, each pair as
one matmul (einsum only for a leg repeated in one operand), coefficients on the smallest operand.
Guarantees: fewest FLOPs among the orders opt_einsum considers, ties to the smaller intermediate."""

from __future__ import annotations

import functools
from collections.abc import Iterable

import sympy

from .chooser import cheapest
from .context import Lowering
from .legs import renamed_value
from .program import (
    BATCH,
    Einsum,
    Matmul,
    Multiply,
    Operand,
    Scale,
    Step,
    SumAxes,
    Value,
    align,
    read_groups,
    show_legs,
)

OPTIMAL_UP_TO = 5  # opt_einsum's 'optimal' path up to this many operands, 'dp' beyond


def plan_contraction(
    ctx: Lowering, values: list[Value], out: tuple[str, ...], coefficient: sympy.Expr, var: str | None
) -> Value:
    if coefficient != 1:
        values, coefficient = place_coefficient(ctx, values, out, coefficient)
    if len(values) == 1:
        result = reduce_single(ctx, values[0], out, var)
    else:
        result = pairwise_steps(ctx, values, out, var)
    if coefficient != 1:
        result = scale_value(ctx, result, coefficient, var)
    return result


def place_coefficient(ctx: Lowering, values: list[Value], out: tuple[str, ...], coefficient: sympy.Expr):
    """Multiply the smallest operand by the coefficient (a softmax scale lands on Q, not on QKᵀ)."""
    sizes = [ctx.numel_number(v.legs) for v in values]
    smallest = cheapest([(i, size) for i, size in enumerate(sizes)])
    if sizes[smallest] <= ctx.numel_number(out):
        values = list(values)
        values[smallest] = scale_value(ctx, values[smallest], coefficient)
        return values, sympy.Integer(1)
    return values, coefficient


def scale_value(ctx: Lowering, value: Value, coefficient: sympy.Expr, var: str | None = None) -> Value:
    """`value` × `coefficient`, made once per value and coefficient (the two parts of a
    chunked causal sum each carry a region's coefficient to the same smallest operand)."""
    key = ("scale", value.var, value.legs, value.broadcast, coefficient)
    if var is None and key in ctx.memo:
        return ctx.memo[key][0]
    scaled = _scaled_value(ctx, value, coefficient, var)
    if var is None:
        ctx.memo[key] = (scaled, scaled.legs)
    return scaled


def _scaled_value(ctx: Lowering, value: Value, coefficient: sympy.Expr, var: str | None) -> Value:
    name = ctx.names.fresh(var or "scaled")
    return ctx.emit(
        Step(
            "scale",
            Scale(value, ctx.runtime(coefficient)),
            Value(name, value.legs, value.broadcast),
            f"× {coefficient}",
            elementwise=ctx.numel(value.legs),
            inputs=(value,),
        )
    )  # type: ignore[return-value]


def reduce_single(ctx: Lowering, value: Value, out: tuple[str, ...], var: str | None) -> Value:
    summed = tuple(leg for leg in value.legs if leg not in out)
    if not summed:
        return value
    name = ctx.names.fresh(var or "summed")
    dims = tuple(value.legs.index(leg) for leg in summed)
    legs = tuple(leg for leg in value.legs if leg in out)
    return ctx.emit(
        Step(
            "sum",
            SumAxes(value, dims),
            Value(name, legs),
            f"Σ over {' '.join(show_legs(summed))}",
            summed,
            flops=ctx.numel(value.legs),
            inputs=(value,),
        )
    )  # type: ignore[return-value]


def pairwise_steps(ctx: Lowering, values: list[Value], out: tuple[str, ...], var: str | None) -> Value:
    path = contraction_path(ctx, values, out)
    operands = list(values)
    for k, step in enumerate(path):
        chosen = [operands[i] for i in step]
        rest = [v for n, v in enumerate(operands) if n not in step]
        needed = set(out) | {leg for v in rest for leg in v.legs}
        last = k == len(path) - 1
        result = chosen[0]
        if len(chosen) == 1:  # a leg only this operand has: summed on its own
            result = reduce_single(ctx, result, tuple(leg for leg in result.legs if leg in needed), None)
        for n, other in enumerate(chosen[1:], start=2):
            later = {leg for v in chosen[n:] for leg in v.legs}
            result = pairwise(ctx, result, other, needed | later, var if last and n == len(chosen) else None)
        operands = [*rest, result]
    (result,) = operands
    if len(values) > 1 and set(result.legs) != set(out):
        result = reduce_single(ctx, result, out, var)
    return result


def contraction_path(ctx: Lowering, values: list[Value], out: tuple[str, ...]) -> list[tuple[int, ...]]:
    import opt_einsum  # loaded when a region is contracted: `tdiag check` plans nothing

    legs = sorted({leg for v in values for leg in v.legs} | set(out))
    symbol = {leg: opt_einsum.get_symbol(i) for i, leg in enumerate(legs)}
    equation = (
        ",".join("".join(symbol[leg] for leg in v.legs) for v in values) + "->" + "".join(symbol[leg] for leg in out)
    )
    shapes = tuple(tuple(ctx.number(leg) for leg in v.legs) for v in values)
    return list(_cheapest_path(equation, shapes))


def pairwise(ctx: Lowering, a: Value, b: Value, needed: set[str], var: str | None) -> Value:
    """One pairwise contraction, computed once per emit target (the chunks of a causal
    contraction and its numerator and denominator share their key-side products)."""
    if a.broadcast or b.broadcast:
        return matmul(ctx, a, b, needed, var)
    order = tuple(dict.fromkeys(a.legs + b.legs))
    index = {leg: k for k, leg in enumerate(order)}
    key = (
        "pairwise",
        *((v.var, tuple(index[leg] for leg in v.legs)) for v in (a, b)),
        frozenset(index[leg] for leg in order if leg in needed),
    )
    if key not in ctx.memo:
        ctx.memo[key] = (matmul(ctx, a, b, needed, var), order)
    value, earlier = ctx.memo[key]
    return renamed_value(value, dict(zip(earlier, order, strict=True)))


def matmul(ctx: Lowering, a: Value, b: Value, needed: set[str], var: str | None) -> Value:
    """One pairwise contraction as a matmul: (batch, a's kept legs, summed) @ (batch, summed,
    b's kept legs). Legs that one side alone has and nobody needs are summed first."""
    a = reduce_single(ctx, a, tuple(leg for leg in a.legs if leg in needed or leg in b.legs), None)
    b = reduce_single(ctx, b, tuple(leg for leg in b.legs if leg in needed or leg in a.legs), None)
    if BATCH in b.legs and BATCH not in a.legs:
        a, b = b, a
    if len(set(a.legs)) != len(a.legs) or len(set(b.legs)) != len(b.legs):
        out = tuple(leg for leg in dict.fromkeys(a.legs + b.legs) if leg in needed)
        return einsum_step(ctx, [a, b], out, var)
    batch = [leg for leg in a.legs if leg in b.legs and leg in needed]
    summed = [leg for leg in a.legs if leg in b.legs and leg not in needed]
    left = [leg for leg in a.legs if leg not in b.legs]
    right = [leg for leg in b.legs if leg not in a.legs]
    if not summed or not (left or right):
        return broadcast_product(ctx, a, b, summed, var)
    legs = tuple(batch + left + right)
    if batch:
        a_operand = arrange(ctx, a, [batch, left, summed])
        b_operand = arrange(ctx, b, [batch, summed, right])
        natural = [batch, left, right]
    else:
        a_operand = arrange(ctx, a, [*[[leg] for leg in left], summed])
        b_operand = arrange(ctx, b, [summed, right])
        natural = [*[[leg] for leg in left], right]
    shape = None  # an empty group after the first is a unit axis of the product: reshaped away
    if [g for g in natural if g] != [[leg] for leg in legs] or any(not g for g in natural[1:]):
        shape = ctx.shape(legs)
    name = ctx.names.fresh(var or "t")
    flops = 2 * ctx.numel(batch + left + summed + right)
    description = f"{ctx.show_value(a)} · {ctx.show_value(b)} -> [{' '.join(show_legs(legs))}]"
    step = Step(
        "contraction",
        Matmul(a_operand, b_operand, shape),
        Value(name, legs),
        description,
        tuple(summed),
        flops,
        inputs=(a, b),
    )
    return ctx.emit(step)  # type: ignore[return-value]


def broadcast_product(ctx: Lowering, a: Value, b: Value, summed: list[str], var: str | None) -> Value:
    """A pairwise contraction that sums nothing (an outer or batch product), or that leaves no
    free leg on either side (a batched dot product), as a broadcast multiply: one multiply
    per element of the product (FLOPs as opt_einsum counts them), then the sum if any (2 per
    multiply-add, as a matmul's). The result's legs follow a's, then b's own; the layout
    pass may reorder them for its consumer."""
    order = a.legs + tuple(leg for leg in b.legs if leg not in a.legs)
    legs = tuple(leg for leg in order if leg not in summed)
    dims = tuple(order.index(leg) for leg in summed)
    flops = 2 * ctx.numel(order) if summed else ctx.numel(order)
    name = ctx.names.fresh(var or "t")
    description = f"{ctx.show_value(a)} · {ctx.show_value(b)} -> [{' '.join(show_legs(legs))}]"
    step = Step(
        "contraction",
        Multiply(align(a, order), align(b, order), dims),
        Value(name, legs),
        description,
        tuple(summed),
        flops,
        inputs=(a, b),
    )
    return ctx.emit(step)  # type: ignore[return-value]


def arrange(ctx: Lowering, value: Value, groups: list[list[str]]) -> Operand:
    """`value` permuted to the legs of `groups` in order, one axis per group; an empty group
    is a unit axis inserted by indexing (a view whose last axis keeps stride 1, which the fused
    attention kernels need, where a reshape of a permuted tensor may not)."""
    return read_groups(value, groups, lambda group: group_size(ctx, group))


def group_size(ctx: Lowering, group: Iterable[str]) -> sympy.Expr:
    return ctx.runtime(sympy.Mul(*(ctx.size(leg) for leg in group)))


def einsum_step(ctx: Lowering, values: list[Value], out: tuple[str, ...], var: str | None) -> Value:
    """The fallback for what a matmul cannot say (a leg repeated within one operand)."""
    import opt_einsum  # loaded when a region is contracted: `tdiag check` plans nothing

    legs = sorted({leg for v in values for leg in v.legs} | set(out))
    symbol = {leg: opt_einsum.get_symbol(i) for i, leg in enumerate(legs)}
    spec = ",".join("".join(symbol[leg] for leg in v.legs) for v in values) + "->" + "".join(symbol[leg] for leg in out)
    name = ctx.names.fresh(var or "t")
    flops = 2 * ctx.numel(legs)
    return ctx.emit(
        Step(
            "contraction",
            Einsum(spec, tuple(values)),
            Value(name, out),
            " · ".join(ctx.show_value(v) for v in values),
            flops=flops,
            inputs=tuple(values),
        )
    )  # type: ignore[return-value]


@functools.lru_cache(maxsize=65536)
def _cheapest_path(equation: str, shapes: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
    """opt_einsum's order of pairwise contractions for `equation` at `shapes`: 'optimal' up to
    OPTIMAL_UP_TO operands ('dp' beyond) or the dynamic program minimizing the largest
    intermediate, whichever costs fewer FLOPs (then the smaller intermediate). Remembered: the
    planner orders the same contraction for every candidate form it prices."""
    import opt_einsum  # loaded when a region is contracted: `tdiag check` plans nothing

    strategies = [
        "optimal" if len(shapes) <= OPTIMAL_UP_TO else "dp",
        opt_einsum.paths.DynamicProgramming(minimize="size"),
    ]
    candidates = []
    for strategy in strategies:
        path, info = opt_einsum.contract_path(equation, *shapes, shapes=True, optimize=strategy)
        candidates.append((int(info.opt_cost), int(info.largest_intermediate), path))
    path = cheapest([(path, (flops, largest)) for flops, largest, path in candidates])
    return tuple(tuple(sorted(p)) for p in path)
