"""Which computed tensors the default drawing keeps as nodes, and how large a drawing may grow.

A computed tensor used once is inlined, as the papers' figures draw it; one used more than once
(RWKV's token-shifted input feeding four projections, RoPE's rotated query read twice) is drawn
once as a derived node with an edge bundle to each use, so no sub-diagram is copied. A drawing
with more nodes than a screen shows is drawn one statement per panel instead."""

from __future__ import annotations

from collections import Counter

from .graph import DesignGraph
from .ir import Expr, PaddingMask, Statement, TensorRef, walk

MAX_NODES = 64
"""The most visible nodes (tensors, junctions, shift and mask marks) a default drawing keeps in
one picture: the bundled designs' largest, cohere_qk_norm, has 55 and Graphviz lays it out at
about 3400 x 1700 px; much past 64 a side passes 4000 px."""


def references(expr: Expr) -> list[TensorRef]:
    """Every tensor an expression reads, padding masks and gathered tables included."""
    found = []
    for node in walk(expr):
        if isinstance(node, TensorRef):
            found.append(node)
        found += [m.tensor for m in getattr(node, "masks", ()) if isinstance(m, PaddingMask)]
    return found


def drawn_statements(design: DesignGraph) -> list[Statement]:
    """The statements the outputs depend on, in the file's order."""
    needed: set[str] = set()
    pending = list(design.outputs)
    while pending:
        name = pending.pop()
        statement = design.tensors[name].statement
        if name in needed or statement is None:
            continue
        needed.add(name)
        pending += [ref.name for ref in references(statement.expr)]
    return [s for s in design.statements if s.target in needed]


def shared_tensors(design: DesignGraph) -> list[str]:
    """The computed tensors used more than once (an output counts as one use), in statement order."""
    statements = drawn_statements(design)
    uses = Counter(ref.name for s in statements for ref in references(s.expr))
    uses.update(design.outputs)
    return [s.target for s in statements if uses[s.target] > 1]


def too_large(node_count: int) -> bool:
    return node_count > MAX_NODES
