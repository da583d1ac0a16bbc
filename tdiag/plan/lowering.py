"""Contraction planning: DesignGraph + sizes -> Plan, a list of Steps over named values that
codegen turns into PyTorch and cost turns into formulas (so the two cannot disagree).

Invariants the Plan keeps:
- Every maximal multilinear region (single-use products inlined into their consumer, up to the
  softmax boxes, maps and sum nodes around them) is one contraction, ordered by opt_einsum for
  the sizes the module is built with ('optimal' up to 5 operands, 'dp' beyond).
- Identity and all-ones constants never reach a Step: identities merge the legs they join,
  all-ones drop out (a leg they alone carried becomes a broadcast leg or a factor of its size),
  so THSA with C = I_H ⊗ J_D costs what MHSA costs (Tuformer Prop. 1), and a box whose content
  is constant along a leg is computed without it (skip-right and single-head, spec §3.4).
- A leg that a Kronecker-structured definition views as (h d) is split into those pieces in the
  whole design, head-major, so the structure is visible to the contraction.
- The leading batch dims are flattened into one leg, BATCH, on entry and restored on exit."""

from __future__ import annotations

import contextlib
import functools
import itertools
import keyword
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import opt_einsum
import sympy

from ..design import OBJECTIVES
from ..errors import Diagnostic, TdiagError
from ..graph import DesignGraph
from ..ir import (
    ONE,
    CausalMask,
    Contraction,
    ElementwiseMap,
    Expr,
    PaddingMask,
    Quotient,
    Reduction,
    Scalar,
    SoftmaxBox,
    SquaredDistance,
    Statement,
    SumNode,
    Tensor,
    TensorRef,
    walk,
)
from .program import (
    BATCH,
    BATCH_SIZE,
    Attention,
    Binary,
    BufferUpdate,
    ChunkCount,
    Einsum,
    Elementwise,
    Expand,
    JoinChunks,
    Map,
    MaskFill,
    Materialize,
    Matmul,
    Normalize,
    Operand,
    Permute,
    Plan,
    PrefixSum,
    Ratio,
    Reduce,
    Reshape,
    Scale,
    Softmax,
    SplitChunks,
    Step,
    SumAxes,
    Triangle,
    Value,
    VisibleMask,
    show_legs,
)

OPTIMAL_UP_TO = 5
RESERVED = set(keyword.kwlist) | {"self", "torch", "F", "math", "hashlib", "nn", "inputs", "masks", "batch_shape"}


# ---- leaves of a multilinear region ----------------------------------------------------------


@dataclass
class _Leaf:
    """A factor of a region: a stored tensor (viewed into region legs) or a computed Value."""

    legs: tuple[str, ...]
    tensor: Tensor | None = None
    value: Value | None = None
    view: tuple[tuple[str, ...], ...] = ()  # for stored tensors: region legs of each axis
    box: tuple[SoftmaxBox, dict[str, tuple[str, ...]]] | None = None  # a box its consumer may fuse


class _Names:
    """Python variable names for the generated code: .td names where possible, fresh otherwise."""

    def __init__(self, taken: Iterable[str]):
        self.used = set(RESERVED) | set(taken)
        self.counter = itertools.count()

    def fresh(self, stem: str) -> str:
        stem = stem if stem.isidentifier() else "t"
        name = stem
        while name in self.used:
            name = f"{stem}_{next(self.counter)}"
        self.used.add(name)
        return name


