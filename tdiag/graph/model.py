"""The design graph, the front end's result: sizes, legs, tensors, statements and the networkx
dataflow graph that check, render, plan and cost read; and Limits, what check refuses before
anything is built."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import networkx as nx
import sympy

from ..errors import Diagnostic, Span, TdiagError
from ..ir import Leg, Size, SoftmaxBox, Statement, Tensor, walk
from .sizes import expand_sizes, size_values


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
EVALUATIONS_KEPT = 200_000  # sizes evaluated per design graph before the memo starts over


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
    sources: tuple[str, ...] = ()  # the files read to build it: the design's, then its bases' (none from text)
    # leg -> the tensors (declarations and uses) and functions (index, ...) that bind or agree with its size
    leg_binders: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # leg -> (statement, span) of its first use in each statement that writes it, in file order
    leg_uses: dict[str, tuple[tuple[str, Span], ...]] = field(default_factory=dict)
    _size_values: dict[str, int] | None = field(default=None, init=False, repr=False, compare=False)
    _evaluated: dict[tuple, sympy.Expr] = field(default_factory=dict, init=False, repr=False, compare=False)
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
        """Remembered per expression and sizes: the planner prices every candidate of every box
        at the same sizes, over and over (the sizes of a design never change)."""
        key = (expr, tuple(sorted(at.items())))
        known = self._evaluated.get(key)
        if known is None:
            if len(self._evaluated) > EVALUATIONS_KEPT:
                self._evaluated.clear()
            known = self._evaluated[key] = self._evaluate_at(expr, at)
        return known

    def _evaluate_at(self, expr: sympy.Expr, at: Mapping[str, int]) -> sympy.Expr:
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


def checked_sizes(graph: DesignGraph | None, sizes: Mapping[str, object]) -> dict[str, int]:
    """Sizes given through the Python API: positive whole numbers within LIMITS.max_size, each a
    size of the design (or B, the batch size a plan assumes); anything else is a TdiagError."""
    for key, value in sizes.items():
        if isinstance(value, Mapping):
            raise TdiagError(
                Diagnostic(
                    f"{key}={value!r} is not a size",
                    hint="give sizes as keywords (N=512) or as a mapping in first place ({'N': 512})",
                )
            )
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise TdiagError(Diagnostic(f"size {key} must be a positive whole number, got {value!r}"))
        if value > LIMITS.max_size:
            raise TdiagError(Diagnostic(f"size {key} = {value:,} is over the limit of {LIMITS.max_size:,}"))
        if graph is not None and key not in graph.sizes and key != "B":
            raise TdiagError(
                Diagnostic(
                    f"design '{graph.name}' has no size '{key}'",
                    hint=f"its sizes are: {', '.join(sorted(graph.sizes)) or 'none'}",
                )
            )
    return dict(sizes)  # type: ignore[arg-type]


def numeric_shape(tensor: Tensor, sizes: Mapping[str, int], graph: DesignGraph) -> tuple[int, ...]:
    """The tensor's axis sizes as numbers at `sizes`; a run-time size here is an error."""
    shape = []
    for axis in tensor.axes:
        value = graph.evaluate(axis.size, **sizes)
        if not value.is_Integer:
            missing = ", ".join(sorted(str(s) for s in value.free_symbols))
            raise TdiagError(
                Diagnostic(
                    f"{tensor.kind} {tensor.name} needs the size of leg {axis.leg} ({axis.size}) when it is built",
                    (tensor.span,),
                    f"give {missing} a value, e.g. tdiag.load(..., {missing}=256) or --set {missing}=256",
                )
            )
        shape.append(int(value))
    return tuple(shape)
