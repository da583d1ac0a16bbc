"""Syntax -> DesignGraph. Resolves every name, binds every leg to one size symbol, applies the
diagram rule for legs (a leg that does not cross a box, map or sum boundary is summed inside it;
Tuformer App. A) and records the result as a networkx graph of tensors and operations. Every
mistake becomes a Diagnostic; all of them are collected before anything is raised."""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator
import os
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import networkx as nx
import sympy

from . import parse as syn
from .errors import Diagnostic, Span, TdiagError, a_or_an, did_you_mean, one_of
from .errors import hint as join_hint
from .ir import (
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
from .names import reserved_because
from .resources import design_file

BOXES = ("softmax", "normalize")
# elementwise maps: name -> number of arguments after the tensor
MAPS = {
    **dict.fromkeys(
        ("exp", "log", "relu", "elu1", "sigmoid", "tanh", "softplus", "silu", "gelu", "sin", "cos", "sqrt", "abs"), 0
    ),
    "clamp": 2,
}
REDUCTIONS = ("max", "logsumexp", "mean")
PAIRINGS = ("sqdist",)
SCALAR_FUNCTIONS = ("sqrt", "exp", "log")  # of numbers and sizes: a scalar, not a map
MASK_FACTORS = ("causal",)
POSITION_FUNCTIONS = ("index",)
FUNCTIONS = tuple(
    dict.fromkeys((*BOXES, *MAPS, *REDUCTIONS, *PAIRINGS, *SCALAR_FUNCTIONS, *MASK_FACTORS, *POSITION_FUNCTIONS))
)
BOX_OPTIONS = {"softmax": ("mask", "scale"), "normalize": ("eps", "mask")}
INITIALIZERS = {
    "param": ("fill", "identity", "normal", "ones", "uniform", "values", "zeros"),
    "const": ("fill", "identity", "ones", "values", "zeros"),
    "buffer": ("fill", "ones", "zeros"),
    "random": ("normal",),
}
INIT_PARAMS = {
    "normal": ("mean", "std"),
    "uniform": ("low", "high"),
    "fill": ("value",),
    "identity": ("scale",),
    "ones": (),
    "zeros": (),
    "values": (),  # any number of entries, row-major
}
RANDOM_MODES = ("always", "never", "train")


@dataclass
class Limits:
    """What check refuses before anything is built. Change them on `tdiag.LIMITS`, or with the
    environment variables TDIAG_MAX_SIZE and TDIAG_MAX_BYTES."""

    max_size: int = int(os.environ.get("TDIAG_MAX_SIZE", 2**31 - 1))  # one size (a tensor dimension)
    max_bytes: int = int(os.environ.get("TDIAG_MAX_BYTES", 0)) or None  # type: ignore[assignment]  # stored tensors
    max_literal: float = 1e15  # a number written in a .td file, and every scale, eps or coefficient

    def bytes_limit(self) -> int:
        """max_bytes, or this machine's physical memory."""
        if self.max_bytes:
            return self.max_bytes
        try:
            return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return 2**40


LIMITS = Limits()
POISON_NAME = ""  # the name of a stand-in for an expression that had an error
POISON_SIZE = sympy.Symbol("_invalid_", positive=True)  # the size of a leg bound by a mistake


# ---- the design graph ----------------------------------------------------------------------


@dataclass
class DesignGraph:
    """One design: sizes, legs, tensors, statements, boxes, and `graph`, a networkx MultiDiGraph
    whose nodes are tensors and operations and whose edges carry the legs that flow along them."""

    name: str
    file: str
    base: str | None
    sizes: dict[str, Size]
    legs: dict[str, Leg]
    tensors: dict[str, Tensor]
    statements: list[Statement]
    updates: list[Statement]
    outputs: list[str]
    graph: nx.MultiDiGraph
    warnings: list[Diagnostic] = field(default_factory=list)
    _size_values: dict[str, int] | None = field(default=None, init=False, repr=False, compare=False)
    _forward: nx.MultiDiGraph | None = field(default=None, init=False, repr=False, compare=False)

    # sizes
    def expand(self, expr: sympy.Expr) -> sympy.Expr:
        """Substitute derived sizes (D = F / H) until only base sizes remain."""
        return expand_sizes(expr, self.sizes)

    def size_values(self) -> dict[str, int]:
        """Numbers for every size that does not depend on a run-time size (computed once)."""
        if self._size_values is None:
            self._size_values = size_values(self.sizes)
        return dict(self._size_values)

    def evaluate(self, expr: sympy.Expr, /, **at: int) -> sympy.Expr:
        """`expr` at the design's sizes and `at` (any size name, even `self` or `expr`)."""
        return self.evaluate_at(expr, at)

    def evaluate_at(self, expr: sympy.Expr, at: Mapping[str, int]) -> sympy.Expr:
        values = self.size_values() | dict(at)
        subs = {self.sizes[k].symbol: sympy.sympify(v) for k, v in values.items() if k in self.sizes}
        value = self.expand(sympy.sympify(expr)).xreplace(subs)
        return sympy.nsimplify(value) if value.has(sympy.Float) else value

    # tensors
    def tensors_of_kind(self, *kinds: str) -> list[Tensor]:
        return [t for t in self.tensors.values() if t.kind in kinds]

    @property
    def parameters(self) -> list[Tensor]:
        return self.tensors_of_kind("param")

    @property
    def inputs(self) -> list[Tensor]:
        return self.tensors_of_kind("input")

    def parameter_count(self) -> sympy.Expr:
        """Σ over trainable tensors of the product of their leg sizes (Tuformer A.3(2))."""
        return sympy.factor(sympy.Add(*(t.numel for t in self.parameters)))

    def statement_of(self, tensor: str) -> Statement | None:
        t = self.tensors.get(tensor)
        return t.statement if t else None

    def boxes(self) -> list[tuple[Statement, SoftmaxBox]]:
        """Every softmax or normalize box, with the statement it sits in, in file order."""
        found = []
        for statement in [*self.statements, *self.updates]:
            found += [(statement, n) for n in walk(statement.expr) if isinstance(n, SoftmaxBox)]
        return found

    def depends_on(self, *tensors: str) -> set[str]:
        """Names of all tensors that any of `tensors` is computed from (one walk for all of them)."""
        forward = self.forward_graph()
        seen = set().union(*(nx.ancestors(forward, t) for t in tensors if t in forward))
        return {n for n in seen if n in self.tensors}

    def forward_graph(self) -> nx.MultiDiGraph:
        """The graph without update edges: the forward pass's dataflow (acyclic); built once."""
        if self._forward is None:
            edges = [(u, v, k) for u, v, k, d in self.graph.edges(keys=True, data=True) if d.get("update")]
            view = self.graph.copy()
            view.remove_edges_from(edges)
            self._forward = view
        return self._forward


# ---- sizes ---------------------------------------------------------------------------------


def size_symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, positive=True)


