"""The design as it runs when its own masks are not given (`forward(X)` without `pad=...`): a mask
left out means every entry attends, so the graph without the mask inputs computes the same values
without building an all-True mask, a float copy of it for SDPA, or the rows-with-a-key guard
around the box. The compiled module runs this twin when every one of the design's masks is None
(codegen_calls.py)."""

from __future__ import annotations

import dataclasses

from ..ir import Expr, PaddingMask, TensorRef, map_children
from .dataflow import dataflow_graph
from .model import DesignGraph


def without_masks(graph: DesignGraph) -> DesignGraph | None:
    """The graph with every `mask` input dropped from the masks of the boxes, reductions, scans and
    convolutions it hides; None where the design has no mask input, or reads one other than as a
    node's mask (a factor `pad[m] x[m]`), where leaving it out is not the same as all-True."""
    names = {t.name for t in graph.tensors_of_kind("mask")}
    if not names:
        return None
    statements = [dataclasses.replace(s, expr=_unmasked(s.expr, names)) for s in graph.statements]
    updates = [dataclasses.replace(s, expr=_unmasked(s.expr, names)) for s in graph.updates]
    if any(_reads(s.expr, names) for s in (*statements, *updates)):
        return None
    tensors = {name: dataclasses.replace(t) for name, t in graph.tensors.items() if name not in names}
    for statement in statements:
        tensors[statement.target].statement = statement
    return dataclasses.replace(
        graph,
        tensors=tensors,
        statements=statements,
        updates=updates,
        graph=dataflow_graph(tensors, statements, updates),
    )


def _hides(mask: object, names: set[str]) -> bool:
    return isinstance(mask, PaddingMask) and mask.tensor.name in names


def _unmasked(expr: Expr, names: set[str]) -> Expr:
    expr = map_children(expr, lambda child: _unmasked(child, names))
    masks = getattr(expr, "masks", ())
    if any(_hides(mask, names) for mask in masks):
        expr = dataclasses.replace(expr, masks=tuple(m for m in masks if not _hides(m, names)))  # type: ignore[call-arg]
    return expr


def _reads(expr: Expr, names: set[str]) -> bool:
    """Whether `expr` still reads one of the mask inputs anywhere below it, masks included."""
    if isinstance(expr, TensorRef):
        return expr.name in names
    if any(isinstance(m, PaddingMask) and m.tensor.name in names for m in getattr(expr, "masks", ())):
        return True
    return any(_reads(child, names) for child in expr.children() if isinstance(child, Expr))
