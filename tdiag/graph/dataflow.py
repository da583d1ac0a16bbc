"""The networkx view of a design: tensors and operations as nodes, edges carrying the legs of the
value that flows on them, update rules as edges marked `update=True`. Built last by the builder (and
again by with_causal_mask); render and DesignGraph.depends_on read it."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping

import networkx as nx

from ..ir import Expr, PaddingMask, SoftmaxBox, Statement, Tensor, TensorRef


def dataflow_graph(
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
