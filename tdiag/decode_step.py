"""The decoding step planned and compiled (issues 24 and 25): a "kv" cache's step as generated
code, and the choice between a design's plain and absorbed forms by the planner's cost model.

A step of a "kv" cache (tdiag/decode.py) computes T new positions after P cached ones. Its work
splits in two programs, each a design graph planned by the planner (tdiag/plan) and printed by
codegen (tdiag/codegen.py), so that nothing of a `.td` file reaches the generated text except
through codegen's one door:

- the rows program: the new rows of the cached tensors (K, V; MLA's latent) from the new inputs
  X[T], every position leg over the T new positions;
- the attention program: the outputs at the new positions from the new inputs and the cached
  rows of every position so far (inputs over M = P + T), the query legs over T, the key legs
  over M.

T and M are run-time sizes of the generated code (bound from the inputs' shapes), so one program
serves every length; `index(n)` of a new position is read from an input of absolute positions
P .. P + T − 1, and a gather's address or a table's slice along a new position is offset by
P = M − T. The design's causal masks and windows compare absolute positions, so each becomes a
mask input over its query and key legs made at each step (`PositionMask`). A causal mask of one
new position against every key hides nothing, so the attention program is planned twice: for one
new position without those masks (the common step, planned with the cache), and for any count
with them (planned the first time a call brings several). The first step of an empty cache runs
the module's own compiled causal forward and the rows program; noise is zero, as in
the eval mode a cache of a noisy design needs. Where a design needs what these programs do not
take (a position-only tensor read over both the new and every position; a cached tensor also
read at the new positions alone, or read in a slice; a leg that is a query in one statement and
a key in another),
`CompiledStep.reason` says so and the cache evaluates the step with the reference evaluator, as
before: the answer is the same either way (tests/test_decode_step.py).

The form (`decode_form`): where a statement reads at every key a linear map of a smaller
per-position tensor (MLA's per-head keys and values of its latent, graph/absorb.py), the step
can cache either the mapped rows (the plain form) or the smaller tensor, with the map's weights
multiplied into the query and the output (the absorbed form, DeepSeek-V2 Sec. 2.1). Each form's
two programs are planned at the step's sizes and priced by the planner's one time model
(plan/timing.py `plan_time`: a roofline of FLOPs and bytes moved on the planning device), and the
cheaper is taken, the plain form on a tie: for one query against a long cache reading the cache
dominates (memory traffic, not FLOPs), and the absorbed form reads the fewer entries per
position; over a whole sequence (T = N new positions; with nothing cached, the training forward,
both forms planned as whole forward passes) the planner contracts the latent with the weights
first in either form, its cheaper order at N × N, so the forms cost the same or the absorbed one
a little more, and the plain form is kept."""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sympy

from .decode_rows import ALL, NEW, DecodeRule, RowRequests, reads_length
from .errors import Span
from .graph import DesignGraph
from .graph.absorb import absorbed, length_symbol
from .graph.dataflow import dataflow_graph
from .graph.sizes import size_symbol
from .ir import (
    Axis,
    CausalFactor,
    CausalMask,
    Contraction,
    Expr,
    Gather,
    PaddingMask,
    Position,
    PositionIndex,
    Scalar,
    Size,
    Statement,
    Tensor,
    TensorRef,
    WindowFactor,
    WindowMask,
    walk,
)
from .names import BUILTINS, GENERATED

if TYPE_CHECKING:
    import torch

    from .decode import DecodeCache

__all__ = ["CompiledStep", "DecodeForm", "NotCompiledError", "PositionMask", "decode_form", "pin_form", "step_graphs"]

STEP_PLANNED_LENGTH = 1024  # the cache length a step is planned and its form chosen at, unless given


@dataclass(frozen=True)
class PositionMask:
    """A causal mask (`before` None) or a window of a step, over a query leg and a key leg each
    running over the new positions (NEW) or every position (ALL): True where the key is visible."""

    query: str
    key: str
    before: int | None = None
    after: int | None = None

    def value(self, past: int, count: int, device) -> torch.Tensor:
        import torch

        def positions(role: str) -> torch.Tensor:
            return (
                torch.arange(past, past + count, device=device)
                if role == NEW
                else torch.arange(past + count, device=device)
            )

        q, k = positions(self.query)[:, None], positions(self.key)[None, :]
        if self.before is None:
            return k <= q
        return (k > q - self.before) & (k < q + self.after)


class NotCompiledError(ValueError):
    """A design whose step the generated programs cannot take: the reason."""