class SizeTable(dict[str, Size]):
    """Sizes by name that remember, until one is set again, the order in which they depend on
    each other and each derived size in base sizes only: expanding or evaluating a size is then
    one substitution, and a file of 10,000 sizes checks in linear time."""

    _order: list[str] | None = None
    _expansion: dict[sympy.Symbol, sympy.Expr] | None = None

    def __setitem__(self, name: str, size: Size) -> None:
        self._order = self._expansion = None
        super().__setitem__(name, size)

    def order(self) -> list[str]:
        """Names, each after the sizes its definition uses (Kahn's algorithm; sizes in a cycle,
        which graph.py reports, are left out)."""
        if self._order is None:
            users: dict[str, list[str]] = {name: [] for name in self}
            waiting = {}
            for name, size in self.items():
                used = (
                    {str(s) for s in size.definition.free_symbols} & self.keys()
                    if size.definition is not None
                    else set()
                )
                waiting[name] = len(used)
                for other in used:
                    users[other].append(name)
            ready = [name for name, count in waiting.items() if count == 0]
            order = []
            while ready:
                name = ready.pop()
                order.append(name)
                for user in users[name]:
                    waiting[user] -= 1
                    if waiting[user] == 0:
                        ready.append(user)
            self._order = order
        return self._order

    def expansion(self) -> dict[sympy.Symbol, sympy.Expr]:
        """Each size defined by other sizes -> its definition in sizes with no such definition."""
        if self._expansion is None:
            expansion: dict[sympy.Symbol, sympy.Expr] = {}
            for name in self.order():
                definition = self[name].definition
                if definition is not None and definition.free_symbols:
                    expansion[self[name].symbol] = definition.xreplace(expansion)
            self._expansion = expansion
        return self._expansion


