"""Multilinear regions: single-use products are inlined into their consumer and their
factors collected as leaves, each a stored tensor viewed with region legs or a computed value.
Guarantees: one contraction per maximal multilinear region, legs renamed consistently. The
factors a region collects (a tensor, a number, a causal or window factor, a product) have no
lower rule of their own (base.LOWER): they are lowered here, with their region."""

from __future__ import annotations

from collections.abc import Iterable

import sympy

from ..errors import Diagnostic, TdiagError
from ..ir import (
    CausalFactor,
    Contraction,
    ElementwiseMap,
    Expr,
    PositionIndex,
    Scalar,
    SoftmaxBox,
    Statement,
    SumNode,
    TensorRef,
    WindowFactor,
    walk,
)
from .boxes import expand_broadcast, materialize, resolve_boxes
from .constants import constant_value, fill, fold_constants
from .context import Leaf, Lowering
from .contraction import plan_contraction
from .decay import may_be_decay, segment_pairs
from .distribute import distributed_over_boxes
from .leaves import causal_numbers, leaf_value, mask_numbers
from .legs import all_legs, constant_along, is_scaling, renamed_value, value_leaves
from .literals import unroll_literals
from .positions import computed_slice, positions, sliced
from .program import (
    BATCH,
    BATCH_SIZE,
    CumulativeScan,
    Permute,
    Reshape,
    Step,
    Value,
    show_legs,
)
from .stabilize import stabilize_exponents
from .trials import trial_cost

SCAN_NOTE = "a product with a causal triangle summed over {summed} as a {kind} along {summed}: O(N), not N²"


def _prefix_pair(leaves: list[Leaf], out: tuple[str, ...]) -> tuple[str, str] | None:
    """The (query, key) of the one causal factor of a product (a causal triangle, or a decay's
    segment sum, causal by itself) that keeps the query and sums the key, if there is one pair."""
    pairs = {leaf.triangle for leaf in leaves if leaf.triangle is not None}
    pairs |= {pair for leaf in leaves if leaf.decay is not None for pair in segment_pairs(*leaf.decay)}
    if len(pairs) != 1:
        return None
    query, key = pairs.pop()  # type: ignore[misc]
    return (query, key) if query in out and key not in out else None


DISTRIBUTED_NOTE = "a product of a sum of softmax boxes distributed over the sum: one value product per box"


def is_inlined(ctx: Lowering, name: str) -> bool:
    """Single-use multilinear statements (and constant ones) are folded into their consumer."""
    tensor = ctx.g.tensors[name]
    statement = tensor.statement
    if statement is None or name in ctx.g.outputs:
        return False
    if isinstance(statement.expr, SoftmaxBox | SumNode):
        return ctx.uses[name] == 1  # its consumer may fuse it (SDPA, linear-time order, P11)
    if name in ctx.exp_factors:
        return True  # an exp factor of a normalize box: shifted there (stabilize.py)
    if not isinstance(statement.expr, Contraction | TensorRef):
        return False
    return tensor.is_constant or ctx.uses[name] == 1


def lower_region(ctx: Lowering, e: Expr, ren: dict[str, tuple[str, ...]], var: str | None, scale: sympy.Expr) -> Value:
    distributed = distributed_form(ctx, e)
    if distributed is not None:
        whole = trial_cost(ctx, lambda: contract_region(ctx, e, ren, var, scale))
        parts = trial_cost(ctx, lambda: ctx.lower(distributed, ren, var, scale))
        if parts < whole:
            if not ctx.trialing:
                ctx.lowered.append(DISTRIBUTED_NOTE)
            return ctx.lower(distributed, ren, var, scale)  # a sum: lower_sum, then the scale
    return contract_region(ctx, e, ren, var, scale)


def distributed_form(ctx: Lowering, e: Expr) -> SumNode | None:
    """`e` distributed over a sum of softmax boxes (distribute.py), where the lowering is not
    inside a softmax's scores (whose shift invariance drops terms of sums)."""
    if ctx.shift_invariant is not None or ctx.stabilized is not None:
        return None
    return distributed_over_boxes(e, lambda name: is_folded_box(ctx, name))


def is_folded_box(ctx: Lowering, name: str) -> bool:
    tensor = ctx.g.tensors.get(name)
    statement = tensor.statement if tensor is not None else None
    return statement is not None and isinstance(statement.expr, SoftmaxBox) and is_inlined(ctx, name)


