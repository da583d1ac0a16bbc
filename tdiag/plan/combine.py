"""Values combined elementwise: a signed sum or a quotient of values aligned with broadcasting,
its terms added smallest pair first; and whether a term holds a parameter nothing else reads
(kept wherever it could drop out). Functions of the lowering's context, shared by the passes."""

from __future__ import annotations

import itertools

import sympy

from ..ir import Expr, TensorRef, walk
from .chooser import cheapest
from .context import Lowering
from .program import BATCH, Binary, Elementwise, Operand, Step, Value, align


def owns_parameter(ctx: Lowering, e: Expr) -> bool:
    """Does `e` hold a parameter nothing else uses? Such a term is kept even where it cannot
    matter (GFiSH's b2, T11), so every parameter gets a gradient and DDP needs no
    find_unused_parameters."""
    for node in walk(e):
        if isinstance(node, TensorRef) and ctx.g.tensors[node.name].kind == "param" and ctx.uses[node.name] == 1:
            return True
    return False


def combine(
    ctx: Lowering, kind: str, parts: list[tuple[int, Value]], out: tuple[str, ...], var: str | None, operator: str = "+"
) -> Value:
    """Elementwise sum (or quotient) of values aligned to `out` with broadcasting."""
    present = [leg for leg in out if any(leg in v.legs for _, v in parts)]
    if any(v.is_batched for _, v in parts) and BATCH not in present:
        present = [BATCH, *present]
    largest = max((v for _, v in parts), key=lambda v: ctx.numel_number(v.legs))
    if set(largest.legs) == set(present):
        present = list(largest.legs)  # the largest operand is read in its own layout, not permuted
    broadcast = frozenset(leg for leg in out if leg not in present)
    name = ctx.names.fresh(var or kind)
    aligned = [(sign, align(v, tuple(present)), v.legs) for sign, v in parts]
    if operator == "+":
        op, elementwise = sum_tree(ctx, aligned)
    else:
        tree = aligned[0][1]
        for _, operand, _ in aligned[1:]:
            tree = Binary("/", tree, operand)
        op, elementwise = Elementwise(tree), ctx.numel(present) * (len(parts) - 1)
    return ctx.emit(
        Step(
            kind,
            op,
            Value(name, tuple(present), broadcast),
            kind,
            elementwise=elementwise,
            inputs=tuple(v for _, v in parts),
        )
    )  # type: ignore[return-value]


def sum_tree(ctx: Lowering, terms: list[tuple[int, Operand, tuple[str, ...]]]) -> tuple[Elementwise, sympy.Expr]:
    """Σ ± terms, broadcasting, added smallest pair first: terms along few legs meet before
    they are broadcast to the full result (sMGK's five-term distance, P11), so each full-size
    pass is paid once. Returns the op and its elementwise operation count."""
    nodes: list[tuple[int, Binary | Operand, frozenset[str]]] = [
        (sign, operand, frozenset(legs)) for sign, operand, legs in terms
    ]
    elementwise = sympy.Integer(0)
    while len(nodes) > 1:
        pairs = itertools.combinations(range(len(nodes)), 2)
        i, j = cheapest([(p, ctx.numel_number(nodes[p[0]][2] | nodes[p[1]][2])) for p in pairs])
        (sa, a, la), (sb, b, lb) = nodes[i], nodes[j]
        elementwise += ctx.numel(la | lb)
        if sa == sb:
            merged = (sa, Binary("+", a, b))
        else:
            merged = (1, Binary("-", a, b) if sa > 0 else Binary("-", b, a))
        nodes = [n for k, n in enumerate(nodes) if k not in (i, j)] + [(*merged, la | lb)]
    sign, tree, _ = nodes[0]
    return Elementwise(tree, negate=sign < 0), elementwise


def as_missing_legs(value: Value) -> Value:
    """A value's broadcast legs, for combine, which broadcasts any leg an operand lacks."""
    return Value(value.var, value.legs, frozenset())