@dataclass(frozen=True)
class StepGraphs:
    """The graphs of a step (module docstring): `rows` gives the new rows of the `cached` tensors
    computed from the input (None where only the input itself is cached), `attend` the outputs at
    any count of new positions, with the mask inputs `masks`, and `attend_one` those at one new
    position, with `masks_one` (no causal mask of the new position against every key). `sizes`
    names the step's sizes in them: T (new positions), M (all positions) and P (= M − T, cached).
    `positions` is the input of absolute positions of the new rows; `inputs` the attention
    graphs' inputs in the order of their forward: the design's input, then the cached tensors'
    rows (`cached_inputs`: a cached tensor's name -> its input's), then the positions where read;
    `rows_inputs` the rows graph's."""

    attend: DesignGraph
    rows: DesignGraph | None
    cached: tuple[str, ...]
    sizes: Mapping[str, str]
    positions: str | None
    inputs: tuple[str, ...]
    rows_inputs: tuple[str, ...]
    cached_inputs: Mapping[str, str]
    masks: Mapping[str, PositionMask]
    attend_one: DesignGraph
    masks_one: Mapping[str, PositionMask]


def _fresh(stem: str, taken: set[str]) -> str:
    name = stem
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def _rebuild(expr: Expr, fn) -> Expr:
    """`expr` rebuilt bottom-up with `fn` applied to every node (every Expr-valued field)."""
    changes: dict[str, object] = {}
    for f in dataclasses.fields(expr):
        value = getattr(expr, f.name)
        if isinstance(value, Expr):
            new = _rebuild(value, fn)
        elif isinstance(value, tuple) and value and all(isinstance(v, Expr) for v in value):
            new = tuple(_rebuild(v, fn) for v in value)
        else:
            continue
        if new is not value:
            changes[f.name] = new
    expr = dataclasses.replace(expr, **changes) if changes else expr
    return fn(expr)


def _substituted(value: Any, subs: Mapping[sympy.Symbol, sympy.Expr]) -> Any:
    """Every size expression in `value` (an expression node's fields, recursively) with `subs`."""
    if isinstance(value, sympy.Basic):
        return value.xreplace(subs)
    if isinstance(value, tuple):
        items = tuple(_substituted(v, subs) for v in value)
        return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
    if isinstance(value, Position):
        return dataclasses.replace(
            value, value=_substituted(value.value, subs), operands=_substituted(value.operands, subs)
        )
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and not isinstance(value, Span):
        changes = {}
        for f in dataclasses.fields(value):
            old = getattr(value, f.name)
            new = _substituted(old, subs)
            if new is not old:
                changes[f.name] = new
        return dataclasses.replace(value, **changes) if changes else value
    return value


def _offset_position(position: Position, roles: Mapping[str, str], offset: sympy.Expr) -> Position:
    """A gather's address with each new position's leg read at its absolute position."""
    if position.op == "leg":
        if roles.get(position.name) == NEW:
            return Position("+", operands=(position, Position("number", value=offset)))
        return position
    return dataclasses.replace(position, operands=tuple(_offset_position(o, roles, offset) for o in position.operands))


class _Builder:
    """One graph of a step: the statements `requests` reach from the given tensors, over the
    position legs' roles (NEW: the new positions, T; ALL: every position, M)."""

    def __init__(self, work: DesignGraph, rule: DecodeRule, symbol: sympy.Symbol, stop: set[str]):
        self.work, self.rule, self.symbol, self.stop = work, rule, symbol, stop
        self.labels: dict[str, tuple] = {}  # tensor -> the rows it is computed at
        self.roles: dict[str, str] = {}  # position leg -> NEW or ALL
        self.order: list[str] = []
        self.cached_reads: dict[str, str] = {}  # a cached tensor read at every position -> its input's name
        self.randoms: list[str] = []  # noise over positions

    def role(self, leg: str, role: str) -> None:
        if self.roles.setdefault(leg, role) != role:
            raise NotCompiledError(
                f"leg {leg} runs over the new positions in one statement and every position in another"
            )

    def request(self, name: str, labels: tuple) -> None:
        tensor = self.work.tensors[name]
        if tensor.kind == "input" or (name in self.stop and ALL in labels):
            if ALL in labels and name not in self.stop:
                raise NotCompiledError(f"input {name} is read at every position but not cached")
            if tensor.kind != "input" and NEW in labels:
                raise NotCompiledError(f"{name} is read at the new positions and at every position")
            if ALL in labels:
                self.cached_reads.setdefault(name, name)
            return
        if name in self.stop:
            raise NotCompiledError(f"cached {name} is read at the new positions alone")
        if tensor.kind in ("param", "const", "buffer", "mask"):
            return
        if name in self.labels:
            if self.labels[name] != labels:
                raise NotCompiledError(f"{name} is read at the new positions and at every position")
            return
        self.labels[name] = labels
        if tensor.kind == "random":  # zero in a step, as in the eval-mode forward a cache needs
            self.randoms.append(name)
            return
        statement = tensor.statement
        assert statement is not None
        legs = {}
        for group, label in zip(statement.groups, labels, strict=True):
            if label is not None:
                legs[group[0]] = label
        for leg in self.rule.inner.get(name, ()):
            legs[leg] = ALL
        for leg, label in legs.items():
            self.role(leg, label)
        for node in walk(statement.expr):
            if isinstance(node, TensorRef):
                self.ref(node, legs)
        self.order.append(name)

    def ref(self, ref: TensorRef, legs: Mapping[str, str]) -> None:
        tensor = self.work.tensors[ref.name]
        labels = []
        for group, axis in zip(ref.groups, tensor.axes, strict=True):
            if axis.size == self.symbol:
                labels.append(legs.get(group[0], NEW))
                self.role(group[0], labels[-1])
            else:
                labels.append(None)
        self.request(ref.name, tuple(labels))