def contract_region(
    ctx: Lowering, e: Expr, ren: dict[str, tuple[str, ...]], var: str | None, scale: sympy.Expr
) -> Value:
    """The region's factors collected (a causal factor kept as a triangle, so that
    scan_triangles can take it), then contracted; anything lowered after the collection (a box
    resolved, a form's own collection) sees causal factors as numbers again."""
    leaves: list[Leaf] = []
    with ctx.scope(lazy_triangles=True):  # collecting the region's own factors
        coefficient = collect(ctx, e, ren, leaves) * scale
    kept = ctx.stabilized
    with ctx.scope(lazy_triangles=False, stabilized=None):
        out = tuple(p for leg in e.legs for p in ren[leg])
        leaves = scan_triangles(ctx, leaves, out)
        if kept is not None:
            leaves = stabilize_exponents(ctx, leaves, kept)
        prefix = _prefix_pair(leaves, out)
        if prefix is not None:
            return lower_causal_product(ctx, *prefix, leaves, out, coefficient, var)
        leaves = [triangle_numbers(ctx, leaf) for leaf in leaves]
        return contract(ctx, leaves, out, coefficient, var)


def lower_causal_product(
    ctx: Lowering,
    query: str,
    key: str,
    leaves: list[Leaf],
    out: tuple[str, ...],
    coefficient: sympy.Expr,
    var: str | None,
) -> Value:
    """A product with a causal(query, key) factor that sums the key: its candidate forms
    (forms/causal_product.py: masked, chunked) weighed by the one model, reached through the
    config (the lowering imports no form)."""
    lower = ctx.config.causal_product
    if lower is None:
        raise AssertionError("a causal product reached a lowering whose config has no chooser of its forms")
    return lower(ctx, query, key, leaves, out, coefficient, var)


def collect(
    ctx: Lowering, e: Expr, ren: dict[str, tuple[str, ...]], leaves: list[Leaf], *, expand_powers: bool = False
) -> sympy.Expr:
    """Gather the factors of a multilinear region into `leaves`; returns the coefficient.
    With `expand_powers`, an integer power of a contraction becomes that many copies of it."""
    if isinstance(e, Scalar):
        return e.value
    if expand_powers and isinstance(e, ElementwiseMap) and e.name == "pow" and e.params[0].is_Integer:
        coefficient = sympy.Integer(1)
        for _ in range(int(e.params[0])):
            inner = with_fresh_legs(ctx, ren, sorted(all_legs(e.operand) - set(e.operand.legs)))  # type: ignore[arg-type]
            coefficient *= collect(ctx, e.operand, inner, leaves, expand_powers=True)  # type: ignore[arg-type]
        return coefficient
    if isinstance(e, Contraction):
        inner = with_fresh_legs(ctx, ren, e.summed)
        coefficient = e.coefficient
        # a softmax around a product lets no factor drop a constant term: causal(n, m)·(x + 3)
        # is not causal(n, m)·x plus a constant (found by fuzzing, an inlined statement)
        with ctx.scope(shift_invariant=ctx.shift_invariant if is_scaling(e) else None):
            for factor in e.factors:
                coefficient *= collect(ctx, factor, inner, leaves, expand_powers=expand_powers)
        return coefficient
    if isinstance(e, TensorRef):
        return collect_tensor(ctx, e, ren, leaves)
    if ctx.stabilized is not None and isinstance(e, ElementwiseMap) and e.name == "exp":
        with ctx.scope(stabilized=None):
            argument = ctx.lower(e.operand, ren)  # type: ignore[arg-type]
        leaves += [Leaf(argument.legs, value=argument, exponent=True), *constant_along(argument.broadcast)]
        return sympy.Integer(1)
    if not isinstance(e, TensorRef):
        constant = constant_value(ctx, e)
        if constant is not None:
            leaves.append(Leaf(tuple(p for leg in e.legs for p in ren[leg]), constant=constant))
            return sympy.Integer(1)
    if isinstance(e, PositionIndex):
        leaves.append(Leaf(tuple(ren[e.leg]), value=positions(ctx, tuple(ren[e.leg]))))
        return sympy.Integer(1)
    if isinstance(e, WindowFactor):
        (query,), (key,) = ren[e.query], ren[e.key]
        band = Value(ctx.window_mask(query, key, e.before, e.after), (query, key))
        leaves.append(Leaf((query, key), value=mask_numbers(ctx, band, invert=True)))
        return sympy.Integer(1)
    if isinstance(e, CausalFactor):
        (query,), (key,) = ren[e.query], ren[e.key]
        if ctx.lazy_triangles:  # made numbers after scan_triangles, unless it became a scan
            leaves.append(Leaf((query, key), triangle=(query, key)))
        else:
            leaves.append(Leaf((query, key), value=causal_numbers(ctx, query, key)))
        return sympy.Integer(1)
    if isinstance(e, SoftmaxBox):
        batch = (BATCH,) if is_batched(ctx, e) else ()
        leaves.append(Leaf(batch + tuple(p for leg in e.legs for p in ren[leg]), box=(e, ren)))
        return sympy.Integer(1)
    if ctx.lazy_triangles and ctx.shift_invariant is None and may_be_decay(e):
        batch = (BATCH,) if is_batched(ctx, e) else ()
        leaves.append(Leaf(batch + tuple(p for leg in e.legs for p in ren[leg]), decay=(e, ren)))  # type: ignore[arg-type]
        return sympy.Integer(1)
    value = ctx.lower_nonlinear(e, ren, None)
    leaves.extend(value_leaves(value))
    return sympy.Integer(1)