def _table(sizes: Mapping[str, Size]) -> SizeTable:
    return sizes if isinstance(sizes, SizeTable) else SizeTable(sizes)


def expand_sizes(expr: sympy.Expr, sizes: Mapping[str, Size]) -> sympy.Expr:
    """Substitute derived sizes (D = F / H) until only base sizes remain."""
    return sympy.sympify(expr).xreplace(_table(sizes).expansion())


def size_values(sizes: Mapping[str, Size]) -> dict[str, int]:
    """Numbers for every size that does not depend on a run-time size, in one pass in dependency order."""
    table = _table(sizes)
    numbers: dict[sympy.Symbol, sympy.Expr] = {}
    values: dict[str, int] = {}
    for name in table.order():
        definition = table[name].definition
        if definition is None:
            continue
        value = definition.xreplace(numbers)
        if value.has(sympy.Float):
            value = sympy.nsimplify(value)
        if value.is_number:
            numbers[table[name].symbol] = value
            values[name] = value  # type: ignore[assignment]
    return {name: values[name] for name in table if name in values}


# ---- merging a derived design into its base ------------------------------------------------


def _item_name(item: syn.Item) -> str | None:
    if isinstance(item, syn.SizeDef | syn.Declaration):
        return item.name
    if isinstance(item, syn.Statement):
        return item.target.name
    return None


def _what(item: syn.Item) -> str:
    if isinstance(item, syn.Declaration):
        return f"declared as {item.kind}"
    if isinstance(item, syn.SizeDef):
        return "as a size"
    return "computed by a statement"


def _item_name_span(item: syn.Item) -> Span:
    if isinstance(item, syn.SizeDef) and item.name_span is not None:
        return item.name_span
    if isinstance(item, syn.Declaration):
        return item.name_span
    if isinstance(item, syn.Statement):
        return item.target.name_span
    return item.span


def load_items(path: str) -> tuple[syn.DesignDecl, list[syn.Item]]:
    """Parse `path` and, when it `extends` a base design, merge it into the base's items. The
    chain of bases is followed in a loop, not by recursion, so its length has no limit. A bundled
    design may be named instead of a path (`fish`)."""
    path = str(design_file(path))
    chain: list[tuple[syn.DesignDecl, list[syn.Item]]] = []
    seen = {Path(path).resolve()}
    current = path
    while True:
        head, body = _design_file(current)
        chain.append((head, body))
        if head.base is None:
            break
        base_path = str(Path(current).parent / f"{head.base}.td")
        if Path(base_path).resolve() in seen:
            raise TdiagError(
                Diagnostic(f"design '{head.name}' extends itself through '{head.base}'", (head.base_span,))
            )
        if not Path(base_path).exists():
            siblings = [p.stem for p in Path(current).parent.glob("*.td")]
            raise TdiagError(
                Diagnostic(
                    f"no base design '{head.base}' (looked for {base_path})",
                    (head.base_span,),
                    did_you_mean(head.base, siblings),
                )
            )
        seen.add(Path(base_path).resolve())
        current = base_path
    items = chain[-1][1]
    for _, body in reversed(chain[:-1]):
        items = _merge(items, body)
    return chain[0][0], items


def _design_file(path: str) -> tuple[syn.DesignDecl, list[syn.Item]]:
    """One file's `design` line and its other items."""
    source = syn.parse_file(path)
    items = list(source.items)
    if not items or not isinstance(items[0], syn.DesignDecl):
        span = items[0].span if items else Span(path, 1, 1, 1, 2)
        span = Span(span.file, span.line, 1, span.line, 2)
        raise TdiagError(
            Diagnostic("a design file starts with 'design NAME'", (span,), "add a first line: design my_attention")
        )
    head = items[0]
    extra = [i for i in items[1:] if isinstance(i, syn.DesignDecl)]
    if extra:
        raise TdiagError(Diagnostic("a file holds one design; 'design' appears again", (extra[0].span,), None))
    body = items[1:]
    if head.base is None:
        stray = [i for i in body if getattr(i, "replace", False)]
        if stray:
            raise TdiagError(
                [
                    Diagnostic(
                        f"'replace {_item_name(i)}' needs a base design",
                        (i.span,),
                        f"write 'design {head.name} extends BASE' to derive from BASE.td",
                    )
                    for i in stray
                ]
            )
    return head, body


