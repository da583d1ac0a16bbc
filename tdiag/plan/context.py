"""The lowering's state as one explicit object: what it was asked to plan (`LoweringConfig`),
what it derived from the design once (sizes, splits, the inputs' names), and what lowering
changes as it goes (names, leg sizes, values, memo, steps, notes, choices, chunk counts,
causal masks, stabilizations), every mutable field listed here and written only here or
through the scopes below.

A trial (`with ctx.trial() as steps:`) is a fork of the context: every mutable field is
copied on entry and the originals put back on exit, so what a candidate emitted, named,
noted or counted leaves the real lowering exactly as it was. `with ctx.aside() as steps:`
emits steps that may still be kept (an attention's prelude, built while matching it): they
take names and legs of the real lowering, only their values and memo stay apart. Scopes that
a nested computation sets and undoes (a box's depth, a float32 region, the softmax legs that
a sum may drop terms along) are entered with `with`, so they are undone on every exit.

Not forked, on purpose: the tally of time estimates the trials made (`estimates`,
`fusion_estimates`, counted by `count_estimate`), which tells the `time` objective afterwards which rival
objectives could plan otherwise, and the planning device once resolved (a cache of the config)."""

from __future__ import annotations

import contextlib
import keyword
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import sympy

from ..device import planning_device
from ..graph import DesignGraph
from ..ir import (
    ElementwiseMap,
    Expr,
    SoftmaxBox,
    Tensor,
)
from ..names import BUILTINS, GENERATED
from .derived import count_uses, exp_factors, leg_splits, over_run_time_size
from .program import BATCH, BATCH_SIZE, Step, Value, show_legs

if TYPE_CHECKING:
    from ..device import DeviceModel

# names the generated module uses for itself: a forward local of the design (an input, a mask,
# noise, a statement's result, a temporary) named like one of them gets a fresh name instead
RESERVED = set(keyword.kwlist) | set(GENERATED) | set(BUILTINS) | {"F", "inputs", "masks"}


@dataclass(frozen=True)
class LoweringConfig:
    """What one lowering plans: the design, its sizes, the objective, the attention kernel a
    fusable softmax box may use ("sdpa" or "flex"), the device that prices candidates (None:
    the planning device), the candidate forms of a box (forms.FORMS, or those `only_forms`
    kept) and the choosers that weigh them."""

    graph: DesignGraph
    sizes: Mapping[str, int]
    objective: str = "flops"
    attention: str = "sdpa"
    device: DeviceModel | None = None
    forms: tuple = ()  # forms.base.Form instances, typed loosely: the lowering imports no form
    # the choosers above the lowering (forms/), reached through the config so that the lowering
    # imports none of them: `resolve_boxes(ctx, leaves, out)` replaces each box of a region by
    # the form taken, `causal_product(ctx, query, key, leaves, out, coefficient, var)` lowers a
    # causal product in the form taken (build.py passes forms.resolve_boxes and
    # forms.causal_product.lower_causal_product; None: a lowering that meets neither)
    resolve_boxes: Callable[..., list[Leaf]] | None = None
    causal_product: Callable[..., Value] | None = None
    # the costs of the chunk sizes tried for a causal pair, by what decides them (chunked.py): a
    # cache of a pure function of its key, kept outside the state so that a trial that asks again
    # (every form and placement of an enclosing trial does) prices the sizes once
    chunk_costs: dict[tuple, dict[int, float]] = field(default_factory=dict, compare=False, repr=False)
    # expressions at the planned sizes, by the expression and the chunk counts' values
    # (`at_sizes`): every candidate of every box is priced at the same sizes, over and over
    evaluated: dict[tuple, sympy.Expr] = field(default_factory=dict, compare=False, repr=False)


