"""The lowering's shared state: names, leg sizes, the emit target, memoization of nonlinear
values and trial plans; each pass (a base class of build._Lowering) builds on it.

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
import dataclasses
import itertools
import keyword
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sympy

from ..errors import Span
from ..graph import DesignGraph
from ..ir import (
    ONE,
    POSITION_MASKS,
    CausalFactor,
    Contraction,
    Convolution,
    ElementwiseMap,
    Expr,
    Gather,
    PaddingMask,
    Position,
    PositionIndex,
    Quotient,
    Reduction,
    Scalar,
    Scan,
    SegmentSum,
    SoftmaxBox,
    SquaredDistance,
    SumNode,
    Tensor,
    TensorRef,
    WindowFactor,
    walk,
)
from ..names import BUILTINS, GENERATED
from .convolution import lower_convolution
from .norms import LayerNormNode, lower_layer_norm
from .program import (
    BATCH,
    BATCH_SIZE,
    Multiply,
    Step,
    Value,
    show_legs,
)

if TYPE_CHECKING:
    from .forms.base import BoxChoice

OPTIMAL_UP_TO = 5
# names the generated module uses for itself: a forward local of the design (an input, a mask,
# noise, a statement's result, a temporary) named like one of them gets a fresh name instead
RESERVED = set(keyword.kwlist) | set(GENERATED) | set(BUILTINS) | {"F", "inputs", "masks"}

# reductions through which a term constant along the reduced legs passes unchanged (+ c)
SHIFT_EQUIVARIANT = ("max", "logsumexp", "mean")


# ---- leaves of a multilinear region ----------------------------------------------------------


@dataclass
class _Leaf:
    """A factor of a region: a stored tensor (viewed into region legs) or a computed Value."""

    legs: tuple[str, ...]
    tensor: Tensor | None = None
    value: Value | None = None
    view: tuple[tuple[str, ...], ...] = ()  # for stored tensors: region legs of each axis
    box: tuple[SoftmaxBox, dict[str, tuple[str, ...]]] | None = None  # a box its consumer may fuse
    constant: sympy.Expr | None = None  # a sub-expression that is one number at every index
    exponent: bool = False  # the factor is exp(value), its shift decided with the box's other factors
    triangle: tuple[str, str] | None = None  # causal(query, key) as a factor, not yet made numbers
    decay: tuple[ElementwiseMap, dict[str, tuple[str, ...]]] | None = None  # an exp lowered when read (decay.py)


def _constant_along(legs: Iterable[str]) -> list[_Leaf]:
    """A factor 1 over the broadcast legs of a computed value (legs it is constant along and has
    no axis for): a region that sums one of them multiplies by its size (Σ_g c = G c)."""
    legs = tuple(sorted(leg for leg in legs if leg != BATCH))
    return [_Leaf(legs, constant=sympy.Integer(1))] if legs else []


def _value_leaves(value: Value) -> list[_Leaf]:
    """A computed value as factors of a region: itself over its axes, and 1 over its broadcast legs."""
    return [_Leaf(value.legs, value=value), *_constant_along(value.broadcast)]


def _over_run_time_size(graph: DesignGraph, tensor: Tensor) -> bool:
    return any(graph.sizes[s.name].is_free for a in tensor.axes for s in graph.expand(a.size).free_symbols)


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


class LoweringBase:
    """Walks the design graph once, emitting Steps."""

    def __init__(self, graph: DesignGraph, sizes: Mapping[str, int], objective: str = "flops"):
        self.g = graph
        self.objective = objective
        self.attention = "sdpa"  # what a fusable softmax box is lowered to ("flex": build_plan sets it)
        self.sizes = dict(sizes)
        self.steps: list[Step] = []
        # made in forward: a const over a run-time size (N), at the size read from the input;
        self.made_on_entry = [t.name for t in graph.tensors_of_kind("const") if _over_run_time_size(graph, t)]
        # a buffer with an update rule is read through a copy made on entry (codegen), so that the
        # in-place update after the forward never changes a tensor that autograd saved
        self.made_on_entry += sorted({u.target for u in graph.updates})
        self.attributes = {
            t.name
            for t in graph.tensors.values()
            if t.kind in ("param", "const", "buffer") and t.name not in self.made_on_entry
        }
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
            t.name: self.names.fresh(t.name)
            for t in graph.tensors.values()
            if t.kind in ("input", "mask", "random") or t.name in self.made_on_entry
        }
        # (N, M) -> a causal triangle; (N, M, before, after) -> a window's band
        self.causal_masks: dict[tuple[sympy.Expr, ...], str] = {}
        self.stored_used: set[str] = set()
        self.lowered: list[str] = []
        self.refused: list[str] = []
        self.choices: list[BoxChoice] = []  # each box's candidate forms and the one taken (forms/)
        self.box_segments: list[tuple[int, int, str]] = []  # (first step, box step, box value)
        # the normalized legs of the softmax whose argument the current expression is added into:
        # a term constant along them shifts every row equally and changes nothing (softmax(x + c))
        self.shift_invariant: frozenset[str] | None = None
        self.box_depth = 0  # > 0 while a softmax box's argument is being computed
        # > 0 while a normalize box is computed: its steps run in float32 under autocast, since a
        # ratio of sums of a kernel (a polynomial: (q·k)^p / Σ (q·k)^p) loses the relative
        # precision of small scores that bfloat16 inputs cannot carry
        self.wide_depth = 0
        # the region legs a normalize box (without eps) keeps, while its content's product is
        # collected: an exp factor there is shifted by its max over the other legs (stabilize.py)
        self.stabilized: frozenset[str] | None = None
        self.stabilizations = 0  # exp factors shifted so far: a box that shifted one guards 0 / 0
        self.memo: dict[tuple, tuple[Value, tuple[str, ...]]] = {}  # nonlinear values of the current target
        self.chunk_counts: dict[tuple[sympy.Expr, int], sympy.Symbol] = {}  # (extent, C) -> ⌈N / C⌉
        self.chunk_values: dict[sympy.Symbol, sympy.Integer] = {}  # ... at the planned sizes
        self.chunk_sizes: dict[sympy.Symbol, sympy.Expr] = {}  # ... as N / C in cost formulas
        self.chunk_pairs: dict[tuple[str, str], tuple[str, str, str, int]] = {}
        self.chunk_notes: dict[tuple[str, str], str] = {}  # the chunk size each pair took, and why

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
        step.wide = step.wide or self.wide_depth > 0
        self.target.append(step)
        return step.out

    @property
    def dearer(self) -> str:
        """How a refused rewrite compares under the objective, for its note."""
        return "is estimated slower than" if self.objective == "time" else "costs more FLOPs than"

    def refuse(self, note: str) -> None:
        """Say why a rewrite was not taken (once, and not for trial plans)."""
        if self.target is self.steps and note not in self.refused:
            self.refused.append(note)

    def show_value(self, value: Value) -> str:
        var = f"self.{value.var}" if value.var in self.attributes else value.var
        return f"{var}[{' '.join(show_legs(value.legs))}]"

    def identity_renaming(self, legs: Iterable[str]) -> dict[str, tuple[str, ...]]:
        return {leg: self.expand(leg) for leg in legs}

    def lower_design(self) -> None:
        for statement in self.g.statements:
            if self.is_inlined(statement.target):
                continue
            ren = self.identity_renaming(_all_legs(statement.expr))
            value = self.lower(statement.expr, ren, var=statement.target)
            self.values[statement.target] = value

    def lower(self, e: Expr, ren: dict[str, tuple[str, ...]], var: str | None = None, scale: sympy.Expr = ONE) -> Value:
        """Lower expression `e` whose legs are renamed by `ren` into region legs."""
        context, self.shift_invariant = self.shift_invariant, self.inner_shift_invariance(e, ren)
        try:
            return self._lower(e, ren, var, scale)
        finally:
            self.shift_invariant = context

    def inner_shift_invariance(self, e: Expr, ren: dict[str, tuple[str, ...]]) -> frozenset[str] | None:
        """The legs along which a softmax around `e` lets e's sums drop constant terms: through a
        sum, a squared distance or a scaling unchanged; below max, logsumexp or mean over r only a
        term also constant along r (max_r(x + c) = max_r(x) + c: MGK's query norm in the hard
        E-step), not below a masked mean (0, not c, where every entry is hidden); below anything
        else (a product, a map, a quotient) none: softmax(log(1 + x)) is not softmax(log(x))."""
        context = self.shift_invariant
        if context is None or isinstance(e, SumNode | SquaredDistance) or _is_scaling(e):
            return context
        if isinstance(e, Reduction) and e.name in SHIFT_EQUIVARIANT and not (e.masks and e.name == "mean"):
            return context | {p for leg in e.over for p in ren[leg]}
        return None

    def _lower(self, e: Expr, ren: dict[str, tuple[str, ...]], var: str | None, scale: sympy.Expr) -> Value:
        if isinstance(e, Contraction | TensorRef | Scalar | CausalFactor | WindowFactor):
            return self.lower_region(e, ren, var, scale)  # a position mask alone is a region of one factor
        constant = self.constant_value(e)
        if constant is not None:
            return self.fill(constant * scale, tuple(p for leg in e.legs for p in ren[leg]), var)
        value = self.lower_nonlinear(e, ren, var)
        if scale != 1:
            value = self.scale(value, scale)
        return value

    def lower_nonlinear(self, e: Expr, ren: dict[str, tuple[str, ...]], var: str | None) -> Value:
        """Each nonlinear sub-expression is computed once: a repeat (the same map of the same
        tensors, whatever its legs are called in the region) reads the earlier value. A region
        reaches its nonlinear factors here, not through `lower`, so the same shift rule applies."""
        context, self.shift_invariant = self.shift_invariant, self.inner_shift_invariance(e, ren)
        kept, self.stabilized = self.stabilized, None  # a factor's inside is no factor of the box
        lazy, self.lazy_triangles = self.lazy_triangles, False  # ... nor of the region around it
        try:
            return self.memoized(e, ren, lambda: self._lower_nonlinear(e, ren, var))
        finally:
            self.shift_invariant, self.stabilized, self.lazy_triangles = context, kept, lazy

    def memoized(self, e: Expr, ren: dict[str, tuple[str, ...]], build) -> Value:
        """`build()`, or the value an alpha-equivalent sub-expression (`_alpha_key`) over the same
        pattern of region legs got before, renamed onto this one's legs."""
        shape, ordered, named = _alpha_key(e)
        sizes = tuple(self.g.legs[leg].size if leg in self.g.legs else leg for leg in named)
        legs = tuple(p for leg in ordered for p in ren[leg])
        shift = None  # which of its legs a softmax around it normalizes: sums may drop terms by it
        if self.shift_invariant is not None and isinstance(e, SumNode | SquaredDistance | Reduction):
            shift = frozenset(k for k, p in enumerate(legs) if p in self.shift_invariant)
        pattern = tuple(legs.index(p) for p in legs)
        key = (shape, sizes, tuple(len(ren[leg]) for leg in ordered), pattern, shift)
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
        if isinstance(e, Scan):
            return self.lower_scan(e, ren, var)
        if isinstance(e, SegmentSum):
            return self.lower_segment_sum(e, ren, var)
        if isinstance(e, Convolution):
            return lower_convolution(self, e, ren, var)  # type: ignore[arg-type]
        if isinstance(e, SumNode):
            return self.lower_sum(e, ren, var)
        if isinstance(e, Quotient):
            return self.lower_quotient(e, ren, var)
        if isinstance(e, SquaredDistance):
            return self.lower_distance(e, ren, var)
        if isinstance(e, PositionIndex):
            return self.positions(ren[e.leg])
        if isinstance(e, Gather):
            return self.lower_gather(e, ren, var)
        if isinstance(e, LayerNormNode):
            return lower_layer_norm(self, e, ren, var)  # type: ignore[arg-type]
        raise AssertionError(f"cannot lower {type(e).__name__}")

    def numel_number(self, legs: Iterable[str]) -> int:
        total = 1
        for leg in legs:
            total *= self.number(leg)
        return total

    def trial(self, build) -> float:
        """What a lowering would cost under the objective, at the planned sizes, without keeping
        its steps: its FLOPs, or under `time` the estimated seconds of a training step."""
        with self.scratch() as steps:
            build()
            if self.objective == "time":
                return self.estimated_time(steps)
            return self.counted_flops(steps)

    def counted_flops(self, steps: list[Step]) -> int:
        """The FLOPs of `steps` at the planned sizes, as the rewrites compare them (_planned_flops)."""
        total = sum((_planned_flops(s) for s in steps), sympy.Integer(0)).xreplace(self.chunk_values)
        return int(self.g.evaluate(total, **self.sizes).xreplace({BATCH_SIZE: self.sizes.get("B", 1)}))

    @contextlib.contextmanager
    def scratch(self):
        """Emit into a list of its own, whose values are forgotten afterwards: also the
        statements lowered on the way (a computed tensor read with its axes grouped otherwise,
        `Q[n (g r) d]`), whose steps the trial drops."""
        saved, self.target = self.target, []
        memo, self.memo = self.memo, dict(self.memo)
        masks, self.causal_masks = self.causal_masks, dict(self.causal_masks)
        values, self.values = self.values, dict(self.values)
        try:
            yield self.target
        finally:
            self.target, self.memo, self.causal_masks, self.values = saved, memo, masks, values