def _merge(base: list[syn.Item], derived: list[syn.Item]) -> list[syn.Item]:
    items = list(base)
    position = {_item_name(i): k for k, i in enumerate(items) if _item_name(i)}
    problems: list[Diagnostic] = []
    for item in derived:
        name = _item_name(item)
        if getattr(item, "replace", False):
            if name not in position:
                problems.append(
                    Diagnostic(
                        f"nothing named '{name}' in the base design to replace",
                        (_item_name_span(item),),
                        did_you_mean(name or "", [n for n in position if n]),
                    )
                )
                continue
            items[position[name]] = item
        else:
            if isinstance(item, syn.Output):
                items = [i for i in items if not isinstance(i, syn.Output)]
            items.append(item)
            if name and name not in position:
                position[name] = len(items) - 1
    if problems:
        raise TdiagError(problems)
    return items


# ---- the builder ---------------------------------------------------------------------------


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


# ---- helpers on syntax ---------------------------------------------------------------------


def _place(tensor: str, span: Span, relative_to: Span) -> str:
    """`WQ (line 4)`, naming the file too when it is not the one being reported on."""
    return f"{tensor} ({_place_line(span, relative_to)})"


def _place_line(span: Span, relative_to: Span) -> str:
    return f"line {span.line}" if span.file == relative_to.file else f"{Path(span.file).name}, line {span.line}"


def _cycles(deps: nx.DiGraph, order: list[str]) -> list[list[str]]:
    """One cycle per strongly connected component, each starting at its first name in the file,
    in file order, so the report is the same on every run."""
    position = {name: k for k, name in enumerate(order)}
    found = []
    for component in nx.strongly_connected_components(deps):
        first = min(component, key=lambda n: position.get(n, len(order)))
        if len(component) == 1 and not deps.has_edge(first, first):
            continue
        cycle = nx.find_cycle(deps.subgraph(component), source=first)
        found.append([u for u, _ in cycle])
    return sorted(found, key=lambda c: position.get(c[0], len(order)))


def _call_parts(e: syn.Expr):
    """An initializer written `ones` or `normal(std = 0.1)` -> (name, args, keywords, span)."""
    if isinstance(e, syn.Name):
        return e.name, (), (), e.span
    if isinstance(e, syn.Call) and e.legs is None:
        return e.name, e.args, e.keywords, e.name_span
    return None, (), (), e.span


def _leg_names(item: syn.Leg | syn.LegGroup) -> tuple[str, ...]:
    return tuple(leg.name for leg in item.legs) if isinstance(item, syn.LegGroup) else (item.name,)


def _group_name(group: tuple[str, ...]) -> str:
    return group[0] if len(group) == 1 else "(" + " ".join(group) + ")"


def _product_op(e: syn.Expr, tensors: Mapping[str, Tensor]) -> bool:
    """Juxtaposition, `*`, negation and division by a scalar all make an Einstein product."""
    if isinstance(e, syn.Neg):
        return True
    if isinstance(e, syn.BinOp) and e.op == "/":
        return _is_scalar_syntax(e.right, tensors)
    return isinstance(e, syn.BinOp) and (e.op in ("juxt", "*"))


def _flatten_sum(e: syn.Expr, sign: int = 1) -> tuple[list[syn.Expr], list[int]]:
    if isinstance(e, syn.BinOp) and e.op in "+-":
        left, ls = _flatten_sum(e.left, sign)
        right, rs = _flatten_sum(e.right, sign if e.op == "+" else -sign)
        return left + right, ls + rs
    return [e], [sign]


def _is_scalar_syntax(e: syn.Expr, tensors: Mapping[str, Tensor]) -> bool:
    """Numbers, sizes and sqrt/arithmetic of them: things that carry no legs."""
    if isinstance(e, syn.Number):
        return True
    if isinstance(e, syn.Name):
        return e.name not in tensors and e.name not in FUNCTIONS
    if isinstance(e, syn.Neg):
        return _is_scalar_syntax(e.operand, tensors)
    if isinstance(e, syn.BinOp):
        return _is_scalar_syntax(e.left, tensors) and _is_scalar_syntax(e.right, tensors)
    if isinstance(e, syn.Call):
        return e.name in SCALAR_FUNCTIONS and e.legs is None and all(_is_scalar_syntax(a, tensors) for a in e.args)
    return False