def _fresh_name(stem: str, work: DesignGraph, *more) -> str:
    taken = {*work.sizes, *work.tensors, *work.legs, *GENERATED, *BUILTINS}
    for names in more:
        taken |= {names} if isinstance(names, str) else set(names)
    return _fresh(stem, taken)


def _rule_of(work: DesignGraph) -> DecodeRule | None:
    """The decoding rule of a graph as given (its cached tensors and key legs), without taking
    its absorbed form (decode.decode_rule takes the form `decode_form` chooses)."""
    symbol = length_symbol(work)
    positional = frozenset(name for name, leg in work.legs.items() if leg.size == symbol)
    walker = RowRequests(work, positional, symbol)
    for name in work.outputs:
        walker.request(name, walker.output_labels(name))
    if walker.problem is not None:
        return None
    x = work.inputs[0]
    axis = next(k for k, a in enumerate(x.axes) if a.size == symbol)
    return DecodeRule(
        "kv", x.name, axis, symbol.name, positional, tuple(walker.cached), walker.inner, None, walker.noise
    )


def step_graphs(work: DesignGraph, rule: DecodeRule | None = None) -> StepGraphs:
    """The rows and attention graphs of a step of `work` (a causal design of one input, or its
    absorbed form) under `rule` (its decoding rule, of kind "kv"). Raises NotCompiledError with the
    reason where the programs cannot take it."""
    rule = rule or _rule_of(work)
    if rule is None or rule.kind != "kv":
        raise NotCompiledError("the design does not decode with cached rows")
    if work.updates:
        raise NotCompiledError("the design updates buffers")
    symbol = work.sizes[rule.size].symbol
    taken = {*work.sizes, *work.tensors, *work.legs, *GENERATED, *BUILTINS}
    t_name, m_name, p_name = _fresh("T", taken), _fresh("M", taken), _fresh("P", taken)
    t_sym, m_sym, p_sym = (size_symbol(name) for name in (t_name, m_name, p_name))
    span = work.sizes[rule.size].span
    sizes = {name: s for name, s in work.sizes.items() if name != rule.size}
    sizes[t_name] = Size(t_name, t_sym, None, span)
    sizes[m_name] = Size(m_name, m_sym, None, span)
    sizes[p_name] = Size(p_name, p_sym, m_sym - t_sym, span)
    positions_name = _fresh("position", taken)
    names = {"T": t_name, "M": m_name, "P": p_name}

    cached = tuple(rule.cached)
    attend = _Builder(work, rule, symbol, set(cached))
    for name in work.outputs:
        tensor = work.tensors[name]
        attend.request(name, tuple(NEW if a.size == symbol else None for a in tensor.axes))
    x = work.inputs[0].name
    cached_inputs = {name: (name if name != x else _fresh(f"{x}_rows", taken)) for name in cached}
    symbols = (t_sym, m_sym, p_sym)
    masks: dict[str, PositionMask] = {}
    attend_graph = _graph(
        work, attend, sizes, symbol, symbols, positions_name, cached_inputs, f"{work.name}_step", masks
    )
    masks_one: dict[str, PositionMask] = {}
    attend_one = _graph(
        work, attend, sizes, symbol, symbols, positions_name, cached_inputs, f"{work.name}_step1", masks_one, False
    )
    derived = [name for name in cached if work.tensors[name].kind == "derived"]
    rows_graph = None
    if derived:
        rows = _Builder(work, rule, symbol, set())
        for name in derived:
            tensor = work.tensors[name]
            rows.request(name, tuple(NEW if a.size == symbol else None for a in tensor.axes))
        if ALL in rows.roles.values():
            raise NotCompiledError("a cached tensor's new rows read every position")
        rows_graph = _graph(
            work, rows, sizes, symbol, symbols, positions_name, {}, f"{work.name}_rows", {}, outputs=derived
        )
    inputs = tuple(t.name for t in attend_graph.inputs)
    rows_inputs = tuple(t.name for t in rows_graph.inputs) if rows_graph is not None else (x,)
    return StepGraphs(
        attend_graph,
        rows_graph,
        cached,
        names,
        positions_name,
        inputs,
        rows_inputs,
        cached_inputs,
        masks,
        attend_one,
        masks_one,
    )


