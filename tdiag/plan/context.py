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

Not forked, on purpose: the tally of time estimates the trials made (timing.TimeModel's
`estimates`, `fusion_estimates`), which tells the `time` objective afterwards which rival
objectives could plan otherwise, and the planning device once resolved (a cache of the config)."""

from __future__ import annotations

import contextlib
import keyword
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import sympy

from ..graph import DesignGraph
from ..ir import (
    POSITION_MASKS,
    CausalFactor,
    Contraction,
    Convolution,
    ElementwiseMap,
    Expr,
    PaddingMask,
    Scan,
    SegmentSum,
    SoftmaxBox,
    Tensor,
    TensorRef,
    WindowFactor,
    walk,
)
from ..names import BUILTINS, GENERATED
from .program import BATCH, BATCH_SIZE, Step, Value

if TYPE_CHECKING:
    from ..device import DeviceModel
    from ..ir import Reduction, Statement
    from .footprint import Footprint
    from .forms.base import BoxChoice, Form
    from .program import Elementwise, Operand, Plan

# names the generated module uses for itself: a forward local of the design (an input, a mask,
# noise, a statement's result, a temporary) named like one of them gets a fresh name instead
RESERVED = set(keyword.kwlist) | set(GENERATED) | set(BUILTINS) | {"F", "inputs", "masks"}


@dataclass(frozen=True)
class LoweringConfig:
    """What one lowering plans: the design, its sizes, the objective, the attention kernel a
    fusable softmax box may use ("sdpa" or "flex"), the device that prices candidates (None:
    the planning device) and the candidate forms of a box (forms.FORMS, or those `only_forms`
    kept)."""

    graph: DesignGraph
    sizes: Mapping[str, int]
    objective: str = "flops"
    attention: str = "sdpa"
    device: DeviceModel | None = None
    forms: tuple[Form, ...] = ()
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
    choices: list[BoxChoice] = field(default_factory=list)  # each box's candidate forms and the one taken
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
        self._device = config.device  # None: the planning device, found when first asked (timing.py)
        # made in forward: a const over a run-time size (N), at the size read from the input;
        # a buffer with an update rule is read through a copy made on entry (codegen), so that the
        # in-place update after the forward never changes a tensor that autograd saved
        made = [t.name for t in graph.tensors_of_kind("const") if _over_run_time_size(graph, t)]
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


class Lowering(Protocol):
    """What a form of a box (forms/) and an emitter taking the lowering as `ctx` (sdpa.py,
    flex.py, linear.py, global_heads.py, ...) may read and call: the context's fields and scopes,
    and the passes' entry points. build._Lowering is the one class that has them all."""

    def apply_mask(self, content: Value, mask, ren, is_exp: bool, future: str = ...) -> Value: ...
    def arrange(self, value: Value, groups: list[list[str]]) -> Operand: ...
    def as_missing_legs(self, value: Value) -> Value: ...
    def aside(self) -> AbstractContextManager[list[Step]]: ...
    def at_planned_sizes(self, expr: sympy.Expr) -> float: ...

    attention: str

    def box(self) -> AbstractContextManager[None]: ...
    def causal_contract(
        self, query: str, key: str, leaves: list[Leaf], out: tuple[str, ...], coefficient: sympy.Expr, var: str | None
    ) -> Value: ...
    def causal_mask(self, query: str, key: str) -> str: ...

    choices: list[BoxChoice]

    def chunk_legs(self, query: str, key: str, size: int) -> tuple[str, str, str, int]: ...
    def chunk_value(self, value: Value, leg: str, chunks: str, within: str, edge: bool = ...) -> Value: ...
    def collect(
        self, e: Expr, ren: dict[str, tuple[str, ...]], leaves: list[Leaf], *, expand_powers: bool = ...
    ) -> sympy.Expr: ...
    def combine(
        self, kind: str, parts: list[tuple[int, Value]], out: tuple[str, ...], var: str | None, operator: str = ...
    ) -> Value: ...

    config: LoweringConfig

    def context(self, steps: list[Step]) -> Plan: ...
    def contract(self, leaves: list[Leaf], out: tuple[str, ...], coefficient: sympy.Expr, var: str | None) -> Value: ...
    def counted_flops(self, steps: list[Step]) -> int: ...
    @property
    def dearer(self) -> str: ...
    def decay_side(self, terms: list) -> Value: ...
    def definition_renaming(
        self, statement: Statement, axes: tuple[tuple[str, ...], ...]
    ) -> dict[str, tuple[str, ...]] | None: ...
    def emit(self, step: Step) -> Value | None: ...
    def estimated_time(self, steps: list[Step], fp: Footprint | None = ...) -> float: ...
    def expand(self, leg: str) -> tuple[str, ...]: ...
    def expand_broadcast(self, value: Value, legs: set[str]) -> Value: ...

    g: DesignGraph

    def group_size(self, group: Iterable[str]) -> sympy.Expr: ...
    def identity_renaming(self, legs: Iterable[str]) -> dict[str, tuple[str, ...]]: ...

    input_vars: dict[str, str]

    def is_batched(self, e: Expr) -> bool: ...
    def kept_by(self, e: SoftmaxBox, ren: dict[str, tuple[str, ...]]) -> frozenset[str] | None: ...
    def leaf_value(self, leaf: Leaf) -> Value: ...

    leg_sizes: dict[str, sympy.Expr]

    def lower(
        self, e: Expr, ren: dict[str, tuple[str, ...]], var: str | None = ..., scale: sympy.Expr = ...
    ) -> Value: ...
    def lower_box(
        self, e: SoftmaxBox, ren: dict[str, tuple[str, ...]], var: str | None, prefer: set[str] = ...
    ) -> Value: ...

    lowered: list[str]

    def maskable(self, content: Value, e: SoftmaxBox | Reduction, ren, legs: set[str]) -> Value: ...
    def masked_decay_exp(self, exponent: Value, query: str, key: str, what: str) -> Value: ...
    def materialize(self, value: Value, legs: tuple[str, ...]) -> Value: ...

    memo: dict[tuple, tuple[Value, tuple[str, ...]]]

    def memoized(self, e: Expr, ren: dict[str, tuple[str, ...]], build) -> Value: ...

    names: NameSupply

    def new_leg(self, leg: str, size: sympy.Expr | None = ...) -> str: ...
    def number(self, leg: str) -> int: ...
    def numel(self, legs: Iterable[str]) -> sympy.Expr: ...
    def numel_number(self, legs: Iterable[str]) -> int: ...

    objective: str

    def owns_parameter(self, e: Expr) -> bool: ...
    def plan_contraction(
        self, values: list[Value], out: tuple[str, ...], coefficient: sympy.Expr, var: str | None
    ) -> Value: ...
    def refuse(self, note: str) -> None: ...
    def runtime(self, expr: sympy.Expr) -> sympy.Expr: ...
    def scale(self, value: Value, coefficient: sympy.Expr, var: str | None = ...) -> Value: ...
    def scope(self, **values: Any) -> AbstractContextManager[None]: ...
    def shape(self, legs: Iterable[str]) -> tuple[sympy.Expr, ...]: ...

    shift_invariant: frozenset[str] | None

    def show_value(self, value: Value) -> str: ...
    def size(self, leg: str) -> sympy.Expr: ...

    stabilizations: int

    steps: list[Step]

    def sum_tree(self, terms: list[tuple[int, Operand, tuple[str, ...]]]) -> tuple[Elementwise, sympy.Expr]: ...

    target: list[Step]

    def tensor_var(self, tensor: Tensor) -> str: ...
    def trial(self) -> AbstractContextManager[list[Step]]: ...
    def trial_cost(self, build) -> float: ...
    @property
    def trialing(self) -> bool: ...

    values: dict[str, Value]

    def wide(self, depth: int = ...) -> AbstractContextManager[None]: ...
    def window_mask(self, query: str, key: str, before: sympy.Expr, after: sympy.Expr) -> str: ...
    def with_fresh_legs(self, ren: dict[str, tuple[str, ...]], legs: Iterable[str]) -> dict[str, tuple[str, ...]]: ...


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


