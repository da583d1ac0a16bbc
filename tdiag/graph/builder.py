"""The builder: syntax items (after `extends` merging) -> DesignGraph. Checks names, declares sizes
and tensors, orders statements by what they use, builds each one's expression, binds every leg to
one size and declares the outputs; every mistake becomes a Diagnostic and all of them are collected
before TdiagError is raised."""

from __future__ import annotations

import math
import operator
from collections.abc import Collection, Iterator, Mapping

import networkx as nx
import sympy

from .. import parse as syn
from ..errors import Diagnostic, Span, TdiagError, a_or_an, did_you_mean
from ..ir import Axis, Expr, Leg, Statement, Tensor, TensorRef, walk
from ..names import reserved_because
from .dataflow import dataflow_graph
from .declarations import Declarations
from .expressions import ExprBuilder
from .lone_sums import MeantSums
from .merge import item_kind_text, item_name, item_name_span
from .model import LIMITS, DesignGraph
from .sizes import SizeTable, same_size, size_symbol
from .syntax import group_name, leg_names, place, place_line, syntax_cycles, syntax_nodes, tensor_names
from .vocabulary import BOUNDS, FUNCTIONS, POISON_SIZE, SCALAR_FUNCTIONS

# how many legs deep find_leg follows tensors not built yet (T[a] = U[a], U[b] = ...) before it
# gives up and the leg is reported unbound: a bound on the recursion, far beyond any design's chain
MAX_LEG_SEARCH = 64