def _graph(
    work: DesignGraph,
    built: _Builder,
    sizes: dict[str, Size],
    symbol: sympy.Symbol,
    symbols: tuple[sympy.Symbol, sympy.Symbol, sympy.Symbol],
    positions_name: str,
    cached_inputs: Mapping[str, str],
    name: str,
    masks_made: dict[str, PositionMask],
    causal: bool = True,
    outputs: list[str] | None = None,
) -> DesignGraph:
    """The design graph of one program of a step: `built`'s statements over their legs' roles,
    the causal masks dropped (one new position sees every key), `index` of a new position read
    from the positions input, the cached tensors and the design's input as inputs."""
    t, m, p = symbols
    roles = built.roles
    by_role = {NEW: t, ALL: m}
    legs = {}
    for leg_name, leg in work.legs.items():
        if leg.size == symbol:
            if leg_name in roles:
                legs[leg_name] = dataclasses.replace(leg, size=by_role[roles[leg_name]])
        else:
            legs[leg_name] = leg
    subs = {symbol: m}
    if outputs is not None and reads_length(
        dataclasses.replace(work, statements=[work.tensors[n].statement for n in built.order]), symbol
    ):
        raise NotCompiledError("a cached tensor's rows read the length (the rows program has only the new positions)")
    tensors: dict[str, Tensor] = {}
    statements: list[Statement] = []
    x = work.inputs[0]
    tensors[x.name] = dataclasses.replace(
        x, axes=tuple(Axis(a.leg, t) if a.size == symbol else a for a in x.axes), statement=None
    )
    for cached, input_name in cached_inputs.items():
        if cached not in built.cached_reads:
            continue
        source = work.tensors[cached]
        tensors[input_name] = Tensor(
            input_name,
            "input",
            tuple(Axis(a.leg, m) if a.size == symbol else a for a in source.axes),
            source.span,
        )
    for noise in built.randoms:
        source = work.tensors[noise]
        labels = built.labels[noise]
        axes = tuple(
            Axis(a.leg, by_role[lab]) if lab is not None else a for a, lab in zip(source.axes, labels, strict=True)
        )
        tensors[noise] = dataclasses.replace(source, axes=axes)
    uses_index: list[str] = []

    def rewrite(node: Expr) -> Expr:
        if isinstance(node, PositionIndex) and roles.get(node.leg) == NEW:
            uses_index.append(node.leg)
            return TensorRef((node.leg,), node.span, positions_name, ((node.leg,),))
        if isinstance(node, TensorRef):
            return _ref(node)
        if isinstance(node, CausalFactor) and not _hides_nothing(node):
            return _mask_ref(CausalMask(node.query, node.key, node.span))
        if isinstance(node, Contraction) and any(isinstance(f, CausalFactor) for f in node.factors):
            factors = tuple(f for f in node.factors if not isinstance(f, CausalFactor))
            node = (
                dataclasses.replace(node, factors=factors)
                if factors
                else Scalar(node.legs, node.span, node.coefficient)
            )
        if isinstance(node, WindowFactor):
            return _mask_ref(node.mask)
        if isinstance(node, Gather):
            if node.source is not None and any(roles.get(leg) for leg in node.source.legs):
                raise NotCompiledError("a gather from a tensor over positions")
            if node.position is not None and any(roles.get(leg) == NEW for leg in node.position.legs()):
                if outputs is not None:
                    raise NotCompiledError("a cached tensor's rows gather at their positions")
                node = dataclasses.replace(node, position=_offset_position(node.position, roles, p))
        masks = getattr(node, "masks", None)
        if masks:
            kept = tuple(
                PaddingMask(_mask_ref(mask), mask.span)
                for mask in masks
                if isinstance(mask, WindowMask) or (isinstance(mask, CausalMask) and not _hides_nothing(mask))
            )
            node = dataclasses.replace(node, masks=kept)
        return _substituted(node, subs)

    made: dict[PositionMask, str] = {}

    def _hides_nothing(mask: CausalMask | CausalFactor) -> bool:
        """A causal mask of the one new position (the last) against every key, in the program
        for one new position (`causal` False): every key is visible, the mask is left out."""
        return not causal and roles.get(mask.query) == NEW and roles.get(mask.key) == ALL

    def _mask_ref(mask: CausalMask | WindowMask) -> TensorRef:
        """A causal mask or window as a mask input over its query and key legs, made at each step
        from the legs' absolute positions (the new ones P .. P + T − 1, or every one)."""
        if outputs is not None or roles.get(mask.query) is None or roles.get(mask.key) is None:
            raise NotCompiledError("a causal mask or window over other than the step's positions")
        window = isinstance(mask, WindowMask)
        spec = PositionMask(
            roles[mask.query],
            roles[mask.key],
            int(work.evaluate(mask.before)) if window else None,
            int(work.evaluate(mask.after)) if window else None,
        )
        if spec not in made:
            made[spec] = _fresh_name("window" if window else "causal", work, positions_name, made.values())
            axes = (Axis(mask.query, by_role[spec.query]), Axis(mask.key, by_role[spec.key]))
            tensors[made[spec]] = Tensor(made[spec], "mask", axes, mask.span)
            masks_made[made[spec]] = spec
        legs = (mask.query, mask.key)
        return TensorRef(legs, mask.span, made[spec], tuple((leg,) for leg in legs))

    def _ref(ref: TensorRef) -> TensorRef:
        tensor = work.tensors[ref.name]
        if tensor.kind == "input" and ref.name in cached_inputs and any(roles.get(g[0]) == ALL for g in ref.groups):
            ref = dataclasses.replace(ref, name=cached_inputs[ref.name])
        if (tensor.kind == "input" or ref.name in cached_inputs) and ref.is_sliced:
            raise NotCompiledError(f"{ref.name} would be an input read in a slice, which an input is not (check.py)")
        if ref.is_sliced:
            slices, offsets = list(ref.slices), list(ref.offsets) or [sympy.Integer(0)] * len(ref.slices)
            for k, group in enumerate(ref.groups):
                role = roles.get(group[0])
                if role is None or ref.slices[k] is None or tensor.axes[k].size == symbol:
                    continue
                if role == NEW and outputs is not None:
                    raise NotCompiledError("a cached tensor's rows slice a table at their positions")
                slices[k] = t if role == NEW else m
                if role == NEW:
                    offsets[k] = offsets[k] + p
            ref = dataclasses.replace(ref, slices=tuple(slices), offsets=tuple(offsets))
        return _substituted(ref, subs)

    for tensor_name in built.order:
        tensor = work.tensors[tensor_name]
        labels = built.labels[tensor_name]
        statement = tensor.statement
        assert statement is not None
        expr = _rebuild(statement.expr, rewrite)
        if any(isinstance(node, CausalFactor) for node in walk(expr)):
            raise NotCompiledError(f"{tensor_name} has a causal factor outside a product")
        new_statement = dataclasses.replace(statement, expr=expr)
        axes = tuple(
            Axis(a.leg, by_role[label]) if label is not None else a
            for a, label in zip(tensor.axes, labels, strict=True)
        )
        tensors[tensor_name] = dataclasses.replace(tensor, axes=axes, statement=new_statement)
        statements.append(new_statement)
    read = {node.name for statement in statements for node in walk(statement.expr) if isinstance(node, TensorRef)}
    for tensor in work.tensors.values():
        if tensor.kind not in ("param", "const", "buffer"):
            continue
        if tensor.kind == "const" and any(symbol in work.expand(a.size).free_symbols for a in tensor.axes):
            if tensor.name in read:
                raise NotCompiledError(f"constant {tensor.name} is over the length, which the step's sizes replace")
            continue  # a constant over the length that the step never reads is not made for it
        tensors[tensor.name] = tensor
    if uses_index:
        tensors[positions_name] = Tensor(positions_name, "input", (Axis(uses_index[0], t),), x.span)
    order = [x.name, *(cached_inputs[c] for c in cached_inputs if c in built.cached_reads)]
    order += [positions_name] if uses_index else []
    ordered = {name: tensors[name] for name in order}
    ordered.update({name: tensor for name, tensor in tensors.items() if name not in ordered})
    sizes = {
        name: dataclasses.replace(s, definition=s.definition.xreplace(subs)) if s.definition is not None else s
        for name, s in sizes.items()
    }
    for statement in statements:
        for node in walk(statement.expr):
            if isinstance(node, TensorRef) and node.name not in ordered:
                raise NotCompiledError(f"{node.name} is read where the step does not compute it")
    _check_all_positions_carried(ordered, m)
    outs = outputs if outputs is not None else list(work.outputs)
    return dataclasses.replace(
        work,
        name=name,
        sizes=sizes,
        legs=legs,
        tensors=ordered,
        statements=statements,
        updates=[],
        outputs=outs,
        graph=dataflow_graph(ordered, statements, []),
    )


