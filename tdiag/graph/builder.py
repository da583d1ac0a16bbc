"""The builder: syntax items (after `extends` merging) -> DesignGraph. Checks names, declares sizes
and tensors, orders statements by what they use, builds each one's expression, binds every leg to
one size and declares the outputs; every mistake becomes a Diagnostic and all of them are collected
before TdiagError is raised. _ExprBuilder builds the right-hand side of one statement, applying the
diagram rule for legs at every boundary."""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Collection, Mapping

import networkx as nx
import sympy

from .. import parse as syn
from ..errors import Diagnostic, Span, TdiagError, a_or_an, did_you_mean, one_of
from ..errors import hint as join_hint
from ..ir import (
    Axis,
    CausalFactor,
    CausalMask,
    Contraction,
    ElementwiseMap,
    Expr,
    Gather,
    Init,
    Leg,
    Mask,
    PaddingMask,
    Position,
    PositionIndex,
    Quotient,
    Reduction,
    Scalar,
    Size,
    SoftmaxBox,
    SquaredDistance,
    Statement,
    SumNode,
    Tensor,
    TensorRef,
    walk,
)
from ..names import reserved_because
from .dataflow import _dataflow_graph
from .merge import _item_name, _item_name_span, _what
from .model import LIMITS, DesignGraph
from .sizes import SizeTable, _number, _same_size, expand_sizes, size_symbol, size_values
from .syntax import (
    _available,
    _call_as_product,
    _call_parts,
    _cycles,
    _flatten_sum,
    _group_name,
    _is_scalar_syntax,
    _leg_names,
    _ordered_union,
    _place,
    _place_line,
    _position_bounds,
    _product_op,
    _statement_targets,
    _syntax_nodes,
    _tensor_names,
)
from .vocabulary import (
    BOX_OPTIONS,
    BOXES,
    FUNCTIONS,
    INIT_PARAMS,
    INITIALIZERS,
    MAPS,
    MASK_FACTORS,
    PAIRINGS,
    POISON_NAME,
    POISON_SIZE,
    POSITION_FUNCTIONS,
    RANDOM_MODES,
    REDUCTIONS,
    SCALAR_FUNCTIONS,
)