@dataclass
class Leaf:
    """A factor of a multilinear region: a stored tensor (viewed into region legs) or a
    computed Value, or one of the factors decided with the region (a box, a constant, an exp,
    a causal triangle, a decay)."""

    legs: tuple[str, ...]
    tensor: Tensor | None = None
    value: Value | None = None
    view: tuple[tuple[str, ...], ...] = ()  # for stored tensors: region legs of each axis
    box: tuple[SoftmaxBox, dict[str, tuple[str, ...]]] | None = None  # a box its consumer may fuse
    constant: sympy.Expr | None = None  # a sub-expression that is one number at every index
    exponent: bool = False  # the factor is exp(value), its shift decided with the box's other factors
    triangle: tuple[str, str] | None = None  # causal(query, key) as a factor, not yet made numbers
    decay: tuple[ElementwiseMap, dict[str, tuple[str, ...]]] | None = None  # an exp lowered when read (decay.py)


@dataclass
class NameSupply:
    """Python variable names for the generated code: .td names where possible, fresh otherwise
    (the stem and the next free number)."""

    used: set[str]
    counter: int = 0

    @classmethod
    def taking(cls, taken: Iterable[str]) -> NameSupply:
        return cls(set(RESERVED) | set(taken))

    def fresh(self, stem: str) -> str:
        stem = stem if stem.isidentifier() else "t"
        name = stem
        while name in self.used:
            name, self.counter = f"{stem}_{self.counter}", self.counter + 1
        self.used.add(name)
        return name

    def fork(self) -> NameSupply:
        return NameSupply(set(self.used), self.counter)


@dataclass
class ContextState:
    """Every field that lowering changes, in one record: a trial forks all of them."""

    names: NameSupply
    leg_sizes: dict[str, sympy.Expr]
    legs_made: int = 0  # fresh region legs so far (new_leg)
    steps: list[Step] = field(default_factory=list)
    values: dict[str, Value] = field(default_factory=dict)  # each lowered statement's value
    memo: dict[tuple, tuple[Value, tuple[str, ...]]] = field(default_factory=dict)  # nonlinear values
    # (N, M) -> a causal triangle; (N, M, before, after) -> a window's band
    causal_masks: dict[tuple[sympy.Expr, ...], str] = field(default_factory=dict)
    stored_used: set[str] = field(default_factory=set)
    lowered: list[str] = field(default_factory=list)  # the notes of rewrites taken
    refused: list[str] = field(default_factory=list)  # ... and refused
    choices: list = field(default_factory=list)  # each box's candidate forms and the one taken (forms.base.BoxChoice)
    box_segments: list[tuple[int, int, str]] = field(default_factory=list)  # (first step, box step, box value)
    stabilizations: int = 0  # exp factors shifted so far: a box that shifted one guards 0 / 0
    chunk_counts: dict[tuple[sympy.Expr, int], sympy.Symbol] = field(default_factory=dict)  # (extent, C) -> ⌈N/C⌉
    chunk_values: dict[sympy.Symbol, sympy.Integer] = field(default_factory=dict)  # ... at the planned sizes
    chunk_sizes: dict[sympy.Symbol, sympy.Expr] = field(default_factory=dict)  # ... as N / C in cost formulas
    chunk_pairs: dict[tuple[str, str], tuple[str, str, str, int]] = field(default_factory=dict)
    chunk_notes: dict[tuple[str, str], str] = field(default_factory=dict)  # the chunk size each pair took, and why


# the fields of ContextState that `trial` forks
FORKED = tuple(ContextState.__dataclass_fields__)
# the scopes: fields a nested computation sets and undoes (`scope`, `box`, `wide`, `emitting`)
SCOPED = ("target", "shift_invariant", "box_depth", "wide_depth", "stabilized", "lazy_triangles")
# what `aside` keeps apart from the real lowering (its steps may be kept: names and legs are shared)
ASIDE = ("memo", "causal_masks", "values")


