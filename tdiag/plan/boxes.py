"""Softmax and normalize boxes computed as such: content, masks, then the normalization over the
last axes of a layout whose leading legs are the consumer's batch legs.
Guarantees: the box's entries are materialized once, masked entries filled before normalizing."""

from __future__ import annotations

import sympy

from ..ir import (
    POSITION_MASKS,
    CausalMask,
    Reduction,
    SoftmaxBox,
    WindowMask,
)
from .context import Leaf, Lowering
from .program import (
    BATCH,
    Expand,
    MaskFill,
    Materialize,
    Normalize,
    Operand,
    Reshape,
    Softmax,
    Step,
    Value,
    align,
    show_legs,
)


def resolve_boxes(ctx: Lowering, leaves: list[Leaf], out: tuple[str, ...]) -> list[Leaf]:
    """Each box leaf of a region replaced by the candidate form the chooser takes (forms/,
    reached through the config: the lowering imports no form)."""
    chooser = ctx.config.resolve_boxes
    if chooser is None:
        raise AssertionError("a box reached a lowering whose config has no chooser of forms (build.py passes one)")
    return chooser(ctx, leaves, out)


def lower_box(
    ctx: Lowering, e: SoftmaxBox, ren: dict[str, tuple[str, ...]], var: str | None, prefer: set[str] = frozenset()
) -> Value:  # type: ignore[assignment]
    """`prefer`: legs the consumer shares with other factors (its batch legs), laid out first so
    that the consumer's matmul reads the box without a copy."""
    start = len(ctx.target)
    wide = 0 if e.is_exp else 1
    with ctx.wide(wide):
        value = _lower_box(ctx, e, ren, var, prefer)
    if not ctx.trialing:
        ctx.box_segments.append((start, len(ctx.steps) - 1, value.var))
    return value


def _lower_box(
    ctx: Lowering, e: SoftmaxBox, ren: dict[str, tuple[str, ...]], var: str | None, prefer: set[str]
) -> Value:
    scale = e.scale if e.is_exp else sympy.Integer(1)
    normalized = tuple(p for leg in e.normalized for p in ren[leg])
    # a sink breaks the softmax's shift invariance: a term constant along the keys stays
    invariant = frozenset(normalized) if e.is_exp and e.sink is None else None
    shifted = ctx.stabilizations
    with ctx.scope(shift_invariant=invariant, stabilized=kept_by(ctx, e, ren)), ctx.box():
        content = ctx.lower(e.content, ren, None, scale)  # type: ignore[arg-type]
    guard = ctx.stabilizations > shifted
    sink = None
    if e.sink is not None:
        sink = ctx.lower(e.sink, ren, None)
        if BATCH in sink.legs and BATCH not in content.legs:
            batched = materialize(ctx, content, (BATCH, *content.legs))
            content = Value(batched.var, batched.legs, content.broadcast)
    sink_legs = set(sink.legs) if sink is not None else set()
    content = maskable(ctx, content, e, ren, set(normalized) | sink_legs)
    name = ctx.names.fresh(var or ("attention" if e.is_exp else "normalized"))
    masked = content
    for mask in sorted(e.masks, key=lambda m: isinstance(m, POSITION_MASKS)):  # padding first
        masked = apply_mask(ctx, masked, mask, ren, e.is_exp)
    kept = [leg for leg in content.legs if leg not in normalized]
    kept.sort(key=lambda leg: (leg != BATCH, leg not in prefer))
    moved = kept + list(normalized)
    permutation = None
    if list(content.legs) != moved:
        permutation = tuple(content.legs.index(leg) for leg in moved)
    read = Operand(masked, permutation)
    count = len(normalized)
    entries = ctx.numel(content.legs)
    if e.is_exp:
        rows = ctx.numel(kept) if sink is not None else sympy.Integer(0)
        step = Step(
            "softmax",
            Softmax(read, count, ctx.shape(normalized), align(sink, (*kept, normalized[0])) if sink else None),
            Value(name, tuple(moved), content.broadcast),
            f"softmax over {' '.join(show_legs(normalized))}" + (", a sink in each row's denominator" if sink else ""),
            exps=entries + rows,
            divisions=entries,
            entries=entries,
            flops=sympy.Integer(0),
            inputs=(content,) if sink is None else (content, sink),
        )
    else:
        step = Step(
            "normalize",
            Normalize(read, count, ctx.runtime(e.eps), guard),
            Value(name, tuple(moved), content.broadcast),
            f"normalize over {' '.join(show_legs(normalized))}",
            divisions=entries,
            entries=entries,
            elementwise=entries,
            inputs=(content,),
        )
    return ctx.emit(step)  # type: ignore[return-value]