def collect_tensor(ctx: Lowering, e: TensorRef, ren: dict[str, tuple[str, ...]], leaves: list[Leaf]) -> sympy.Expr:
    tensor = ctx.g.tensors[e.name]
    axes = tuple(tuple(p for leg in group for p in ren[leg]) for group in e.groups)
    statement = tensor.statement
    if e.is_sliced and statement is not None:
        value = computed_slice(ctx, statement, e, axes)
        leaves.extend(value_leaves(value))
        return sympy.Integer(1)
    if e.is_sliced:
        value = sliced(ctx, tensor, e, axes)
        leaves.append(Leaf(value.legs, value=value))
        return sympy.Integer(1)
    if statement is None:
        batch = (BATCH,) if tensor.is_batched else ()
        leaves.append(Leaf(batch + tuple(p for a in axes for p in a), tensor=tensor, view=axes))
        return sympy.Integer(1)
    inner = definition_renaming(ctx, statement, axes) if is_inlined(ctx, e.name) else None
    if inner is not None:
        return collect(ctx, statement.expr, inner, leaves)
    if e.name not in ctx.values:  # inlined, but this use groups its axes otherwise
        ren = ctx.identity_renaming(all_legs(statement.expr))
        ctx.values[e.name] = ctx.lower(statement.expr, ren, var=statement.target)
    value = ctx.values[e.name]
    if align_definition(ctx, statement, axes) is None:
        leaves.extend(value_leaves(regrouped(ctx, value, statement, axes)))
        return sympy.Integer(1)
    leaves.append(Leaf(rename_value_legs(ctx, value, statement, axes), value=value))
    leaves.extend(constant_along(rename_value_legs(ctx, value, statement, axes, sorted(value.broadcast))))
    return sympy.Integer(1)