def _check_all_positions_carried(tensors: Mapping[str, Tensor], m: sympy.Symbol) -> None:
    """A program reads its run-time sizes off its inputs' shapes, so a tensor over every position
    (M) needs an input over M: a cached tensor or a mask. Noise over both position legs read where
    nothing cached is (one new position drops its causal masks) has none, and steps by the
    reference evaluator."""
    carried = any(m in a.size.free_symbols for t in tensors.values() if t.kind in ("input", "mask") for a in t.axes)
    if carried:
        return
    for tensor in tensors.values():
        if any(m in a.size.free_symbols for a in tensor.axes):
            raise NotCompiledError(f"{tensor.name} is over every position, which no cached tensor or mask carries")


def _planned(graph: DesignGraph, at: Mapping[str, int]):
    from .module import plan_for

    return plan_for(graph, {**at, "B": 1}, absorb=False)


def _step_sizes(graphs: StepGraphs, queries: int, past: int) -> dict[str, int]:
    return {graphs.sizes["T"]: queries, graphs.sizes["M"]: past + queries}


@dataclass(frozen=True)
class FormCost:
    """One form's plans at the step's sizes and their estimated seconds (plan_time: the time
    model's training-step figure, the same multiple of a forward for every op)."""

    form: str
    seconds: float
    cached: tuple[str, ...]
    width: int