def _over_run_time_size(graph: DesignGraph, tensor: Tensor) -> bool:
    return any(graph.sizes[s.name].is_free for a in tensor.axes for s in graph.expand(a.size).free_symbols)


def count_uses(graph: DesignGraph) -> Counter[str]:
    """How many times each tensor is read (a padding mask of a box counts, an output once)."""
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


def exp_factors(graph: DesignGraph, uses: Counter[str]) -> frozenset[str]:
    """Single-use statements `P[...] = exp(...)` that are factors of a normalize box without eps
    (through products folded into it): folded into the box, so their exp is shifted (stabilize.py)."""
    found: set[str] = set()

    def visit(e: Expr) -> None:
        if isinstance(e, Contraction):
            for factor in e.factors:
                visit(factor)
        elif isinstance(e, TensorRef) and not e.is_sliced and uses[e.name] == 1:
            statement = graph.tensors[e.name].statement
            if statement is None or e.name in graph.outputs:
                return
            if isinstance(statement.expr, ElementwiseMap) and statement.expr.name == "exp":
                found.add(e.name)
            elif isinstance(statement.expr, Contraction | TensorRef):
                visit(statement.expr)

    for _, box in graph.boxes():
        if not box.is_exp and box.eps == 0 and not box.masks:
            visit(box.content)  # type: ignore[arg-type]
    return frozenset(found)


def scan_legs(node: Scan | SegmentSum) -> tuple[str, ...]:
    """The legs a scan or segment sum runs along, and those its causal masks relate."""
    if isinstance(node, SegmentSum):
        return (node.along, node.key)
    return (node.along, *(leg for m in node.masks if isinstance(m, POSITION_MASKS) for leg in (m.query, m.key)))


def leg_splits(graph: DesignGraph, uses: Counter[str]) -> dict[str, tuple[tuple[str, sympy.Expr], ...]]:
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
    nodes = [node for statement in [*graph.statements, *graph.updates] for node in walk(statement.expr)]
    masked |= {leg for node in nodes if isinstance(node, CausalFactor | WindowFactor) for leg in node.legs}
    # a convolution shifts whole legs with whole kernel legs
    masked |= {
        leg
        for node in nodes
        if isinstance(node, Convolution)
        for shift in node.shifts
        for leg in (shift.leg, shift.offset)
    }
    # a scan runs along a whole leg, never along a piece of one
    masked |= {leg for node in nodes if isinstance(node, Scan | SegmentSum) for leg in scan_legs(node)}
    splits = {}
    for leg, options in wanted.items():
        if len(options) == 1 and leg not in masked:
            (sizes,) = options
            splits[leg] = tuple((f"{leg}.{k}", size) for k, size in enumerate(sizes))
    return splits


__all__ = ["FORKED", "RESERVED", "Leaf", "Lowering", "LoweringConfig", "LoweringContext", "NameSupply"]
