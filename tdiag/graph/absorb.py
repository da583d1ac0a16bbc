"""MLA's absorbed form as a rewrite of the design graph (DeepSeek-V2 Sec. 2.1.2: "W^UK can be
absorbed into W^Q, and W^UV can be absorbed into W^O"): where a statement reads at every key a
tensor that is a linear map of a smaller per-position tensor, the map's factors are put in its
place in the reader's product, so that the reader contracts the smaller tensor and the map's
weights go to the query and output side. Torch-free: the decoding cache (tdiag/decode.py,
decode_step.py) and the planner (plan/absorb_choice.py) both take it."""

from __future__ import annotations

import dataclasses
import math

import sympy

from ..ir import Contraction, Expr, Statement, TensorRef, map_children, walk
from .model import DesignGraph
from .position_rules import KEY_LEGS

__all__ = ["absorbed", "length_symbol", "unread_dropped"]


def absorbed(graph: DesignGraph) -> DesignGraph:
    """The design's absorbed form, or `graph` itself where it has none: where a statement reads
    at every key a tensor S that is a linear map of a smaller per-position tensor D
    (S[m h c] = D[m l] W[l h c] with parameters and constants beside D; MLA's per-head keys and
    values of its latent), S's factors are put in its place in the reader's product, so that
    the frontier, and what the cache holds, is D, and the step contracts the new queries with the weights first (the
    absorbed form). It is offered where the cache would keep fewer entries per position (what a
    decoding step reads from memory), and taken where the planner's time model finds a step
    cheaper in it (decode_step.chosen_form), and by the planner for a whole forward pass where
    its objective finds that cheaper (plan/absorb_choice.py). The replaced tensors' statements
    stay (a decoding step reads only what its outputs need); `unread_dropped` removes them."""
    symbol = length_symbol(graph)
    if symbol is None:
        return graph
    positional = {name for name, leg in graph.legs.items() if leg.size == symbol}
    legs = dict(graph.legs)
    statements = []
    for statement in graph.statements:
        keys = _key_legs(statement, positional)
        expr = _absorb(statement.expr, graph, positional, keys, legs)
        statements.append(statement if expr is statement.expr else dataclasses.replace(statement, expr=expr))
    if all(a is b for a, b in zip(statements, graph.statements, strict=True)):
        return graph
    tensors = {name: dataclasses.replace(t) for name, t in graph.tensors.items()}
    for statement in statements:
        tensors[statement.target].statement = statement
    return dataclasses.replace(graph, legs=legs, tensors=tensors, statements=statements)


def unread_dropped(graph: DesignGraph) -> DesignGraph:
    """`graph` without the statements (and their tensors) that no output and no state update
    reads, directly or through other statements: what `absorbed` leaves behind (MLA's per-head
    keys and values once their readers contract the latent), which a plan would otherwise
    compute and never use."""
    read = set(graph.outputs)
    for update in graph.updates:
        read |= {update.target} | _names_read(update.expr)
    for statement in reversed(graph.statements):
        if statement.target in read:
            read |= _names_read(statement.expr)
    statements = [s for s in graph.statements if s.target in read]
    if len(statements) == len(graph.statements):
        return graph
    gone = {s.target for s in graph.statements} - read
    tensors = {name: t for name, t in graph.tensors.items() if name not in gone}
    return dataclasses.replace(graph, tensors=tensors, statements=statements)


def _names_read(expr: Expr) -> set[str]:
    """The tensors an expression reads: its references and its masks' tensors (a padding mask)."""
    names = set()
    for node in walk(expr):
        if isinstance(node, TensorRef):
            names.add(node.name)
        names |= {mask.tensor.name for mask in getattr(node, "masks", ()) if getattr(mask, "tensor", None) is not None}
    return names


def length_symbol(graph: DesignGraph) -> sympy.Expr | None:
    """The run-time length the design's one input runs over (N), or None where there is not
    exactly one input with exactly one such axis."""
    if len(graph.inputs) != 1:
        return None
    free = [
        a.size for a in graph.inputs[0].axes if isinstance(a.size, sympy.Symbol) and graph.sizes[a.size.name].is_free
    ]
    return free[0] if len(free) == 1 else None