def kept_by(ctx: Lowering, e: SoftmaxBox, ren: dict[str, tuple[str, ...]]) -> frozenset[str] | None:
    """The region legs a normalize box without eps or masks keeps (and the batch): its content's
    exp factors may be shifted along any other leg (stabilize.py); None for other boxes. Under
    a mask the max along a key leg may come from a hidden key (a future one, under a causal
    mask), and every visible term would underflow: wrong rows, not a stable box."""
    if e.is_exp or e.eps != 0 or e.masks:
        return None
    normalized = {p for leg in e.normalized for p in ren[leg]}
    return frozenset(p for leg in e.legs for p in ren[leg] if p not in normalized) | {BATCH}


def position_mask(ctx: Lowering, mask: CausalMask | WindowMask, query: str, key: str) -> str:
    """The boolean [query, key] matrix, True where `mask` hides, between region legs."""
    if isinstance(mask, WindowMask):
        return ctx.window_mask(query, key, mask.before, mask.after)
    return ctx.causal_mask(query, key)


def mask_legs(ctx: Lowering, e: SoftmaxBox | Reduction, ren: dict[str, tuple[str, ...]]) -> set[str]:
    """The region legs the masks of a box or reduction index: its content needs them as real
    axes to be filled."""
    legs: set[str] = set()
    for mask in e.masks:
        if isinstance(mask, POSITION_MASKS):
            legs |= {*ren[mask.query], *ren[mask.key]}
        else:
            legs |= {p for leg in mask.tensor.legs for p in ren[leg]}
    return legs


def apply_mask(ctx: Lowering, content: Value, mask, ren, is_exp: bool, future: str = "-inf") -> Value:
    """The box content with the entries a mask hides filled before normalizing; a causal or
    window mask's with `future` (−inf: a box or a scan always sees its diagonal; a reduction
    passes "lowest", since one over another leg may see no entry at all, docs/language.md)."""
    hidden = hidden_operand(ctx, mask, ren, content.legs)
    masked = Value(ctx.names.fresh("masked"), content.legs, content.broadcast)
    fill = (future if isinstance(mask, POSITION_MASKS) else "lowest") if is_exp else "zero"
    ctx.emit(Step("mask", MaskFill(content, hidden, fill), masked, inputs=(content,)))
    return masked


def maskable(ctx: Lowering, content: Value, e: SoftmaxBox | Reduction, ren, legs: set[str]) -> Value:
    """`content` with real axes along `legs` and every leg the masks of `e` index; repeated over
    the batch when a mask input (which differs per sequence) meets content that does not."""
    content = expand_broadcast(ctx, content, legs | mask_legs(ctx, e, ren))
    if BATCH not in content.legs and any(not isinstance(mask, POSITION_MASKS) for mask in e.masks):
        batched = materialize(ctx, content, (BATCH, *content.legs))
        content = Value(batched.var, batched.legs, content.broadcast)
    return content


def hidden_operand(ctx: Lowering, mask, ren, legs: tuple[str, ...]) -> Operand:
    """A mask read over `legs` as True where it hides an entry."""
    if isinstance(mask, POSITION_MASKS):
        (query,), (key,) = ren[mask.query], ren[mask.key]
        return align(Value(position_mask(ctx, mask, query, key), (query, key)), legs)
    ref = mask.tensor
    mask_legs = tuple(p for leg in ref.legs for p in ren[leg])
    value = Value(ctx.input_vars[ref.name], (BATCH, *mask_legs))
    if len(mask_legs) != len(ref.legs):  # a head leg the region splits (h as h.0 k): a view of it
        whole = Value(value.var, (BATCH, *ref.legs))
        value = Value(ctx.names.fresh(f"{ref.name}_view"), value.legs)
        shape = ctx.shape((BATCH, *mask_legs))
        ctx.emit(
            Step("view", Reshape(whole, shape), value, f"view {ref.name} with legs {' '.join(show_legs(mask_legs))}")
        )
    return align(value, legs, invert=True)


def expand_broadcast(ctx: Lowering, value: Value, legs: set[str]) -> Value:
    """Materialize broadcast legs that an operation needs as real axes."""
    needed = [leg for leg in value.broadcast if leg in legs]
    if not needed:
        return value
    name = ctx.names.fresh("expanded")
    target = (*value.legs, *needed)
    return ctx.emit(
        Step(
            "expand",
            Expand(value, ctx.shape(needed)),
            Value(name, target, value.broadcast - set(needed)),
            "broadcast " + " ".join(show_legs(needed)),
            inputs=(value,),
        )
    )  # type: ignore[return-value]


def materialize(ctx: Lowering, value: Value, legs: tuple[str, ...]) -> Value:
    """`value` expanded to exactly `legs` (a copy), for an operand that must be dense."""
    name = ctx.names.fresh(f"{value.var}_full")
    return ctx.emit(
        Step(
            "expand",
            Materialize(align(value, legs), ctx.shape(legs)),
            Value(name, legs),
            "broadcast " + " ".join(show_legs(leg for leg in legs if leg not in value.legs)),
            inputs=(value,),
        )
    )  # type: ignore[return-value]