class DesignBuilder(Declarations):
    """Builds one DesignGraph; `diagnostics` collects every error and warning on the way."""

    def __init__(self, head: syn.DesignDecl, items: list[syn.Item], overrides: Mapping[str, int]):
        self.head = head
        self.items = items
        self.overrides = dict(overrides)
        self.diagnostics: list[Diagnostic] = []
        self.sizes: SizeTable = SizeTable()
        self.legs: dict[str, Leg] = {}
        self.tensors: dict[str, Tensor] = {}
        self.statements: list[Statement] = []
        self.updates: list[Statement] = []
        self.outputs: list[str] = []
        self.conflicting_legs: set[str] = set()  # each leg-size conflict is reported once
        self.runtime_sizes: set[sympy.Symbol] = set()  # sizes bound by the inputs (`size N`)
        self.meant_sums = MeantSums()  # the legs each `sum[...]` names: lone sums said to be meant
        self.lone_sum_spans: set[Span] = set()  # legs a lone-sum warning has named, each named once
        self.leg_binders: dict[str, dict[str, None]] = {}  # leg -> tensors (or index, ...) that size it

    def error(self, message: str, *spans: Span, hint: str | None = None) -> None:
        self.diagnostics.append(Diagnostic(message, tuple(spans), hint))

    def warn(self, message: str, *spans: Span, hint: str | None = None) -> None:
        self.diagnostics.append(Diagnostic(message, tuple(spans), hint, severity="warning"))

    # -- the stages of building, in order --
    def build(self) -> DesignGraph:
        self._check_duplicates()
        self._declare_sizes()
        self._declare_tensors()
        for statement in self._ordered_statements():
            self._add_statement(statement)
        for update in (i for i in self.items if isinstance(i, syn.Update)):
            self._add_update(update)
        self._declare_outputs()
        errors = [d for d in self.diagnostics if d.is_error]
        if errors:
            raise TdiagError(errors)
        graph = DesignGraph(
            name=self.head.name,
            file=self.head.span.file,
            base=self.head.base,
            sizes=self.sizes,
            legs=self.legs,
            tensors=self.tensors,
            statements=self.statements,
            updates=self.updates,
            outputs=self.outputs,
            graph=dataflow_graph(self.tensors, self.statements, self.updates),
            warnings=[d for d in self.diagnostics if not d.is_error],
            leg_binders={leg: tuple(names) for leg, names in self.leg_binders.items()},
            leg_uses=_leg_uses(self.items),
        )
        return graph

    def _check_duplicates(self) -> None:
        seen: dict[str, syn.Item] = {}
        for item in self.items:
            name = item_name(item)
            if name is None:
                continue
            if name in seen:
                first = seen[name]
                self.error(
                    f"'{name}' is defined twice: {item_kind_text(first)} ({place_line(first.span, item.span)}), "
                    f"{item_kind_text(item)} here",
                    item_name_span(item),
                    item_name_span(first),
                    hint="rename one of them, or use 'replace' in a design that extends another",
                )
            else:
                seen[name] = item
            if name in FUNCTIONS:
                self.error(f"'{name}' is a built-in map and cannot name a size or tensor", item_name_span(item))
            role = (
                item.kind
                if isinstance(item, syn.Declaration)
                else "size"
                if isinstance(item, syn.SizeDef)
                else "result"
            )
            reason = reserved_because(name, role)
            if reason:
                self.error(
                    f"{reason}; it cannot name {'a size' if role == 'size' else a_or_an(role)}",
                    item_name_span(item),
                    hint=f"the generated PyTorch module uses this name; rename it, e.g. '{name.strip('_')}_{role[0]}'",
                )

    # -- statements --
    def _ordered_statements(self) -> list[syn.Statement]:
        statements = [i for i in self.items if isinstance(i, syn.Statement)]
        by_target: dict[str, syn.Statement] = {}
        for s in statements:
            name = s.target.name
            if name in self.tensors:
                continue  # reported by _check_duplicates
            by_target.setdefault(name, s)
        deps = nx.DiGraph()
        for name, s in by_target.items():
            deps.add_node(name)
            for used in tensor_names(s.expr):
                if used in by_target:
                    deps.add_edge(used, name)
        for names in syntax_cycles(deps, list(by_target)):
            self.error(
                "cycle of definitions: " + " -> ".join([*names, names[0]]),
                *(by_target[n].target.name_span for n in names),
                hint="a tensor cannot be computed from itself; state updates use 'update'",
            )
        for component in list(nx.strongly_connected_components(deps)):
            node = next(iter(component))
            if len(component) > 1 or deps.has_edge(node, node):
                deps.remove_nodes_from(component)
        return [by_target[n] for n in nx.topological_sort(deps)]

    def _add_statement(self, s: syn.Statement) -> None:
        groups = self._target_groups(s.target)
        expr = ExprBuilder(self).statement(s.expr, groups, s.target)
        axes = tuple(Axis(group_name(g), self._group_size(g)) for g in groups)
        statement = Statement(s.target.name, groups, expr, s.span, s.target.name_span)
        tensor = Tensor(s.target.name, "derived", axes, s.target.name_span, statement=statement)
        tensor.is_constant = _is_constant(expr, self.tensors)
        self.tensors[s.target.name] = tensor
        self.statements.append(statement)

    def _add_update(self, u: syn.Update) -> None:
        name = u.target.name
        buffer = self.tensors.get(name)
        if buffer is None or buffer.kind != "buffer":
            buffers = [t.name for t in self.tensors.values() if t.kind == "buffer"]
            what = a_or_an(buffer.kind) if buffer else "not declared"
            self.error(
                f"'update' rewrites a buffer, but '{name}' is {what}",
                u.target.name_span,
                hint=did_you_mean(name, buffers)
                or (f"only a buffer changes by a rule: declare 'buffer {name}[...] = fill(...)'" if buffer else None)
                or "declare it first: buffer NAME[leg: SIZE] = fill(...)",
            )
            return
        first = next((rule for rule in self.updates if rule.target == name), None)
        if first is not None:
            self.error(
                f"buffer '{name}' has two update rules ({place_line(first.span, u.span)} and here)",
                u.target.name_span,
                first.target_span,
                hint="a buffer has one rule: write both changes in one update",
            )
            return
        groups = self._target_groups(u.target)
        expr = ExprBuilder(self).statement(u.expr, groups, u.target)
        if len(groups) != len(buffer.axes):
            self.error(
                f"buffer {name} has {len(buffer.axes)} axes but its update names {len(groups)}",
                u.target.span,
            )
        self.updates.append(Statement(name, groups, expr, u.span, u.target.name_span, is_update=True))

    def _target_groups(self, target: syn.Target) -> tuple[tuple[str, ...], ...]:
        groups = tuple(leg_names(item) for item in target.legs)
        seen: set[str] = set()
        for item in target.legs:
            for leg in item.legs if isinstance(item, syn.LegGroup) else (item,):
                if leg.name in seen:
                    self.error(f"leg '{leg.name}' appears twice in the result {target.name}", leg.span)
                seen.add(leg.name)
        return groups

    def _group_size(self, group: tuple[str, ...]) -> sympy.Expr:
        return sympy.Mul(*(self.legs[g].size if g in self.legs else sympy.Integer(1) for g in group))

    def _declare_outputs(self) -> None:
        outputs = [i for i in self.items if isinstance(i, syn.Output)]
        if not outputs:
            self.error(
                f"design '{self.head.name}' has no output",
                self.head.span,
                hint="add a line 'output Y' naming the result tensor",
            )
            return
        for item in outputs:
            for name in item.names:
                if name.name not in self.tensors:
                    self.error(
                        f"unknown output '{name.name}'",
                        name.span,
                        hint=did_you_mean(name.name, self.tensors) or "outputs name tensors defined in this file",
                    )
                elif name.name in self.outputs:
                    self.error(f"'{name.name}' is listed as an output twice", name.span)
                elif self.tensors[name.name].kind not in ("input", "derived"):
                    tensor = self.tensors[name.name]
                    what = {"random": "random noise", "mask": "a mask input"}.get(tensor.kind, a_or_an(tensor.kind))
                    self.error(
                        f"output '{name.name}' is {what}, not computed from an input",
                        name.span,
                        tensor.span,
                        hint="an output is an input or the result of a statement that reads one",
                    )
                else:
                    self.outputs.append(name.name)

    # -- legs --
    def find_leg(self, leg: str) -> bool:
        """Bind `leg`, not bound yet, from a use elsewhere in the file (`index(m)` or a position
        `m - n` in a statement built before the one that uses X[m f]), whatever the order of the
        statements: a tensor not built yet has the sizes of its result's legs, found the same way."""
        if leg in self.legs:
            return True
        found = self._size_from_uses(leg, set())
        if found is None:
            return False
        self.bind_leg(leg, *found)
        return True

    def _size_from_uses(self, leg: str, visiting: set[str]) -> tuple[sympy.Expr, Span, str] | None:
        """(size, span, tensor) of the first plain use of `leg` on a tensor axis whose size is known
        or can be found; `visiting` holds the legs being looked for, so a cycle ends."""
        if leg in self.legs:
            known = self.legs[leg]
            return known.size, known.span, known.bound_by
        if leg in visiting or len(visiting) > MAX_LEG_SEARCH:
            return None
        visiting.add(leg)
        for item in self.items:
            if not isinstance(item, syn.Statement | syn.Update):
                continue
            for node in syntax_nodes(item.expr):
                if not isinstance(node, syn.Indexed) or node.options:
                    continue
                for position, use in enumerate(node.legs):
                    if isinstance(use, syn.Leg) and not isinstance(use, syn.SlicedLeg) and use.name == leg:
                        size = self._axis_size(node.name, position, len(node.legs), visiting)
                        if size is not None:
                            return size, use.span, node.name
        return None

    def _axis_size(self, name: str, axis: int, used_with: int, visiting: set[str]) -> sympy.Expr | None:
        """The size of axis `axis` of tensor `name` used with `used_with` legs: declared or built,
        or from the legs of the result of its statement, not built yet."""
        tensor = self.tensors.get(name)
        if tensor is not None:
            return tensor.axes[axis].size if len(tensor.axes) == used_with else None
        statement = next((i for i in self.items if isinstance(i, syn.Statement) and i.target.name == name), None)
        if statement is None or len(statement.target.legs) != used_with:
            return None
        sizes = [self._size_from_uses(piece, visiting) for piece in leg_names(statement.target.legs[axis])]
        return None if None in sizes else sympy.Mul(*(found[0] for found in sizes))  # type: ignore[index]

    def bind_leg(self, leg: str, size: sympy.Expr, span: Span, where: str) -> None:
        """Bind a leg to a size; a leg has one size throughout the file."""
        self.leg_binders.setdefault(leg, {})[where] = None
        known = self.legs.get(leg)
        if known is None:
            self.legs[leg] = Leg(leg, size, span, where)
            return
        if not same_size(known.size, size, self.sizes) and leg not in self.conflicting_legs:
            self.conflicting_legs.add(leg)
            self.error(
                f"leg '{leg}' is bound to {known.size} in {place(known.bound_by, known.span, span)} "
                f"but to {size} in {place(where, span, span)}",
                span,
                known.span,
                hint=f"a leg has one size; use a new leg name where the size is {size}",
            )

    # -- scalars --
    def scalar_of(self, e: syn.Expr, *, sizes_only: bool = False, known: Collection[str] = ()) -> sympy.Expr:
        """A size or scale expression -> sympy, in size symbols. A mistake gives POISON_SIZE, which
        matches any size, so it is reported once."""
        if isinstance(e, syn.Number):
            if not math.isfinite(e.value) or abs(e.value) > LIMITS.max_literal:
                self.error(f"number out of range (at most {LIMITS.max_literal:.0e})", e.span)
                return POISON_SIZE
            return sympy.Rational(str(e.value)) if isinstance(e.value, float) else sympy.Integer(e.value)
        if isinstance(e, syn.Name):
            if e.name in known or e.name in self.sizes:
                return size_symbol(e.name)
            if e.name == "pi" and not sizes_only:
                return sympy.pi
            self._unknown_size(e, {*known, *self.sizes})
            return POISON_SIZE
        if isinstance(e, syn.Neg):
            return -self.scalar_of(e.operand, sizes_only=sizes_only, known=known)
        if isinstance(e, syn.BinOp):
            a = self.scalar_of(e.left, sizes_only=sizes_only, known=known)
            b = self.scalar_of(e.right, sizes_only=sizes_only, known=known)
            if e.op == "/" and b == 0:
                self.error("division by zero", e.right.span)
                return POISON_SIZE
            if e.op == "^" and b.is_number and abs(b) > 64:
                self.error("exponent out of range (at most 64)", e.right.span)
                return POISON_SIZE
            return a**b if e.op == "^" else _ARITHMETIC[e.op](a, b)  # only this one: 1e10 ^ 1e10 never runs
        if isinstance(e, syn.Call) and e.name in SCALAR_FUNCTIONS and e.legs is None and len(e.args) == 1:
            whole = e.name in ("floor", "ceil")  # a whole number: a size may be one (int(D · 0.4))
            if sizes_only and not whole:
                self.error(f"a size is a whole number; {e.name} is for scales", e.name_span)
                return POISON_SIZE
            function = {"sqrt": sympy.sqrt, "exp": sympy.exp, "log": sympy.log, "floor": sympy.floor}.get(
                e.name, sympy.ceiling
            )
            return function(self.scalar_of(e.args[0], sizes_only=sizes_only and not whole, known=known))
        if isinstance(e, syn.Call) and e.name in BOUNDS and e.legs is None and len(e.args) == 2:
            a, b = (self.scalar_of(x, sizes_only=sizes_only, known=known) for x in e.args)
            return sympy.Max(a, b) if e.name == "max" else sympy.Min(a, b)
        what = "a size expression (numbers, sizes, + - * / ^)" if sizes_only else "a number or size expression"
        self.error(f"expected {what}", e.span)
        return POISON_SIZE

    def _unknown_size(self, e: syn.Name, known: set[str]) -> None:
        if e.name in self.tensors:
            self.error(f"'{e.name}' is a tensor; a size or number is expected here", e.span)
        elif e.name in self.legs:
            leg = self.legs[e.name]
            self.error(
                f"'{e.name}' is a leg, not a size",
                e.span,
                hint=f"leg {e.name} has size {leg.size}; write the size: {leg.size}",
            )
        else:
            self.error(f"unknown size '{e.name}'", e.span, hint=did_you_mean(e.name, known))