def _call_as_product(e: syn.Expr, tensors: Mapping[str, Tensor]) -> syn.Expr:
    """`P[k h] (A + B)` reads as a call; when P is a tensor it is the product P[k h] * (A + B),
    and `P[k h] (A + B) ^ p` is P[k h] * (A + B) ^ p: the power binds to the parentheses, as
    it would after `*`."""
    if isinstance(e, syn.BinOp) and e.op == "^":
        product = _call_as_product(e.left, tensors)
        if product is not e.left and isinstance(product, syn.BinOp):
            first, last = product.right.span, e.right.span
            span = Span(first.file, first.line, first.column, last.end_line, last.end_column)
            power = syn.BinOp(span, "^", product.right, e.right)
            return syn.BinOp(e.span, "juxt", product.left, power)
        return e
    if not (isinstance(e, syn.Call) and e.name in tensors and e.legs is not None):
        return e
    if e.options or e.keywords or len(e.args) != 1:
        return e
    tensor = syn.Indexed(e.name_span, e.name, e.name_span, e.legs, ())
    return syn.BinOp(e.span, "juxt", tensor, e.args[0])


def _available(e: syn.Expr, tensors: Mapping[str, Tensor]) -> set[str]:
    """Legs a sub-expression could expose to its surroundings (before the leg rule)."""
    e = _call_as_product(e, tensors)
    if isinstance(e, syn.Indexed):
        legs = {leg for item in e.legs for leg in _leg_names(item)}
        return legs | {n for o in e.options for n in _position_names(o.value, tensors)}
    if isinstance(e, syn.Neg):
        return _available(e.operand, tensors)
    if isinstance(e, syn.BinOp):
        if e.op == "^":
            return _available(e.left, tensors)
        return _available(e.left, tensors) | _available(e.right, tensors)
    if isinstance(e, syn.Call) and e.name in MASK_FACTORS:
        return {a.name for a in e.args if isinstance(a, syn.Name)}
    if isinstance(e, syn.Call) and e.name in POSITION_FUNCTIONS:
        return {a.name for a in e.args[:1] if isinstance(a, syn.Name)}
    if isinstance(e, syn.Call):
        inner = set().union(*(_available(a, tensors) for a in e.args)) if e.args else set()
        over = {leg for item in e.legs or () for leg in _leg_names(item)}
        if e.name in REDUCTIONS or e.name in PAIRINGS:
            return inner - over
        if e.name in SCALAR_FUNCTIONS and _is_scalar_syntax(e, tensors):
            return set()
        return inner
    return set()


def _position_names(e: syn.Expr, tensors: Mapping[str, Tensor]) -> set[str]:
    """Names in a position expression that may be legs (sizes among them stand for no leg)."""
    if isinstance(e, syn.Name):
        return set() if e.name in tensors or e.name in FUNCTIONS else {e.name}
    if isinstance(e, syn.Neg):
        return _position_names(e.operand, tensors)
    if isinstance(e, syn.BinOp):
        return _position_names(e.left, tensors) | _position_names(e.right, tensors)
    if isinstance(e, syn.Call):
        return set().union(*(_position_names(a, tensors) for a in e.args)) if e.args else set()
    return set()


def _position_bounds(position: Position, leg_max, number) -> tuple[float, float]:
    """The smallest and largest value of a position over its legs' ranges 0 .. leg_max(leg)."""
    if position.op == "leg":
        return 0.0, leg_max(position.name)
    if position.op == "number":
        value = number(position.value)
        return (value, value) if not math.isinf(value) else (-math.inf, math.inf)
    parts = [_position_bounds(o, leg_max, number) for o in position.operands]
    if position.op == "neg":
        return -parts[0][1], -parts[0][0]
    if position.op == "+":
        return parts[0][0] + parts[1][0], parts[0][1] + parts[1][1]
    if position.op == "-":
        return parts[0][0] - parts[1][1], parts[0][1] - parts[1][0]
    if position.op == "*":
        products = [a * b for a in parts[0] for b in parts[1] if not (a == 0 or b == 0)] or [0.0]
        products += [0.0] if any(v == 0 for v in (*parts[0], *parts[1])) else []
        return min(products), max(products)
    (low, high), (lo, _), (_, hi) = parts
    return min(max(low, lo), hi), min(max(high, lo), hi)