class _Lowering:
    """Walks the design graph once, emitting Steps."""

    def __init__(self, graph: DesignGraph, sizes: Mapping[str, int], objective: str = "flops"):
        self.g = graph
        self.objective = objective
        self.sizes = dict(sizes)
        self.steps: list[Step] = []
        self.attributes = {t.name for t in graph.tensors.values() if t.kind in ("param", "const", "buffer")}
        self.names = _Names([*graph.sizes, *self.attributes])
        self.values: dict[str, Value] = {}
        self.uses = _count_uses(graph)
        self.splits = _leg_splits(graph, self.uses)
        self.leg_sizes: dict[str, sympy.Expr] = {BATCH: BATCH_SIZE}
        for name, leg in graph.legs.items():
            self.leg_sizes[name] = leg.size
            for piece, size in self.splits.get(name, ()):
                self.leg_sizes[piece] = size
        self.fresh_legs = itertools.count()
        self.known = {graph.sizes[k].symbol: v for k, v in graph.size_values().items()}
        self.target: list[Step] = self.steps
        self.input_vars = {
            t.name: self.names.fresh(t.name) for t in graph.tensors.values() if t.kind in ("input", "mask", "random")
        }
        self.causal_masks: dict[tuple[sympy.Expr, sympy.Expr], str] = {}
        self.stored_used: set[str] = set()
        self.lowered: list[str] = []
        self.box_segments: list[tuple[int, int, str]] = []  # (first step, box step, box value)
        # the normalized legs of the softmax whose argument the current expression is added into:
        # a term constant along them shifts every row equally and changes nothing (softmax(x + c))
        self.shift_invariant: frozenset[str] | None = None
        self.box_depth = 0  # > 0 while a softmax box's argument is being computed
        self.memo: dict[tuple, tuple[Value, tuple[str, ...]]] = {}  # nonlinear values of the current target
        self.chunk_counts: dict[tuple[sympy.Expr, int], sympy.Symbol] = {}  # (extent, C) -> ⌈N / C⌉
        self.chunk_values: dict[sympy.Symbol, sympy.Integer] = {}  # ... at the planned sizes
        self.chunk_sizes: dict[sympy.Symbol, sympy.Expr] = {}  # ... as N / C in cost formulas
        self.chunk_pairs: dict[tuple[str, str], tuple[str, str, str, int]] = {}

    # -- helpers --
    def size(self, leg: str) -> sympy.Expr:
        return self.leg_sizes[leg]

    def number(self, leg: str) -> int:
        value = self.g.evaluate(self.size(leg).xreplace(self.chunk_values), **self.sizes)
        value = value.xreplace({BATCH_SIZE: self.sizes.get("B", 1)})
        return int(value)

    def numel(self, legs: Iterable[str]) -> sympy.Expr:
        return sympy.Mul(*(self.size(leg) for leg in legs))

    def runtime(self, expr: sympy.Expr) -> sympy.Expr:
        """A size or scalar with every size known at build time replaced by its number."""
        return self.g.expand(expr).xreplace(self.known)

    def shape(self, legs: Iterable[str]) -> tuple[sympy.Expr, ...]:
        """The run-time sizes of `legs`, as the forward computes them."""
        return tuple(self.runtime(self.size(leg)) for leg in legs)

    def expand(self, leg: str) -> tuple[str, ...]:
        return tuple(p for p, _ in self.splits[leg]) if leg in self.splits else (leg,)

    def new_leg(self, leg: str, size: sympy.Expr | None = None) -> str:
        """A fresh region leg named after `leg`, of its size or of `size`."""
        name = f"{leg}'{next(self.fresh_legs)}"
        self.leg_sizes[name] = self.size(leg) if size is None else size
        return name

    def emit(self, step: Step) -> Value | None:
        step.in_box = step.in_box or self.box_depth > 0
        self.target.append(step)
        return step.out

    def show_value(self, value: Value) -> str:
        var = f"self.{value.var}" if value.var in self.attributes else value.var
        return f"{var}[{' '.join(show_legs(value.legs))}]"

    def identity_renaming(self, legs: Iterable[str]) -> dict[str, tuple[str, ...]]:
        return {leg: self.expand(leg) for leg in legs}

    # -- statements --
    def lower_design(self) -> None:
        for statement in self.g.statements:
            if self.is_inlined(statement.target):
                continue
            ren = self.identity_renaming(_all_legs(statement.expr))
            value = self.lower(statement.expr, ren, var=statement.target)
            self.values[statement.target] = value

    def is_inlined(self, name: str) -> bool:
        """Single-use multilinear statements (and constant ones) are folded into their consumer."""
        tensor = self.g.tensors[name]
        statement = tensor.statement
        if statement is None or name in self.g.outputs:
            return False
        if isinstance(statement.expr, SoftmaxBox | SumNode):
            return self.uses[name] == 1  # its consumer may fuse it (SDPA, linear-time order, P11)
        if not isinstance(statement.expr, Contraction | TensorRef):
            return False
        return tensor.is_constant or self.uses[name] == 1

    # -- expressions --
    def lower(self, e: Expr, ren: dict[str, tuple[str, ...]], var: str | None = None, scale: sympy.Expr = ONE) -> Value:
        """Lower expression `e` whose legs are renamed by `ren` into region legs."""
        context = self.shift_invariant
        if not (isinstance(e, SumNode | SquaredDistance) or _is_scaling(e)):
            self.shift_invariant = None
        try:
            return self._lower(e, ren, var, scale)
        finally:
            self.shift_invariant = context

    def _lower(self, e: Expr, ren: dict[str, tuple[str, ...]], var: str | None, scale: sympy.Expr) -> Value:
        if isinstance(e, Contraction | TensorRef | Scalar):
            return self.lower_region(e, ren, var, scale)
        value = self.lower_nonlinear(e, ren, var)
        if scale != 1:
            value = self.scale(value, scale)
        return value

    def lower_nonlinear(self, e: Expr, ren: dict[str, tuple[str, ...]], var: str | None) -> Value:
        """Each nonlinear sub-expression is computed once: a repeat (the same map of the same
        tensors, whatever its legs are called in the region) reads the earlier value."""
        return self.memoized(e, ren, lambda: self._lower_nonlinear(e, ren, var))

    def memoized(self, e: Expr, ren: dict[str, tuple[str, ...]], build) -> Value:
        legs = tuple(p for leg in sorted(e.legs) for p in ren[leg])
        shift = None  # which of its legs a softmax around it normalizes: sums may drop terms by it
        if self.shift_invariant is not None and isinstance(e, SumNode | SquaredDistance):
            shift = frozenset(k for k, p in enumerate(legs) if p in self.shift_invariant)
        pattern = tuple(legs.index(p) for p in legs)
        key = (e, tuple(len(ren[leg]) for leg in sorted(e.legs)), pattern, shift)
        if key in self.memo:
            value, earlier = self.memo[key]
            return _renamed(value, dict(zip(earlier, legs, strict=True)))
        value = build()
        self.memo[key] = (value, legs)
        return value

    def _lower_nonlinear(self, e: Expr, ren: dict[str, tuple[str, ...]], var: str | None) -> Value:
        if isinstance(e, SoftmaxBox):
            return self.lower_box(e, ren, var)
        if isinstance(e, ElementwiseMap):
            return self.lower_map(e, ren, var)
        if isinstance(e, Reduction):
            return self.lower_reduction(e, ren, var)
        if isinstance(e, SumNode):
            return self.lower_sum(e, ren, var)
        if isinstance(e, Quotient):
            return self.lower_quotient(e, ren, var)
        if isinstance(e, SquaredDistance):
            return self.lower_distance(e, ren, var)
        raise AssertionError(f"cannot lower {type(e).__name__}")

    # -- multilinear regions --
    def lower_region(self, e: Expr, ren: dict[str, tuple[str, ...]], var: str | None, scale: sympy.Expr) -> Value:
        leaves: list[_Leaf] = []
        coefficient = self.collect(e, ren, leaves) * scale
        out = tuple(p for leg in e.legs for p in ren[leg])
        return self.contract(leaves, out, coefficient, var)

    def collect(
        self, e: Expr, ren: dict[str, tuple[str, ...]], leaves: list[_Leaf], *, expand_powers: bool = False
    ) -> sympy.Expr:
        """Gather the factors of a multilinear region into `leaves`; returns the coefficient.
        With `expand_powers`, an integer power of a contraction becomes that many copies of it."""
        if isinstance(e, Scalar):
            return e.value
        if expand_powers and isinstance(e, ElementwiseMap) and e.name == "pow" and e.params[0].is_Integer:
            coefficient = sympy.Integer(1)
            for _ in range(int(e.params[0])):
                inner = self.with_fresh_legs(ren, _all_legs(e.operand) - set(e.operand.legs))  # type: ignore[arg-type]
                coefficient *= self.collect(e.operand, inner, leaves, expand_powers=True)  # type: ignore[arg-type]
            return coefficient
        if isinstance(e, Contraction):
            inner = self.with_fresh_legs(ren, e.summed)
            coefficient = e.coefficient
            for factor in e.factors:
                coefficient *= self.collect(factor, inner, leaves, expand_powers=expand_powers)
            return coefficient
        if isinstance(e, TensorRef):
            return self.collect_tensor(e, ren, leaves)
        if isinstance(e, SoftmaxBox):
            batch = (BATCH,) if self.is_batched(e) else ()
            leaves.append(_Leaf(batch + tuple(p for leg in e.legs for p in ren[leg]), box=(e, ren)))
            return sympy.Integer(1)
        value = self.lower_nonlinear(e, ren, None)
        leaves.append(_Leaf(value.legs, value=value))
        return sympy.Integer(1)

    def collect_tensor(self, e: TensorRef, ren: dict[str, tuple[str, ...]], leaves: list[_Leaf]) -> sympy.Expr:
        tensor = self.g.tensors[e.name]
        axes = tuple(tuple(p for leg in group for p in ren[leg]) for group in e.groups)
        statement = tensor.statement
        if statement is None:
            batch = (BATCH,) if tensor.is_batched else ()
            leaves.append(_Leaf(batch + tuple(p for a in axes for p in a), tensor=tensor, view=axes))
            return sympy.Integer(1)
        inner = self.definition_renaming(statement, axes) if self.is_inlined(e.name) else None
        if inner is not None:
            return self.collect(statement.expr, inner, leaves)
        value = self.values[e.name]
        leaves.append(_Leaf(self.rename_value_legs(value, statement, axes), value=value))
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
        return self.with_fresh_legs(mapping, [leg for leg in _all_legs(statement.expr) if leg not in mapping])

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

    def rename_value_legs(
        self, value: Value, statement: Statement, axes: tuple[tuple[str, ...], ...]
    ) -> tuple[str, ...]:
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
        return tuple(rename.get(leg, leg) for leg in value.legs)

    # -- folding constants, then planning the contraction --
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

    def contract(self, leaves: list[_Leaf], out: tuple[str, ...], coefficient: sympy.Expr, var: str | None) -> Value:
        leaves = self.resolve_boxes(leaves, out)
        leaves, out, coefficient = self.fold_constants(leaves, out, coefficient)
        if not leaves:
            raise TdiagError(Diagnostic("a statement computes a constant only; nothing depends on an input"))
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

    def fold_constants(self, leaves: list[_Leaf], out: tuple[str, ...], coefficient: sympy.Expr):
        """Identity constants merge the legs they join; fills and all-ones become a coefficient."""
        parent: dict[str, str] = {}

        def find(leg: str) -> str:
            while parent.get(leg, leg) != leg:
                leg = parent[leg]
            return leg

        kept: list[_Leaf] = []
        for leaf in leaves:
            tensor = leaf.tensor
            if tensor is None or tensor.kind != "const" or tensor.init is None:
                kept.append(leaf)
                continue
            init = tensor.init
            if init.name in ("ones", "zeros", "fill"):
                value = {"ones": sympy.Integer(1), "zeros": sympy.Integer(0)}.get(init.name)
                coefficient *= value if value is not None else sympy.sympify(init.param("value"))
                continue
            roots = {find(leg) for leg in leaf.legs}
            if init.name == "identity" and len([r for r in roots if r in out]) <= 1:
                coefficient *= sympy.sympify(init.param("scale", sympy.Integer(1)))
                anchor = next((r for r in roots if r in out), sorted(roots)[0])
                for root in roots:
                    parent[root] = anchor
                parent.setdefault(anchor, anchor)
                continue
            kept.append(leaf)
        if not parent:
            return kept, out, coefficient
        renamed = [
            _Leaf(
                tuple(find(leg) for leg in leaf.legs),
                leaf.tensor,
                leaf.value,
                tuple(tuple(find(leg) for leg in a) for a in leaf.view),
            )
            for leaf in kept
        ]
        return renamed, tuple(find(leg) for leg in out), coefficient

    def leaf_value(self, leaf: _Leaf) -> Value:
        if leaf.value is not None:
            return Value(leaf.value.var, leaf.legs, leaf.value.broadcast)
        return self.stored(leaf.tensor, leaf.view)  # type: ignore[arg-type]

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
        if tensor.kind in ("param", "const", "buffer"):
            return tensor.name
        return self.input_vars[tensor.name]

    # -- the contraction order --
    def plan_contraction(
        self, values: list[Value], out: tuple[str, ...], coefficient: sympy.Expr, var: str | None
    ) -> Value:
        if coefficient != 1:
            values, coefficient = self.place_coefficient(values, out, coefficient)
        if len(values) == 1:
            result = self.reduce_single(values[0], out, var)
        else:
            result = self.pairwise_steps(values, out, var)
        if coefficient != 1:
            result = self.scale(result, coefficient, var)
        return result

    def place_coefficient(self, values: list[Value], out: tuple[str, ...], coefficient: sympy.Expr):
        """Multiply the smallest operand by the coefficient (a softmax scale lands on Q, not on QKᵀ)."""
        sizes = [self.numel_number(v.legs) for v in values]
        smallest = min(range(len(values)), key=lambda i: sizes[i])
        if sizes[smallest] <= self.numel_number(out):
            values = list(values)
            values[smallest] = self.scale(values[smallest], coefficient)
            return values, sympy.Integer(1)
        return values, coefficient

    def numel_number(self, legs: Iterable[str]) -> int:
        total = 1
        for leg in legs:
            total *= self.number(leg)
        return total

    def scale(self, value: Value, coefficient: sympy.Expr, var: str | None = None) -> Value:
        name = self.names.fresh(var or "scaled")
        return self.emit(
            Step(
                "scale",
                Scale(value, self.runtime(coefficient)),
                Value(name, value.legs, value.broadcast),
                f"× {coefficient}",
                elementwise=self.numel(value.legs),
                inputs=(value,),
            )
        )  # type: ignore[return-value]

    def reduce_single(self, value: Value, out: tuple[str, ...], var: str | None) -> Value:
        summed = tuple(leg for leg in value.legs if leg not in out)
        if not summed:
            return value
        name = self.names.fresh(var or "summed")
        dims = tuple(value.legs.index(leg) for leg in summed)
        legs = tuple(leg for leg in value.legs if leg in out)
        return self.emit(
            Step(
                "sum",
                SumAxes(value, dims),
                Value(name, legs),
                f"Σ over {' '.join(show_legs(summed))}",
                summed,
                flops=self.numel(value.legs),
                inputs=(value,),
            )
        )  # type: ignore[return-value]

    def pairwise_steps(self, values: list[Value], out: tuple[str, ...], var: str | None) -> Value:
        path = self.contraction_path(values, out)
        operands = list(values)
        for k, step in enumerate(path):
            chosen = [operands[i] for i in step]
            rest = [v for n, v in enumerate(operands) if n not in step]
            needed = set(out) | {leg for v in rest for leg in v.legs}
            last = k == len(path) - 1
            result = chosen[0]
            if len(chosen) == 1:  # a leg only this operand has: summed on its own
                result = self.reduce_single(result, tuple(leg for leg in result.legs if leg in needed), None)
            for n, other in enumerate(chosen[1:], start=2):
                later = {leg for v in chosen[n:] for leg in v.legs}
                result = self.pairwise(result, other, needed | later, var if last and n == len(chosen) else None)
            operands = [*rest, result]
        (result,) = operands
        if len(values) > 1 and set(result.legs) != set(out):
            result = self.reduce_single(result, out, var)
        return result

    def contraction_path(self, values: list[Value], out: tuple[str, ...]) -> list[tuple[int, ...]]:
        legs = sorted({leg for v in values for leg in v.legs} | set(out))
        symbol = {leg: opt_einsum.get_symbol(i) for i, leg in enumerate(legs)}
        equation = (
            ",".join("".join(symbol[leg] for leg in v.legs) for v in values)
            + "->"
            + "".join(symbol[leg] for leg in out)
        )
        shapes = [tuple(self.number(leg) for leg in v.legs) for v in values]
        strategies = [
            "optimal" if len(values) <= OPTIMAL_UP_TO else "dp",
            opt_einsum.paths.DynamicProgramming(minimize="size"),
        ]
        candidates = []
        for strategy in strategies:
            path, info = opt_einsum.contract_path(equation, *shapes, shapes=True, optimize=strategy)
            candidates.append((int(info.opt_cost), int(info.largest_intermediate), path))
        _, _, path = min(candidates, key=lambda c: (c[0], c[1]))  # fewest FLOPs, then the smaller intermediate
        return [tuple(sorted(p)) for p in path]

    def pairwise(self, a: Value, b: Value, needed: set[str], var: str | None) -> Value:
        """One pairwise contraction, computed once per emit target (the chunks of a causal
        contraction and its numerator and denominator share their key-side products)."""
        if a.broadcast or b.broadcast:
            return self.matmul(a, b, needed, var)
        order = tuple(dict.fromkeys(a.legs + b.legs))
        index = {leg: k for k, leg in enumerate(order)}
        key = (
            "pairwise",
            *((v.var, tuple(index[leg] for leg in v.legs)) for v in (a, b)),
            frozenset(index[leg] for leg in order if leg in needed),
        )
        if key not in self.memo:
            self.memo[key] = (self.matmul(a, b, needed, var), order)
        value, earlier = self.memo[key]
        return _renamed(value, dict(zip(earlier, order, strict=True)))

    def matmul(self, a: Value, b: Value, needed: set[str], var: str | None) -> Value:
        """One pairwise contraction as a matmul: (batch, a's kept legs, summed) @ (batch, summed,
        b's kept legs). Legs that one side alone has and nobody needs are summed first."""
        a = self.reduce_single(a, tuple(leg for leg in a.legs if leg in needed or leg in b.legs), None)
        b = self.reduce_single(b, tuple(leg for leg in b.legs if leg in needed or leg in a.legs), None)
        if BATCH in b.legs and BATCH not in a.legs:
            a, b = b, a
        if len(set(a.legs)) != len(a.legs) or len(set(b.legs)) != len(b.legs):
            out = tuple(leg for leg in dict.fromkeys(a.legs + b.legs) if leg in needed)
            return self.einsum_step([a, b], out, var)
        batch = [leg for leg in a.legs if leg in b.legs and leg in needed]
        summed = [leg for leg in a.legs if leg in b.legs and leg not in needed]
        left = [leg for leg in a.legs if leg not in b.legs]
        right = [leg for leg in b.legs if leg not in a.legs]
        legs = tuple(batch + left + right)
        if batch:
            a_operand = self.arrange(a, [batch, left, summed])
            b_operand = self.arrange(b, [batch, summed, right])
            natural = [batch, left, right]
        else:
            a_operand = self.arrange(a, [*[[leg] for leg in left], summed])
            b_operand = self.arrange(b, [summed, right])
            natural = [*[[leg] for leg in left], right]
        shape = None
        if [g for g in natural if g] != [[leg] for leg in legs] or any(not g for g in natural[-1:]):
            shape = self.shape(legs)
        name = self.names.fresh(var or "t")
        flops = 2 * self.numel(batch + left + summed + right)
        description = f"{self.show_value(a)} · {self.show_value(b)} -> [{' '.join(show_legs(legs))}]"
        step = Step(
            "contraction",
            Matmul(a_operand, b_operand, shape),
            Value(name, legs),
            description,
            tuple(summed),
            flops,
            inputs=(a, b),
        )
        return self.emit(step)  # type: ignore[return-value]

    def arrange(self, value: Value, groups: list[list[str]]) -> Operand:
        """`value` permuted to the legs of `groups` in order, one axis per group."""
        order = [leg for g in groups for leg in g]
        permutation = None
        if list(value.legs) != order:
            permutation = tuple(value.legs.index(leg) for leg in order)
        if all(len(g) == 1 for g in groups):
            return Operand(value, permutation)
        return Operand(value, permutation, tuple(self.group_size(g) for g in groups))

    def group_size(self, group: Iterable[str]) -> sympy.Expr:
        return self.runtime(sympy.Mul(*(self.size(leg) for leg in group)))

    def einsum_step(self, values: list[Value], out: tuple[str, ...], var: str | None) -> Value:
        """The fallback for what a matmul cannot say (a leg repeated within one operand)."""
        legs = sorted({leg for v in values for leg in v.legs} | set(out))
        symbol = {leg: opt_einsum.get_symbol(i) for i, leg in enumerate(legs)}
        spec = (
            ",".join("".join(symbol[leg] for leg in v.legs) for v in values)
            + "->"
            + "".join(symbol[leg] for leg in out)
        )
        name = self.names.fresh(var or "t")
        flops = 2 * self.numel(legs)
        return self.emit(
            Step(
                "contraction",
                Einsum(spec, tuple(values)),
                Value(name, out),
                " · ".join(self.show_value(v) for v in values),
                flops=flops,
                inputs=tuple(values),
            )
        )  # type: ignore[return-value]

    # -- boxes --
    def lower_box(
        self, e: SoftmaxBox, ren: dict[str, tuple[str, ...]], var: str | None, prefer: set[str] = frozenset()
    ) -> Value:  # type: ignore[assignment]
        """`prefer`: legs the consumer shares with other factors (its batch legs), laid out first so
        that the consumer's matmul reads the box without a copy."""
        start = len(self.target)
        value = self._lower_box(e, ren, var, prefer)
        if self.target is self.steps:
            self.box_segments.append((start, len(self.steps) - 1, value.var))
        return value

    def _lower_box(self, e: SoftmaxBox, ren: dict[str, tuple[str, ...]], var: str | None, prefer: set[str]) -> Value:
        scale = e.scale if e.is_exp else sympy.Integer(1)
        normalized = tuple(p for leg in e.normalized for p in ren[leg])
        context, self.shift_invariant = self.shift_invariant, frozenset(normalized) if e.is_exp else None
        self.box_depth += 1
        try:
            content = self.lower(e.content, ren, None, scale)  # type: ignore[arg-type]
        finally:
            self.shift_invariant = context
            self.box_depth -= 1
        content = self.expand_broadcast(content, set(normalized))
        name = self.names.fresh(var or ("attention" if e.is_exp else "normalized"))
        masked = content
        for mask in e.masks:
            masked = self.apply_mask(masked, mask, ren, e.is_exp)
        kept = [leg for leg in content.legs if leg not in normalized]
        kept.sort(key=lambda leg: (leg != BATCH, leg not in prefer))
        moved = kept + list(normalized)
        permutation = None
        if list(content.legs) != moved:
            permutation = tuple(content.legs.index(leg) for leg in moved)
        read = Operand(masked, permutation)
        count = len(normalized)
        entries = self.numel(content.legs)
        if e.is_exp:
            step = Step(
                "softmax",
                Softmax(read, count, self.shape(normalized)),
                Value(name, tuple(moved), content.broadcast),
                f"softmax over {' '.join(show_legs(normalized))}",
                exps=entries,
                divisions=entries,
                entries=entries,
                flops=sympy.Integer(0),
                inputs=(content,),
            )
        else:
            step = Step(
                "normalize",
                Normalize(read, count, self.runtime(e.eps)),
                Value(name, tuple(moved), content.broadcast),
                f"normalize over {' '.join(show_legs(normalized))}",
                divisions=entries,
                entries=entries,
                elementwise=entries,
                inputs=(content,),
            )
        return self.emit(step)  # type: ignore[return-value]

    def causal_mask(self, query: str, key: str) -> str:
        """The forward's boolean [query, key] triangle (True above the diagonal: the future), one per
        pair of sizes, built at entry."""
        sizes = (self.size(query), self.size(key))
        if sizes not in self.causal_masks:
            self.causal_masks[sizes] = self.names.fresh("causal")
        return self.causal_masks[sizes]

    def apply_mask(self, content: Value, mask, ren, is_exp: bool) -> Value:
        """The box content with the entries a mask hides filled before normalizing."""
        if isinstance(mask, CausalMask):
            (query,), (key,) = ren[mask.query], ren[mask.key]
            hidden = self.align(Value(self.causal_mask(query, key), (query, key)), content.legs)
        else:
            ref = mask.tensor
            legs = tuple(p for leg in ref.legs for p in ren[leg])
            hidden = self.align(Value(self.input_vars[ref.name], (BATCH, *legs)), content.legs, invert=True)
        masked = Value(self.names.fresh("masked"), content.legs, content.broadcast)
        fill = "lowest" if is_exp else "zero"
        self.emit(Step("mask", MaskFill(content, hidden, fill), masked, inputs=(content,)))
        return masked

    def align(self, value: Value, target: tuple[str, ...], invert: bool = False) -> Operand:
        """Read `value` so it broadcasts against axes `target`."""
        legs = value.legs
        present = [leg for leg in target if leg in legs]
        permutation = None
        if list(legs) != present:
            permutation = tuple(legs.index(leg) for leg in present)
        if present == list(target):
            return Operand(value, permutation, invert=invert)
        index = tuple(leg in legs for leg in target)
        return Operand(value, permutation, index=index, invert=invert)

    def expand_broadcast(self, value: Value, legs: set[str]) -> Value:
        """Materialize broadcast legs that an operation needs as real axes."""
        needed = [leg for leg in value.broadcast if leg in legs]
        if not needed:
            return value
        name = self.names.fresh("expanded")
        target = (*value.legs, *needed)
        return self.emit(
            Step(
                "expand",
                Expand(value, self.shape(needed)),
                Value(name, target, value.broadcast - set(needed)),
                "broadcast " + " ".join(needed),
                inputs=(value,),
            )
        )  # type: ignore[return-value]

    # -- maps, reductions, sums --
    def owns_parameter(self, e: Expr) -> bool:
        """Does `e` hold a parameter nothing else uses? Such a term is kept even where it cannot
        matter (GFiSH's b2, T11), so every parameter gets a gradient and DDP needs no
        find_unused_parameters."""
        for node in walk(e):
            if isinstance(node, TensorRef) and self.g.tensors[node.name].kind == "param" and self.uses[node.name] == 1:
                return True
        return False

    def lower_map(self, e: ElementwiseMap, ren, var: str | None) -> Value:
        operand = self.lower(e.operand, ren)  # type: ignore[arg-type]
        name = self.names.fresh(var or e.name)
        return self.emit(
            Step(
                "map",
                Map(operand, e.name, tuple(self.runtime(p) for p in e.params)),
                Value(name, operand.legs, operand.broadcast),
                e.name,
                elementwise=self.numel(operand.legs),
                inputs=(operand,),
            )
        )  # type: ignore[return-value]

    def lower_reduction(self, e: Reduction, ren, var: str | None) -> Value:
        operand = self.lower(e.operand, ren)  # type: ignore[arg-type]
        over = tuple(p for leg in e.over for p in ren[leg])
        operand = self.expand_broadcast(operand, set(over))
        dims = tuple(operand.legs.index(leg) for leg in over)
        name = self.names.fresh(var or e.name)
        method = {"max": "amax", "logsumexp": "logsumexp", "mean": "mean"}[e.name]
        legs = tuple(leg for leg in operand.legs if leg not in over)
        return self.emit(
            Step(
                "reduction",
                Reduce(operand, method, dims),
                Value(name, legs, operand.broadcast),
                f"{e.name} over {' '.join(show_legs(over))}",
                over,
                elementwise=self.numel(operand.legs),
                inputs=(operand,),
            )
        )  # type: ignore[return-value]

    def combine(
        self, kind: str, parts: list[tuple[int, Value]], out: tuple[str, ...], var: str | None, operator: str = "+"
    ) -> Value:
        """Elementwise sum (or quotient) of values aligned to `out` with broadcasting."""
        present = [leg for leg in out if any(leg in v.legs for _, v in parts)]
        if any(v.is_batched for _, v in parts) and BATCH not in present:
            present = [BATCH, *present]
        largest = max((v for _, v in parts), key=lambda v: self.numel_number(v.legs))
        if set(largest.legs) == set(present):
            present = list(largest.legs)  # the largest operand is read in its own layout, not permuted
        broadcast = frozenset(leg for leg in out if leg not in present)
        name = self.names.fresh(var or kind)
        aligned = [(sign, self.align(v, tuple(present)), v.legs) for sign, v in parts]
        if operator == "+":
            op, elementwise = self.sum_tree(aligned)
        else:
            tree = aligned[0][1]
            for _, operand, _ in aligned[1:]:
                tree = Binary("/", tree, operand)
            op, elementwise = Elementwise(tree), self.numel(present) * (len(parts) - 1)
        return self.emit(
            Step(
                kind,
                op,
                Value(name, tuple(present), broadcast),
                kind,
                elementwise=elementwise,
                inputs=tuple(v for _, v in parts),
            )
        )  # type: ignore[return-value]

    def sum_tree(self, terms: list[tuple[int, Operand, tuple[str, ...]]]) -> tuple[Elementwise, sympy.Expr]:
        """Σ ± terms, broadcasting, added smallest pair first: terms along few legs meet before
        they are broadcast to the full result (sMGK's five-term distance, P11), so each full-size
        pass is paid once. Returns the op and its elementwise operation count."""
        nodes: list[tuple[int, Binary | Operand, frozenset[str]]] = [
            (sign, operand, frozenset(legs)) for sign, operand, legs in terms
        ]
        elementwise = sympy.Integer(0)
        while len(nodes) > 1:
            pairs = itertools.combinations(range(len(nodes)), 2)
            i, j = min(pairs, key=lambda p: self.numel_number(nodes[p[0]][2] | nodes[p[1]][2]))
            (sa, a, la), (sb, b, lb) = nodes[i], nodes[j]
            elementwise += self.numel(la | lb)
            if sa == sb:
                merged = (sa, Binary("+", a, b))
            else:
                merged = (1, Binary("-", a, b) if sa > 0 else Binary("-", b, a))
            nodes = [n for k, n in enumerate(nodes) if k not in (i, j)] + [(*merged, la | lb)]
        sign, tree, _ = nodes[0]
        return Elementwise(tree, negate=sign < 0), elementwise

    def lower_sum(self, e: SumNode, ren, var: str | None) -> Value:
        terms = list(zip(e.terms, e.signs, strict=True))
        if self.shift_invariant is not None:
            varying = [
                (t, s)
                for t, s in terms
                if {p for leg in t.legs for p in ren[leg]} & self.shift_invariant or self.owns_parameter(t)
            ]
            terms = varying or terms[:1]  # terms constant along the softmax's legs drop out
        if len(terms) == 1 and terms[0][1] > 0:
            return self.lower(terms[0][0], ren, var)
        parts = [(sign, self.as_missing_legs(self.lower(term, ren))) for term, sign in terms]
        out = tuple(p for leg in e.legs for p in ren[leg])
        return self.combine("sum", parts, out, var)

    def lower_quotient(self, e: Quotient, ren, var: str | None) -> Value:
        numerator = self.as_missing_legs(self.lower(e.numerator, ren))  # type: ignore[arg-type]
        denominator = self.as_missing_legs(self.lower(e.denominator, ren))  # type: ignore[arg-type]
        out = tuple(p for leg in e.legs for p in ren[leg])
        return self.combine("quotient", [(1, numerator), (1, denominator)], out, var, operator="/")

    def as_missing_legs(self, value: Value) -> Value:
        """A value's broadcast legs, for combine, which broadcasts any leg an operand lacks."""
        return Value(value.var, value.legs, frozenset())

    def lower_distance(self, e: SquaredDistance, ren, var: str | None) -> Value:
        """Σ_d (a − b)² = Σ_d a² + Σ_d b² − 2 Σ_d a·b: contractions, no (a − b) tensor. A side that
        is a sum (sMGK's k_jr = k_j + b_r) may be expanded one level further, so that the N²
        contraction is paid once rather than once per shift (MGK P11, spec §6.3); the expansion
        is taken when it costs fewer FLOPs at the planned sizes."""
        plain = [[(1, e.left, ren)], [(1, e.right, ren)]]
        expanded = [self.summands(e.left, ren, e.over), self.summands(e.right, ren, e.over)]
        if expanded == plain or any(s is None for s in expanded):
            return self.distance_terms(e, plain, ren, var)
        naive = self.trial(lambda: self.distance_terms(e, plain, ren, var))
        if self.trial(lambda: self.distance_terms(e, expanded, ren, var)) < naive:
            if self.target is self.steps:
                self.lowered.append("squared distance to shifted keys expanded (MGK P11): one N² contraction")
            return self.distance_terms(e, expanded, ren, var)
        return self.distance_terms(e, plain, ren, var)

    def summands(self, e: Expr, ren, over: tuple[str, ...]) -> list[tuple[int, Expr, dict]] | None:
        """The terms of a sum side (directly or through the statement defining it) with their leg
        renamings, or the side itself; None where a term lacks a distance leg (Σ_d of a constant
        is not a contraction)."""
        distance = {p for leg in over for p in ren[leg]}
        if isinstance(e, TensorRef) and self.g.tensors[e.name].statement is not None:
            statement = self.g.tensors[e.name].statement
            axes = tuple(tuple(p for leg in group for p in ren[leg]) for group in e.groups)
            inner = self.definition_renaming(statement, axes) if isinstance(statement.expr, SumNode) else None
            if inner is not None:
                e, ren = statement.expr, inner
        if not isinstance(e, SumNode):
            return [(1, e, ren)]
        terms = [(sign, term, ren) for term, sign in zip(e.terms, e.signs, strict=True)]
        if any(not distance <= {p for leg in term.legs for p in ren[leg]} for _, term, _ in terms):
            return None
        return terms

    def distance_terms(self, e: SquaredDistance, sides, ren, var: str | None) -> Value:
        """Σ_d (Σ_k c_k z_k)² = Σ_k ‖z_k‖² + 2 Σ_{k<l} c_k c_l z_k·z_l over the summands z of
        both sides (right ones negated); a term constant along a surrounding softmax's legs is
        dropped (the query norm, MGK P2)."""
        over = tuple(p for leg in e.over for p in ren[leg])
        out = tuple(p for leg in e.legs for p in ren[leg])
        vectors = [
            (sign * side_sign, term, r)
            for side_sign, side in zip((1, -1), sides, strict=True)
            for sign, term, r in side
        ]
        values = [self.lower(term, r) for _, term, r in vectors]
        parts = []
        for k, (a, value_a) in enumerate(zip(vectors, values, strict=True)):
            for j in range(k, len(vectors)):
                b, value_b = vectors[j], values[j]
                kept = tuple(leg for leg in (BATCH, *out) if leg in value_a.legs + value_b.legs and leg not in over)
                if self.shift_invariant is not None and not set(kept) & self.shift_invariant:
                    continue  # the same for every key: it cancels in the softmax (MGK P2)
                if k == j:
                    parts.append((1, self.squared_norm(value_a, kept, sympy.Integer(a[0] * b[0]))))
                else:
                    parts.append(
                        (1, self.plan_contraction([value_a, value_b], kept, sympy.Integer(2 * a[0] * b[0]), None))
                    )
        return self.combine("sqdist", [(sign, self.as_missing_legs(v)) for sign, v in parts], out, var)

    def squared_norm(self, value: Value, kept: tuple[str, ...], coefficient: sympy.Expr = ONE) -> Value:
        """coefficient · Σ value² over the legs not kept; its steps are "norm" steps, which the
        papers' counting leaves out (MGK App. B)."""
        start = len(self.target)
        result = self.plan_contraction([value, value], kept, coefficient, None)
        for step in self.target[start:]:
            step.kind = "norm" if step.kind == "contraction" else step.kind
        return result

    # -- normalize boxes in the linear-time order --
    def resolve_normalize(self, box: SoftmaxBox, ren, k: int, others: list[_Leaf], out: tuple[str, ...]) -> list[_Leaf]:
        """Σ_m (x / Σ_m x) v = (Σ_m x v) / (Σ_m x): with the content multilinear (powers of a
        contraction expanded into copies), both sides are contractions that opt_einsum can order
        so that N·M never appears (linear attention, Tuformer §3.3, MGK P12). Taken when a trial
        plan is cheaper than the materialized box."""

        def materialized() -> list[_Leaf]:
            value = self.memoized(box, ren, lambda: self.lower_box(box, ren, None))
            return [*others[:k], _Leaf(value.legs, value=value), *others[k:]]

        normalized = tuple(p for leg in box.normalized for p in ren[leg])
        if any(leg in out for leg in normalized) or not self.is_multilinear(box.content):
            return materialized()
        if box.masks and self.prefix_legs(box, ren) is None:
            return materialized()
        fixed = [o for o in others if set(normalized) & set(o.legs)]
        optional = [o for o in others if o not in fixed]
        if not fixed or len(optional) > 6:
            return materialized()
        best, best_cost = None, self.trial(lambda: self.contract(materialized(), out, sympy.Integer(1), None))
        for choice in itertools.product((0, 1), repeat=len(optional)):
            values = fixed + [o for o, c in zip(optional, choice, strict=True) if c]
            rest = [o for o in others if o not in values]
            cost = self.trial(
                lambda v=values, r=rest: self.contract(self.hoist(box, ren, v, r, out), out, sympy.Integer(1), None)
            )
            if cost < best_cost:
                best, best_cost = (values, rest), cost
        if best is None:
            return materialized()
        if self.target is self.steps:
            how = " with causal prefix sums over chunks" if box.masks else ""
            self.lowered.append(
                f"normalize box over {' '.join(show_legs(normalized))} evaluated in the linear-time order{how}"
            )
        return self.hoist(box, ren, *best, out)

    def prefix_legs(self, box: SoftmaxBox, ren) -> tuple[str, str] | None:
        """(query, key) region legs when the box's only masks are causal ones over its single
        normalized leg, between legs of one size: then Σ_{m ≤ n} is a prefix sum."""
        normalized = tuple(p for leg in box.normalized for p in ren[leg])
        pairs = set()
        for mask in box.masks:
            if not isinstance(mask, CausalMask) or len(ren[mask.query]) != 1 or ren[mask.key] != normalized:
                return None
            pairs.add((ren[mask.query][0], normalized[0]))
        if len(pairs) != 1:
            return None
        query, key = pairs.pop()
        if sympy.simplify(self.g.expand(self.size(query) - self.size(key))) != 0:
            return None
        return query, key

    def causal_contract(
        self, query: str, key: str, leaves: list[_Leaf], out: tuple[str, ...], coefficient: sympy.Expr, var: str | None
    ) -> Value:
        """Σ_{m ≤ n} of a product, chunked (causal linear attention in O(N·C + N·D·E/C)): both
        legs split into chunks of C; within a chunk the product is masked by a C×C triangle,
        across chunks the key side is summed per chunk into a state whose exclusive prefix sum
        over chunks the query side reads (MGK P12, spec mgk §6.6; Katharopoulos et al. §3.3)."""
        leaves = self.resolve_boxes(leaves, out)
        if any(query in leaf.legs and key in leaf.legs for leaf in leaves):
            raise AssertionError("a causal prefix sum needs the query and key legs on different factors")
        free = [leaf for leaf in leaves if key not in leaf.legs and query not in leaf.legs]
        best, best_cost = [], None
        choices = itertools.product((0, 1), repeat=len(free)) if len(free) <= 4 else [(0,) * len(free)]
        for choice in choices:
            joined = [leaf for leaf, c in zip(free, choice, strict=True) if c]
            cost = self.trial(lambda j=joined: self.chunked_contract(query, key, leaves, j, out, coefficient, var))
            if best_cost is None or cost < best_cost:
                best, best_cost = joined, cost
        return self.chunked_contract(query, key, leaves, best, out, coefficient, var)

    def chunked_contract(self, query, key, leaves, joined, out, coefficient, var) -> Value:
        """causal_contract with the factors `joined` (carrying neither leg) in the key side's state."""
        chunks, within_query, within_key, size = self.chunk_legs(query, key)
        rename = {query: (chunks, within_query), key: (chunks, within_key)}
        chunked = [self.chunk_leaf(leaf, rename) for leaf in leaves]
        out_chunked = tuple(p for leg in out for p in rename.get(leg, (leg,)))
        some = self.leaf_value(chunked[0])
        triangle = self.names.fresh("triangle")
        self.emit(
            Step(
                "const",
                Triangle(size, some),
                Value(triangle, (within_query, within_key)),
                "causal triangle within a chunk",
            )
        )
        mask = _Leaf((within_query, within_key), value=Value(triangle, (within_query, within_key)))
        within = self.contract([*chunked, mask], out_chunked, coefficient, None)
        key_side = [c for c, leaf in zip(chunked, leaves, strict=True) if key in leaf.legs or leaf in joined]
        rest = [c for c in chunked if c not in key_side]
        needed = set(out_chunked) | {leg for leaf in rest for leg in leaf.legs}
        state_legs = tuple(
            dict.fromkeys(leg for leaf in key_side for leg in leaf.legs if leg in needed or leg in (chunks, BATCH))
        )
        state = self.contract(key_side, state_legs, sympy.Integer(1), None)
        name = self.names.fresh("earlier")
        axis = state.legs.index(chunks)
        earlier = self.emit(
            Step(
                "prefix",
                PrefixSum(state, axis),
                Value(name, state.legs, state.broadcast),
                f"state of the earlier chunks: exclusive prefix sum over {show_legs([chunks])[0]} (causal)",
                (chunks,),
                flops=self.numel(state.legs),
                inputs=(state,),
            )
        )
        across = self.contract([*rest, _Leaf(earlier.legs, value=earlier)], out_chunked, coefficient, None)  # type: ignore[union-attr]
        total = self.combine("sum", [(1, within), (1, across)], out_chunked, None)
        order = [leg for leg in total.legs if leg != within_query]
        position = order.index(chunks)
        order.insert(position + 1, within_query)
        permutation = None
        if list(total.legs) != order:
            permutation = tuple(total.legs.index(leg) for leg in order)
        legs = tuple(query if leg == chunks else leg for leg in order if leg != within_query)
        name = self.names.fresh(var or "causal_sum")
        return self.emit(
            Step(
                "view",
                JoinChunks(Operand(total, permutation), position, self.runtime(self.size(query))),
                Value(name, legs, total.broadcast),
                "chunks joined",
                inputs=(total,),
            )
        )  # type: ignore[return-value]

    def chunk_legs(self, query: str, key: str) -> tuple[str, str, str, int]:
        """Legs for chunks of C positions (C a power of two, at most 64 and about a quarter of
        the planned length): the chunk count, a run-time ⌈N / C⌉ bound in forward, and the
        query's and key's position within a chunk. The same legs for every causal contraction
        over this pair, so that their chunked factors and products are shared."""
        if (query, key) in self.chunk_pairs:
            return self.chunk_pairs[(query, key)]
        planned = self.number(query)
        size = max(4, min(64, 2 ** max(0, int(math.log2(max(planned, 1) / 4)))))
        extent = self.runtime(self.size(query))
        count_key = (extent, size)
        if count_key not in self.chunk_counts:
            var = self.names.fresh(f"chunks_{size}")
            symbol = sympy.Symbol(var, positive=True, integer=True)
            self.chunk_counts[count_key] = symbol
            self.chunk_values[symbol] = sympy.Integer(-(-int(planned) // size))
            self.chunk_sizes[symbol] = self.size(query) / size
        legs = (
            self.new_leg("chunk", self.chunk_counts[count_key]),
            self.new_leg(query, sympy.Integer(size)),
            self.new_leg(key, sympy.Integer(size)),
        )
        self.chunk_pairs[(query, key)] = (*legs, size)
        return self.chunk_pairs[(query, key)]

    def chunk_leaf(self, leaf: _Leaf, rename: dict[str, tuple[str, str]]) -> _Leaf:
        """A factor with its query or key leg split into (chunk, position within the chunk),
        zero-padded to whole chunks (zeros add nothing to a sum)."""
        legs = tuple(p for leg in leaf.legs for p in rename.get(leg, (leg,)))
        split = [leg for leg in leaf.legs if leg in rename]
        if not split:
            return leaf
        (leg,) = split
        value = self.leaf_value(leaf)
        chunks, within = rename[leg]
        key = ("chunk", value.var, value.legs.index(leg), len(value.legs), chunks, within)
        if key not in self.memo:
            self.memo[key] = (self.chunk_value(value, leg, chunks, within), value.legs)
        chunked, earlier = self.memo[key]
        return _Leaf(legs, value=_renamed(chunked, dict(zip(earlier, value.legs, strict=True))))

    def chunk_value(self, value: Value, leg: str, chunks: str, within: str) -> Value:
        """`value` with `leg` split into (chunks, within), zero-padded to whole chunks."""
        legs = tuple(p for old in value.legs for p in ((chunks, within) if old == leg else (old,)))
        if leg in value.broadcast:
            return Value(value.var, legs, (value.broadcast - {leg}) | {chunks, within})
        physical = [old for old in value.legs if old not in value.broadcast]
        axis = physical.index(leg)
        size = self.number(within)
        split = SplitChunks(
            value, axis, len(physical) - 1 - axis, self.leg_sizes[chunks], size, self.runtime(self.size(leg))
        )
        name = self.names.fresh(f"{value.var}_chunks")
        return self.emit(
            Step(
                "view",
                split,
                Value(name, legs, value.broadcast),
                f"{show_legs([leg])[0]} in chunks of {size}",
                inputs=(value,),
            )
        )  # type: ignore[return-value]

    def is_multilinear(self, e: Expr) -> bool:
        if isinstance(e, ElementwiseMap) and e.name == "pow":
            exponent = e.params[0]
            return exponent.is_Integer and 1 <= int(exponent) <= 4 and self.is_multilinear(e.operand)  # type: ignore[arg-type]
        if isinstance(e, Contraction):
            return all(self.is_multilinear(f) or not isinstance(f, ElementwiseMap) for f in e.factors)
        return isinstance(e, TensorRef | Scalar | ElementwiseMap)

    def collect_expanded(self, e: Expr, ren, leaves: list[_Leaf]) -> sympy.Expr:
        """Like collect, with x ^ p of a contraction written as p copies of it."""
        return self.collect(e, ren, leaves, expand_powers=True)

    def hoist(self, box: SoftmaxBox, ren, values: list[_Leaf], rest: list[_Leaf], out: tuple[str, ...]) -> list[_Leaf]:
        """Emit numerator and denominator contractions and their quotient; return the region's
        leaves with the quotient standing in for the box and its value side."""
        normalized = {p for leg in box.normalized for p in ren[leg]}
        content: list[_Leaf] = []
        coefficient = self.collect_expanded(box.content, ren, content)  # type: ignore[arg-type]
        kept = tuple(p for leg in box.legs for p in ren[leg] if p not in normalized)
        batch = (BATCH,) if any(BATCH in c.legs for c in [*content, *values]) else ()
        needed = set(out) | {leg for r in rest for leg in r.legs}
        extra = tuple(
            leg
            for leg in dict.fromkeys(leg for v in values for leg in v.legs)
            if leg in needed and leg not in kept and leg != BATCH
        )
        causal = self.prefix_legs(box, ren) if box.masks else None
        contract = self.contract if causal is None else functools.partial(self.causal_contract, *causal)
        numerator = contract([*content, *values], (*batch, *kept, *extra), coefficient, "numerator")
        den_content: list[_Leaf] = []
        den_coefficient = self.collect_expanded(box.content, ren, den_content)  # type: ignore[arg-type]
        denominator = contract(
            den_content,
            tuple(leg for leg in (BATCH, *kept) if any(leg in c.legs for c in den_content)),
            den_coefficient,
            "denominator",
        )
        present = tuple(leg for leg in numerator.legs)
        name = self.names.fresh("normalized")
        step = Step(
            "quotient",
            Ratio(numerator, self.align(denominator, present), self.runtime(box.eps)),
            Value(name, present),
            "numerator / (denominator + eps)",
            elementwise=self.numel(present),
            divisions=self.numel(present),
            inputs=(numerator, denominator),
        )
        value = self.emit(step)
        return [*rest, _Leaf(value.legs, value=value)]  # type: ignore[union-attr]

    # -- softmax boxes fused with their consumer (scaled_dot_product_attention) --
    def resolve_boxes(self, leaves: list[_Leaf], out: tuple[str, ...]) -> list[_Leaf]:
        """Each box leaf of a region becomes SDPA with its value side when that costs no more
        than the materialized box and its consumer; otherwise the box is computed as such."""
        while any(leaf.box is not None for leaf in leaves):
            k = next(i for i, leaf in enumerate(leaves) if leaf.box is not None)
            box, ren = leaves[k].box  # type: ignore[misc]
            others = leaves[:k] + leaves[k + 1 :]
            if not box.is_exp:
                leaves = self.resolve_normalize(box, ren, k, others, out)
                continue
            fused = self.fusable(box, ren, leaves[k], others, out)
            if fused is not None and self.cheaper_fused(box, ren, leaves[k], others, out, fused):
                leaves = self.fuse(box, ren, others, fused)
            else:
                prefer = {leg for o in others for leg in o.legs}
                value = self.memoized(box, ren, lambda b=box, r=ren, p=prefer: self.lower_box(b, r, None, p))
                leaves = [*others[:k], _Leaf(value.legs, value=value), *others[k:]]
        return leaves

    def fusable(self, box: SoftmaxBox, ren, leaf: _Leaf, others: list[_Leaf], out: tuple[str, ...]):
        """The query, key and value sides of an attention, or None when the pattern does not hold:
        content = per-head dot product (or squared distance) of a query side and a key side, plus
        bias terms that vary only along heads and keys (carried by one more latent feature, MGK
        P17); causal masks only; values joined along the normalized legs, or tied across some."""
        if any(not isinstance(m, CausalMask) for m in box.masks):
            return None
        keys = tuple(p for leg in box.normalized for p in ren[leg])
        if any(k in out for k in keys):
            return None
        items = self.score_items(box.content, ren, set(keys))  # type: ignore[arg-type]
        if items is None:
            return None
        (kind, coefficient, cross), biases = items
        distance_weight = coefficient  # of Σ_d (q − k)², whose ‖k‖² becomes a bias
        content: list[_Leaf] = []
        key_value = over = None
        with self.scratch() as prelude:  # the content's computed factors; kept only if fused
            if kind == "term":
                coefficient *= self.collect(cross, ren, content)
            else:
                inner = self.with_fresh_legs(ren, cross.over)
                sides = [self.lower(cross.left, inner), self.lower(cross.right, inner)]
                if set(keys) & set(sides[0].legs):
                    sides.reverse()
                content = [_Leaf(v.legs, value=v) for v in sides]
                coefficient *= -2  # Σ_d (q − k)² = −2 q·k + ‖k‖² (+ ‖q‖², constant along the keys)
                key_value, over = sides[1], tuple(p for leg in cross.over for p in inner[leg])
            memo = self.memo
        box_legs = tuple(p for leg in box.legs for p in ren[leg])
        content, box_legs, coefficient = self.fold_constants(content, box_legs, coefficient)
        if any(c.box is not None or (c.value is not None and c.value.broadcast) for c in content):
            return None
        split = self.split_sides(content, box_legs, keys, others, out)
        if split is None:
            return None
        query_side, key_side, values, heads, queries, latent, features = split
        if kind == "sqdist" and (query_side, key_side) != (content[:1], content[1:]):
            return None
        bias_items = []
        for bias_kind, weight, e in biases:
            legs = {p for leg in e.legs for p in ren[leg]}
            if not legs <= set(heads) | set(keys):
                return None
            bias_items.append((bias_kind, weight, e))
        if kind == "sqdist":
            bias_items.append(("norm", distance_weight, None))
        if len(queries) != 1 and box.masks:
            return None
        for mask in box.masks:
            if ren[mask.query] != (queries[0],) or len(ren[mask.key]) != 1 or ren[mask.key][0] not in keys:  # type: ignore[union-attr]
                return None
        return {
            "query": query_side,
            "key": key_side,
            "value": values,
            "heads": heads,
            "queries": queries,
            "keys": list(keys),
            "latent": latent,
            "features": features,
            "scale": coefficient * box.scale,
            "box_scale": box.scale,
            "biases": bias_items,
            "key_norm": (key_value, over),
            "ren": ren,
            "masks": [(ren[m.query][0], ren[m.key][0]) for m in box.masks],  # type: ignore[union-attr]
            "prelude": (prelude, memo),
        }

    def score_items(self, e: Expr, ren, keys: set[str], weight: sympy.Expr = ONE):
        """The box content as Σ weight·item: (cross item, bias items), the cross item the one
        spanning every leg, terms constant along the keys dropped (softmax shift invariance);
        None when that shape does not hold."""
        items: list[tuple[str, sympy.Expr, Expr]] = []

        def walk_terms(e: Expr, weight: sympy.Expr) -> None:
            if isinstance(e, SumNode):
                for term, sign in zip(e.terms, e.signs, strict=True):
                    walk_terms(term, weight * sign)
            elif isinstance(e, Contraction) and _is_scaling(e):
                factor = next(f for f in e.factors if not isinstance(f, Scalar))
                scalars = [f.value for f in e.factors if isinstance(f, Scalar)]
                walk_terms(factor, weight * e.coefficient * sympy.Mul(*scalars))
            else:
                items.append(("sqdist" if isinstance(e, SquaredDistance) else "term", weight, e))

        walk_terms(e, weight)
        kept = []
        for item in items:
            legs = {p for leg in item[2].legs for p in ren[leg]}
            if legs & keys:
                kept.append(item)
            elif self.owns_parameter(item[2]):
                return None
        if not kept:
            return None
        widest = max(len(item[2].legs) for item in kept)
        crosses = [item for item in kept if len(item[2].legs) == widest]
        if len(crosses) != 1 or (crosses[0][0] == "term" and not isinstance(crosses[0][2], Contraction | TensorRef)):
            return None
        biases = [item for item in kept if item is not crosses[0]]
        if any(not self.is_bias(item[2]) for item in biases):
            return None
        return crosses[0], biases

    def is_bias(self, e: Expr) -> bool:
        """A term the fused form computes apart (O(keys)): no box inside, nothing random."""
        return not any(
            isinstance(node, SoftmaxBox) or (isinstance(node, TensorRef) and self.g.tensors[node.name].kind == "random")
            for node in walk(e)
        )

    def split_sides(self, content: list[_Leaf], box_legs, keys, others: list[_Leaf], out: tuple[str, ...]):
        """Assign the content's factors to a query and a key side, and the consumer's factors to
        the value side or the rest, so that the sides meet only in head legs (kept) and latent
        legs (contracted) and the values carry every head; the cheapest valid split wins."""
        fixed_key = [c for c in content if set(keys) & set(c.legs)]
        fixed_value = [o for o in others if set(keys) & set(o.legs)]
        undecided = [c for c in content if c not in fixed_key]
        optional = [o for o in others if o not in fixed_value]
        if len(undecided) + len(optional) > 12:
            return None
        present = {leg for c in content for leg in c.legs}
        queries_all = [leg for leg in box_legs if leg not in keys and leg in present]
        best, best_cost = None, None
        for choice in itertools.product((0, 1), repeat=len(undecided) + len(optional)):
            query_side = [c for c, side in zip(undecided, choice, strict=False) if side == 0]
            key_side = fixed_key + [c for c, side in zip(undecided, choice, strict=False) if side == 1]
            values = fixed_value + [o for o, side in zip(optional, choice[len(undecided) :], strict=True) if side == 1]
            rest = [o for o in others if o not in values]
            q_legs = {leg for c in query_side for leg in c.legs}
            k_legs = {leg for c in key_side for leg in c.legs}
            v_legs = {leg for c in values for leg in c.legs}
            heads = [leg for leg in (BATCH, *box_legs) if leg in q_legs and leg in k_legs]
            queries = [leg for leg in queries_all if leg in q_legs and leg not in k_legs]
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
                or v_legs & set(queries)
                or (v_legs - set(heads) - set(keys)) & (q_legs | k_legs)
            ):
                continue
            cost = self.numel_number([*heads, *queries, *keys]) * (
                self.numel_number(latent) + self.numel_number(features)
            )
            if best_cost is None or cost < best_cost:
                best, best_cost = (query_side, key_side, values, heads, queries, latent, features), cost
        return best

    def cheaper_fused(self, box, ren, leaf: _Leaf, others: list[_Leaf], out, fused) -> bool:
        def materialized() -> None:
            value = self.lower_box(box, ren, None)
            self.contract([*others, _Leaf(value.legs, value=value)], out, sympy.Integer(1), None)

        def as_sdpa() -> None:
            self.contract(self.fuse(box, ren, others, fused), out, sympy.Integer(1), None)

        if self.objective == "memory":
            return True  # the fused kernel never materializes the box's entries
        return self.trial(as_sdpa) <= self.trial(materialized)

    def trial(self, build) -> int:
        """The FLOPs a lowering would emit, at the planned sizes, without keeping its steps."""
        with self.scratch() as steps:
            build()
            total = sum((s.flops for s in steps), sympy.Integer(0)).xreplace(self.chunk_values)
            return int(self.g.evaluate(total, **self.sizes).xreplace({BATCH_SIZE: self.sizes.get("B", 1)}))

    @contextlib.contextmanager
    def scratch(self):
        """Emit into a list of its own, whose values are forgotten afterwards."""
        saved, self.target = self.target, []
        memo, self.memo = self.memo, dict(self.memo)
        masks, self.causal_masks = self.causal_masks, dict(self.causal_masks)
        try:
            yield self.target
        finally:
            self.target, self.memo, self.causal_masks = saved, memo, masks

    def fuse(self, box: SoftmaxBox, ren, others: list[_Leaf], fused: dict) -> list[_Leaf]:
        """Emit q, k, v and the SDPA call; return the region's leaves with the attention output
        standing in for the box and its value side."""
        heads, queries, keys, latent, features = (fused[k] for k in ("heads", "queries", "keys", "latent", "features"))
        prelude, memo = fused["prelude"]
        for step in prelude:
            self.emit(step)
        self.memo.update(memo)
        self.box_depth += 1
        q = self.contract(fused["query"], tuple(heads + queries + latent), sympy.Integer(1), "q")
        k = self.contract(fused["key"], tuple(heads + keys + latent), sympy.Integer(1), "k")
        bias = self.key_bias(fused) if fused["biases"] else None
        self.box_depth -= 1
        v = self.contract(fused["value"], tuple(heads + keys + features), sympy.Integer(1), "v")
        v = self.expand_broadcast(v, set(keys))  # values tied across a key leg (MGK's r, P17)
        flat = [[h] for h in heads]
        bias_operand, pad_value, pad_query_key, width = None, 0, 0, None
        if bias is not None:
            bias_operand = self.arrange(bias, [*flat, keys])
            # the fused kernels want one head width for q, k and v: zero features change nothing
            query_width, value_width = self.numel_number(latent) + 1, self.numel_number(features)
            if value_width < query_width:
                pad_value, width = query_width - value_width, value_width
            elif value_width > query_width:
                pad_query_key = value_width - query_width
        causal, visible = False, None
        if fused["masks"] and keys == [fused["masks"][0][1]]:
            causal = True
        elif fused["masks"]:
            visible = self.causal_attention_mask(fused["masks"][0], queries[0], keys)
        name = self.names.fresh("attended")
        legs = tuple(heads + queries + features)
        attention = Attention(
            self.arrange(q, [*flat, queries, latent]),
            self.arrange(k, [*flat, keys, latent]),
            self.arrange(v, [*flat, keys, features]),
            self.runtime(fused["scale"]),
            causal=causal,
            mask=visible,
            bias=bias_operand,
            pad_value=pad_value,
            pad_query_key=pad_query_key,
            width=width,
            shape=self.shape(legs) if len(queries) != 1 or len(features) != 1 else None,
        )
        entries = self.numel([*heads, *queries, *keys])
        latent_size = self.numel(latent) + (1 if bias is not None else 0)
        flops = 2 * entries * (latent_size + self.numel(features))
        description = (
            f"scaled_dot_product_attention over {' '.join(show_legs(keys))}, heads {' '.join(show_legs(heads))}"
        )
        if bias is not None:
            description += ", key bias as one more feature (MGK P17)"
        value = self.emit(
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
                inputs=(q, k, v) if bias is None else (q, k, v, bias),
                paper=entries * (2 * latent_size - 1) + self.numel(legs) * (2 * self.numel(keys) - 1),
                score_flops=2 * entries * latent_size,
                score_paper=entries * (2 * latent_size - 1),
            )
        )
        if self.target is self.steps:
            how = " with the key bias as a feature (MGK P17)" if bias is not None else ""
            self.lowered.append(
                f"softmax box over {' '.join(show_legs(keys))} lowered to scaled_dot_product_attention{how}"
            )
        rest = [o for o in others if o not in fused["value"]]
        return [*rest, _Leaf(value.legs, value=value)]  # type: ignore[union-attr]

    def key_bias(self, fused: dict) -> Value:
        """Σ of the bias terms (each along heads and keys only) divided by the SDPA scale, so that
        [q, 1]·[k, bias] = q·k + bias/scale: the augmented keys of MGK P17."""
        heads, keys = fused["heads"], fused["keys"]
        parts = []
        for kind, weight, e in fused["biases"]:
            if kind == "norm":
                key_value, over = fused["key_norm"]
                kept = tuple(leg for leg in key_value.legs if leg not in over)
                value = self.squared_norm(key_value, kept)
            else:
                value = self.lower(e, fused["ren"])
            factor = sympy.simplify(weight * fused["box_scale"] / fused["scale"])
            if factor != 1:
                value = self.scale(value, factor)
            parts.append((1, self.as_missing_legs(value)))
        bias = self.combine("bias", parts, tuple(heads + keys), "bias") if len(parts) > 1 else parts[0][1]
        missing = [leg for leg in (*heads, *keys) if leg not in bias.legs]
        if not missing:
            return bias
        return self.materialize(bias, tuple(leg for leg in (*heads, *keys)))

    def materialize(self, value: Value, legs: tuple[str, ...]) -> Value:
        """`value` expanded to exactly `legs` (a copy), for an operand that must be dense."""
        name = self.names.fresh(f"{value.var}_full")
        return self.emit(
            Step(
                "expand",
                Materialize(self.align(value, legs), self.shape(legs)),
                Value(name, legs),
                "broadcast " + " ".join(show_legs(leg for leg in legs if leg not in value.legs)),
                inputs=(value,),
            )
        )  # type: ignore[return-value]

    def causal_attention_mask(self, pair: tuple[str, str], query: str, keys: list[str]) -> Value:
        """The boolean SDPA mask (True = attend) of a causal mask over one of several flattened
        key legs: key (m, r) is visible from n when m ≤ n."""
        mask_query, mask_key = pair
        causal = Value(self.causal_mask(mask_query, mask_key), (mask_query, mask_key))
        aligned = self.align(causal, (query, *keys), invert=True)
        visible = Value(self.names.fresh("visible"), (query, *keys))
        op = VisibleMask(aligned, self.shape([query, *keys]), self.group_size([query]))
        self.emit(Step("mask", op, visible, inputs=()))
        return visible