_ARITHMETIC = {"+": operator.add, "-": operator.sub, "*": operator.mul, "juxt": operator.mul, "/": operator.truediv}
"""Scalar arithmetic by operator; juxtaposition multiplies, as `*` does (`10000 sqrt(D)`)."""


def _leg_uses(items: list[syn.Item]) -> dict[str, tuple[tuple[str, Span], ...]]:
    """Leg -> (statement, span) of its first use in each statement or update that writes it, in
    file order: where check points when a leg's size comes from somewhere surprising."""
    uses: dict[str, dict[str, Span]] = {}
    for item in items:
        if not isinstance(item, syn.Statement | syn.Update):
            continue
        name = item.target.name
        for node in syntax_nodes(item.expr):
            for leg, span in _written_legs(node):
                first = uses.setdefault(leg, {}).get(name)
                if first is None or (span.line, span.column) < (first.line, first.column):
                    uses[leg][name] = span
    return {
        leg: tuple(sorted(found.items(), key=lambda use: (use[1].file, use[1].line, use[1].column)))
        for leg, found in uses.items()
    }


def _written_legs(node: syn.Expr) -> Iterator[tuple[str, Span]]:
    """The legs a syntax node writes itself: a tensor use's or a call's legs in brackets, and a
    name (a leg of index, causal, window or a gathered position, where it is not a size)."""
    if isinstance(node, syn.Name):
        yield node.name, node.span
    elif isinstance(node, syn.Indexed | syn.Call):
        for item in node.legs or ():
            for leg in item.legs if isinstance(item, syn.LegGroup) else (item,):
                yield leg.name, leg.span


def _is_constant(expr: Expr, tensors: Mapping[str, Tensor]) -> bool:
    refs = [n for n in walk(expr) if isinstance(n, TensorRef)]
    return all(tensors[r.name].is_constant for r in refs if r.name in tensors)


def build_graph(head: syn.DesignDecl, items: list[syn.Item], overrides: Mapping[str, int] | None = None) -> DesignGraph:
    """Syntax items (after `extends` merging) -> DesignGraph, or TdiagError with every mistake."""
    return DesignBuilder(head, items, overrides or {}).build()