def _syntax_nodes(e: syn.Expr) -> Iterator[syn.Expr]:
    """Every node of a syntax expression (iteratively: nesting is bounded by the parser)."""
    stack = [e]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, syn.Neg):
            stack.append(node.operand)
        elif isinstance(node, syn.BinOp):
            stack += [node.left, node.right]
        elif isinstance(node, syn.Call):
            stack += [*node.args, *(k.value for k in node.keywords), *(o.value for o in node.options)]
        elif isinstance(node, syn.Indexed):
            stack += [o.value for o in node.options]


def _tensor_names(e: syn.Expr) -> Iterator[str]:
    if isinstance(e, syn.Indexed):
        yield e.name
    elif isinstance(e, syn.Neg):
        yield from _tensor_names(e.operand)
    elif isinstance(e, syn.BinOp):
        yield from _tensor_names(e.left)
        yield from _tensor_names(e.right)
    elif isinstance(e, syn.Call):
        if e.name not in FUNCTIONS:
            yield e.name
        for a in e.args:
            yield from _tensor_names(a)
        for o in e.options:
            yield from _tensor_names(o.value)


def _statement_targets(items: list[syn.Item]) -> list[str]:
    return [i.target.name for i in items if isinstance(i, syn.Statement)]


def _ordered_union(leg_lists: Iterable[Iterable[str]]) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for legs in leg_lists:
        for leg in legs:
            seen.setdefault(leg, None)
    return tuple(seen)


def _same_size(a: sympy.Expr, b: sympy.Expr, sizes: Mapping[str, Size]) -> bool:
    if POISON_SIZE in a.free_symbols | b.free_symbols:
        return True
    return sympy.simplify(expand_sizes(a, sizes) - expand_sizes(b, sizes)) == 0


def _product_text(group: syn.LegGroup, legs: Mapping[str, Leg]) -> str:
    return "·".join(str(legs[leg.name].size) for leg in group.legs)


def _number(value: sympy.Expr) -> str:
    if value.is_Rational and not value.is_integer:  # type: ignore[attr-defined]
        return f"{value} = {float(value):.4g}"
    return str(value)


def _is_constant(expr: Expr, tensors: Mapping[str, Tensor]) -> bool:
    refs = [n for n in walk(expr) if isinstance(n, TensorRef)]
    return all(tensors[r.name].is_constant for r in refs if r.name in tensors)


# ---- the networkx view ---------------------------------------------------------------------


def _dataflow_graph(
    tensors: Mapping[str, Tensor], statements: list[Statement], updates: list[Statement]
) -> nx.MultiDiGraph:
    """Tensors and operations as nodes; an edge carries the legs of the value that flows on it.
    Update rules add edges marked `update=True`, so the forward graph stays acyclic."""
    g = nx.MultiDiGraph()
    for t in tensors.values():
        g.add_node(t.name, kind="tensor", tensor=t)
    for statement in [*statements, *updates]:
        top = _add_operations(g, statement, statement.expr, itertools.count())
        g.add_edge(top, statement.target, position=0, legs=statement.expr.legs, update=statement.is_update)
    return g


def _add_operations(g: nx.MultiDiGraph, statement: Statement, node: Expr, counter: Iterator[int]) -> str:
    """Add `node` and its operands to `g`; return the id of the node that produces its value."""
    if isinstance(node, TensorRef):
        return node.name
    suffix = "@update" if statement.is_update else ""
    node_id = f"{statement.target}{suffix}#{next(counter)}"
    g.add_node(node_id, kind=node.kind, expr=node, statement=statement.target)
    for position, child in enumerate(c for c in node.children() if c is not None):
        source = _add_operations(g, statement, child, counter)
        g.add_edge(source, node_id, position=position, legs=child.legs, update=statement.is_update)
    for mask in node.masks if isinstance(node, SoftmaxBox) else ():
        if isinstance(mask, PaddingMask):
            g.add_edge(mask.tensor.name, node_id, position="mask", legs=mask.tensor.legs, update=statement.is_update)
    return node_id


def build_graph(head: syn.DesignDecl, items: list[syn.Item], overrides: Mapping[str, int] | None = None) -> DesignGraph:
    """Syntax items (after `extends` merging) -> DesignGraph, or TdiagError with every mistake."""
    return _Builder(head, items, overrides or {}).build()