class _Builder:
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
            graph=_dataflow_graph(self.tensors, self.statements, self.updates),
            warnings=[d for d in self.diagnostics if not d.is_error],
        )
        return graph

    def _check_duplicates(self) -> None:
        seen: dict[str, syn.Item] = {}
        for item in self.items:
            name = _item_name(item)
            if name is None:
                continue
            if name in seen:
                first = seen[name]
                self.error(
                    f"'{name}' is defined twice: {_what(first)} ({_place_line(first.span, item.span)}), "
                    f"{_what(item)} here",
                    _item_name_span(item),
                    _item_name_span(first),
                    hint="rename one of them, or use 'replace' in a design that extends another",
                )
            else:
                seen[name] = item
            if name in FUNCTIONS:
                self.error(f"'{name}' is a built-in map and cannot name a size or tensor", _item_name_span(item))
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
                    _item_name_span(item),
                    hint=f"the generated PyTorch module uses this name; rename it, e.g. '{name.strip('_')}_{role[0]}'",
                )

    # -- sizes --
    def _declare_sizes(self) -> None:
        defs = [i for i in self.items if isinstance(i, syn.SizeDef)]
        names = {d.name for d in defs}
        for key in self.overrides:
            if key not in names:
                self.error(
                    f"design '{self.head.name}' has no size '{key}'",
                    hint=join_hint(did_you_mean(key, names), f"its sizes are: {', '.join(sorted(names))}"),
                )
        self.runtime_sizes = {size_symbol(d.name) for d in defs if d.value is None and d.name not in self.overrides}
        for d in defs:
            symbol = size_symbol(d.name)
            if d.name in self.overrides:
                definition: sympy.Expr | None = sympy.Integer(self.overrides[d.name])
            elif d.value is None:
                definition = None
            else:
                definition = self._scalar(d.value, sizes_only=True, known=names)
            self.sizes[d.name] = Size(d.name, symbol, definition, d.span)
        self._check_size_cycles()
        self._check_size_values()

    def _check_size_cycles(self) -> None:
        deps = nx.DiGraph()
        for s in self.sizes.values():
            deps.add_node(s.name)
            for sym in s.definition.free_symbols if s.definition is not None else ():
                deps.add_edge(s.name, str(sym))
        for cycle in _cycles(deps, list(self.sizes)):
            spans = [self.sizes[n].span for n in cycle if n in self.sizes]
            self.error("sizes defined in a cycle: " + " -> ".join([*cycle, cycle[0]]), *spans)
            for n in cycle:
                s = self.sizes[n]
                self.sizes[n] = Size(n, s.symbol, None, s.span)

    def _check_size_values(self) -> None:
        values = size_values(self.sizes)
        for name, value in values.items():
            size = self.sizes[name]
            if value.is_integer and value > LIMITS.max_size:  # type: ignore[operator]
                self.error(
                    f"size {name} = {_number(value)} is over the limit of {LIMITS.max_size:,}",
                    size.span,
                    hint="sizes are tensor dimensions; the limit is tdiag.LIMITS.max_size (TDIAG_MAX_SIZE)",
                )
                continue
            if value.is_integer and value > 0:  # type: ignore[attr-defined]
                continue
            shown = ", ".join(
                f"{k}={v}"
                for k, v in values.items()
                if k != name and sympy.Symbol(k, positive=True) in (size.definition or sympy.S.Zero).free_symbols
            )
            self.error(
                f"size {name} = {size.definition} is {_number(value)}"
                + (f" at {shown}" if shown else "")
                + "; a size must be a whole positive number",
                size.span,
                hint="choose sizes that divide evenly" if "/" in str(size.definition) else None,
            )

    # -- declarations --
    def _declare_tensors(self) -> None:
        for d in (i for i in self.items if isinstance(i, syn.Declaration)):
            axes = []
            for axis in d.axes:
                size = self._scalar(axis.size, sizes_only=True)
                self._bind(axis.leg, size, axis.span, d.name)
                axes.append(Axis(axis.leg, size))
            self._check_axis_names(d)
            self._check_stored_size(d, tuple(axes))
            init = self._initializer(d, tuple(axes))
            tensor = Tensor(d.name, d.kind, tuple(axes), d.name_span, init=init)
            tensor.is_constant = d.kind == "const"
            self.tensors[d.name] = tensor

    def _check_stored_size(self, d: syn.Declaration, axes: tuple[Axis, ...]) -> None:
        """A parameter is built once, at sizes known before any input: an axis over a run-time
        size (N) has no size then. A table over positions is declared over a maximum length and
        read at the run-time length with a slice (`P[n: N, f]`)."""
        if d.kind != "param":
            return
        free = self.runtime_sizes
        runtime = [
            (axis, syntax, sorted(str(s) for s in expand_sizes(axis.size, self.sizes).free_symbols & free))
            for axis, syntax in zip(axes, d.axes, strict=True)
        ]
        runtime = [(axis, syntax, used[0]) for axis, syntax, used in runtime if used]
        if not runtime:
            return
        names = iter(n for n in "ijkluvw" if n not in self.legs and n not in {a.leg for a in axes})
        declared, used = [], []
        for axis in axes:
            over = next((size for a, _, size in runtime if a is axis), None)
            if over is None:
                declared.append(f"{axis.leg}: {axis.size}")
                used.append(axis.leg)
            else:
                declared.append(f"{next(names, axis.leg + '0')}: L")
                used.append(f"{axis.leg}: {axis.size}")
        axis, _, size = runtime[0]
        self.error(
            f"param {d.name} has axis {axis.leg} over the run-time size {size}, "
            "which is not known when parameters are built",
            *(syntax.span for _, syntax, _ in runtime),
            hint=f"declare it over a maximum length with legs of its own, e.g. size L = 1024 and "
            f"param {d.name}[{', '.join(declared)}], then read its first entries where it is used: "
            f"{d.name}[{', '.join(used)}]",
        )

    def _check_axis_names(self, d: syn.Declaration) -> None:
        seen: dict[str, syn.Axis] = {}
        for axis in d.axes:
            if axis.leg in seen:
                self.error(f"leg '{axis.leg}' names two axes of {d.name}", axis.span, seen[axis.leg].span)
            seen[axis.leg] = axis

    def _initializer(self, d: syn.Declaration, axes: tuple[Axis, ...]) -> Init | None:
        allowed = INITIALIZERS.get(d.kind, ())
        if d.init is None:
            if d.kind == "const":
                self.error(f"constant {d.name} needs a value", d.span, hint=f"write '= ...', {one_of(allowed)}")
            return Init("normal", (("mode", "train"),)) if d.kind == "random" else None
        if not allowed:
            self.error(f"{d.kind} {d.name} takes no initializer", d.init.span, hint="inputs are given at run time")
            return None
        name, args, keywords, span = _call_parts(d.init)
        if name is None:
            self.error(f"expected an initializer for {d.kind} {d.name}", d.init.span, hint=one_of(allowed))
            return None
        if name not in allowed:
            self.error(
                f"unknown initializer '{name}' for {d.kind} {d.name}",
                span,
                hint=join_hint(did_you_mean(name, allowed), one_of(allowed)),
            )
            return None
        return self._init_params(d, axes, name, args, keywords, span)

    def _init_params(self, d, axes, name, args, keywords, span) -> Init:
        if d.kind == "random":
            return self._random_mode(d, args, keywords, span)
        if name == "values":
            return self._literal_values(d, axes, args, keywords, span)
        known = INIT_PARAMS[name]
        params: list[tuple[str, sympy.Expr | str]] = []
        if len(args) > len(known):
            self.error(
                f"{name} takes {len(known)} argument(s), got {len(args)}",
                span,
                hint=f"arguments: {', '.join(known) or 'none'}",
            )
        for key, value in zip(known, args, strict=False):
            params.append((key, self._scalar(value)))
        for kw in keywords:
            if kw.name not in known:
                self.error(
                    f"unknown argument '{kw.name}' of {name}",
                    kw.span,
                    hint=join_hint(did_you_mean(kw.name, known), f"arguments: {', '.join(known) or 'none'}"),
                )
                continue
            params.append((kw.name, self._scalar(kw.value)))
        if name == "identity":
            sizes = {expand_sizes(a.size, self.sizes) for a in axes}
            if len(axes) < 2 or len(sizes) > 1:
                self.error(
                    f"identity needs two or more axes of one size; {d.name} has "
                    + (", ".join(str(a.size) for a in axes) or "none"),
                    span,
                )
        if name == "uniform" and {k for k, _ in params} != {"low", "high"}:
            self.error("uniform needs low and high", span, hint="uniform(low = -0.1, high = 0.1)")
        return Init(name, tuple(params), span)

    def _literal_values(self, d, axes, args, keywords, span) -> Init:
        """`values(0, -1, 1, 0)`: the entries written out, row-major over the declared axes (RoPE's
        2×2 rotation generator); their count must be the number of entries."""
        for kw in keywords:
            self.error("values takes numbers only, no keyword arguments", kw.span, hint="e.g. values(0, -1, 1, 0)")
        entries = tuple(self._scalar(a) for a in args)
        known = size_values(self.sizes)
        subs = {self.sizes[k].symbol: v for k, v in known.items()}
        count = expand_sizes(sympy.Mul(*(a.size for a in axes)), self.sizes).xreplace(subs)
        shape = ", ".join(f"{a.leg}: {a.size}" for a in axes)
        if not count.is_Integer:
            self.error(
                f"values needs every axis of {d.name} to have a size known before any input ({d.name}[{shape}])",
                span,
                hint="give literal entries only to a small fixed table",
            )
        elif len(entries) != int(count):
            self.error(
                f"values gives {len(entries)} number(s) but {d.name}[{shape}] has {int(count)} entries",
                span,
                hint="write one number per entry, row-major (the last axis varies fastest)",
            )
        elif any(POISON_SIZE in v.free_symbols for v in entries):
            pass
        elif any(v.free_symbols - {s.symbol for s in self.sizes.values()} for v in entries):
            self.error("values takes numbers and sizes", span)
        return Init("values", (), span, entries)

    def _random_mode(self, d, args, keywords, span) -> Init:
        mode = "train"
        for kw in keywords:
            if kw.name != "mode":
                self.error(f"unknown argument '{kw.name}' of normal noise", kw.span, hint="arguments: mode")
                continue
            value = kw.value.name if isinstance(kw.value, syn.Name) else None
            if value not in RANDOM_MODES:
                found = f" '{value}'" if value else ""
                self.error(
                    f"unknown noise mode{found}",
                    kw.value.span,
                    hint=join_hint(did_you_mean(value or "", RANDOM_MODES), one_of(RANDOM_MODES)),
                )
            else:
                mode = value
        if args:
            self.error(
                "random nodes are standard normal; scale them in a statement",
                args[0].span,
                hint="e.g. noise[m n s] = sigma[m] eps[m n s]",
            )
        return Init("normal", (("mode", mode),), span)

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
            for used in _tensor_names(s.expr):
                if used in by_target:
                    deps.add_edge(used, name)
        for names in _cycles(deps, list(by_target)):
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
        expr = _ExprBuilder(self).statement(s.expr, groups, s.target)
        axes = tuple(Axis(_group_name(g), self._group_size(g)) for g in groups)
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
        groups = self._target_groups(u.target)
        expr = _ExprBuilder(self).statement(u.expr, groups, u.target)
        if len(groups) != len(buffer.axes):
            self.error(
                f"buffer {name} has {len(buffer.axes)} axes but its update names {len(groups)}",
                u.target.span,
            )
        self.updates.append(Statement(name, groups, expr, u.span, u.target.name_span, is_update=True))

    def _target_groups(self, target: syn.Target) -> tuple[tuple[str, ...], ...]:
        groups = tuple(_leg_names(item) for item in target.legs)
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
                else:
                    self.outputs.append(name.name)

    # -- legs --
    def find_leg(self, leg: str) -> bool:
        """Bind `leg`, not bound yet, from a use elsewhere in the file of a tensor whose axes are
        known (`index(m)` or a position `m - n` in a statement before the one that uses X[m f])."""
        if leg in self.legs:
            return True
        for item in self.items:
            if not isinstance(item, syn.Statement | syn.Update):
                continue
            for node in _syntax_nodes(item.expr):
                tensor = self.tensors.get(node.name) if isinstance(node, syn.Indexed) else None
                if tensor is None or node.options or len(node.legs) != len(tensor.axes):
                    continue
                for use, axis in zip(node.legs, tensor.axes, strict=True):
                    if isinstance(use, syn.Leg) and not isinstance(use, syn.SlicedLeg) and use.name == leg:
                        self._bind(leg, axis.size, use.span, tensor.name)
                        return True
        return False

    def _bind(self, leg: str, size: sympy.Expr, span: Span, where: str) -> None:
        """Bind a leg to a size; a leg has one size throughout the file."""
        known = self.legs.get(leg)
        if known is None:
            self.legs[leg] = Leg(leg, size, span, where)
            return
        if not _same_size(known.size, size, self.sizes) and leg not in self.conflicting_legs:
            self.conflicting_legs.add(leg)
            self.error(
                f"leg '{leg}' is bound to {known.size} in {_place(known.bound_by, known.span, span)} "
                f"but to {size} in {_place(where, span, span)}",
                span,
                known.span,
                hint=f"a leg has one size; use a new leg name where the size is {size}",
            )

    # -- scalars --
    def _scalar(self, e: syn.Expr, *, sizes_only: bool = False, known: Collection[str] = ()) -> sympy.Expr:
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
            self._unknown_size(e, {*known, *self.sizes})
            return POISON_SIZE
        if isinstance(e, syn.Neg):
            return -self._scalar(e.operand, sizes_only=sizes_only, known=known)
        if isinstance(e, syn.BinOp) and e.op != "juxt":
            a = self._scalar(e.left, sizes_only=sizes_only, known=known)
            b = self._scalar(e.right, sizes_only=sizes_only, known=known)
            if e.op == "/" and b == 0:
                self.error("division by zero", e.right.span)
                return POISON_SIZE
            if e.op == "^" and b.is_number and abs(b) > 64:
                self.error("exponent out of range (at most 64)", e.right.span)
                return POISON_SIZE
            operation = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
            return a**b if e.op == "^" else operation[e.op](a, b)  # only this one: 1e10 ^ 1e10 never runs
        if isinstance(e, syn.Call) and e.name in SCALAR_FUNCTIONS and e.legs is None and len(e.args) == 1:
            if sizes_only:
                self.error(f"a size is a whole number; {e.name} is for scales", e.name_span)
                return POISON_SIZE
            function = {"sqrt": sympy.sqrt, "exp": sympy.exp, "log": sympy.log}[e.name]
            return function(self._scalar(e.args[0], known=known))
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


