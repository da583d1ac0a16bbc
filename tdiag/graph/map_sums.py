"""Sums inside a map. By the diagram rule a leg seen only inside a map's argument is summed inside
the map: right for a contraction between factors (`elu1(Q[n h d] K[m h d])` sums d), but for a leg
that one factor alone carries it is a plain reduction inside the map, `exp(S[h n k])` = exp(Σ_k S),
which is easily read as Σ_k exp(S) (an attention sink's denominator). Such a sum inside a map, a
power or a reduction is warned of, with both readings and how to write the other one."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from .. import parse as syn
from ..errors import Diagnostic, Span
from ..ir import (
    CausalFactor,
    Contraction,
    Convolution,
    ElementwiseMap,
    Expr,
    Reduction,
    Scan,
    SegmentSum,
    SoftmaxBox,
    SquaredDistance,
    Tensor,
    WindowFactor,
)
from ..ir import TensorRef as Ref
from .syntax import _syntax_nodes, _syntax_text
from .vocabulary import REDUCTIONS

# nodes that apply the leg rule at their own boundary: a sum inside them is theirs, not the map's
_BOUNDARIES = (ElementwiseMap, SoftmaxBox, Reduction, Scan, SegmentSum, Convolution, SquaredDistance)


def lone_sums(operand: Expr, tensors: Mapping[str, Tensor]) -> list[str]:
    """Legs that a product in `operand` (outside any nested map, box or reduction) sums over one
    factor only, masks aside: a reduction of that factor, not a contraction between factors."""
    found: list[str] = []
    stack = [operand]
    while stack:
        node = stack.pop()
        if isinstance(node, _BOUNDARIES):
            continue
        if isinstance(node, Contraction):
            for leg in node.summed:
                carriers = [f for f in node.factors if leg in f.legs and not _is_mask(f, tensors)]
                if len(carriers) == 1 and leg not in found:
                    found.append(leg)
        stack.extend(child for child in node.children() if child is not None)
    return found


def _is_mask(factor: Expr, tensors: Mapping[str, Tensor]) -> bool:
    if isinstance(factor, CausalFactor | WindowFactor):
        return True
    return isinstance(factor, Ref) and factor.name in tensors and tensors[factor.name].kind == "mask"


def map_sum_warning(
    call: syn.Call | syn.BinOp, argument: syn.Expr, operand: Expr, legs: list[str], taken: set[str]
) -> Diagnostic:
    """The warning for `call` (a map, reduction or power) whose `argument` sums `legs` that one
    factor carries; `operand` is the argument as built (its legs are the kept ones), `taken` the names in use."""
    sigma = _sigma(legs)
    summed = _summed_text(argument, legs)
    if isinstance(call, syn.BinOp):  # a power: (Σ_k x) ^ p
        where, computes = "the power", f"({summed}) ^ {_syntax_text(call.right)}"
    else:
        placeholder = syn.Name(argument.span, summed)
        where, computes = call.name, _syntax_text(dataclasses.replace(call, args=(placeholder, *call.args[1:])))
    text = _syntax_text(call)
    name = next(n for n in ("E", *(f"E{k}" for k in range(1, len(taken) + 2))) if n not in taken)
    is_reduction = isinstance(call, syn.Call) and call.name in REDUCTIONS
    reduced = {leg.name for item in call.legs or () for leg in _item_legs(item)} if is_reduction else set()
    result = f"{name}[{' '.join((*(leg for leg in operand.legs if leg not in reduced), *legs))}]"
    return Diagnostic(
        f"{text} sums {' and '.join(legs)} inside {where}: it computes {computes}",
        _leg_spans(argument, set(legs)) or (argument.span,),
        f"to sum the values instead, {sigma} {_operand(call)}, write it as its own statement: "
        f"{result} = {text}, then use {result}",
        severity="warning",
    )


def _sigma(legs: list[str]) -> str:
    return "Σ_" + (legs[0] if len(legs) == 1 else "(" + " ".join(legs) + ")")


def _summed_text(e: syn.Expr, legs: list[str]) -> str:
    """`e` with Σ where the leg rule sums `legs`: within each term of a sum that has them, within
    the side of a quotient that alone has them, else around the whole expression."""
    here = [leg for leg in legs if leg in _written_legs(e)]
    if not here:
        return _syntax_text(e)
    if isinstance(e, syn.BinOp) and e.op in "+-":
        right = _summed_text(e.right, here)
        return f"{_summed_text(e.left, here)} {e.op} {f'({right})' if e.op == '-' and right.startswith('Σ') else right}"
    if isinstance(e, syn.BinOp) and e.op == "/":
        numerator, denominator = _written_legs(e.left), _written_legs(e.right)
        if numerator and denominator and not any(leg in numerator and leg in denominator for leg in here):
            sides = [_summed_text(side, here) for side in (e.left, e.right)]
            return " / ".join(
                f"({t})" if t.startswith("Σ") or isinstance(side, syn.BinOp) else t
                for t, side in zip(sides, (e.left, e.right), strict=True)
            )
    return f"{_sigma(here)} {_operand(e)}"


def _written_legs(e: syn.Expr) -> set[str]:
    """Legs written in `e`'s tensor uses and index(...) calls."""
    found = set()
    for node in _syntax_nodes(e):
        if isinstance(node, syn.Indexed):
            found |= {
                leg.name for item in node.legs for leg in (item.legs if isinstance(item, syn.LegGroup) else (item,))
            }
        elif isinstance(node, syn.Call) and node.name in ("index", "causal", "window"):
            found |= {a.name for a in node.args if isinstance(a, syn.Name)}
    return found


def _item_legs(item: syn.Leg | syn.LegGroup) -> tuple[syn.Leg, ...]:
    return item.legs if isinstance(item, syn.LegGroup) else (item,)


def _operand(e: syn.Expr) -> str:
    """`e` as an operand of Σ: parenthesized unless it is one tensor use, call or name."""
    text = _syntax_text(e)
    return text if isinstance(e, syn.Indexed | syn.Call | syn.Name) else f"({text})"


def _leg_spans(argument: syn.Expr, legs: set[str]) -> tuple[Span, ...]:
    """Where the argument writes the summed legs, in file order (the carets)."""
    spans = []
    for node in _syntax_nodes(argument):
        for item in node.legs if isinstance(node, syn.Indexed) else ():
            for leg in _item_legs(item):
                if leg.name in legs:
                    spans.append(leg.span)
    return tuple(sorted(spans, key=lambda s: (s.line, s.column)))