def with_fresh_legs(ctx: Lowering, ren: dict[str, tuple[str, ...]], legs: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """`ren` with a fresh region leg for each of `legs`, summed inside a sub-expression."""
    inner = dict(ren)
    for leg in legs:
        inner[leg] = tuple(ctx.new_leg(p) for p in ctx.expand(leg))
    return inner


def definition_renaming(
    ctx: Lowering, statement: Statement, axes: tuple[tuple[str, ...], ...]
) -> dict[str, tuple[str, ...]] | None:
    """The legs of a statement's definition as seen from a use with region legs `axes`: its
    result legs mapped onto them, its summed legs fresh; None where the shapes do not align."""
    mapping = align_definition(ctx, statement, axes)
    if mapping is None:
        return None
    return with_fresh_legs(ctx, mapping, sorted(leg for leg in all_legs(statement.expr) if leg not in mapping))


def align_definition(
    ctx: Lowering, statement: Statement, axes: tuple[tuple[str, ...], ...]
) -> dict[str, tuple[str, ...]] | None:
    """Map the definition's result legs onto the use's region legs, piece by piece."""
    mapping: dict[str, tuple[str, ...]] = {}
    for group, use in zip(statement.groups, axes, strict=True):
        pieces = [(leg, p) for leg in group for p in ctx.expand(leg)]
        if len(pieces) != len(use):
            return None
        for (leg, piece), target in zip(pieces, use, strict=True):
            if sympy.simplify(ctx.g.expand(ctx.size(piece) - ctx.size(target))) != 0:
                return None
            mapping.setdefault(leg, ())
            mapping[leg] = (*mapping[leg], target)
    return mapping


def regrouped(ctx: Lowering, value: Value, statement: Statement, axes: tuple[tuple[str, ...], ...]) -> Value:
    """A computed tensor used with an axis grouped otherwise than its definition has it
    (`E[n (g i) d]` of `E[n h d] = ...`, grouped-query heads): the definition's pieces of each
    axis laid out in order, then reshaped to the use's pieces (a view where the layout
    allows). An axis the value is constant along stays a broadcast leg of the use."""
    order, legs, broadcast = [], [], set()
    for group, use in zip(statement.groups, axes, strict=True):
        pieces = [p for leg in group for p in ctx.expand(leg)]
        if all(p in value.broadcast for p in pieces):
            broadcast.update(use)
            continue
        order += pieces
        legs += use
    batch = [BATCH] if value.is_batched else []
    order, legs = [*batch, *order], [*batch, *legs]
    if any(p not in value.legs for p in order):
        value = materialize(ctx, value, tuple(order))
    elif list(value.legs) != order:
        permuted = Value(ctx.names.fresh(f"{value.var}_laid"), tuple(order))
        permutation = tuple(value.legs.index(p) for p in order)
        step = Step("permute", Permute(value, permutation), permuted, "reorder legs", inputs=(value,))
        value = ctx.emit(step)  # type: ignore[assignment]
    shape = (BATCH_SIZE,) * len(batch) + ctx.shape(legs[len(batch) :])
    if shape == (BATCH_SIZE,) * len(batch) + ctx.shape(order[len(batch) :]):
        return Value(value.var, tuple(legs), frozenset(broadcast))  # only broadcast axes regrouped
    out = Value(ctx.names.fresh(f"{value.var}_view"), tuple(legs), frozenset(broadcast))
    shown = " ".join(show_legs(legs))
    step = Step("view", Reshape(value, shape), out, f"view {statement.target} with legs {shown}", inputs=(value,))
    return ctx.emit(step)  # type: ignore[return-value]


def rename_value_legs(
    ctx: Lowering,
    value: Value,
    statement: Statement,
    axes: tuple[tuple[str, ...], ...],
    legs: Iterable[str] | None = None,
) -> tuple[str, ...]:
    """The region legs of a computed tensor's axes (or of `legs` of it) at a use with `axes`."""
    mapping = align_definition(ctx, statement, axes)
    if mapping is None:
        raise TdiagError(
            Diagnostic(
                f"cannot use {statement.target} with these legs: its axes are split differently",
                (statement.target_span,),
            )
        )
    rename = {}
    for leg, targets in mapping.items():
        for piece, target in zip(ctx.expand(leg), targets, strict=True):
            rename[piece] = target
    return tuple(rename.get(leg, leg) for leg in (value.legs if legs is None else legs))


def is_product(ctx: Lowering, e: Expr) -> bool:
    """Is `e` a product of stored or already computed tensors (nothing left to lower)?"""
    if isinstance(e, Scalar):
        return True
    if isinstance(e, Contraction):
        return all(is_product(ctx, f) for f in e.factors)
    if isinstance(e, TensorRef):
        statement = ctx.g.tensors[e.name].statement
        return statement is None or not is_inlined(ctx, e.name) or is_product(ctx, statement.expr)
    return False


def is_batched(ctx: Lowering, e: Expr) -> bool:
    """Does `e` depend on an input, mask or noise (and so carry the batch)?"""
    for node in walk(e):
        if isinstance(node, TensorRef):
            tensor = ctx.g.tensors[node.name]
            if tensor.is_batched or (tensor.statement is not None and is_batched(ctx, tensor.statement.expr)):
                return True
    return False


def contract(
    ctx: Lowering, leaves: list[Leaf], out: tuple[str, ...], coefficient: sympy.Expr, var: str | None
) -> Value:
    leaves = resolve_boxes(ctx, leaves, out)
    leaves, out, coefficient = fold_constants(ctx, leaves, out, coefficient)
    leaves = unroll_literals(ctx, leaves, out)
    if not leaves:
        value = fill(ctx, coefficient, tuple(leg for leg in out if leg != BATCH), var)
        return value
    # a value constant along a broadcast leg does not carry it; a leg no factor carries is a
    # broadcast leg of the result if kept, and a factor of its size if summed
    values = [leaf_value(ctx, leaf) for leaf in leaves]
    values = [Value(v.var, tuple(leg for leg in v.legs if leg not in v.broadcast), v.broadcast) for v in values]
    present = {leg for v in values for leg in v.legs}
    broadcast = frozenset(leg for leg in out if leg not in present and leg != BATCH)
    for leg in {leg for leaf in leaves for leg in leaf.legs} - present - set(out):
        coefficient *= ctx.size(leg)
    if BATCH in present and BATCH not in out:
        out = (BATCH, *out)
    wanted = tuple(leg for leg in out if leg in present)
    result = plan_contraction(ctx, values, wanted, coefficient, var)
    return Value(result.var, result.legs, broadcast)


def triangle_numbers(ctx: Lowering, leaf: Leaf) -> Leaf:
    """A causal factor left as a triangle, as the 1s and 0s it multiplies by."""
    if leaf.triangle is None:
        return leaf
    return Leaf(leaf.legs, value=causal_numbers(ctx, *leaf.triangle))


def scan_triangles(ctx: Lowering, leaves: list[Leaf], out: tuple[str, ...]) -> list[Leaf]:
    """A product with causal(n, l) summed over l, where no other factor carrying l carries n,
    is the prefix sum of the product P of the factors carrying l: Σ_l causal(n, l) P[l] =
    Σ_{l ≤ n} P[l] = cumsum_l(P)[n]. P is contracted first (summing the legs only it has),
    then scanned along l and read with l renamed n: N entries scanned instead of an N×N
    triangle multiplied. Summed over n instead (causal(n, l) with l kept) it is the suffix
    sum Σ_{n ≥ l} P[n], a reverse scan. Each triangle of the region is taken in turn."""
    changed = True
    while changed:
        changed = False
        for leaf in leaves:
            rewritten = scan_triangle(ctx, leaf, leaves, out) if leaf.triangle is not None else None
            if rewritten is not None:
                leaves, changed = rewritten, True
                break
    return leaves


def scan_triangle(ctx: Lowering, triangle: Leaf, leaves: list[Leaf], out: tuple[str, ...]) -> list[Leaf] | None:
    """`leaves` with `triangle` and the factors carrying its summed leg replaced by their scan,
    or None where the rewrite does not apply (both legs kept, a factor that carries both legs,
    a box or exp factor among those to scan, legs of different sizes). With both legs summed
    the scanned product is summed over the other leg too: Σ_n Σ_{l ≤ n} P[l]."""
    query, key = triangle.triangle  # type: ignore[misc]
    if ctx.size(query) != ctx.size(key) and sympy.simplify(ctx.g.expand(ctx.size(query) - ctx.size(key))) != 0:
        return None
    others = [leaf for leaf in leaves if leaf is not triangle]
    for summed, kept, reverse in ((key, query, False), (query, key, True)):
        if summed in out or any(summed in leaf.legs for leaf in others if leaf.triangle is not None):
            continue
        carriers = [leaf for leaf in others if summed in leaf.legs]
        rest = [leaf for leaf in others if summed not in leaf.legs]
        if not carriers or any(kept in leaf.legs or leaf.box or leaf.exponent for leaf in carriers):
            continue
        needed = set(out) | {BATCH} | {leg for leaf in rest for leg in leaf.legs}
        legs = tuple(dict.fromkeys(leg for leaf in carriers for leg in leaf.legs if leg in needed or leg == summed))
        product = contract(ctx, carriers, legs, sympy.Integer(1), None)
        scanned = prefix_scan(ctx, expand_broadcast(ctx, product, {summed}), summed, reverse)
        if not ctx.trialing:
            kind = "reverse cumulative sum" if reverse else "cumulative sum"
            ctx.lowered.append(SCAN_NOTE.format(summed=show_legs([summed])[0], kind=kind))
        return [*rest, *value_leaves(renamed_value(scanned, {summed: kept}))]
    return None


def prefix_scan(ctx: Lowering, value: Value, leg: str, reverse: bool) -> Value:
    """The inclusive cumulative sum of `value` along `leg` (from the end when `reverse`)."""
    name = ctx.names.fresh("prefix")
    return ctx.emit(
        Step(
            "scan",
            CumulativeScan(value, "cumsum", value.legs.index(leg), False, reverse),
            Value(name, value.legs, value.broadcast),
            f"cumsum{' reverse' if reverse else ''} along {' '.join(show_legs([leg]))} (a causal triangle)",
            elementwise=ctx.numel(value.legs),
            inputs=(value,),
        )
    )  # type: ignore[return-value]
