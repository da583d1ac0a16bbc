"""The lowering's walk over expressions: a statement, region or nonlinear node lowered into Steps
through the context (context.py: names, leg sizes, the emit target, memo, trials). A multilinear
region is lowered by regions.py; every other kind by its rule in `LOWER`, which each construct
module (tdiag/constructs) fills for its kind (JAX's `register_lowering`): a rule is a function
of the context, `rule(ctx, e, ren, var) -> Value`, reaching the walk again through `ctx.lower`
and `ctx.lower_nonlinear`, so that no pass imports this module.

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

from collections.abc import Callable, Mapping

import sympy

from ..graph import DesignGraph
from ..ir import (
    ONE,
    CausalFactor,
    Contraction,
    Expr,
    Reduction,
    Scalar,
    SquaredDistance,
    SumNode,
    TensorRef,
    WindowFactor,
)
from ..rules import Rules
from .constants import constant_value, fill
from .context import LoweringConfig, LoweringContext
from .contraction import scale_value
from .legs import all_legs, alpha_key, is_scaling, renamed_value
from .program import Value
from .regions import is_inlined, lower_region

# the lower stage: each nonlinear kind's rule, `rule(ctx, e, ren, var) -> Value`
LOWER: Rules[Callable[..., Value]] = Rules("lower")

# the factors of a multilinear region: lowered with their region (regions.lower_region), which
# collects them as its leaves, never by a rule of their own
MULTILINEAR = (Contraction, TensorRef, Scalar, CausalFactor, WindowFactor)
REGION_FACTOR = "a factor of a multilinear region: lowered with its region (plan/regions.py), never alone"

# reductions through which a term constant along the reduced legs passes unchanged (+ c)
SHIFT_EQUIVARIANT = ("max", "logsumexp", "mean")


class DesignLowering(LoweringContext):
    """The context with the walk: lowers every statement of the design, emitting Steps."""

    def __init__(self, graph: DesignGraph, sizes: Mapping[str, int], objective: str = "flops", **config):
        super().__init__(LoweringConfig(graph, sizes, objective, **config))

    def lower_design(self) -> None:
        for statement in self.g.statements:
            if is_inlined(self, statement.target):
                continue
            ren = self.identity_renaming(all_legs(statement.expr))
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
        if context is None or isinstance(e, SumNode | SquaredDistance) or is_scaling(e):
            return context
        if isinstance(e, Reduction) and e.name in SHIFT_EQUIVARIANT and not (e.masks and e.name == "mean"):
            return context | {p for leg in e.over for p in ren[leg]}
        return None

    def _lower(self, e: Expr, ren: dict[str, tuple[str, ...]], var: str | None, scale: sympy.Expr) -> Value:
        if isinstance(e, MULTILINEAR):
            return lower_region(self, e, ren, var, scale)  # a position mask alone is a region of one factor
        constant = constant_value(self, e)
        if constant is not None:
            return fill(self, constant * scale, tuple(p for leg in e.legs for p in ren[leg]), var)
        value = self.lower_nonlinear(e, ren, var)
        if scale != 1:
            value = scale_value(self, value, scale)
        return value

    def lower_nonlinear(self, e: Expr, ren: dict[str, tuple[str, ...]], var: str | None) -> Value:
        """Each nonlinear sub-expression is computed once, by its kind's rule in LOWER: a repeat
        (the same map of the same tensors, whatever its legs are called in the region) reads the
        earlier value. A region reaches its nonlinear factors here, not through `lower`, so the
        same shift rule applies."""
        # a factor's inside is no factor of the box (stabilized), nor of the region around it
        invariant = self.inner_shift_invariance(e, ren)
        with self.scope(shift_invariant=invariant, stabilized=None, lazy_triangles=False):
            return self.memoized(e, ren, lambda: LOWER.lookup(e)(self, e, ren, var))

    def memoized(self, e: Expr, ren: dict[str, tuple[str, ...]], build: Callable[[], Value]) -> Value:
        """`build()`, or the value an alpha-equivalent sub-expression (`alpha_key`) over the same
        pattern of region legs got before, renamed onto this one's legs."""
        shape, ordered, named = alpha_key(e)
        sizes = tuple(self.g.legs[leg].size if leg in self.g.legs else leg for leg in named)
        legs = tuple(p for leg in ordered for p in ren[leg])
        shift = None  # which of its legs a softmax around it normalizes: sums may drop terms by it
        if self.shift_invariant is not None and isinstance(e, SumNode | SquaredDistance | Reduction):
            shift = frozenset(k for k, p in enumerate(legs) if p in self.shift_invariant)
        pattern = tuple(legs.index(p) for p in legs)
        key = (shape, sizes, tuple(len(ren[leg]) for leg in ordered), pattern, shift)
        if key in self.memo:
            value, earlier = self.memo[key]
            return renamed_value(value, dict(zip(earlier, legs, strict=True)))
        value = build()
        self.memo[key] = (value, legs)
        return value