# ---- helpers -------------------------------------------------------------------------------


def _renamed(value: Value, rename: Mapping[str, str]) -> Value:
    """The same variable with its legs called by other names."""
    return Value(
        value.var,
        tuple(rename.get(leg, leg) for leg in value.legs),
        frozenset(rename.get(leg, leg) for leg in value.broadcast),
    )


def _is_scaling(e: Expr) -> bool:
    """A contraction that only multiplies one factor by a number."""
    if not isinstance(e, Contraction) or e.summed:
        return False
    return len([f for f in e.factors if not isinstance(f, Scalar)]) == 1


def _dims(dims: Sequence[int]) -> str:
    return str(dims[0]) if len(dims) == 1 else "(" + ", ".join(map(str, dims)) + ")"


def _all_legs(e: Expr) -> set[str]:
    legs: set[str] = set()
    for node in walk(e):
        legs |= set(node.legs)
        if isinstance(node, Contraction):
            legs |= set(node.summed)
        if isinstance(node, Reduction | SquaredDistance):
            legs |= set(node.over)
        if isinstance(node, TensorRef):
            legs |= {leg for g in node.groups for leg in g}
    return legs


def _count_uses(graph: DesignGraph) -> Counter[str]:
    uses: Counter[str] = Counter()
    for statement in [*graph.statements, *graph.updates]:
        for node in walk(statement.expr):
            if isinstance(node, TensorRef):
                uses[node.name] += 1
            if isinstance(node, SoftmaxBox):
                for mask in node.masks:
                    if isinstance(mask, PaddingMask):
                        uses[mask.tensor.name] += 1
    for name in graph.outputs:
        uses[name] += 1
    return uses


