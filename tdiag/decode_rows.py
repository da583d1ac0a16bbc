"""Which rows of each tensor a decoding step needs: the walk from a causal design's outputs back
that labels every position axis NEW (the new positions) or ALL (every position so far) and finds
what a cache must hold (RowRequests), and whether a statement reads the run-time length as a
number. The decoding rule (decode.py) and the step programs (decode_graphs.py) share it; it reads
the design graph only and never imports torch. Why a kind cannot be computed from cached rows (a
scan or convolution along the result's positions, a segment sum) is its KV_ROWS rule
(decode_rules.py, registered by its construct module)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import sympy

from . import decode_fused  # noqa: F401  (the fused layer norm's rules)
from .decode_rules import ALL, KV_ROWS, NEW
from .graph import DesignGraph
from .ir import Position, Statement, TensorRef, walk


@dataclass(frozen=True)
class DecodeRule:
    """How a design decodes, read off its graph. `kind`: "kv" (cache the rows of `cached`,
    computed tensors or the input itself, and compute new positions from them) or "prefix"
    (cache the input and re-run the prefix, for the `reason` given). `size` is the run-time
    length the input's `axis` runs over; `inner` holds, for each statement that reads the input,
    its position legs that run over every position (its keys); `noise` whether training-mode
    noise makes decoding need eval mode; `reads_length` whether a statement reads the run-time
    length as a number (ReLU² attention's 1/N, sigmoid attention's −log N, cosFormer's πi/2N):
    such a design's earlier outputs change as positions are added, and a step computes its new
    positions at N = P + T, as the forward over the sequence so far does."""

    kind: str
    input: str
    axis: int
    size: str
    positional: frozenset[str]
    cached: tuple[str, ...] = ()
    inner: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    reason: str | None = None
    noise: bool = False
    reads_length: bool = False
    states: tuple[str, ...] = ()


def reads_length(graph: DesignGraph, symbol: sympy.Expr) -> bool:
    """Whether a statement uses the run-time length as a number (a scale, coefficient, map
    parameter or position number), not only as the extent of a slice."""
    return any(statement_reads_length(graph, statement, symbol) for statement in graph.statements)


def statement_reads_length(graph: DesignGraph, statement: Statement, symbol: sympy.Expr) -> bool:
    """Whether `statement` uses the run-time length as a number (not only as a slice's extent)."""

    def numbers(value: object):
        if isinstance(value, sympy.Basic):
            yield value
        elif isinstance(value, tuple):
            for item in value:
                yield from numbers(item)
        elif isinstance(value, Position):
            yield value.value
            yield from numbers(value.operands)

    for node in walk(statement.expr):
        if isinstance(node, TensorRef):
            continue
        for name in node.__dataclass_fields__:
            for number in numbers(getattr(node, name)):
                if symbol in graph.evaluate(number).free_symbols:
                    return True
    return False


class RowRequests:
    """Walks the graph from the outputs back, asking each tensor for the rows (NEW or ALL per
    position axis) its readers need; the first thing that cannot be given from the new inputs
    and the cached rows is the `problem`."""

    def __init__(self, graph: DesignGraph, positional: frozenset[str], symbol: sympy.Expr):
        self.graph, self.positional, self.symbol = graph, positional, symbol
        self.cached: list[str] = []
        self.inner: dict[str, tuple[str, ...]] = {}
        self.seen: set[tuple[str, tuple]] = set()
        self.problem: str | None = None
        self.noise = False
        self.recomputed: list[str] = []
        self._depends: dict[str, bool] = {}
        self._length: dict[str, bool] = {}

    def fail(self, reason: str) -> None:
        self.problem = self.problem or reason

    def output_labels(self, name: str) -> tuple[str | None, ...]:
        tensor = self.graph.tensors[name]
        labels = tuple(NEW if self.is_position(a.size) else None for a in tensor.axes)
        if NEW not in labels:
            self.fail(f"output {name} has no position axis")
        return labels

    def is_position(self, size: sympy.Expr) -> bool:
        return size == self.symbol

    def depends(self, name: str) -> bool:
        """Whether a tensor is computed from the input, a mask or noise (else from positions,
        parameters and constants alone, computable at any positions)."""
        if name not in self._depends:
            tensor = self.graph.tensors[name]
            self._depends[name] = tensor.is_batched or (
                tensor.statement is not None
                and any(isinstance(n, TensorRef) and self.depends(n.name) for n in walk(tensor.statement.expr))
            )
        return self._depends[name]

    def reads_length(self, name: str) -> bool:
        """Whether a tensor's value depends on the run-time length as a number (its statement or
        one it reads, cosFormer's key-side re-weighting by index(m) / N): its earlier rows change
        as positions are added, so they are computed again at each step, never cached."""
        if name not in self._length:
            statement = self.graph.tensors[name].statement
            self._length[name] = statement is not None and (
                statement_reads_length(self.graph, statement, self.symbol)
                or any(isinstance(n, TensorRef) and self.reads_length(n.name) for n in walk(statement.expr))
            )
        return self._length[name]

    def request(self, name: str, labels: tuple[str | None, ...]) -> None:
        if (name, labels) in self.seen or self.problem is not None:
            return
        self.seen.add((name, labels))
        tensor = self.graph.tensors[name]
        if tensor.kind == "input":
            if ALL in labels and name not in self.cached:
                self.cached.append(name)  # keys that are the input itself (X[m f] inside a score)
        elif tensor.kind == "random":
            mode = str(tensor.init.param("mode", "train")) if tensor.init else "train"
            if mode == "always":
                self.fail(f"noise {name} is drawn over every position at each call (mode = always)")
            self.noise = self.noise or mode == "train"
        elif tensor.kind in ("param", "const", "buffer"):
            if any(label is not None for label in labels):
                self.fail(f"{tensor.kind} {name} has an axis of the run-time length")
        elif tensor.kind == "derived":
            assert tensor.statement is not None
            axes = [k for k, label in enumerate(labels) if label is not None]
            if self.depends(name) and len(axes) == 1 and labels[axes[0]] == ALL and self.reads_length(name):
                if name not in self.recomputed:
                    self.recomputed.append(name)
            elif self.depends(name) and len(axes) == 1 and labels[axes[0]] == ALL:
                if name not in self.cached:
                    self.cached.append(name)
                labels = tuple(NEW if label is not None else None for label in labels)
            self.statement(tensor.statement, labels, self.depends(name))

    def statement(self, statement: Statement, labels: tuple[str | None, ...], depends: bool) -> None:
        """Evaluate `statement` with its result's position axes covering `labels`: its other
        position legs cover every position (the keys); each tensor it reads is asked in turn."""
        if (statement.target, ("statement", labels)) in self.seen:
            return
        self.seen.add((statement.target, ("statement", labels)))
        legs: dict[str, str] = {}
        for group, label in zip(statement.groups, labels, strict=True):
            if label is not None and len(group) != 1:
                self.fail(f"{statement.target} merges a position leg with other legs")
                return
            if label is not None:
                legs[group[0]] = label
        inner = sorted({leg for node in walk(statement.expr) for leg in node.legs} & self.positional - set(legs))
        if inner and not depends:
            self.fail(f"{statement.target} sums positions {', '.join(inner)} without reading the input")
            return
        self.inner[statement.target] = tuple(inner)
        legs.update(dict.fromkeys(inner, ALL))
        for node in walk(statement.expr):
            reason = KV_ROWS.lookup(node)(self, node, statement.target, legs)
            if reason is not None:
                self.fail(reason)
            if isinstance(node, TensorRef):
                self.ref(node, legs)

    def ref(self, ref: TensorRef, legs: Mapping[str, str]) -> None:
        tensor = self.graph.tensors[ref.name]
        labels: list[str | None] = []
        for k, (group, axis) in enumerate(zip(ref.groups, tensor.axes, strict=True)):
            here = [leg for leg in group if leg in self.positional]
            if here and len(group) != 1:
                self.fail(f"{ref.name} is read with a position leg merged with other legs")
                return
            if self.is_position(axis.size):
                if ref.is_sliced and ref.slices[k] is not None:
                    self.fail(f"{ref.name} is read in a slice along its positions")
                    return
                labels.append(legs[group[0]] if here else NEW)
                continue
            if here and not (ref.is_sliced and ref.slices[k] == self.symbol):
                self.fail(f"{ref.name} is read along leg {group[0]} other than by a slice of the run-time length")
                return
            labels.append(None)
        if tensor.kind != "mask":
            self.request(ref.name, tuple(labels))
