"""Multilinear regions: single-use products are inlined into their consumer and their
factors collected as leaves, each a stored tensor viewed with region legs or a computed value.
Guarantees: one contraction per maximal multilinear region, legs renamed consistently."""

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
    Tensor,
    TensorRef,
    WindowFactor,
    walk,
)
from .constants import constant_value, fill, fold_constants
from .context import Leaf
from .decay import may_be_decay, segment_pairs
from .distribute import distributed_over_boxes
from .forms.causal_product import CausalSite, decide_causal_product
from .legs import all_legs, constant_along, is_scaling, renamed_value, value_leaves
from .literals import unroll_literals
from .positions import computed_slice, positions, sliced
from .program import (
    BATCH,
    BATCH_SIZE,
    CumulativeScan,
    MaskNumbers,
    Operand,
    Permute,
    Reshape,
    Step,
    Value,
    show_legs,
)
from .stabilize import stabilize_exponents

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


class RegionLowering:
    """Collects a multilinear region's factors and contracts them."""

    def is_inlined(self, name: str) -> bool:
        """Single-use multilinear statements (and constant ones) are folded into their consumer."""
        tensor = self.g.tensors[name]
        statement = tensor.statement
        if statement is None or name in self.g.outputs:
            return False
        if isinstance(statement.expr, SoftmaxBox | SumNode):
            return self.uses[name] == 1  # its consumer may fuse it (SDPA, linear-time order, P11)
        if name in self.exp_factors:
            return True  # an exp factor of a normalize box: shifted there (stabilize.py)
        if not isinstance(statement.expr, Contraction | TensorRef):
            return False
        return tensor.is_constant or self.uses[name] == 1

    def lower_region(self, e: Expr, ren: dict[str, tuple[str, ...]], var: str | None, scale: sympy.Expr) -> Value:
        distributed = self.distributed(e)
        if distributed is not None:
            whole = self.trial_cost(lambda: self.contract_region(e, ren, var, scale))
            parts = self.trial_cost(lambda: self._lower(distributed, ren, var, scale))
            if parts < whole:
                if not self.trialing:
                    self.lowered.append(DISTRIBUTED_NOTE)
                return self._lower(distributed, ren, var, scale)  # a sum: lower_sum, then the scale
        return self.contract_region(e, ren, var, scale)

    def distributed(self, e: Expr) -> SumNode | None:
        """`e` distributed over a sum of softmax boxes (distribute.py), where the lowering is not
        inside a softmax's scores (whose shift invariance drops terms of sums)."""
        if self.shift_invariant is not None or self.stabilized is not None:
            return None
        return distributed_over_boxes(e, self.is_folded_box)

    def is_folded_box(self, name: str) -> bool:
        tensor = self.g.tensors.get(name)
        statement = tensor.statement if tensor is not None else None
        return statement is not None and isinstance(statement.expr, SoftmaxBox) and self.is_inlined(name)

    def contract_region(self, e: Expr, ren: dict[str, tuple[str, ...]], var: str | None, scale: sympy.Expr) -> Value:
        """The region's factors collected (a causal factor kept as a triangle, so that
        scan_triangles can take it), then contracted; anything lowered after the collection (a box
        resolved, a form's own collection) sees causal factors as numbers again."""
        leaves: list[Leaf] = []
        with self.scope(lazy_triangles=True):  # collecting the region's own factors
            coefficient = self.collect(e, ren, leaves) * scale
        kept = self.stabilized
        with self.scope(lazy_triangles=False, stabilized=None):
            out = tuple(p for leg in e.legs for p in ren[leg])
            leaves = self.scan_triangles(leaves, out)
            if kept is not None:
                leaves = stabilize_exponents(self, leaves, kept)
            prefix = _prefix_pair(leaves, out)
            if prefix is not None:
                return self.causal_product(*prefix, leaves, out, coefficient, var)
            leaves = [self.triangle_numbers(leaf) for leaf in leaves]
            return self.contract(leaves, out, coefficient, var)

    def causal_product(
        self, query: str, key: str, leaves: list[Leaf], out: tuple[str, ...], coefficient: sympy.Expr, var: str | None
    ) -> Value:
        """A product with a causal(query, key) factor that sums the key: its candidate forms
        (forms/causal_product.py: masked, chunked) weighed by the one model."""
        site = CausalSite(query, key, leaves, out, coefficient)
        return decide_causal_product(self, site, var)  # type: ignore[arg-type]

    def collect(
        self, e: Expr, ren: dict[str, tuple[str, ...]], leaves: list[Leaf], *, expand_powers: bool = False
    ) -> sympy.Expr:
        """Gather the factors of a multilinear region into `leaves`; returns the coefficient.
        With `expand_powers`, an integer power of a contraction becomes that many copies of it."""
        if isinstance(e, Scalar):
            return e.value
        if expand_powers and isinstance(e, ElementwiseMap) and e.name == "pow" and e.params[0].is_Integer:
            coefficient = sympy.Integer(1)
            for _ in range(int(e.params[0])):
                inner = self.with_fresh_legs(ren, sorted(all_legs(e.operand) - set(e.operand.legs)))  # type: ignore[arg-type]
                coefficient *= self.collect(e.operand, inner, leaves, expand_powers=True)  # type: ignore[arg-type]
            return coefficient
        if isinstance(e, Contraction):
            inner = self.with_fresh_legs(ren, e.summed)
            coefficient = e.coefficient
            # a softmax around a product lets no factor drop a constant term: causal(n, m)·(x + 3)
            # is not causal(n, m)·x plus a constant (found by fuzzing, an inlined statement)
            with self.scope(shift_invariant=self.shift_invariant if is_scaling(e) else None):
                for factor in e.factors:
                    coefficient *= self.collect(factor, inner, leaves, expand_powers=expand_powers)
            return coefficient
        if isinstance(e, TensorRef):
            return self.collect_tensor(e, ren, leaves)
        if self.stabilized is not None and isinstance(e, ElementwiseMap) and e.name == "exp":
            with self.scope(stabilized=None):
                argument = self.lower(e.operand, ren)  # type: ignore[arg-type]
            leaves += [Leaf(argument.legs, value=argument, exponent=True), *constant_along(argument.broadcast)]
            return sympy.Integer(1)
        if not isinstance(e, TensorRef):
            constant = constant_value(self, e)
            if constant is not None:
                leaves.append(Leaf(tuple(p for leg in e.legs for p in ren[leg]), constant=constant))
                return sympy.Integer(1)
        if isinstance(e, PositionIndex):
            leaves.append(Leaf(tuple(ren[e.leg]), value=positions(self, tuple(ren[e.leg]))))
            return sympy.Integer(1)
        if isinstance(e, WindowFactor):
            (query,), (key,) = ren[e.query], ren[e.key]
            band = Value(self.window_mask(query, key, e.before, e.after), (query, key))
            leaves.append(Leaf((query, key), value=self.mask_numbers(band, invert=True)))
            return sympy.Integer(1)
        if isinstance(e, CausalFactor):
            (query,), (key,) = ren[e.query], ren[e.key]
            if self.lazy_triangles:  # made numbers after scan_triangles, unless it became a scan
                leaves.append(Leaf((query, key), triangle=(query, key)))
            else:
                leaves.append(Leaf((query, key), value=self.causal_numbers(query, key)))
            return sympy.Integer(1)
        if isinstance(e, SoftmaxBox):
            batch = (BATCH,) if self.is_batched(e) else ()
            leaves.append(Leaf(batch + tuple(p for leg in e.legs for p in ren[leg]), box=(e, ren)))
            return sympy.Integer(1)
        if self.lazy_triangles and self.shift_invariant is None and may_be_decay(e):
            batch = (BATCH,) if self.is_batched(e) else ()
            leaves.append(Leaf(batch + tuple(p for leg in e.legs for p in ren[leg]), decay=(e, ren)))  # type: ignore[arg-type]
            return sympy.Integer(1)
        value = self.lower_nonlinear(e, ren, None)
        leaves.extend(value_leaves(value))
        return sympy.Integer(1)

    def collect_tensor(self, e: TensorRef, ren: dict[str, tuple[str, ...]], leaves: list[Leaf]) -> sympy.Expr:
        tensor = self.g.tensors[e.name]
        axes = tuple(tuple(p for leg in group for p in ren[leg]) for group in e.groups)
        statement = tensor.statement
        if e.is_sliced and statement is not None:
            value = computed_slice(self, statement, e, axes)
            leaves.extend(value_leaves(value))
            return sympy.Integer(1)
        if e.is_sliced:
            value = sliced(self, tensor, e, axes)
            leaves.append(Leaf(value.legs, value=value))
            return sympy.Integer(1)
        if statement is None:
            batch = (BATCH,) if tensor.is_batched else ()
            leaves.append(Leaf(batch + tuple(p for a in axes for p in a), tensor=tensor, view=axes))
            return sympy.Integer(1)
        inner = self.definition_renaming(statement, axes) if self.is_inlined(e.name) else None
        if inner is not None:
            return self.collect(statement.expr, inner, leaves)
        if e.name not in self.values:  # inlined, but this use groups its axes otherwise
            ren = self.identity_renaming(all_legs(statement.expr))
            self.values[e.name] = self.lower(statement.expr, ren, var=statement.target)
        value = self.values[e.name]
        if self.align_definition(statement, axes) is None:
            leaves.extend(value_leaves(self.regrouped(value, statement, axes)))
            return sympy.Integer(1)
        leaves.append(Leaf(self.rename_value_legs(value, statement, axes), value=value))
        leaves.extend(constant_along(self.rename_value_legs(value, statement, axes, sorted(value.broadcast))))
        return sympy.Integer(1)

    def with_fresh_legs(self, ren: dict[str, tuple[str, ...]], legs: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """`ren` with a fresh region leg for each of `legs`, summed inside a sub-expression."""
        inner = dict(ren)
        for leg in legs:
            inner[leg] = tuple(self.new_leg(p) for p in self.expand(leg))
        return inner

    def definition_renaming(
        self, statement: Statement, axes: tuple[tuple[str, ...], ...]
    ) -> dict[str, tuple[str, ...]] | None:
        """The legs of a statement's definition as seen from a use with region legs `axes`: its
        result legs mapped onto them, its summed legs fresh; None where the shapes do not align."""
        mapping = self.align_definition(statement, axes)
        if mapping is None:
            return None
        return self.with_fresh_legs(mapping, sorted(leg for leg in all_legs(statement.expr) if leg not in mapping))

    def align_definition(
        self, statement: Statement, axes: tuple[tuple[str, ...], ...]
    ) -> dict[str, tuple[str, ...]] | None:
        """Map the definition's result legs onto the use's region legs, piece by piece."""
        mapping: dict[str, tuple[str, ...]] = {}
        for group, use in zip(statement.groups, axes, strict=True):
            pieces = [(leg, p) for leg in group for p in self.expand(leg)]
            if len(pieces) != len(use):
                return None
            for (leg, piece), target in zip(pieces, use, strict=True):
                if sympy.simplify(self.g.expand(self.size(piece) - self.size(target))) != 0:
                    return None
                mapping.setdefault(leg, ())
                mapping[leg] = (*mapping[leg], target)
        return mapping

    def regrouped(self, value: Value, statement: Statement, axes: tuple[tuple[str, ...], ...]) -> Value:
        """A computed tensor used with an axis grouped otherwise than its definition has it
        (`E[n (g i) d]` of `E[n h d] = ...`, grouped-query heads): the definition's pieces of each
        axis laid out in order, then reshaped to the use's pieces (a view where the layout
        allows). An axis the value is constant along stays a broadcast leg of the use."""
        order, legs, broadcast = [], [], set()
        for group, use in zip(statement.groups, axes, strict=True):
            pieces = [p for leg in group for p in self.expand(leg)]
            if all(p in value.broadcast for p in pieces):
                broadcast.update(use)
                continue
            order += pieces
            legs += use
        batch = [BATCH] if value.is_batched else []
        order, legs = [*batch, *order], [*batch, *legs]
        if any(p not in value.legs for p in order):
            value = self.materialize(value, tuple(order))
        elif list(value.legs) != order:
            permuted = Value(self.names.fresh(f"{value.var}_laid"), tuple(order))
            permutation = tuple(value.legs.index(p) for p in order)
            step = Step("permute", Permute(value, permutation), permuted, "reorder legs", inputs=(value,))
            value = self.emit(step)  # type: ignore[assignment]
        shape = (BATCH_SIZE,) * len(batch) + self.shape(legs[len(batch) :])
        if shape == (BATCH_SIZE,) * len(batch) + self.shape(order[len(batch) :]):
            return Value(value.var, tuple(legs), frozenset(broadcast))  # only broadcast axes regrouped
        out = Value(self.names.fresh(f"{value.var}_view"), tuple(legs), frozenset(broadcast))
        shown = " ".join(show_legs(legs))
        step = Step("view", Reshape(value, shape), out, f"view {statement.target} with legs {shown}", inputs=(value,))
        return self.emit(step)  # type: ignore[return-value]

    def rename_value_legs(
        self,
        value: Value,
        statement: Statement,
        axes: tuple[tuple[str, ...], ...],
        legs: Iterable[str] | None = None,
    ) -> tuple[str, ...]:
        """The region legs of a computed tensor's axes (or of `legs` of it) at a use with `axes`."""
        mapping = self.align_definition(statement, axes)
        if mapping is None:
            raise TdiagError(
                Diagnostic(
                    f"cannot use {statement.target} with these legs: its axes are split differently",
                    (statement.target_span,),
                )
            )
        rename = {}
        for leg, targets in mapping.items():
            for piece, target in zip(self.expand(leg), targets, strict=True):
                rename[piece] = target
        return tuple(rename.get(leg, leg) for leg in (value.legs if legs is None else legs))

    def is_product(self, e: Expr) -> bool:
        """Is `e` a product of stored or already computed tensors (nothing left to lower)?"""
        if isinstance(e, Scalar):
            return True
        if isinstance(e, Contraction):
            return all(self.is_product(f) for f in e.factors)
        if isinstance(e, TensorRef):
            statement = self.g.tensors[e.name].statement
            return statement is None or not self.is_inlined(e.name) or self.is_product(statement.expr)
        return False

    def is_batched(self, e: Expr) -> bool:
        """Does `e` depend on an input, mask or noise (and so carry the batch)?"""
        for node in walk(e):
            if isinstance(node, TensorRef):
                tensor = self.g.tensors[node.name]
                if tensor.is_batched or (tensor.statement is not None and self.is_batched(tensor.statement.expr)):
                    return True
        return False

    def contract(self, leaves: list[Leaf], out: tuple[str, ...], coefficient: sympy.Expr, var: str | None) -> Value:
        leaves = self.resolve_boxes(leaves, out)
        leaves, out, coefficient = fold_constants(self, leaves, out, coefficient)
        leaves = unroll_literals(self, leaves, out)
        if not leaves:
            value = fill(self, coefficient, tuple(leg for leg in out if leg != BATCH), var)
            return value
        # a value constant along a broadcast leg does not carry it; a leg no factor carries is a
        # broadcast leg of the result if kept, and a factor of its size if summed
        values = [self.leaf_value(leaf) for leaf in leaves]
        values = [Value(v.var, tuple(leg for leg in v.legs if leg not in v.broadcast), v.broadcast) for v in values]
        present = {leg for v in values for leg in v.legs}
        broadcast = frozenset(leg for leg in out if leg not in present and leg != BATCH)
        for leg in {leg for leaf in leaves for leg in leaf.legs} - present - set(out):
            coefficient *= self.size(leg)
        if BATCH in present and BATCH not in out:
            out = (BATCH, *out)
        wanted = tuple(leg for leg in out if leg in present)
        result = self.plan_contraction(values, wanted, coefficient, var)
        return Value(result.var, result.legs, broadcast)

    def triangle_numbers(self, leaf: Leaf) -> Leaf:
        """A causal factor left as a triangle, as the 1s and 0s it multiplies by."""
        if leaf.triangle is None:
            return leaf
        return Leaf(leaf.legs, value=self.causal_numbers(*leaf.triangle))

    def scan_triangles(self, leaves: list[Leaf], out: tuple[str, ...]) -> list[Leaf]:
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
                rewritten = self.scan_triangle(leaf, leaves, out) if leaf.triangle is not None else None
                if rewritten is not None:
                    leaves, changed = rewritten, True
                    break
        return leaves

    def scan_triangle(self, triangle: Leaf, leaves: list[Leaf], out: tuple[str, ...]) -> list[Leaf] | None:
        """`leaves` with `triangle` and the factors carrying its summed leg replaced by their scan,
        or None where the rewrite does not apply (both legs kept, a factor that carries both legs,
        a box or exp factor among those to scan, legs of different sizes). With both legs summed
        the scanned product is summed over the other leg too: Σ_n Σ_{l ≤ n} P[l]."""
        query, key = triangle.triangle  # type: ignore[misc]
        if self.size(query) != self.size(key) and sympy.simplify(self.g.expand(self.size(query) - self.size(key))) != 0:
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
            product = self.contract(carriers, legs, sympy.Integer(1), None)
            scanned = self.prefix_scan(self.expand_broadcast(product, {summed}), summed, reverse)
            if not self.trialing:
                kind = "reverse cumulative sum" if reverse else "cumulative sum"
                self.lowered.append(SCAN_NOTE.format(summed=show_legs([summed])[0], kind=kind))
            return [*rest, *value_leaves(renamed_value(scanned, {summed: kept}))]
        return None

    def prefix_scan(self, value: Value, leg: str, reverse: bool) -> Value:
        """The inclusive cumulative sum of `value` along `leg` (from the end when `reverse`)."""
        name = self.names.fresh("prefix")
        return self.emit(
            Step(
                "scan",
                CumulativeScan(value, "cumsum", value.legs.index(leg), False, reverse),
                Value(name, value.legs, value.broadcast),
                f"cumsum{' reverse' if reverse else ''} along {' '.join(show_legs([leg]))} (a causal triangle)",
                elementwise=self.numel(value.legs),
                inputs=(value,),
            )
        )  # type: ignore[return-value]

    def leaf_value(self, leaf: Leaf) -> Value:
        if leaf.triangle is not None:
            return self.causal_numbers(*leaf.triangle)
        if leaf.decay is not None:
            return self.lower_nonlinear(*leaf.decay, None)
        if leaf.value is not None:
            return Value(leaf.value.var, leaf.legs, leaf.value.broadcast)
        value = self.stored(leaf.tensor, leaf.view)  # type: ignore[arg-type]
        if leaf.tensor.kind == "mask":  # type: ignore[union-attr]
            return self.mask_numbers(value, invert=False)
        return value

    def causal_numbers(self, query: str, key: str) -> Value:
        """causal(query, key) as numbers: 1 where key <= query, 0 above the diagonal."""
        return self.mask_numbers(Value(self.causal_mask(query, key), (query, key)), invert=True)

    def mask_numbers(self, mask: Value, invert: bool) -> Value:
        """A boolean mask (True = attend; `invert` for the causal triangle, True = hidden) as 1s
        and 0s in the forward's dtype, made once per mask."""
        key = ("mask numbers", mask.var, invert)
        if key not in self.memo:
            inputs = [t.name for t in self.g.inputs]
            like = self.input_vars[inputs[0]] if inputs else None
            name = self.names.fresh(f"{mask.var}_numbers")
            out = Value(name, mask.legs)
            self.emit(Step("mask", MaskNumbers(Operand(mask, invert=invert), like), out, "mask as 1 and 0"))
            self.memo[key] = (out, mask.legs)
        value, earlier = self.memo[key]
        return renamed_value(value, dict(zip(earlier, mask.legs, strict=True)))

    def stored(self, tensor: Tensor, view: tuple[tuple[str, ...], ...]) -> Value:
        """A declared tensor seen with region legs, viewed into pieces where an axis is split."""
        base = self.tensor_var(tensor)
        legs = tuple(p for axis in view for p in axis)
        batched = tensor.is_batched
        if all(len(axis) == 1 for axis in view):
            return Value(base, ((BATCH,) if batched else ()) + legs)
        shape = ((BATCH_SIZE,) if batched else ()) + self.shape(legs)
        var = self.names.fresh(f"{tensor.name}_view")
        self.emit(
            Step(
                "view",
                Reshape(Value(base, ()), shape),
                Value(var, ((BATCH,) if batched else ()) + legs),
                f"view {tensor.name} with legs {' '.join(legs)}",
            )
        )
        return Value(var, ((BATCH,) if batched else ()) + legs)

    def tensor_var(self, tensor: Tensor) -> str:
        self.stored_used.add(tensor.name)
        if tensor.name in self.attributes:
            return tensor.name
        return self.input_vars[tensor.name]
