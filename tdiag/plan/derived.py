"""What the lowering derives from the design once, before it lowers anything: how often each
tensor is read, which exp statements a normalize box shifts, which legs split into head-major
pieces, the legs a scan runs along, the constants made in forward (context.py keeps them)."""

from __future__ import annotations

from collections import Counter

import sympy

from ..graph import DesignGraph
from ..ir import (
    POSITION_MASKS,
    CausalFactor,
    Contraction,
    Convolution,
    ElementwiseMap,
    Expr,
    PaddingMask,
    Scan,
    SegmentSum,
    SoftmaxBox,
    Tensor,
    TensorRef,
    WindowFactor,
    walk,
)


def over_run_time_size(graph: DesignGraph, tensor: Tensor) -> bool:
    """Whether a tensor has an axis over a size known only at run time (N): made in forward."""
    return any(graph.sizes[s.name].is_free for a in tensor.axes for s in graph.expand(a.size).free_symbols)


def count_uses(graph: DesignGraph) -> Counter[str]:
    """How many times each tensor is read (a padding mask of a box counts, an output once)."""
    uses: Counter[str] = Counter()
    for statement in [*graph.statements, *graph.updates]:
        for node in walk(statement.expr):
            if isinstance(node, TensorRef):
                uses[node.name] += 1
            if isinstance(node, SoftmaxBox):
                for mask in node.masks:
                    if isinstance(mask, PaddingMask):
                        uses[mask.tensor.name] += 1
    for name in graph.outputs:
        uses[name] += 1
    return uses


def exp_factors(graph: DesignGraph, uses: Counter[str]) -> frozenset[str]:
    """Single-use statements `P[...] = exp(...)` that are factors of a normalize box without eps
    (through products folded into it): folded into the box, so their exp is shifted (stabilize.py)."""
    found: set[str] = set()

    def visit(e: Expr) -> None:
        if isinstance(e, Contraction):
            for factor in e.factors:
                visit(factor)
        elif isinstance(e, TensorRef) and not e.is_sliced and uses[e.name] == 1:
            statement = graph.tensors[e.name].statement
            if statement is None or e.name in graph.outputs:
                return
            if isinstance(statement.expr, ElementwiseMap) and statement.expr.name == "exp":
                found.add(e.name)
            elif isinstance(statement.expr, Contraction | TensorRef):
                visit(statement.expr)

    for _, box in graph.boxes():
        if not box.is_exp and box.eps == 0 and not box.masks:
            visit(box.content)  # type: ignore[arg-type]
    return frozenset(found)


def scan_legs(node: Scan | SegmentSum) -> tuple[str, ...]:
    """The legs a scan or segment sum runs along, and those its causal masks relate."""
    if isinstance(node, SegmentSum):
        return (node.along, node.key)
    return (node.along, *(leg for m in node.masks if isinstance(m, POSITION_MASKS) for leg in (m.query, m.key)))


def leg_splits(graph: DesignGraph, uses: Counter[str]) -> dict[str, tuple[tuple[str, sympy.Expr], ...]]:
    """Legs that a definition with grouped axes (`C[(h d) (g e)] = ...`) is used with as one
    leg (`C[r s]`) are split into head-major pieces everywhere, so that the structure of the
    definition reaches the contraction. A leg asked to split two different ways stays whole."""
    wanted: dict[str, set[tuple[sympy.Expr, ...]]] = {}
    for statement in [*graph.statements, *graph.updates]:
        for node in walk(statement.expr):
            if not isinstance(node, TensorRef):
                continue
            definition = graph.tensors[node.name].statement
            if definition is None:
                continue
            for use, group in zip(node.groups, definition.groups, strict=True):
                if len(use) == 1 and len(group) > 1:
                    wanted.setdefault(use[0], set()).add(tuple(graph.legs[leg].size for leg in group))
    masked = {
        leg for _, box in graph.boxes() for m in box.masks if isinstance(m, POSITION_MASKS) for leg in (m.query, m.key)
    }
    nodes = [node for statement in [*graph.statements, *graph.updates] for node in walk(statement.expr)]
    masked |= {leg for node in nodes if isinstance(node, CausalFactor | WindowFactor) for leg in node.legs}
    # a convolution shifts whole legs with whole kernel legs
    masked |= {
        leg
        for node in nodes
        if isinstance(node, Convolution)
        for shift in node.shifts
        for leg in (shift.leg, shift.offset)
    }
    # a scan runs along a whole leg, never along a piece of one
    masked |= {leg for node in nodes if isinstance(node, Scan | SegmentSum) for leg in scan_legs(node)}
    splits = {}
    for leg, options in wanted.items():
        if len(options) == 1 and leg not in masked:
            (sizes,) = options
            splits[leg] = tuple((f"{leg}.{k}", size) for k, size in enumerate(sizes))
    return splits