def _planned_flops(step: Step) -> sympy.Expr:
    """A step's FLOPs as the rewrites compare them: a product that sums nothing (one multiply per
    element) is weighed as the matmul with inner size 1 it replaced, 2 per element, as SDPA's
    count weighs a head of width 1; so choosing the product op moves no rewrite decision."""
    if isinstance(step.op, Multiply) and not step.op.summed:
        return 2 * step.flops
    return step.flops


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


def _alpha_key(e: Expr) -> tuple[object, tuple[str, ...], tuple[str, ...]]:
    """`e` up to the names of its legs: a key equal for two sub-expressions that compute the same
    thing with their legs renamed consistently (`cos(Ang[n p])` and `cos(Ang[m p])`, RoPE on
    the queries and on the keys) where the legs' sizes agree too (the caller compares them), its
    result legs in the order that key numbers them, and every leg it numbered in that order. Spans
    are left out; a string is a leg wherever it names one of `e`'s legs, except in the fields
    that name tensors, maps and reductions (`name`) or a position's operation (`op`)."""
    universe = _all_legs(e)
    order: dict[str, int] = {}

    def convert(value: object, field: str, owner: object) -> object:
        if isinstance(value, Span):
            return None
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return node(value)
        if isinstance(value, tuple):
            return tuple(convert(v, field, owner) for v in value)
        if isinstance(value, str) and value in universe and field not in ("name", "op"):
            return ("leg", order.setdefault(value, len(order)))
        if isinstance(value, str) and field == "name" and isinstance(owner, Position) and owner.op == "leg":
            return ("leg", order.setdefault(value, len(order)))
        return value

    def node(n: object) -> tuple:
        return (type(n).__name__, *(convert(getattr(n, f.name), f.name, n) for f in dataclasses.fields(n)))

    key = node(e)
    return key, tuple(sorted(dict.fromkeys(e.legs), key=lambda leg: order.get(leg, len(order)))), tuple(order)


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


def _scan_legs(node: Scan | SegmentSum) -> tuple[str, ...]:
    """The legs a scan or segment sum runs along, and those its causal masks relate."""
    if isinstance(node, SegmentSum):
        return (node.along, node.key)
    return (node.along, *(leg for m in node.masks if isinstance(m, POSITION_MASKS) for leg in (m.query, m.key)))


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
        leg for _, box in graph.boxes() for m in box.masks if isinstance(m, POSITION_MASKS) for leg in (m.query, m.key)
    }
    masked |= {
        leg
        for statement in [*graph.statements, *graph.updates]
        for node in walk(statement.expr)
        if isinstance(node, CausalFactor | WindowFactor)
        for leg in node.legs
    }
    masked |= {  # a convolution shifts whole legs with whole kernel legs
        leg
        for statement in [*graph.statements, *graph.updates]
        for node in walk(statement.expr)
        if isinstance(node, Convolution)
        for shift in node.shifts
        for leg in (shift.leg, shift.offset)
    }
    masked |= {  # a scan runs along a whole leg, never along a piece of one
        leg
        for statement in [*graph.statements, *graph.updates]
        for node in walk(statement.expr)
        if isinstance(node, Scan | SegmentSum)
        for leg in _scan_legs(node)
    }
    splits = {}
    for leg, options in wanted.items():
        if len(options) == 1 and leg not in masked:
            (sizes,) = options
            splits[leg] = tuple((f"{leg}.{k}", size) for k, size in enumerate(sizes))
    return splits