@dataclass(frozen=True)
class DecodeForm:
    """The planner's choice of a step's form at `queries` new positions after `past` cached ones:
    `form` is "plain" or "absorbed", `costs` each form's estimate (one entry where the design has
    no absorbed form)."""

    form: str
    queries: int
    past: int
    costs: tuple[FormCost, ...]
    pinned: bool = False  # set by `pin_form`, not chosen

    def __str__(self) -> str:
        where = f"a forward over N = {self.queries}" if self.past == 0 else f"T = {self.queries} after P = {self.past}"
        parts = [
            f"{c.form} {c.seconds * 1e3:.3g} ms (caches {', '.join(c.cached)}: {c.width} per position)"
            for c in self.costs
        ]
        chosen = f"{self.form} form pinned (the planner's choice" if self.pinned else f"{self.form} form"
        return f"{chosen} at {where}: " + "; ".join(parts) + (")" if self.pinned else "")


def _width(work: DesignGraph, cached: tuple[str, ...], symbol: sympy.Symbol) -> int:
    total = 0
    for name in cached:
        entries = 1
        for a in work.tensors[name].axes:
            if a.size != symbol:
                entries *= int(work.evaluate(a.size))
        total += entries
    return total


def decode_form(graph: DesignGraph, queries: int = 1, past: int = STEP_PLANNED_LENGTH - 1) -> DecodeForm:
    """The form a step of `queries` new positions after `past` cached ones takes, by the
    planner's time model (plan/timing.py): the plain and the absorbed graph (graph/absorb.py `absorbed`)
    each planned, as a step's rows and attention programs at those sizes, or with nothing cached
    (`past` = 0) as whole forward passes over N = `queries` (the training forward), and the
    cheaper taken (the plain one on a tie, or where the absorbed one cannot be planned)."""
    from .plan.timing import plan_time

    forms = {"plain": graph}
    other = absorbed(graph)
    if other is not graph:
        forms["absorbed"] = other
    costs = []
    for form, work in forms.items():
        rule = _rule_of(work)
        if rule is None:
            continue
        symbol = work.sizes[rule.size].symbol
        if past == 0:
            plan = _planned(work, {rule.size: queries})
            seconds = plan_time(plan, plan.device or _device())
        else:
            try:
                graphs = step_graphs(work, rule)
            except NotCompiledError:
                continue
            at = _step_sizes(graphs, queries, past)
            seconds = 0.0
            for part in (graphs.rows, graphs.attend):
                if part is not None:
                    plan = _planned(part, at)
                    seconds += plan_time(plan, plan.device or _device())
        costs.append(FormCost(form, seconds, rule.cached, _width(work, rule.cached, symbol)))
    if not costs:
        raise NotCompiledError(f"design '{graph.name}' has no form a step can be planned in")
    best = min(costs, key=lambda c: (c.seconds, c.form != "plain"))
    return DecodeForm(best.form, queries, past, tuple(costs))