def _key_legs(statement: Statement, positional: set[str]) -> set[str]:
    """The position legs a statement reads at every key: those it sums over without keeping, and
    those its nodes read at every key (`KEY_LEGS`: a box's normalized legs, the legs whose future a
    mask hides, a causal or window factor's key). (A box's normalized leg is its mask's key
    wherever a decoding cache applies, since the design is causal; only an unmasked box, planned
    for training, needs it named.)"""
    inner = {leg for node in walk(statement.expr) for leg in node.legs} - set(statement.legs)
    keys = inner & positional
    for node in walk(statement.expr):
        keys |= KEY_LEGS.lookup(node)(node, positional)
    return keys


def _absorb(expr: Expr, graph: DesignGraph, positional: set[str], keys: set[str], legs: dict) -> Expr:
    expr = map_children(expr, lambda child: _absorb(child, graph, positional, keys, legs))
    if not isinstance(expr, Contraction):
        return expr
    factors, summed, coefficient = [], list(expr.summed), expr.coefficient
    for factor in expr.factors:
        inlined = _linear_map(factor, graph, positional, keys, legs) if isinstance(factor, TensorRef) else None
        if inlined is None:
            factors.append(factor)
            continue
        more, fresh, scale = inlined
        factors += more
        summed += fresh
        coefficient *= scale
    if len(factors) == len(expr.factors):
        return expr
    return dataclasses.replace(expr, factors=tuple(factors), summed=tuple(summed), coefficient=coefficient)


def _linear_map(
    ref: TensorRef, graph: DesignGraph, positional: set[str], keys: set[str], legs: dict
) -> tuple[list[Expr], list[str], sympy.Expr] | None:
    """The factors of the statement `ref` reads, with its legs named as `ref` names them and its
    summed legs given fresh names, where that statement is a product of one smaller per-position
    tensor computed from the input and stored tensors, read here at every key; else None."""
    tensor = graph.tensors[ref.name]
    statement = tensor.statement
    if statement is None or ref.is_reshaped or ref.is_sliced or not isinstance(statement.expr, Contraction):
        return None
    if any(len(g) != 1 for g in statement.groups) or not (set(ref.legs) & keys):
        return None
    inner = statement.expr
    computed = [
        f for f in inner.factors if isinstance(f, TensorRef) and graph.tensors[f.name].kind in ("derived", "input")
    ]
    stored = [
        f
        for f in inner.factors
        if isinstance(f, TensorRef) and graph.tensors[f.name].kind in ("param", "const", "buffer")
    ]
    if (
        len(computed) != 1
        or len(computed) + len(stored) != len(inner.factors)
        or computed[0].is_reshaped
        or computed[0].is_sliced
    ):
        return None
    source = computed[0]
    if len(set(source.legs) & positional) != 1 or len(set(statement.legs) & positional) != 1:
        return None
    if any(set(f.legs) & positional for f in stored) or any(f.is_sliced or f.is_reshaped for f in stored):
        return None

    def entries(names) -> int | None:
        values = [graph.evaluate(graph.legs[leg].size) for leg in names if leg not in positional]
        return int(math.prod(values)) if all(v.is_Integer for v in values) else None

    small, large = entries(source.legs), entries(statement.legs)
    if small is None or large is None or small >= large:
        return None
    renamed = dict(zip(statement.legs, ref.legs, strict=True))
    fresh = []
    for leg in inner.summed:
        name = f"{leg}_{ref.name}"
        while name in legs:
            name += "_"
        legs[name] = dataclasses.replace(graph.legs[leg], name=name)
        renamed[leg] = name
        fresh.append(name)
    factors = [
        dataclasses.replace(
            f, legs=tuple(renamed[leg] for leg in f.legs), groups=tuple((renamed[leg],) for leg in f.legs)
        )
        for f in inner.factors
    ]
    return factors, fresh, inner.coefficient