def _is_constant(expr: Expr, tensors: Mapping[str, Tensor]) -> bool:
    refs = [n for n in walk(expr) if isinstance(n, TensorRef)]
    return all(tensors[r.name].is_constant for r in refs if r.name in tensors)


def build_graph(head: syn.DesignDecl, items: list[syn.Item], overrides: Mapping[str, int] | None = None) -> DesignGraph:
    """Syntax items (after `extends` merging) -> DesignGraph, or TdiagError with every mistake."""
    return _Builder(head, items, overrides or {}).build()


# ---- expressions ---------------------------------------------------------------------------


class _ExprBuilder:
    """Builds the expression of one statement, applying the leg rule at every boundary."""

    def __init__(self, builder: _Builder):
        self.b = builder
        self.gathered: list[tuple[str, Span]] = []  # legs naming an axis read at a position

    def statement(self, e: syn.Expr, groups: tuple[tuple[str, ...], ...], target: syn.Target) -> Expr:
        result = [leg for g in groups for leg in g]
        errors_before = len(self.b.diagnostics)
        expr = self.inside(e, set(result))
        if len(self.b.diagnostics) > errors_before:
            return expr  # a mistake inside already explains any missing result leg
        self._check_gathered_legs(expr, set(result))
        spans = {
            leg.name: leg.span
            for item in target.legs
            for leg in (item.legs if isinstance(item, syn.LegGroup) else (item,))
        }
        for leg in result:
            if leg not in expr.legs:
                self.b.error(
                    f"result leg '{leg}' of {target.name} appears in no factor",
                    spans[leg],
                    hint=did_you_mean(leg, expr.legs)
                    or f"the right-hand side has legs: {', '.join(expr.legs) or 'none'}",
                )
        if any(len(g) > 1 for g in groups):
            for g in groups:
                if len(g) > 1 and any(leg not in self.b.legs for leg in g):
                    self.b.error(f"cannot size the merged legs ({' '.join(g)})", target.span)
        return expr

    def _check_gathered_legs(self, expr: Expr, result: set[str]) -> None:
        """The leg naming an axis read at a position (`r` in Rel[h, r = m - n]) belongs to that
        read alone: used anywhere else in the statement it would mean two things."""
        sources = {id(n.source) for n in walk(expr) if isinstance(n, Gather)}
        elsewhere = {
            leg
            for n in walk(expr)
            if isinstance(n, TensorRef | PositionIndex | CausalFactor) and id(n) not in sources
            for leg in n.legs
        }
        for leg, span in self.gathered:
            if leg in elsewhere or leg in result:
                self.b.error(
                    f"leg '{leg}' names the axis read at a position, and is used elsewhere in this statement",
                    span,
                    hint="give the gathered axis a leg name of its own",
                )

    def poison(self, e: syn.Expr) -> Expr:
        """A stand-in for a sub-expression that had an error: it has the legs the text gives it,
        so one mistake is reported once, not again by every check downstream of it."""
        return TensorRef(tuple(sorted(_available(e, self.b.tensors))), e.span, POISON_NAME, ())

    # -- the leg rule --
    def inside(self, e: syn.Expr, keep: set[str]) -> Expr:
        """A sub-expression seen from outside: legs not in `keep` are summed inside it."""
        return self.restrict(self.build(e, keep), keep, e.span)

    @staticmethod
    def restrict(node: Expr, keep: set[str], span: Span) -> Expr:
        extra = tuple(leg for leg in node.legs if leg not in keep)
        if not extra:
            return node
        kept = tuple(leg for leg in node.legs if leg in keep)
        if isinstance(node, Contraction):
            return Contraction(
                kept,
                node.span,
                node.factors,
                node.coefficient,
                (*node.summed, *extra),
                tuple(b for b in node.batch if b in keep),
            )
        return Contraction(kept, span, (node,), sympy.Integer(1), extra, ())

    def build(self, e: syn.Expr, keep: set[str]) -> Expr:
        e = _call_as_product(e, self.b.tensors)
        if _is_scalar_syntax(e, self.b.tensors):
            return Scalar((), e.span, self.b._scalar(e))
        if isinstance(e, syn.Name):
            return self._bare_name(e)
        if isinstance(e, syn.Indexed):
            return self.tensor_ref(e)
        if isinstance(e, syn.Neg | syn.BinOp) and _product_op(e, self.b.tensors):
            return self.product(e, keep)
        if isinstance(e, syn.BinOp) and e.op in "+-":
            return self.sum(e, keep)
        if isinstance(e, syn.BinOp) and e.op == "/":
            return self.quotient(e, keep)
        if isinstance(e, syn.BinOp) and e.op == "^":
            return self.power(e, keep)
        if isinstance(e, syn.Call):
            return self.call(e, keep)
        self.b.error("expected a tensor expression", e.span)
        return self.poison(e)

    def _bare_name(self, e: syn.Name) -> Expr:
        if e.name in self.b.tensors:
            t = self.b.tensors[e.name]
            self.b.error(
                f"tensor '{e.name}' is used without legs",
                e.span,
                hint=f"name its legs: {e.name}[{' '.join(t.legs)}]",
            )
        elif e.name in FUNCTIONS:
            self.b.error(f"'{e.name}' needs an argument", e.span, hint=f"e.g. {e.name}(...)")
        else:
            candidates = [*self.b.tensors, *self.b.sizes, *_statement_targets(self.b.items)]
            self.b.error(f"unknown name '{e.name}'", e.span, hint=did_you_mean(e.name, candidates))
        return self.poison(e)

    # -- tensors --
    def tensor_ref(self, e: syn.Indexed) -> Expr:
        if e.name in FUNCTIONS:
            if e.name not in _statement_targets(self.b.items) and e.name not in self.b.tensors:
                self.b.error(f"'{e.name}[...]' needs its argument", e.span, hint=f"write {e.name}[...](expression)")
            return self.poison(e)
        tensor = self.b.tensors.get(e.name)
        if tensor is None:
            return self._unknown_tensor(e)
        if e.options:
            return self.gather(e, tensor)
        groups = tuple(_leg_names(item) for item in e.legs)
        if len(groups) != len(tensor.axes):
            axes = " ".join(tensor.legs)
            self.b.error(
                f"{e.name} has {len(tensor.axes)} axes ({axes}) but is used with {len(groups)} legs",
                e.span,
                hint=f"e.g. {e.name}[{axes}]",
            )
            return self.poison(e)
        self._check_repeated_legs(e)
        slices: list[sympy.Expr | None] = []
        for item, axis in zip(e.legs, tensor.axes, strict=True):
            where = e.name
            if isinstance(item, syn.SlicedLeg):
                extent = self._slice(item, axis, tensor)
                slices.append(extent)
                if extent is not None:  # a refused slice binds nothing: its error explains the leg
                    self.b._bind(item.name, extent, item.span, where)
            elif isinstance(item, syn.Leg):
                slices.append(None)
                self.b._bind(item.name, axis.size, item.span, where)
            else:
                slices.append(None)
                self._bind_group(item, axis, e.name, where)
        legs = tuple(leg for g in groups for leg in g)
        sliced = tuple(slices) if any(k is not None for k in slices) else ()
        return TensorRef(legs, e.span, e.name, groups, sliced)

    def _unknown_tensor(self, e: syn.Indexed) -> Expr:
        if e.name in self.b.sizes:
            self.b.error(f"'{e.name}' is a size, not a tensor", e.name_span)
        else:
            defined = [*self.b.tensors, *_statement_targets(self.b.items)]
            if e.name in defined:
                return self.poison(e)  # its own statement failed; already reported
            self.b.error(f"unknown tensor '{e.name}'", e.name_span, hint=did_you_mean(e.name, defined))
        return self.poison(e)

    def _check_repeated_legs(self, e: syn.Indexed) -> None:
        seen: dict[str, Span] = {}
        for item in e.legs:
            for leg in item.legs if isinstance(item, syn.LegGroup) else (item,):
                if leg.name in seen:
                    self.b.error(
                        f"leg '{leg.name}' names two axes of {e.name}",
                        leg.span,
                        seen[leg.name],
                        hint="each axis of a tensor needs its own leg; a diagonal is not supported",
                    )
                seen[leg.name] = leg.span

    def _bind_group(self, group: syn.LegGroup, axis: Axis, name: str, where: str) -> None:
        """A reshape `(h d)`: the axis size must equal the product of the legs' sizes."""
        unknown = [leg for leg in group.legs if leg.name not in self.b.legs]
        known = sympy.Mul(*(self.b.legs[leg.name].size for leg in group.legs if leg.name in self.b.legs))
        pieces = " ".join(leg.name for leg in group.legs)
        if len(unknown) > 1:
            self.b.error(
                f"cannot split axis {axis.leg} of {name} ({axis.size}) into ({pieces}): "
                f"legs {', '.join(leg.name for leg in unknown)} have no size yet",
                group.span,
                hint="declare a tensor that uses these legs, so their sizes are known",
            )
            return
        if unknown:
            inferred = sympy.simplify(
                self.b.sizes and expand_sizes(axis.size, self.b.sizes) / expand_sizes(known, self.b.sizes)
            )
            self.b._bind(unknown[0].name, inferred, unknown[0].span, where)
            return
        if not _same_size(known, axis.size, self.b.sizes):
            self.b.error(
                f"reshape mismatch: axis {axis.leg} of {name} has size {axis.size} "
                f"but ({' '.join(leg.name for leg in group.legs)}) has size {_product_text(group, self.b.legs)}",
                group.span,
                hint="the legs of a reshape must multiply to the axis size",
            )

    # -- products, sums, quotients --
    def product(self, e: syn.Expr, keep: set[str]) -> Expr:
        coefficient, factors = self._flatten_product(e)
        if not factors:
            return Scalar((), e.span, coefficient)
        available = [_available(f, self.b.tensors) for f in factors]
        nodes = []
        for i, f in enumerate(factors):
            outside = set().union(*(a for j, a in enumerate(available) if j != i))
            nodes.append(self.build(f, keep | outside))
        every = _ordered_union(n.legs for n in nodes)
        kept = tuple(leg for leg in every if leg in keep)
        summed = tuple(leg for leg in every if leg not in keep)
        batch = tuple(leg for leg in kept if sum(leg in n.legs for n in nodes) > 1)
        if len(nodes) == 1 and coefficient == 1 and not summed:
            return nodes[0]
        return Contraction(kept, e.span, tuple(nodes), coefficient, summed, batch)

    def _flatten_product(self, e: syn.Expr) -> tuple[sympy.Expr, list[syn.Expr]]:
        e = _call_as_product(e, self.b.tensors)
        if _is_scalar_syntax(e, self.b.tensors):
            return self.b._scalar(e), []
        if isinstance(e, syn.Neg):
            c, fs = self._flatten_product(e.operand)
            return -c, fs
        if isinstance(e, syn.BinOp) and e.op in ("juxt", "*"):
            c1, f1 = self._flatten_product(e.left)
            c2, f2 = self._flatten_product(e.right)
            return c1 * c2, f1 + f2
        if isinstance(e, syn.BinOp) and e.op == "/" and _is_scalar_syntax(e.right, self.b.tensors):
            c, fs = self._flatten_product(e.left)
            divisor = self.b._scalar(e.right)
            if divisor == 0:
                self.b.error("division by zero", e.right.span)
                return c, fs
            return c / divisor, fs
        return sympy.Integer(1), [e]

    def _elementwise(self, operands: list[syn.Expr], keep: set[str]) -> list[Expr]:
        """Operands of an elementwise node: legs shared between operands survive into the node."""
        available = [_available(o, self.b.tensors) for o in operands]
        shared = {
            leg
            for i, a in enumerate(available)
            for leg in a
            if any(leg in b for j, b in enumerate(available) if j != i)
        }
        return [self.inside(o, keep | shared) for o in operands]

    def sum(self, e: syn.BinOp, keep: set[str]) -> Expr:
        """A leg that leaves no term is summed within each term: Σ_k (A + B) = Σ_k A + Σ_k B."""
        terms, signs = _flatten_sum(e)
        nodes = [self.inside(t, keep) for t in terms]
        node = SumNode(_ordered_union(n.legs for n in nodes), e.span, tuple(nodes), tuple(signs))
        return self.restrict(node, keep, e.span)

    def quotient(self, e: syn.BinOp, keep: set[str]) -> Expr:
        numerator, denominator = self._elementwise([e.left, e.right], keep)
        node = Quotient(_ordered_union([numerator.legs, denominator.legs]), e.span, numerator, denominator)
        return self.restrict(node, keep, e.span)

    def power(self, e: syn.BinOp, keep: set[str]) -> Expr:
        if not _is_scalar_syntax(e.right, self.b.tensors):
            self.b.error("an exponent is a number or size, not a tensor", e.right.span)
            return self.poison(e)
        base = self.inside(e.left, keep)
        return ElementwiseMap(base.legs, e.span, "pow", base, (self.b._scalar(e.right),))

    def _slice(self, item: syn.SlicedLeg, axis: Axis, tensor: Tensor) -> sympy.Expr | None:
        """`P[n: N, f]`: leg n reads the first N entries of P's axis (a table over a maximum
        length read at the run-time length); a longer slice than a known axis is an error, one
        that depends on a run-time size is checked when the module runs."""
        extent = self.b._scalar(item.size, sizes_only=True)
        if POISON_SIZE in extent.free_symbols:
            return None
        if tensor.kind not in ("param", "const", "buffer"):
            self.b.error(
                f"only a stored table (param, const or buffer) is sliced; {tensor.name} is {a_or_an(tensor.kind)}",
                item.span,
                hint=f"use it with its legs: {tensor.name}[{' '.join(tensor.legs)}]",
            )
            return None
        values = size_values(self.b.sizes)
        subs = {self.b.sizes[k].symbol: v for k, v in values.items()}
        have = expand_sizes(axis.size, self.b.sizes).xreplace(subs)
        want = expand_sizes(extent, self.b.sizes).xreplace(subs)
        if have.is_number and want.is_number and want > have:
            self.b.error(
                f"slice {item.name}: {extent} = {want} is longer than axis {axis.leg} of {tensor.name} "
                f"({axis.size} = {have})",
                item.span,
                hint=f"a slice reads the first entries of the axis; at most {have}",
            )
            return None
        return extent

    def gather(self, e: syn.Indexed, tensor: Tensor) -> Expr:
        """`Rel[h, r = clamp(m - n, -K, K) + K]`: the axis named by `r = ...` is read at an
        integer position computed from legs; the result has the other legs and the position's."""
        items = e.items or (*e.legs, *e.options)
        if len(items) != len(tensor.axes):
            axes = " ".join(tensor.legs)
            self.b.error(
                f"{e.name} has {len(tensor.axes)} axes ({axes}) but is used with {len(items)}",
                e.span,
                hint=f"e.g. {e.name}[{axes}]",
            )
            return self.poison(e)
        if len(e.options) > 1:
            self.b.error(
                f"one axis of {e.name} may be read at a position; this use gives {len(e.options)}",
                e.options[1].span,
                hint="gather one axis per use",
            )
            return self.poison(e)
        if tensor.kind not in ("param", "const", "buffer"):
            self.b.error(
                f"only a stored table (param, const or buffer) is read at a position; "
                f"{e.name} is {a_or_an(tensor.kind)}",
                e.options[0].span,
                hint=f"declare the table: param {e.name}[...]",
            )
            return self.poison(e)
        option = e.options[0]
        groups: list[tuple[str, ...]] = []
        outer: list[str] = []
        for item, axis in zip(items, tensor.axes, strict=True):
            if isinstance(item, syn.Option):
                self.b._bind(item.name, axis.size, item.span, e.name)
                groups.append((item.name,))
                position = self.position(item.value)
                if position is None:
                    return self.poison(e)
                for leg in position.legs():
                    if leg in outer or leg == item.name:
                        self.b.error(f"leg '{leg}' names two axes of {e.name}", item.value.span)
                        return self.poison(e)
                outer += [leg for leg in position.legs() if leg not in outer]
                self._check_position_range(position, axis, item, tensor)
            elif isinstance(item, syn.LegGroup):
                self.b.error("a use read at a position takes leg names, not a reshape", item.span)
                return self.poison(e)
            else:
                if isinstance(item, syn.SlicedLeg):
                    self.b.error("a use read at a position is not sliced too", item.span)
                    return self.poison(e)
                self.b._bind(item.name, axis.size, item.span, e.name)
                groups.append((item.name,))
                if item.name in outer:
                    self.b.error(f"leg '{item.name}' names two axes of {e.name}", item.span)
                    return self.poison(e)
                outer.append(item.name)
        source = TensorRef(tuple(g[0] for g in groups), e.span, e.name, tuple(groups))
        self.gathered.append((option.name, option.span))
        return Gather(tuple(outer), e.span, source, option.name, position)

    def position(self, e: syn.Expr) -> Position | None:
        """An integer position of legs, whole numbers and sizes with + - * and clamp(x, lo, hi)."""
        if isinstance(e, syn.Number):
            if not isinstance(e.value, int):
                self.b.error("a position is a whole number", e.span)
                return None
            return Position("number", value=sympy.Integer(e.value))
        if isinstance(e, syn.Name):
            if e.name in self.b.sizes:
                return Position("number", value=self.b._scalar(e, sizes_only=True))
            if self.b.find_leg(e.name):
                return Position("leg", name=e.name)
            self.b.error(
                f"position leg '{e.name}' is not bound to a size",
                e.span,
                hint=did_you_mean(e.name, [*self.b.legs, *self.b.sizes]) or "use legs of this statement's tensors",
            )
            return None
        if isinstance(e, syn.Neg):
            inner = self.position(e.operand)
            return None if inner is None else Position("neg", operands=(inner,))
        if isinstance(e, syn.BinOp) and e.op in ("+", "-", "*"):
            left, right = self.position(e.left), self.position(e.right)
            if left is None or right is None:
                return None
            if e.op == "*" and left.legs() and right.legs():
                self.b.error("a position multiplies a leg by a number or size only", e.span)
                return None
            return Position(e.op, operands=(left, right))
        if isinstance(e, syn.Call) and e.name == "clamp" and e.legs is None and len(e.args) == 3 and not e.keywords:
            parts = [self.position(a) for a in e.args]
            if any(p is None for p in parts):
                return None
            if parts[1].legs() or parts[2].legs():  # type: ignore[union-attr]
                self.b.error("clamp's bounds in a position are numbers or sizes", e.span)
                return None
            return Position("clamp", operands=tuple(parts))  # type: ignore[arg-type]
        self.b.error(
            "expected a position: legs, whole numbers and sizes with + - * and clamp(x, lo, hi)",
            e.span,
            hint="e.g. Rel[h, r = clamp(m - n, -K, K) + K]",
        )
        return None

    def _check_position_range(self, position: Position, axis: Axis, item: syn.Option, tensor: Tensor) -> None:
        """A position must stay in 0 .. size − 1 at every index of its legs, proved before
        anything runs (interval arithmetic; a run-time size is unbounded), so no read wraps around."""
        values = size_values(self.b.sizes)
        subs = {self.b.sizes[k].symbol: v for k, v in values.items()}

        def number(expr: sympy.Expr) -> float:
            value = expand_sizes(expr, self.b.sizes).xreplace(subs)
            return float(value) if value.is_number else math.inf

        low, high = _position_bounds(position, lambda leg: number(self.b.legs[leg].size) - 1, number)
        size = number(axis.size)
        if low < 0 or high > size - 1:
            shown = lambda v: ("-inf" if v < 0 else "+inf") if math.isinf(v) else str(int(v))  # noqa: E731
            self.b.error(
                f"position {item.name} = {position} of {tensor.name} ranges over {shown(low)} .. {shown(high)}, "
                f"outside its axis {axis.leg} ({axis.size}: 0 .. {shown(size - 1)}); a run-time size is unbounded here",
                item.value.span,
                hint="clamp it into the table, e.g. clamp(m - n, -K, K) + K for a table of 2K + 1 entries",
            )

    def position_index(self, e: syn.Call) -> Expr:
        """`index(n)`: entry i is i, over leg n; `index(p, P)` also binds leg p to size P."""
        if e.legs is not None or e.keywords or not 1 <= len(e.args) <= 2 or not isinstance(e.args[0], syn.Name):
            self.b.error(
                "index takes a leg, and optionally its size", e.span, hint="index(n), or index(p, P) to size leg p"
            )
            return self.poison(e)
        leg = e.args[0].name
        if leg in self.b.sizes or leg in self.b.tensors:
            what = "a size" if leg in self.b.sizes else "a tensor"
            self.b.error(f"index takes a leg; '{leg}' is {what}", e.args[0].span, hint="e.g. index(n)")
            return self.poison(e)
        if len(e.args) == 2:
            self.b._bind(leg, self.b._scalar(e.args[1], sizes_only=True), e.args[0].span, "index")
        elif not self.b.find_leg(leg):
            self.b.error(
                f"leg '{leg}' of index(...) is not bound to a size",
                e.args[0].span,
                hint=did_you_mean(leg, self.b.legs)
                or f"use a leg that a declared tensor has, or give its size: index({leg}, SIZE)",
            )
            return self.poison(e)
        return PositionIndex((leg,), e.span, leg)

    # -- calls: boxes, maps, reductions, squared distance --
    def call(self, e: syn.Call, keep: set[str]) -> Expr:
        if e.name in BOXES:
            return self.box(e, keep)
        if e.name in MAPS:
            return self.elementwise_map(e, keep)
        if e.name in REDUCTIONS:
            return self.reduction(e, keep)
        if e.name in PAIRINGS:
            return self.squared_distance(e, keep)
        if e.name in MASK_FACTORS:
            return self.causal_factor(e)
        if e.name in POSITION_FUNCTIONS:
            return self.position_index(e)
        if e.name in self.b.tensors:
            legs = " ".join(self.b.tensors[e.name].legs)
            self.b.error(
                f"'{e.name}' is a tensor, not a map",
                e.name_span,
                hint=f"use it with legs, e.g. {e.name}[{legs}]; write '*' between factors if you meant a product",
            )
        elif e.name in SCALAR_FUNCTIONS:
            self.b.error(f"{e.name} takes a number or size, not a tensor", e.span)
        else:
            self.b.error(
                f"unknown map '{e.name}'",
                e.name_span,
                hint=join_hint(
                    did_you_mean(e.name, FUNCTIONS),
                    one_of(f for f in FUNCTIONS if f in MAPS or f not in SCALAR_FUNCTIONS),
                ),
            )
        return self.poison(e)

    def _one_argument(self, e: syn.Call) -> syn.Expr | None:
        if e.keywords:
            self.b.error(f"{e.name} takes no keyword arguments; options go in [...]", e.keywords[0].span)
        if len(e.args) != 1:
            self.b.error(f"{e.name} takes one argument, got {len(e.args)}", e.span)
            return None
        return e.args[0]

    def _legs_of(self, e: syn.Call) -> tuple[str, ...]:
        legs: list[str] = []
        for item in e.legs or ():
            if isinstance(item, syn.LegGroup):
                self.b.error(f"{e.name} takes leg names, not a reshape", item.span)
                names = [leg.name for leg in item.legs]
            else:
                names = [item.name]
            for name in names:
                if name in legs:
                    self.b.error(f"leg '{name}' is named twice in {e.name}[...]", item.span, hint="name each leg once")
                else:
                    legs.append(name)
        return tuple(legs)

    def box(self, e: syn.Call, keep: set[str]) -> Expr:
        normalized = self._legs_of(e)
        argument = self._one_argument(e)
        if not normalized:
            self.b.error(
                f"a {e.name} box needs its normalized leg",
                e.name_span,
                hint=f"name the leg of the filled ball: {e.name}[m](...)",
            )
        if argument is None:
            return self.poison(e)
        available = _available(argument, self.b.tensors)
        for leg, item in zip(normalized, e.legs or (), strict=False):
            if leg not in available:
                self.b.error(
                    f"normalized leg '{leg}' is not a leg of the {e.name} box's content",
                    item.span,
                    hint=did_you_mean(leg, available) or f"its legs are: {', '.join(sorted(available)) or 'none'}",
                )
            elif leg not in keep:
                self.b.error(
                    f"normalized leg '{leg}' is contracted inside its {e.name} box",
                    item.span,
                    hint=f"the ball's leg must leave the box: use '{leg}' in the result or in a factor outside the box",
                )
        content = self.inside(argument, keep | (set(normalized) & available))
        options = self._box_options(e, content)
        factor = options.pop("scale_factor", None)
        if factor is not None:  # softmax[m, scale = t[h]](x) = softmax[m](t[h] x): a factor inside the box
            batch = tuple(leg for leg in factor.legs if leg in content.legs)
            content = Contraction(content.legs, factor.span, (factor, content), sympy.Integer(1), (), batch)
        return SoftmaxBox(
            content.legs,
            e.span,
            content,
            normalized,
            options.get("scale", sympy.Integer(1)),
            tuple(options.get("masks", ())),
            is_exp=e.name == "softmax",
            eps=options.get("eps", sympy.Integer(0)),
        )

    def _box_options(self, e: syn.Call, content: Expr) -> dict:
        allowed = BOX_OPTIONS[e.name]
        options: dict = {"masks": []}
        for option in e.options:
            if option.name not in allowed:
                self.b.error(
                    f"unknown {e.name} option '{option.name}'",
                    option.span,
                    hint=join_hint(did_you_mean(option.name, allowed), one_of(allowed)),
                )
            elif option.name == "mask":
                mask = self._mask(option.value, content, f"{e.name} box")
                if mask is not None:
                    options["masks"].append(mask)
            elif option.name in options or (option.name == "scale" and "scale_factor" in options):
                self.b.error(f"option '{option.name}' is given twice", option.span)
            elif option.name == "scale" and not _is_scalar_syntax(option.value, self.b.tensors):
                factor = self._scale_factor(option.value, content, e.name)
                if factor is not None:
                    options["scale_factor"] = factor
            else:
                options[option.name] = self.b._scalar(option.value)
        return options

    def _scale_factor(self, value: syn.Expr, content: Expr, box: str) -> Expr | None:
        """A scale that is a tensor expression (a learned per-head temperature `t[h]`): its legs
        must be legs of the box, along which it scales the logits entrywise."""
        legs = _available(value, self.b.tensors)
        wrong = sorted(legs - set(content.legs))
        for leg in wrong:
            self.b.error(
                f"scale leg '{leg}' is not a leg of the {box} box",
                value.span,
                hint=did_you_mean(leg, content.legs) or f"the box's legs are: {', '.join(content.legs)}",
            )
        if wrong:
            return None
        return self.inside(value, set(content.legs))

    def _mask(self, value: syn.Expr, content: Expr, box: str) -> Mask | None:
        if isinstance(value, syn.Call) and value.name == "causal":
            legs = [a.name if isinstance(a, syn.Name) else None for a in value.args]
            if len(legs) != 2 or None in legs or value.legs is not None:
                self.b.error("causal takes a query leg and a key leg", value.span, hint="mask = causal(n, m)")
                return None
            for leg, arg in zip(legs, value.args, strict=True):
                if leg not in content.legs:
                    self.b.error(
                        f"causal mask leg '{leg}' is not a leg of the {box}",
                        arg.span,
                        hint=did_you_mean(leg, content.legs)
                        or f"the {box.split()[-1]}'s legs are: {', '.join(content.legs)}",
                    )
            if legs[0] == legs[1]:
                self.b.error("a causal mask relates two different legs", value.span)
            return CausalMask(legs[0], legs[1], value.span)  # type: ignore[arg-type]
        if isinstance(value, syn.Indexed):
            tensor = self.b.tensors.get(value.name)
            if tensor is None or tensor.kind != "mask":
                masks = [t.name for t in self.b.tensors.values() if t.kind == "mask"]
                what = a_or_an(tensor.kind) if tensor else "not declared"
                self.b.error(
                    f"a padding mask must be a 'mask' input; '{value.name}' is {what}",
                    value.name_span,
                    hint=did_you_mean(value.name, masks) or "declare it: mask pad[m: N]",
                )
                return None
            ref = self.tensor_ref(value)
            for leg in ref.legs:
                if leg not in content.legs:
                    self.b.error(
                        f"mask leg '{leg}' is not a leg of the {box}",
                        value.span,
                        hint=did_you_mean(leg, content.legs)
                        or f"the {box.split()[-1]}'s legs are: {', '.join(content.legs)}",
                    )
            return PaddingMask(ref, value.span) if isinstance(ref, TensorRef) else None
        self.b.error("a mask is causal(query_leg, key_leg) or a mask input like pad[m]", value.span)
        return None

    def causal_factor(self, e: syn.Call) -> Expr:
        """`causal(n, m)` as a factor: 1 where m <= n, 0 elsewhere (zeroing the future)."""
        legs = [a.name if isinstance(a, syn.Name) else None for a in e.args]
        if len(legs) != 2 or None in legs or e.legs is not None or e.keywords:
            self.b.error("causal takes a query leg and a key leg", e.span, hint="causal(n, m)")
            return self.poison(e)
        for leg, arg in zip(legs, e.args, strict=True):
            if leg not in self.b.legs:
                self.b.error(
                    f"causal mask leg '{leg}' is not bound to a size",
                    arg.span,
                    hint=did_you_mean(leg, self.b.legs) or "use legs that a tensor of this file has",
                )
                return self.poison(e)
        if legs[0] == legs[1]:
            self.b.error("a causal mask relates two different legs", e.span)
            return self.poison(e)
        return CausalFactor((legs[0], legs[1]), e.span, legs[0], legs[1])  # type: ignore[arg-type]

    def _map_masks(self, e: syn.Call, operand: Expr) -> list[Expr]:
        """`relu[m, mask = causal(n, m)](x)`: the map's value is zeroed where a mask hides it;
        the legs in brackets are the key legs it runs along, legs of its argument."""
        factors: list[Expr] = []
        for option in e.options:
            if option.name != "mask":
                self.b.error(
                    f"unknown {e.name} option '{option.name}'",
                    option.span,
                    hint=f"a map takes only masks: {e.name}[m, mask = causal(n, m)](...)",
                )
                continue
            mask = self._mask(option.value, operand, f"{e.name} map")
            if isinstance(mask, CausalMask):
                factors.append(CausalFactor((mask.query, mask.key), mask.span, mask.query, mask.key))
            elif isinstance(mask, PaddingMask):
                factors.append(mask.tensor)
        for leg, item in zip(self._legs_of(e), e.legs or (), strict=False):
            if leg not in operand.legs:
                self.b.error(
                    f"leg '{leg}' is not a leg of the {e.name} map's argument",
                    item.span,
                    hint=did_you_mean(leg, operand.legs) or f"its legs are: {', '.join(operand.legs) or 'none'}",
                )
        if e.legs and not e.options:
            self.b.error(
                f"{e.name} is elementwise and takes no legs",
                e.name_span,
                hint=f"write {e.name}(...), or name a mask: {e.name}[m, mask = causal(n, m)](...)",
            )
        return factors

    def elementwise_map(self, e: syn.Call, keep: set[str]) -> Expr:
        if e.legs is not None or e.options:
            along = {leg for option in e.options for leg in _available(option.value, self.b.tensors)}
            masked = self.elementwise_map(dataclasses.replace(e, legs=None, options=()), keep | along)
            factors = self._map_masks(e, masked)
            if not factors:
                return masked
            batch = tuple(leg for leg in masked.legs if any(leg in f.legs for f in factors))
            return Contraction(masked.legs, e.span, (masked, *factors), sympy.Integer(1), (), batch)
        extra = MAPS[e.name]
        args = list(e.args)
        keywords = {k.name: k.value for k in e.keywords}
        if e.name == "clamp":
            for key in ("lo", "hi"):
                if key in keywords:
                    args.append(keywords.pop(key))
        for key in keywords:
            self.b.error(f"unknown argument '{key}' of {e.name}", e.span)
        if len(args) != 1 + extra:
            usage = "clamp(x, lo, hi)" if extra else f"{e.name}(x)"
            self.b.error(f"{e.name} takes {1 + extra} argument(s), got {len(args)}", e.span, hint=usage)
            return self.poison(e)
        operand = self.inside(args[0], keep)
        params = tuple(self.b._scalar(a) for a in args[1:])
        return ElementwiseMap(operand.legs, e.span, e.name, operand, params)

    def reduction(self, e: syn.Call, keep: set[str]) -> Expr:
        over = self._legs_of(e)
        argument = self._one_argument(e)
        if not over:
            self.b.error(f"{e.name} needs the leg it reduces", e.name_span, hint=f"e.g. {e.name}[r](...)")
        if argument is None:
            return self.poison(e)
        operand = self.inside(argument, keep | set(over))
        available = sorted(_available(argument, self.b.tensors))
        for leg, item in zip(over, e.legs or (), strict=False):
            if leg not in operand.legs:
                self.b.error(
                    f"{e.name} over leg '{leg}', which its argument does not have",
                    item.span,
                    hint=did_you_mean(leg, available) or f"its legs are: {', '.join(available) or 'none'}",
                )
        legs = tuple(leg for leg in operand.legs if leg not in over)
        return self.restrict(Reduction(legs, e.span, e.name, over, operand), keep, e.span)

    def squared_distance(self, e: syn.Call, keep: set[str]) -> Expr:
        over = self._legs_of(e)
        if e.keywords or len(e.args) != 2:
            self.b.error(
                "sqdist takes two arguments, a query side and a key side",
                e.span,
                hint="sqdist[d](Q[n h d], K[m h d])",
            )
            return self.poison(e)
        if not over:
            self.b.error("sqdist needs the leg it sums over", e.name_span, hint="e.g. sqdist[d](Q[n h d], K[m h d])")
        left, right = self._elementwise(list(e.args), keep | set(over))
        for side, name in ((left, "query"), (right, "key")):
            for leg in over:
                if leg not in side.legs:
                    self.b.error(f"sqdist leg '{leg}' is missing from the {name} side", side.span)
        legs = tuple(leg for leg in _ordered_union([left.legs, right.legs]) if leg not in over)
        return self.restrict(SquaredDistance(legs, e.span, over, left, right), keep, e.span)


def _product_text(group: syn.LegGroup, legs: Mapping[str, Leg]) -> str:
    return "·".join(str(legs[leg.name].size) for leg in group.legs)