class LoweringContext:
    """The state of one lowering (module docstring): its config, what it derived from the design
    once, its mutable `state` (read as attributes: `ctx.memo`, `ctx.names`) and its scopes."""

    def __init__(self, config: LoweringConfig):
        graph = config.graph
        self.config = config
        self.g = graph
        self.objective = config.objective
        self.attention = config.attention  # what a fusable softmax box is lowered to
        self.sizes = dict(config.sizes)
        self._device = config.device  # None: the planning device, found when first asked (`device`)
        self.estimates = 0  # time estimates the trials made: none means no choice the objective could change
        self.fusion_estimates = 0  # those of a fused attention: the only choices `memory` makes otherwise than `flops`
        # made in forward: a const over a run-time size (N), at the size read from the input;
        # a buffer with an update rule is read through a copy made on entry (codegen), so that the
        # in-place update after the forward never changes a tensor that autograd saved
        made = [t.name for t in graph.tensors_of_kind("const") if over_run_time_size(graph, t)]
        self.made_on_entry = made + sorted({u.target for u in graph.updates})
        self.attributes = {
            t.name
            for t in graph.tensors.values()
            if t.kind in ("param", "const", "buffer") and t.name not in self.made_on_entry
        }
        self.uses = count_uses(graph)
        self.splits = leg_splits(graph, self.uses)
        self.exp_factors = exp_factors(graph, self.uses)
        self.known = {graph.sizes[k].symbol: v for k, v in graph.size_values().items()}
        leg_sizes: dict[str, sympy.Expr] = {BATCH: BATCH_SIZE}
        for name, leg in graph.legs.items():
            leg_sizes[name] = leg.size
            for piece, size in self.splits.get(name, ()):
                leg_sizes[piece] = size
        self.state = ContextState(NameSupply.taking([*graph.sizes, *self.attributes]), leg_sizes)
        self.input_vars = {
            t.name: self.state.names.fresh(t.name)
            for t in graph.tensors.values()
            if t.kind in ("input", "mask", "random") or t.name in self.made_on_entry
        }
        self.target: list[Step] = self.state.steps  # where emit appends
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
        self.lazy_triangles = False  # collecting a region's own factors: a causal factor stays a triangle

    def __getattr__(self, name: str) -> Any:
        """The fields of `state` read as the context's own (`ctx.memo`)."""
        if name in FORKED:
            return getattr(self.__dict__["state"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def trialing(self) -> bool:
        """Whether the steps emitted now are not the forward's own: a trial's, or the update
        rules' (whose boxes record no choices and no notes either)."""
        return self.target is not self.state.steps

    def __setattr__(self, name: str, value: Any) -> None:
        if name in FORKED:
            raise AttributeError(f"{name} is a field of the lowering's state, changed through its methods")
        object.__setattr__(self, name, value)

    @contextlib.contextmanager
    def trial(self) -> Iterator[list[Step]]:
        """A fork of the context for a candidate: its steps go to the list yielded, and every
        mutable field is put back on exit, as it was on entry."""
        with self._forked(FORKED) as steps:
            yield steps

    @contextlib.contextmanager
    def aside(self) -> Iterator[list[Step]]:
        """Steps emitted into a list of their own that the caller may emit later (an attention's
        prelude): they take names and legs as real steps do; the values, memo and causal masks
        they made are forgotten afterwards (the caller keeps the memo it read inside, if it emits
        them)."""
        with self._forked(ASIDE) as steps:
            yield steps

    @contextlib.contextmanager
    def _forked(self, names: Sequence[str]) -> Iterator[list[Step]]:
        """Emit into a list of its own with the fields `names` copied, put back on exit; the
        others, changed inside, stay changed."""
        saved, scopes = self.state, {name: getattr(self, name) for name in SCOPED}
        fork = self.state = _fork_of(saved, names)
        self.target = []
        try:
            yield self.target
        finally:
            for name in FORKED:
                if name not in names:
                    setattr(saved, name, getattr(fork, name))
            self.state = saved
            for name, value in scopes.items():
                setattr(self, name, value)

    @contextlib.contextmanager
    def scope(self, **values: Any) -> Iterator[None]:
        """Set the scoped fields given (shift_invariant, stabilized, lazy_triangles) for the
        duration of the block."""
        if not set(values) <= set(SCOPED):
            raise AssertionError(f"not a scope of the lowering: {', '.join(sorted(set(values) - set(SCOPED)))}")
        saved = {name: getattr(self, name) for name in values}
        for name, value in values.items():
            setattr(self, name, value)
        try:
            yield
        finally:
            for name, value in saved.items():
                setattr(self, name, value)

    @contextlib.contextmanager
    def box(self) -> Iterator[None]:
        """Inside a softmax box's argument: the steps emitted are marked in_box."""
        self.box_depth += 1
        try:
            yield
        finally:
            self.box_depth -= 1

    @contextlib.contextmanager
    def wide(self, depth: int = 1) -> Iterator[None]:
        """Inside a normalize box (`depth` 1; 0: not): its steps run in float32 under autocast."""
        self.wide_depth += depth
        try:
            yield
        finally:
            self.wide_depth -= depth

    @contextlib.contextmanager
    def emitting(self, steps: list[Step]) -> Iterator[None]:
        """Emit into `steps` (the state updates after the forward) for the duration of the block."""
        saved, self.target = self.target, steps
        try:
            yield
        finally:
            self.target = saved

    def emit(self, step: Step) -> Value | None:
        step.in_box = step.in_box or self.box_depth > 0
        step.wide = step.wide or self.wide_depth > 0
        self.target.append(step)
        return step.out

    def at_sizes(self, expr: sympy.Expr) -> sympy.Expr:
        """`expr` at the planned sizes, the chunk counts' values and the planned batch (B, else 1):
        a pure function of the expression and those values, remembered in the config."""
        chunks = self.state.chunk_values
        key = (expr, tuple(chunks.items()))
        known = self.config.evaluated.get(key)
        if known is None:
            value = self.g.evaluate(expr.xreplace(chunks), **self.sizes)
            known = self.config.evaluated[key] = value.xreplace({BATCH_SIZE: self.sizes.get("B", 1)})
        return known

    def new_leg(self, leg: str, size: sympy.Expr | None = None) -> str:
        """A fresh region leg named after `leg`, of its size or of `size`."""
        name = f"{leg}'{self.state.legs_made}"
        self.state.legs_made += 1
        self.state.leg_sizes[name] = self.state.leg_sizes[leg] if size is None else size
        return name

    def count_stabilization(self) -> None:
        """One more exp factor shifted by its max (stabilize.py)."""
        self.state.stabilizations += 1

    def note(self, text: str) -> None:
        """A rewrite taken, for the plan's notes (once, and not for trial plans)."""
        if not self.trialing and text not in self.state.lowered:
            self.state.lowered.append(text)

    def refuse(self, note: str) -> None:
        """Say why a rewrite was not taken (once, and not for trial plans)."""
        if not self.trialing and note not in self.state.refused:
            self.state.refused.append(note)

    # ---- what the design's legs and sizes are, at run time and at the planned sizes ----------

    def size(self, leg: str) -> sympy.Expr:
        return self.leg_sizes[leg]

    def number(self, leg: str) -> int:
        return int(self.at_sizes(self.size(leg)))

    def numel(self, legs: Iterable[str]) -> sympy.Expr:
        return sympy.Mul(*(self.size(leg) for leg in legs))

    def numel_number(self, legs: Iterable[str]) -> int:
        total = 1
        for leg in legs:
            total *= self.number(leg)
        return total

    def runtime(self, expr: sympy.Expr) -> sympy.Expr:
        """A size or scalar with every size known at build time replaced by its number."""
        return self.g.expand(expr).xreplace(self.known)

    def shape(self, legs: Iterable[str]) -> tuple[sympy.Expr, ...]:
        """The run-time sizes of `legs`, as the forward computes them."""
        return tuple(self.runtime(self.size(leg)) for leg in legs)

    def at_planned_sizes(self, expr: sympy.Expr) -> float:
        return float(self.at_sizes(sympy.sympify(expr)))

    def expand(self, leg: str) -> tuple[str, ...]:
        return tuple(p for p, _ in self.splits[leg]) if leg in self.splits else (leg,)

    def identity_renaming(self, legs: Iterable[str]) -> dict[str, tuple[str, ...]]:
        return {leg: self.expand(leg) for leg in legs}

    # ---- names the forward reads: stored tensors, masks built at entry -----------------------

    def show_value(self, value: Value) -> str:
        var = f"self.{value.var}" if value.var in self.attributes else value.var
        return f"{var}[{' '.join(show_legs(value.legs))}]"

    def tensor_var(self, tensor: Tensor) -> str:
        self.state.stored_used.add(tensor.name)
        if tensor.name in self.attributes:
            return tensor.name
        return self.input_vars[tensor.name]

    def causal_mask(self, query: str, key: str) -> str:
        """The forward's boolean [query, key] triangle (True above the diagonal: the future), one per
        pair of sizes, built at entry."""
        sizes = (self.size(query), self.size(key))
        if sizes not in self.causal_masks:
            self.state.causal_masks[sizes] = self.names.fresh("causal")
        return self.causal_masks[sizes]

    def window_mask(self, query: str, key: str, before: sympy.Expr, after: sympy.Expr) -> str:
        """The forward's boolean [query, key] band of a window (True outside it: key ≤ query −
        before or key ≥ query + after), one per sizes and widths, built at entry beside the causal
        triangles (`Plan.causal`, keyed (N, M, before, after))."""
        sizes = (self.size(query), self.size(key), self.runtime(before), self.runtime(after))
        if sizes not in self.causal_masks:
            self.state.causal_masks[sizes] = self.names.fresh("window")
        return self.causal_masks[sizes]

    # ---- the objective: how candidates compare, and what the trials estimated ----------------

    @property
    def dearer(self) -> str:
        """How a refused rewrite compares under the objective, for its note."""
        return "is estimated slower than" if self.objective == "time" else "costs more FLOPs than"

    @property
    def device(self) -> DeviceModel:
        """The device that prices candidates: the config's, else the planning device."""
        if self._device is None:
            self._device = planning_device()
        return self._device

    def count_estimate(self, fused: bool) -> None:
        """One more time estimate made on trial (`fused`: of steps with a fused attention)."""
        self.estimates += 1
        self.fusion_estimates += fused

    def rival_objectives(self) -> tuple[str, ...]:
        """The objectives whose plans may differ from this lowering's (made for `time`): none
        where no choice was estimated, `flops` where no fused attention was (`memory` then
        chooses as `flops` does: by FLOPs, trials.trial_cost), else both."""
        if not self.estimates:
            return ()
        return ("flops", "memory") if self.fusion_estimates else ("flops",)


class Lowering(Protocol):
    """What a lower rule, a form of a box (forms/) and an emitter taking the lowering as `ctx`
    (regions.py, sdpa.py, linear.py, ...) read and call: the context's fields, scopes and
    accessors above, and the walk's entry points (base.DesignLowering, the one class that has
    them): `lower` an expression, `lower_nonlinear` a factor of a region, `memoized` a value
    computed once per alpha-equivalent sub-expression."""

    attention: str
    attributes: set[str]
    box_segments: list[tuple[int, int, str]]
    causal_masks: dict[tuple[sympy.Expr, ...], str]
    choices: list
    chunk_counts: dict[tuple[sympy.Expr, int], sympy.Symbol]
    chunk_notes: dict[tuple[str, str], str]
    chunk_pairs: dict[tuple[str, str], tuple[str, str, str, int]]
    chunk_sizes: dict[sympy.Symbol, sympy.Expr]
    chunk_values: dict[sympy.Symbol, sympy.Integer]
    config: LoweringConfig
    exp_factors: frozenset[str]
    g: DesignGraph
    input_vars: dict[str, str]
    lazy_triangles: bool
    leg_sizes: dict[str, sympy.Expr]
    lowered: list[str]
    memo: dict[tuple, tuple[Value, tuple[str, ...]]]
    names: NameSupply
    objective: str
    refused: list[str]
    shift_invariant: frozenset[str] | None
    sizes: dict[str, int]
    stabilizations: int
    stabilized: frozenset[str] | None
    steps: list[Step]
    stored_used: set[str]
    target: list[Step]
    uses: Counter[str]
    values: dict[str, Value]

    def lower(
        self, e: Expr, ren: dict[str, tuple[str, ...]], var: str | None = ..., scale: sympy.Expr = ...
    ) -> Value: ...
    def lower_nonlinear(self, e: Expr, ren: dict[str, tuple[str, ...]], var: str | None) -> Value: ...
    def memoized(self, e: Expr, ren: dict[str, tuple[str, ...]], build: Callable[[], Value]) -> Value: ...

    def aside(self) -> AbstractContextManager[list[Step]]: ...
    def box(self) -> AbstractContextManager[None]: ...
    def emitting(self, steps: list[Step]) -> AbstractContextManager[None]: ...
    def scope(self, **values: Any) -> AbstractContextManager[None]: ...
    def trial(self) -> AbstractContextManager[list[Step]]: ...
    def wide(self, depth: int = ...) -> AbstractContextManager[None]: ...
    @property
    def trialing(self) -> bool: ...

    def emit(self, step: Step) -> Value | None: ...
    def new_leg(self, leg: str, size: sympy.Expr | None = ...) -> str: ...
    def count_stabilization(self) -> None: ...
    def refuse(self, note: str) -> None: ...

    def size(self, leg: str) -> sympy.Expr: ...
    def number(self, leg: str) -> int: ...
    def numel(self, legs: Iterable[str]) -> sympy.Expr: ...
    def numel_number(self, legs: Iterable[str]) -> int: ...
    def runtime(self, expr: sympy.Expr) -> sympy.Expr: ...
    def shape(self, legs: Iterable[str]) -> tuple[sympy.Expr, ...]: ...
    def at_planned_sizes(self, expr: sympy.Expr) -> float: ...
    def expand(self, leg: str) -> tuple[str, ...]: ...
    def identity_renaming(self, legs: Iterable[str]) -> dict[str, tuple[str, ...]]: ...

    def show_value(self, value: Value) -> str: ...
    def tensor_var(self, tensor: Tensor) -> str: ...
    def causal_mask(self, query: str, key: str) -> str: ...
    def window_mask(self, query: str, key: str, before: sympy.Expr, after: sympy.Expr) -> str: ...

    @property
    def dearer(self) -> str: ...
    @property
    def device(self) -> DeviceModel: ...
    def count_estimate(self, fused: bool) -> None: ...
    def rival_objectives(self) -> tuple[str, ...]: ...


def _fork_of(state: ContextState, names: Sequence[str]) -> ContextState:
    """A copy of `state` whose fields `names` are copies of their own (a container copied one
    level deep: what it holds is never changed in place)."""
    copied = ContextState(**{name: getattr(state, name) for name in FORKED})
    for name in names:
        setattr(copied, name, _copy(getattr(state, name)))
    return copied


def _copy(value: Any) -> Any:
    if isinstance(value, NameSupply):
        return value.fork()
    if isinstance(value, dict | list | set):
        return type(value)(value)
    return value


__all__ = ["FORKED", "RESERVED", "Leaf", "Lowering", "LoweringConfig", "LoweringContext", "NameSupply"]