def _leg_splits(graph: DesignGraph, uses: Counter[str]) -> dict[str, tuple[tuple[str, sympy.Expr], ...]]:
    """Legs that a definition with grouped axes (`C[(h d) (g e)] = ...`) is used with as one
    leg (`C[r s]`) are split into head-major pieces everywhere, so that the structure of the
    definition reaches the contraction. A leg asked to split two different ways stays whole."""
    wanted: dict[str, set[tuple[sympy.Expr, ...]]] = {}
    for statement in [*graph.statements, *graph.updates]:
        for node in walk(statement.expr):
            if not isinstance(node, TensorRef):
                continue
            definition = graph.tensors[node.name].statement
            if definition is None:
                continue
            for use, group in zip(node.groups, definition.groups, strict=True):
                if len(use) == 1 and len(group) > 1:
                    wanted.setdefault(use[0], set()).add(tuple(graph.legs[leg].size for leg in group))
    masked = {
        leg for _, box in graph.boxes() for m in box.masks if isinstance(m, CausalMask) for leg in (m.query, m.key)
    }
    splits = {}
    for leg, options in wanted.items():
        if len(options) == 1 and leg not in masked:
            (sizes,) = options
            splits[leg] = tuple((f"{leg}.{k}", size) for k, size in enumerate(sizes))
    return splits