def _device():
    from .device import planning_device

    return planning_device()


@dataclass
class _Programs:
    """What every cache of one design graph shares: the form taken, the step's graphs, and the
    generated classes of its two programs (None and the `reason` where they cannot take it)."""

    form: DecodeForm | None
    graphs: StepGraphs | None = None
    classes: dict[str, type] = field(default_factory=dict)  # "one", "any", "rows": planned when first used
    mask_arguments: dict[str, dict[str, str]] = field(default_factory=dict)  # program -> mask input -> keyword
    reason: str | None = None
    modules: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)

    def part(self, key: str) -> DesignGraph | None:
        assert self.graphs is not None
        return {"one": self.graphs.attend_one, "any": self.graphs.attend, "rows": self.graphs.rows}[key]

    def cls(self, key: str) -> type:
        """The generated class of program `key`: "one" (the attention program for one new
        position), "any" (for any count, its causal masks given), "rows"; planned on first use."""
        if key not in self.classes:
            from .codegen import generate
            from .module import compile_source

            assert self.graphs is not None
            part = self.part(key)
            assert part is not None
            plan = _planned(part, _step_sizes(self.graphs, 1 if key != "any" else 2, STEP_PLANNED_LENGTH - 1))
            self.classes[key] = compile_source(generate(plan), part.name)
            self.mask_arguments[key] = {t.name: plan.names[t.name] for t in part.tensors_of_kind("mask")}
        return self.classes[key]


_FORMS: dict[int, DecodeForm | None] = {}
_PROGRAMS: dict[int, _Programs] = {}


def _remembered(table: dict, graph: DesignGraph, make):
    if id(graph) not in table:
        table[id(graph)] = make()
        weakref.finalize(graph, table.pop, id(graph), None)
    return table[id(graph)]


def chosen_form(graph: DesignGraph) -> DesignGraph:
    """The graph a decoding step of `graph` evaluates: its absorbed form (graph/absorb.py `absorbed`) where
    the planner finds a step of one position after STEP_PLANNED_LENGTH − 1 cheaper in it
    (`decode_form`), else the design as written; where neither form's step can be planned (the
    reference evaluator steps it), the absorbed one, whose cache is the smaller. Chosen once per
    design graph."""
    other = absorbed(graph)
    if other is graph:
        return graph

    def choose() -> DecodeForm | None:
        try:
            return decode_form(graph)
        except NotCompiledError:
            return None

    form = _remembered(_FORMS, graph, choose)
    return other if form is None or form.form == "absorbed" else graph


def pin_form(graph: DesignGraph, form: str) -> None:
    """Make the caches of `graph` take `form` ("plain" or "absorbed") instead of the planner's
    choice, to measure one against the other (scripts/bench_decode.py `--forms`); before the
    first cache of `graph` is made, since the rule is read once per design graph."""
    if form not in ("plain", "absorbed"):
        raise ValueError(f"form must be 'plain' or 'absorbed', got {form!r}")
    chosen = form_of(graph)
    if chosen is None:
        raise ValueError(f"design '{graph.name}' has no absorbed form")
    _FORMS[id(graph)] = dataclasses.replace(chosen, form=form, pinned=True)


def form_of(graph: DesignGraph) -> DecodeForm | None:
    """The form `chosen_form` took for `graph` (None where it has no absorbed form)."""
    chosen_form(graph)
    return _FORMS.get(id(graph))


def _programs(graph: DesignGraph, work: DesignGraph, rule: DecodeRule) -> _Programs:
    def make() -> _Programs:
        programs = _Programs(_FORMS.get(id(graph)))
        try:
            programs.graphs = step_graphs(work, rule)
        except NotCompiledError as error:
            programs.reason = str(error)
            return programs
        programs.cls("one")
        if programs.graphs.rows is not None:
            programs.cls("rows")
        return programs

    return _remembered(_PROGRAMS, graph, make)


