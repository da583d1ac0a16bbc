"""A region's factors as values: a leaf read as the value it stands for (a stored tensor viewed
into region legs, a mask as 1s and 0s, a causal triangle as numbers, a decay lowered when read).
Functions of the lowering's context."""

from __future__ import annotations

from ..ir import Tensor
from .context import Leaf, Lowering
from .legs import renamed_value
from .program import BATCH, BATCH_SIZE, MaskNumbers, Operand, Reshape, Step, Value


def leaf_value(ctx: Lowering, leaf: Leaf) -> Value:
    if leaf.triangle is not None:
        return causal_numbers(ctx, *leaf.triangle)
    if leaf.decay is not None:
        return ctx.lower_nonlinear(*leaf.decay, None)
    if leaf.value is not None:
        return Value(leaf.value.var, leaf.legs, leaf.value.broadcast)
    value = stored(ctx, leaf.tensor, leaf.view)  # type: ignore[arg-type]
    if leaf.tensor.kind == "mask":  # type: ignore[union-attr]
        return mask_numbers(ctx, value, invert=False)
    return value


def causal_numbers(ctx: Lowering, query: str, key: str) -> Value:
    """causal(query, key) as numbers: 1 where key <= query, 0 above the diagonal."""
    return mask_numbers(ctx, Value(ctx.causal_mask(query, key), (query, key)), invert=True)


def mask_numbers(ctx: Lowering, mask: Value, invert: bool) -> Value:
    """A boolean mask (True = attend; `invert` for the causal triangle, True = hidden) as 1s
    and 0s in the forward's dtype, made once per mask."""
    key = ("mask numbers", mask.var, invert)
    if key not in ctx.memo:
        inputs = [t.name for t in ctx.g.inputs]
        like = ctx.input_vars[inputs[0]] if inputs else None
        name = ctx.names.fresh(f"{mask.var}_numbers")
        out = Value(name, mask.legs)
        ctx.emit(Step("mask", MaskNumbers(Operand(mask, invert=invert), like), out, "mask as 1 and 0"))
        ctx.memo[key] = (out, mask.legs)
    value, earlier = ctx.memo[key]
    return renamed_value(value, dict(zip(earlier, mask.legs, strict=True)))


def stored(ctx: Lowering, tensor: Tensor, view: tuple[tuple[str, ...], ...]) -> Value:
    """A declared tensor seen with region legs, viewed into pieces where an axis is split."""
    base = ctx.tensor_var(tensor)
    legs = tuple(p for axis in view for p in axis)
    batched = tensor.is_batched
    if all(len(axis) == 1 for axis in view):
        return Value(base, ((BATCH,) if batched else ()) + legs)
    shape = ((BATCH_SIZE,) if batched else ()) + ctx.shape(legs)
    var = ctx.names.fresh(f"{tensor.name}_view")
    ctx.emit(
        Step(
            "view",
            Reshape(Value(base, ()), shape),
            Value(var, ((BATCH,) if batched else ()) + legs),
            f"view {tensor.name} with legs {' '.join(legs)}",
        )
    )
    return Value(var, ((BATCH,) if batched else ()) + legs)