def _masked(
    expr: Expr, query: str, key: str, span: Span, hidden: Mapping[str, set[tuple[int, int]]]
) -> tuple[Expr, int]:
    """`expr` with a causal mask added to every box normalized over `key` that has `query`, and a
    causal factor in every contraction that sums `key` beside `query` where no factor is masked
    already (an un-normalized attention: Σ_m f(S)[n m] V[m] with m <= n). `hidden` holds, for
    each statement masked so far, the (query, key) pairs of its own legs it is masked on."""
    count = 0
    if isinstance(expr, TensorRef | Scalar | CausalFactor):
        return expr, 0
    changes = {}
    for field_name in ("factors", "terms"):
        children = getattr(expr, field_name, None)
        if children is not None:
            rebuilt = [_masked(c, query, key, span, hidden) for c in children]
            count += sum(n for _, n in rebuilt)
            changes[field_name] = tuple(c for c, _ in rebuilt)
    for field_name in ("content", "operand", "numerator", "denominator", "left", "right"):
        child = getattr(expr, field_name, None)
        if isinstance(child, Expr):
            rebuilt, n = _masked(child, query, key, span, hidden)
            count += n
            changes[field_name] = rebuilt
    if isinstance(expr, SoftmaxBox) and key in expr.normalized and query in expr.legs:
        if not any(isinstance(m, CausalMask) and (m.query, m.key) == (query, key) for m in expr.masks):
            changes["masks"] = (*expr.masks, CausalMask(query, key, span))
            count += 1
    if isinstance(expr, Contraction) and key in expr.summed and query in expr.legs:
        factors = changes.get("factors", expr.factors)
        if not any((query, key) in _hidden_pairs(f, hidden) for f in factors if key in f.legs):
            changes["factors"] = (*factors, CausalFactor((query, key), span, query, key))
            changes["batch"] = tuple(dict.fromkeys((*expr.batch, query)))
            count += 1
    return (dataclasses.replace(expr, **changes) if changes else expr), count


def _hidden_pairs(expr: Expr, hidden: Mapping[str, set[tuple[int, int]]]) -> set[tuple[str, str]]:
    """The (query, key) leg pairs along which `expr` is causally masked or zeroed already."""
    if isinstance(expr, CausalFactor):
        return {(expr.query, expr.key)}
    if isinstance(expr, SoftmaxBox):
        return {(m.query, m.key) for m in expr.masks if isinstance(m, CausalMask)}
    if isinstance(expr, Contraction):
        return set().union(*(_hidden_pairs(f, hidden) for f in expr.factors))
    if isinstance(expr, SumNode):  # zero where every term is
        return set.intersection(*(_hidden_pairs(t, hidden) for t in expr.terms))
    if isinstance(expr, Quotient):
        return _hidden_pairs(expr.numerator, hidden)  # type: ignore[arg-type]
    if isinstance(expr, TensorRef) and not expr.is_reshaped and expr.name in hidden:
        return {(expr.legs[q], expr.legs[k]) for q, k in hidden[expr.name]}
    return set()


def with_causal_mask(graph: DesignGraph, query: str = "n", key: str = "m") -> DesignGraph:
    """The same design with `mask = causal(query, key)` on every box normalized over `key` that
    also has leg `query`, and the factor causal(query, key) in every contraction that sums `key`
    beside `query` over factors not masked already (sigmoid, ReLU² and linear attention); the
    bundled designs use n for queries and m for keys."""
    statements, total = [], 0
    hidden: dict[str, set[tuple[int, int]]] = {}
    for statement in graph.statements:
        expr, count = _masked(statement.expr, query, key, statement.span, hidden)
        total += count
        statements.append(dataclasses.replace(statement, expr=expr))
        if not any(len(g) != 1 for g in statement.groups):
            position = {leg: k for k, leg in enumerate(statement.legs)}
            hidden[statement.target] = {
                (position[q], position[k]) for q, k in _hidden_pairs(expr, hidden) if q in position and k in position
            }
    if not total:
        raise TdiagError(
            Diagnostic(
                f"design '{graph.name}' has no attention over leg '{key}' with leg '{query}' to mask"
                " (a box normalized over it, or a contraction that sums it beside the query leg)",
                (Span(graph.file, 1, 1, 1, 2),),
                "name the query and key legs: with_causal_mask(query=..., key=...)",
            )
        )
    tensors = {name: dataclasses.replace(t) for name, t in graph.tensors.items()}
    for statement in statements:
        tensors[statement.target].statement = statement
    return dataclasses.replace(
        graph,
        name=graph.name,
        tensors=tensors,
        statements=statements,
        graph=_dataflow_graph(tensors, statements, graph.updates),
    )