class CompiledStep:
    """The generated programs of a "kv" cache's step (module docstring), bound to one module:
    `reason` is None where they serve it, else why the cache evaluates its steps with the
    reference evaluator. `source` gives the generated text of both programs."""

    def __init__(self, cache: DecodeCache):
        graph = cache.original_graph
        self.programs = _programs(graph, cache.graph, cache.rule)
        self.module = cache.module
        self.form = self.programs.form
        self.reason = self.programs.reason
        self.attend: torch.nn.Module | None = None
        self.rows: torch.nn.Module | None = None
        if self.reason is None:
            self.attend = self.program("one")
            self.rows = self.program("rows") if self.programs.graphs.rows is not None else None

    @property
    def source(self) -> str:
        """The generated text of the attention program for one new position, then of the rows
        program."""
        return "\n\n".join(m.tdiag_source for m in (self.attend, self.rows) if m is not None)

    def program(self, key: str) -> torch.nn.Module:
        """An instance of program `key` (`_Programs.cls`) holding the module's parameters,
        buffers and constants (the same tensors, not copies), made once per module."""
        like = next(iter(self.module.parameters()), None)
        kwargs = {} if like is None else {"dtype": like.dtype, "device": like.device}
        known = self.programs.modules.get(self.module)
        if known is None or known[0] != kwargs:  # made anew after module.to(dtype or device)
            known = self.programs.modules[self.module] = (kwargs, {})
        if key not in known[1]:
            cls = self.programs.cls(key)
            instance = cls(**kwargs).eval()
            instance.tdiag_source = cls.tdiag_generated[0]
            known[1][key] = instance
        _share(self.module, known[1][key])
        return known[1][key]

    def extend(self, cache: DecodeCache, x: torch.Tensor, rank: int) -> tuple[torch.Tensor, ...]:
        """The outputs at the positions of `x` after the cached ones, the cache extended."""

        dim = cache.rule.axis - rank
        count = x.shape[dim]
        if cache.length == 0:
            outputs = self.module(x)
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)
            self._append(cache, x, dim, count)
            return outputs
        rows = self._append(cache, x, dim, count)
        graphs = self.programs.graphs
        assert graphs is not None and self.attend is not None
        named = {graphs.inputs[0]: x, **{graphs.cached_inputs[name]: rows[name] for name in graphs.cached}}
        if graphs.positions in graphs.inputs:
            named[graphs.positions] = self._positions(cache.length - count, count, x)
        past = cache.length - count
        key = "one" if count == 1 else "any"  # one new position: its causal masks hide nothing
        program = self.attend if count == 1 else self.program("any")
        arguments = self.programs.mask_arguments[key]
        masks = {
            arguments[name]: mask.value(past, count, x.device)
            for name, mask in (graphs.masks_one if count == 1 else graphs.masks).items()
        }
        outputs = program(*(named[name] for name in graphs.inputs), **masks)
        return outputs if isinstance(outputs, tuple) else (outputs,)

    def _output_axis(self, cache: DecodeCache, name: str) -> int:
        axes = cache.position_axes[name]
        return axes.index(True) - len(axes)

    def _positions(self, start: int, count: int, x: torch.Tensor) -> torch.Tensor:
        import torch

        return torch.arange(start, start + count, dtype=self._dtype(x), device=x.device)

    def _dtype(self, x: torch.Tensor):
        like = next(iter(self.module.parameters()), None)
        return like.dtype if like is not None else x.dtype

    def _append(self, cache: DecodeCache, x: torch.Tensor, dim: int, count: int) -> dict[str, torch.Tensor]:
        """The cached rows with those of `x`'s positions appended (computed by the rows program)."""
        import torch

        graphs = self.programs.graphs
        assert graphs is not None
        new: dict[str, torch.Tensor] = {}
        derived = [name for name in graphs.cached if cache.graph.tensors[name].kind == "derived"]
        if derived:
            assert self.rows is not None
            given = [x]
            if len(graphs.rows_inputs) > 1:
                given.append(self._positions(cache.length, count, x))
            made = self.rows(*given)
            made = made if isinstance(made, tuple) else (made,)
            new.update(zip(derived, made, strict=True))
        for name in graphs.cached:
            new.setdefault(name, x)
        rows = {}
        for name in graphs.cached:
            held = cache.tensors.get(name)
            axis = self._output_axis(cache, name)
            rows[name] = new[name] if held is None else torch.cat([held, new[name]], axis)
        cache.tensors.update(rows)
        cache.length += count
        cache._batch = x.shape[: x.dim() - len(cache.graph.inputs[0].axes)]
        return rows


def step_summary(cache: DecodeCache) -> str:
    """How a cache's steps run and, for a design with an absorbed form, the form taken with its
    estimates: the end of the cache's repr."""
    step, form = cache.step, form_of(cache.original_graph)
    text = ""
    if step is not None:
        text = (
            "; steps by generated code" if step.reason is None else f"; steps by the reference evaluator: {step.reason}"
        )
    return text + (f"; {form}" if form is not None else "")


def _share(module: torch.nn.Module, instance: torch.nn.Module) -> None:
    """Point `instance`'s parameters and buffers at `module`'s of the same names."""
    for table in ("_parameters", "_buffers"):
        own = getattr(instance, table)
        for name in list(own):
            held = getattr(module, name, None)
            if held is not None:
                own[name] = held