# ---- the plan of a whole design ------------------------------------------------------------


def build_plan(
    graph: DesignGraph, sizes: Mapping[str, int], *, checkpoint_boxes: bool = False, objective: str = "flops"
) -> Plan:
    """Lower every statement, then the outputs and the state updates. With `checkpoint_boxes`,
    each box, its content and its first consumer are recomputed in the backward pass instead of
    being kept (Tuformer §4.3, spec §3.4). `objective="flops"` takes a fused attention only when
    it costs no more FLOPs; `"memory"` takes it wherever the pattern holds, since it never stores
    the box (MGK P17 multiplies the value contraction by M but keeps no N²·M scores)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    lowering = _Lowering(graph, sizes, objective)
    lowering.lower_design()
    plan = Plan(graph, dict(sizes), lowering.leg_sizes, steps=lowering.steps)
    for name in graph.outputs:
        value = lowering.expand_broadcast(lowering.values[name], set(lowering.values[name].broadcast))
        statement = graph.tensors[name].statement
        order = [BATCH] if value.is_batched else []
        order += [p for group in statement.groups for leg in group for p in lowering.expand(leg)]  # type: ignore[union-attr]
        plan.outputs.append((name, _reorder(lowering, value, order)))
    lowering.target = plan.update_steps
    for update in graph.updates:
        value = lowering.lower(update.expr, lowering.identity_renaming(_all_legs(update.expr)))
        value = lowering.expand_broadcast(value, set(value.broadcast))
        order = [BATCH] if value.is_batched else []
        order += [p for group in update.groups for leg in group for p in lowering.expand(leg)]
        value = _reorder(lowering, value, order)
        shape = lowering.shape([leg for leg in order if leg != BATCH])
        lowering.emit(Step("update", BufferUpdate(update.target, value, shape), None, f"update {update.target}"))
    plan.steps = lowering.steps
    plan.names = lowering.input_vars
    plan.lowered = lowering.lowered
    if checkpoint_boxes:
        plan.segments = _checkpoint_segments(lowering.steps, lowering.box_segments)
    plan.causal = lowering.causal_masks
    for (extent, size), symbol in lowering.chunk_counts.items():
        plan.chunks.append(ChunkCount(str(symbol), extent, size))
    _express_chunks(plan, lowering.chunk_sizes)
    plan.stored = sorted(lowering.stored_used)
    plan.attributes = frozenset(lowering.attributes)
    return plan


def _express_chunks(plan: Plan, sizes: Mapping[sympy.Symbol, sympy.Expr]) -> None:
    """Cost formulas in the design's sizes: a chunk count ⌈N / C⌉ is written N / C (exact
    when C divides N)."""
    if not sizes:
        return
    fields = ("flops", "exps", "divisions", "entries", "elementwise", "paper", "score_flops", "score_paper")
    for step in [*plan.steps, *plan.update_steps]:
        for name in fields:
            setattr(step, name, sympy.sympify(getattr(step, name)).xreplace(sizes))
    plan.leg_sizes = {leg: size.xreplace(sizes) for leg, size in plan.leg_sizes.items()}


def _reorder(lowering: _Lowering, value: Value, order: list[str]) -> Value:
    if list(value.legs) == order:
        return value
    name = lowering.names.fresh(f"{value.var}_out")
    permutation = tuple(value.legs.index(leg) for leg in order)
    return lowering.emit(Step("permute", Permute(value, permutation), Value(name, tuple(order)), "reorder legs"))  # type: ignore[return-value]


def _checkpoint_segments(steps: list[Step], boxes: list[tuple[int, int, str]]) -> list[tuple[int, int]]:
    """Each box's steps extended to the first step that reads the box, merged where they meet."""
    segments = []
    for start, end, var in boxes:
        consumer = next((k for k in range(end + 1, len(steps)) if any(v.var == var for v in steps[k].inputs)), end)
        segments.append((start, consumer))
    merged: list[tuple[int, int]] = []
    for start, end in sorted(segments):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged
