"""The lowering's walk over expressions: a statement, region or nonlinear node lowered into Steps
through the context (context.py: names, leg sizes, the emit target, memo, trials); each pass (a
base class of build._Lowering) builds on it.

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

import dataclasses
from collections.abc import Iterable, Mapping

import sympy

from ..errors import Span
from ..graph import DesignGraph
from ..ir import (
    ONE,
    CausalFactor,
    Contraction,
    Convolution,
    ElementwiseMap,
    Expr,
    Gather,
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
    TensorRef,
    WindowFactor,
)
from .constants import constant_value, fill
from .context import Leaf, LoweringConfig, LoweringContext
from .convolution import lower_convolution
from .distance import lower_distance
from .legs import _all_legs, _is_scaling, _renamed
from .norms import LayerNormNode, lower_layer_norm
from .positions import lower_gather, positions
from .program import (
    BATCH,
    BATCH_SIZE,
    Multiply,
    Step,
    Value,
    show_legs,
)

OPTIMAL_UP_TO = 5

# reductions through which a term constant along the reduced legs passes unchanged (+ c)
SHIFT_EQUIVARIANT = ("max", "logsumexp", "mean")


# ---- leaves of a multilinear region ----------------------------------------------------------


_Leaf = Leaf  # the name the passes knew it by


def _constant_along(legs: Iterable[str]) -> list[_Leaf]:
    """A factor 1 over the broadcast legs of a computed value (legs it is constant along and has
    no axis for): a region that sums one of them multiplies by its size (Σ_g c = G c)."""
    legs = tuple(sorted(leg for leg in legs if leg != BATCH))
    return [_Leaf(legs, constant=sympy.Integer(1))] if legs else []


def _value_leaves(value: Value) -> list[_Leaf]:
    """A computed value as factors of a region: itself over its axes, and 1 over its broadcast legs."""
    return [_Leaf(value.legs, value=value), *_constant_along(value.broadcast)]


class LoweringBase(LoweringContext):
    """Walks the design graph once, emitting Steps into its context."""

    def __init__(self, graph: DesignGraph, sizes: Mapping[str, int], objective: str = "flops", **config):
        super().__init__(LoweringConfig(graph, sizes, objective, **config))

    def size(self, leg: str) -> sympy.Expr:
        return self.leg_sizes[leg]

    def number(self, leg: str) -> int:
        return int(self.at_sizes(self.size(leg)))

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

    @property
    def dearer(self) -> str:
        """How a refused rewrite compares under the objective, for its note."""
        return "is estimated slower than" if self.objective == "time" else "costs more FLOPs than"

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
        with self.scope(shift_invariant=self.inner_shift_invariance(e, ren)):
            return self._lower(e, ren, var, scale)

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
        constant = constant_value(self, e)
        if constant is not None:
            return fill(self, constant * scale, tuple(p for leg in e.legs for p in ren[leg]), var)
        value = self.lower_nonlinear(e, ren, var)
        if scale != 1:
            value = self.scale(value, scale)
        return value

    def lower_nonlinear(self, e: Expr, ren: dict[str, tuple[str, ...]], var: str | None) -> Value:
        """Each nonlinear sub-expression is computed once: a repeat (the same map of the same
        tensors, whatever its legs are called in the region) reads the earlier value. A region
        reaches its nonlinear factors here, not through `lower`, so the same shift rule applies."""
        # a factor's inside is no factor of the box (stabilized), nor of the region around it
        invariant = self.inner_shift_invariance(e, ren)
        with self.scope(shift_invariant=invariant, stabilized=None, lazy_triangles=False):
            return self.memoized(e, ren, lambda: self._lower_nonlinear(e, ren, var))

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
            return lower_distance(self, e, ren, var)
        if isinstance(e, PositionIndex):
            return positions(self, ren[e.leg])
        if isinstance(e, Gather):
            return lower_gather(self, e, ren, var)
        if isinstance(e, LayerNormNode):
            return lower_layer_norm(self, e, ren, var)  # type: ignore[arg-type]
        raise AssertionError(f"cannot lower {type(e).__name__}")

    def numel_number(self, legs: Iterable[str]) -> int:
        total = 1
        for leg in legs:
            total *= self.number(leg)
        return total

    def trial_cost(self, build) -> float:
        """What a lowering would cost under the objective, at the planned sizes, without keeping
        its steps (a trial): its FLOPs, or under `time` the estimated seconds of a training step."""
        with self.trial() as steps:
            build()
            if self.objective == "time":
                return self.estimated_time(steps)
            return self.counted_flops(steps)

    def counted_flops(self, steps: list[Step]) -> int:
        """The FLOPs of `steps` at the planned sizes, as the rewrites compare them (_planned_flops):
        each step's count evaluated on its own (the same counts recur from trial to trial) and
        summed exactly, unless a count holds a float, which the evaluation of the sum rationalizes."""
        terms = [sympy.sympify(_planned_flops(s)) for s in steps]
        if not any(term.has(sympy.Float) for term in terms):
            return int(sum((self.at_sizes(term) for term in terms), sympy.Integer(0)))
        total = sum(terms, sympy.Integer(0)).xreplace(self.chunk_values)
        return int(self.g.evaluate(total, **self.sizes).xreplace({BATCH_SIZE: self.sizes.get("B", 1)}))


def _planned_flops(step: Step) -> sympy.Expr:
    """A step's FLOPs as the rewrites compare them: a product that sums nothing (one multiply per
    element) is weighed as the matmul with inner size 1 it replaced, 2 per element, as SDPA's
    count weighs a head of width 1; so choosing the product op moves no rewrite decision."""
    if isinstance(step.op, Multiply) and not step.op.summed:
        return 2 * step.flops
    return step.flops


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
