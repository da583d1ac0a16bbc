"""The graphs of a "kv" cache's step (issue 24): from a causal design graph, the rows program's
graph (the new rows of the cached tensors from the new inputs) and the attention programs' (the
outputs at the new positions from the new inputs and the cached rows), each a design graph the
planner plans and codegen prints (decode_step.py compiles them; its docstring describes the
step). Which rows each statement is computed at is `Builder`'s walk; how each node is written
in a program is its kind's STEP_REWRITE rule (decode_rules.py, registered by its construct
module), applied by `StepProgram`: a causal mask or window becomes a mask input over absolute
positions, `index(n)` of a new position is read from the positions input, a gather's address
along a new position is offset by P. Nothing here imports torch."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sympy

from .decode_rows import DecodeRule, RowRequests, reads_length
from .decode_rules import ALL, NEW, STEP_REWRITE, NotCompiledError
from .errors import Span
from .graph import DesignGraph
from .graph.absorb import length_symbol
from .graph.dataflow import dataflow_graph
from .graph.sizes import size_symbol
from .ir import (
    Axis,
    CausalFactor,
    CausalMask,
    Expr,
    PaddingMask,
    Position,
    PositionIndex,
    Size,
    Statement,
    Tensor,
    TensorRef,
    WindowMask,
    walk,
)
from .names import BUILTINS, GENERATED

if TYPE_CHECKING:
    import torch

__all__ = ["NotCompiledError", "PositionMask", "StepGraphs", "StepProgram", "offset_position", "rule_of", "step_graphs"]


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


def fresh(stem: str, taken: set[str]) -> str:
    """`stem`, or it with underscores appended until no name of `taken` has it (then taken)."""
    name = stem
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def rebuild(expr: Expr, fn) -> Expr:
    """`expr` rebuilt bottom-up with `fn` applied to every node (every Expr-valued field)."""
    changes: dict[str, object] = {}
    for f in dataclasses.fields(expr):
        value = getattr(expr, f.name)
        if isinstance(value, Expr):
            new = rebuild(value, fn)
        elif isinstance(value, tuple) and value and all(isinstance(v, Expr) for v in value):
            new = tuple(rebuild(v, fn) for v in value)
        else:
            continue
        if new is not value:
            changes[f.name] = new
    expr = dataclasses.replace(expr, **changes) if changes else expr
    return fn(expr)


def substituted(value: Any, subs: Mapping[sympy.Symbol, sympy.Expr]) -> Any:
    """Every size expression in `value` (an expression node's fields, recursively) with `subs`."""
    if isinstance(value, sympy.Basic):
        return value.xreplace(subs)
    if isinstance(value, tuple):
        items = tuple(substituted(v, subs) for v in value)
        return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
    if isinstance(value, Position):
        return dataclasses.replace(
            value, value=substituted(value.value, subs), operands=substituted(value.operands, subs)
        )
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and not isinstance(value, Span):
        changes = {}
        for f in dataclasses.fields(value):
            old = getattr(value, f.name)
            new = substituted(old, subs)
            if new is not old:
                changes[f.name] = new
        return dataclasses.replace(value, **changes) if changes else value
    return value


def offset_position(position: Position, roles: Mapping[str, str], offset: sympy.Expr) -> Position:
    """A gather's address with each new position's leg read at its absolute position."""
    if position.op == "leg":
        if roles.get(position.name) == NEW:
            return Position("+", operands=(position, Position("number", value=offset)))
        return position
    return dataclasses.replace(position, operands=tuple(offset_position(o, roles, offset) for o in position.operands))


class Builder:
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


def fresh_name(stem: str, work: DesignGraph, *more) -> str:
    taken = {*work.sizes, *work.tensors, *work.legs, *GENERATED, *BUILTINS}
    for names in more:
        taken |= {names} if isinstance(names, str) else set(names)
    return fresh(stem, taken)


def rule_of(work: DesignGraph) -> DecodeRule | None:
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
    rule = rule or rule_of(work)
    if rule is None or rule.kind != "kv":
        raise NotCompiledError("the design does not decode with cached rows")
    if work.updates:
        raise NotCompiledError("the design updates buffers")
    symbol = work.sizes[rule.size].symbol
    taken = {*work.sizes, *work.tensors, *work.legs, *GENERATED, *BUILTINS}
    t_name, m_name, p_name = fresh("T", taken), fresh("M", taken), fresh("P", taken)
    t_sym, m_sym, p_sym = (size_symbol(name) for name in (t_name, m_name, p_name))
    span = work.sizes[rule.size].span
    sizes = {name: s for name, s in work.sizes.items() if name != rule.size}
    sizes[t_name] = Size(t_name, t_sym, None, span)
    sizes[m_name] = Size(m_name, m_sym, None, span)
    sizes[p_name] = Size(p_name, p_sym, m_sym - t_sym, span)
    positions_name = fresh("position", taken)
    names = {"T": t_name, "M": m_name, "P": p_name}

    cached = tuple(rule.cached)
    attend = Builder(work, rule, symbol, set(cached))
    for name in work.outputs:
        tensor = work.tensors[name]
        attend.request(name, tuple(NEW if a.size == symbol else None for a in tensor.axes))
    x = work.inputs[0].name
    cached_inputs = {name: (name if name != x else fresh(f"{x}_rows", taken)) for name in cached}
    symbols = (t_sym, m_sym, p_sym)
    masks: dict[str, PositionMask] = {}
    attend_graph = program_graph(
        work, attend, sizes, symbol, symbols, positions_name, cached_inputs, f"{work.name}_step", masks
    )
    masks_one: dict[str, PositionMask] = {}
    attend_one = program_graph(
        work, attend, sizes, symbol, symbols, positions_name, cached_inputs, f"{work.name}_step1", masks_one, False
    )
    derived = [name for name in cached if work.tensors[name].kind == "derived"]
    rows_graph = None
    if derived:
        rows = Builder(work, rule, symbol, set())
        for name in derived:
            tensor = work.tensors[name]
            rows.request(name, tuple(NEW if a.size == symbol else None for a in tensor.axes))
        if ALL in rows.roles.values():
            raise NotCompiledError("a cached tensor's new rows read every position")
        rows_graph = program_graph(
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


class StepProgram:
    """The rewrite of a design's statements into one program of a step (`program_graph`): each
    node by its kind's STEP_REWRITE rule, over the position legs' `roles` (NEW or ALL), with the
    tensors the program takes (`tensors`: the input, cached rows, noise, mask inputs as they are
    made, then the statements' tensors). `rows_only` for the rows program (only the new
    positions), `causal` False for the program of one new position (its causal masks against
    every key hide nothing); `offset` is P, the cached positions before the new ones."""

    def __init__(
        self,
        work: DesignGraph,
        roles: Mapping[str, str],
        symbol: sympy.Symbol,
        symbols: tuple[sympy.Symbol, sympy.Symbol, sympy.Symbol],
        positions_name: str,
        cached_inputs: Mapping[str, str],
        masks_made: dict[str, PositionMask],
        causal: bool,
        rows_only: bool,
    ):
        t, m, p = symbols
        self.work, self.roles, self.symbol = work, roles, symbol
        self.t, self.m, self.offset = t, m, p
        self.by_role = {NEW: t, ALL: m}
        self.subs = {symbol: m}
        self.positions_name, self.cached_inputs = positions_name, cached_inputs
        self.masks_made, self.causal, self.rows_only = masks_made, causal, rows_only
        self.tensors: dict[str, Tensor] = {}
        self.uses_index: list[str] = []
        self.made: dict[PositionMask, str] = {}

    def rewritten(self, expr: Expr) -> Expr:
        """`expr` rebuilt bottom-up, each node by its kind's rule."""
        return rebuild(expr, lambda node: STEP_REWRITE.lookup(node)(self, node))

    def finish(self, node: Expr) -> Expr:
        """`node` with the causal masks and windows among its masks as mask inputs (those that
        hide nothing left out) and its sizes over the length over every position (M)."""
        masks = getattr(node, "masks", None)
        if masks:
            kept = tuple(
                PaddingMask(self.mask_ref(mask), mask.span)
                for mask in masks
                if isinstance(mask, WindowMask) or (isinstance(mask, CausalMask) and not self.hides_nothing(mask))
            )
            node = dataclasses.replace(node, masks=kept)
        return substituted(node, self.subs)

    def positions_ref(self, node: PositionIndex) -> TensorRef:
        """`index(n)` of a new position, read from the input of absolute positions."""
        self.uses_index.append(node.leg)
        return TensorRef((node.leg,), node.span, self.positions_name, ((node.leg,),))

    def hides_nothing(self, mask: CausalMask | CausalFactor) -> bool:
        """A causal mask of the one new position (the last) against every key, in the program
        for one new position (`causal` False): every key is visible, the mask is left out."""
        return not self.causal and self.roles.get(mask.query) == NEW and self.roles.get(mask.key) == ALL

    def mask_ref(self, mask: CausalMask | WindowMask) -> TensorRef:
        """A causal mask or window as a mask input over its query and key legs, made at each step
        from the legs' absolute positions (the new ones P .. P + T − 1, or every one)."""
        roles = self.roles
        if self.rows_only or roles.get(mask.query) is None or roles.get(mask.key) is None:
            raise NotCompiledError("a causal mask or window over other than the step's positions")
        window = isinstance(mask, WindowMask)
        spec = PositionMask(
            roles[mask.query],
            roles[mask.key],
            int(self.work.evaluate(mask.before)) if window else None,
            int(self.work.evaluate(mask.after)) if window else None,
        )
        if spec not in self.made:
            name = fresh_name("window" if window else "causal", self.work, self.positions_name, self.made.values())
            self.made[spec] = name
            axes = (Axis(mask.query, self.by_role[spec.query]), Axis(mask.key, self.by_role[spec.key]))
            self.tensors[name] = Tensor(name, "mask", axes, mask.span)
            self.masks_made[name] = spec
        legs = (mask.query, mask.key)
        return TensorRef(legs, mask.span, self.made[spec], tuple((leg,) for leg in legs))

    def offset_address(self, position: Position) -> Position:
        """A gather's address with each new position's leg read at its absolute position (+ P)."""
        return offset_position(position, self.roles, self.offset)

    def ref(self, ref: TensorRef) -> TensorRef:
        """A tensor read: a cached one read at every position from its input, a table's slice
        along a position leg over the step's positions (offset by P where new)."""
        tensor = self.work.tensors[ref.name]
        cached_inputs, roles = self.cached_inputs, self.roles
        if tensor.kind == "input" and ref.name in cached_inputs and any(roles.get(g[0]) == ALL for g in ref.groups):
            ref = dataclasses.replace(ref, name=cached_inputs[ref.name])
        if (tensor.kind == "input" or ref.name in cached_inputs) and ref.is_sliced:
            raise NotCompiledError(f"{ref.name} would be an input read in a slice, which an input is not (check.py)")
        if ref.is_sliced:
            slices, offsets = list(ref.slices), list(ref.offsets) or [sympy.Integer(0)] * len(ref.slices)
            for k, group in enumerate(ref.groups):
                role = roles.get(group[0])
                if role is None or ref.slices[k] is None or tensor.axes[k].size == self.symbol:
                    continue
                if role == NEW and self.rows_only:
                    raise NotCompiledError("a cached tensor's rows slice a table at their positions")
                slices[k] = self.t if role == NEW else self.m
                if role == NEW:
                    offsets[k] = offsets[k] + self.offset
            ref = dataclasses.replace(ref, slices=tuple(slices), offsets=tuple(offsets))
        return substituted(ref, self.subs)


def program_graph(
    work: DesignGraph,
    built: Builder,
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
    t, m, _ = symbols
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
    program = StepProgram(
        work, roles, symbol, symbols, positions_name, cached_inputs, masks_made, causal, outputs is not None
    )
    tensors = program.tensors
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
    for tensor_name in built.order:
        tensor = work.tensors[tensor_name]
        labels = built.labels[tensor_name]
        statement = tensor.statement
        assert statement is not None
        expr = program.rewritten(statement.expr)
        if any(isinstance(node, CausalFactor) for node in walk(expr)):  # a product's own are dropped there
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
    uses_index = program.uses_index
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
    check_all_positions_carried(ordered, m)
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


def check_all_positions_carried(tensors: Mapping[str, Tensor], m: sympy.Symbol) -> None:
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
