"""Elementwise maps (exp, log, relu, elu1, the common activations, clamp, max/min with a bound,
pow): shape-preserving functions of one operand. Their rules in every stage's table."""

from __future__ import annotations

from typing import TYPE_CHECKING

import sympy

from .. import decode_rules as decode
from .. import parse as syn
from ..check import CHECK, NumberRule
from ..decode_rules import (
    STATE_FACTOR,
    ProductParts,
)
from ..evaluation import EVALUATE
from ..graph import position_rules as pos
from ..graph.calls import BUILD
from ..graph.position_rules import Hidden, Pairs
from ..graph.vocabulary import MAPS, RSQRT
from ..ir import Contraction, ElementwiseMap, Expr, PositionIndex, Scalar, SumNode
from ..plan.base import LOWER
from ..plan.elementwise import lower_map
from ..printing import DESCRIBE, PRINT, format_expr, nothing_to_describe, wrapped
from ..render import RENDER, math_text
from ..render import draw as draw_node
from ..render_notation import MAP_LABEL

if TYPE_CHECKING:
    import torch

    from ..graph.calls import BoxesAndMaps
    from ..reference import Frame
    from ..render import Drawing

_TORCH_MAPS = ("sigmoid", "tanh", "sin", "cos", "sqrt", "abs")  # torch.<name>
_FUNCTIONAL_MAPS = ("softplus", "silu", "gelu")  # torch.nn.functional.<name>


@EVALUATE.register(ElementwiseMap)
def evaluate(node: ElementwiseMap, frame: Frame) -> torch.Tensor:
    """exp, log, relu, elu1 = elu + 1, the common maps (sigmoid ... abs), clamp(lo, hi), pow(p)."""
    import torch
    from torch import nn

    from ..reference import align

    assert node.operand is not None
    x = align(frame.evaluate(node.operand), node.operand.legs, node.legs)
    params = [frame.number(p) for p in node.params]
    if node.name == "exp":
        return torch.exp(x)
    if node.name == "log":
        return torch.log(x)
    if node.name == "relu":
        return torch.relu(x)
    if node.name == "elu1":
        return nn.functional.elu(x) + 1
    if node.name in _TORCH_MAPS:
        return getattr(torch, node.name)(x)
    if node.name in _FUNCTIONAL_MAPS:
        return getattr(nn.functional, node.name)(x)
    if node.name == "clamp":
        return torch.clamp(x, params[0], params[1])
    if node.name in ("maximum", "minimum"):
        return torch.clamp(x, **{"min" if node.name == "maximum" else "max": params[0]})
    if node.name == "pow":
        return x ** (int(params[0]) if params[0].is_integer() else params[0])
    raise ValueError(f"unknown elementwise map {node.name}")


@PRINT.register(ElementwiseMap)
def text(e: ElementwiseMap) -> str:
    """`exp(x)`, `clamp(x, lo, hi)`, `max(x, c)`, and a power as `x ^ p`."""
    assert e.operand is not None
    if e.name == "pow":
        return f"{wrapped(e.operand)} ^ {e.params[0]}"
    params = "".join(f", {p}" for p in e.params)
    name = {"maximum": "max", "minimum": "min"}.get(e.name, e.name)
    return f"{name}({format_expr(e.operand)}{params})"


DESCRIBE.register(ElementwiseMap)(nothing_to_describe)


@RENDER.register(ElementwiseMap)
def draw(d: Drawing, e: ElementwiseMap, env: dict[str, str], cluster: str | None) -> None:
    """A dotted cluster labelled with the map (`(·)^p` for a power) around its operand."""
    assert e.operand is not None
    label = f"(·)^{math_text(e.params[0])}" if e.name == "pow" else MAP_LABEL[e.name]
    draw_node(d, e.operand, env, d.cluster(label, "dotted", cluster))


@CHECK.register(ElementwiseMap)
def numbers(node: ElementwiseMap) -> list[tuple[str, sympy.Expr, NumberRule | None]]:
    """A power's exponent (at most 64 in size), a bound's value, and clamp's lo <= hi."""
    rule = _exponent_rule if node.name == "pow" else None
    found: list[tuple[str, sympy.Expr, NumberRule | None]] = [
        (f"the {'exponent' if rule else node.name + ' bound'}", value, rule) for value in node.params
    ]
    if node.name == "clamp" and len(node.params) == 2:
        found.append(("clamp's hi - lo =", node.params[1] - node.params[0], _order_rule("lo", "hi")))
    return found


def _exponent_rule(x: float) -> str | None:
    return None if abs(x) <= 64 else "is out of range (at most 64)"


def _order_rule(low: str, high: str) -> NumberRule:
    return lambda x: None if x >= 0 else f"is negative: {low} is greater than {high}"


@BUILD.register(ElementwiseMap, names=(*MAPS, RSQRT))
def build(builder: BoxesAndMaps, e: syn.Call, keep: set[str]) -> Expr:
    """`exp(x)`, `clamp(x, lo, hi)`, ... and `rsqrt(x)`, which is x ^ -0.5. (`max(x, c)` and
    `min(x, c)` share their words with the reductions: reduction.py builds them.)"""
    return builder.rsqrt(e, keep) if e.name == RSQRT else builder.elementwise_map(e, keep)


# Positions (graph/position_rules.py): a clamp of the index difference is zero past the query (a
# causal factor as written), exp of an operand −inf there is zero there, and a map that sends 0 to 0
# keeps its operand's zeros.
@pos.ZEROS.register(ElementwiseMap)
def zeros(node: ElementwiseMap, hidden: Hidden) -> Pairs:
    clamp = causal_clamp(node)
    if clamp is not None:
        return {clamp}
    if node.name == "exp" and node.operand is not None:
        return pos.minus_infinity(node.operand)
    if node.operand is not None and _keeps_zero(node):
        return pos.zeros(node.operand, hidden)
    return set()


@pos.HIDES.register(ElementwiseMap)
def hides(node: ElementwiseMap, query: str, key: str, diagonal: Hidden) -> bool:
    return causal_clamp(node) == (query, key)


def causal_clamp(node: ElementwiseMap) -> tuple[str, str] | None:
    """(n, m) for a factor zero wherever key m is after query n: `clamp(index(n) - index(m), 0, c)`
    (stick-breaking's strictly-earlier keys), `relu(...)` or `max(..., 0)` of that difference."""
    if node.operand is None:
        return None
    floor = {"clamp": 0, "maximum": 0}.get(node.name)
    if node.name == "relu" or (floor is not None and node.params and node.params[0] == 0):
        return _position_difference(node.operand)
    return None


def _position_difference(expr: Expr) -> tuple[str, str] | None:
    """(n, m) for `index(n) - index(m)`, plus a number of at most zero (`index(n) - index(m) - 1`)."""
    if not isinstance(expr, SumNode):
        return None
    plus, minus = [], []
    for term, sign in zip(expr.terms, expr.signs, strict=True):
        if isinstance(term, PositionIndex):
            (plus if sign > 0 else minus).append(term.leg)
        elif not (isinstance(term, Scalar) and _number(term) * sign <= 0):
            return None
    return (plus[0], minus[0]) if len(plus) == len(minus) == 1 and plus != minus else None


def _number(scalar: Scalar) -> float:
    try:
        return float(scalar.value)
    except (TypeError, ValueError):
        return 1.0  # not a number here: not taken as an offset that keeps the factor causal


def _keeps_zero(node: ElementwiseMap) -> bool:
    """Whether the map sends 0 to 0, so that an operand zero past the query stays zero there."""
    params = [sympy.sympify(p) for p in node.params]
    if node.name in ("relu", "abs", "sin", "tanh", "sqrt", "silu", "gelu"):
        return True
    if node.name == "clamp":
        return len(params) == 2 and params[0].is_nonpositive is True and params[1].is_nonnegative is True
    if node.name == "maximum":
        return len(params) == 1 and params[0].is_nonpositive is True
    if node.name == "minimum":
        return len(params) == 1 and params[0].is_nonnegative is True
    return node.name == "pow" and len(params) == 1 and params[0].is_positive is True


pos.plain(ElementwiseMap, but=(pos.ZEROS, pos.HIDES))


# ---- decoding (decode_rules.py): what the kind means to a cache

decode.plain(ElementwiseMap, but=(STATE_FACTOR,))


@STATE_FACTOR.register(ElementwiseMap)
def map_factor(parts: ProductParts, node: ElementwiseMap) -> None:
    """An integer power 1..4 of a product, as that many copies multiplied out (Based's (q·k)²);
    an exp reading the query and key legs, a decay exp(U[n] + W[m]); else a side by its legs."""
    if node.name == "pow" and isinstance(node.operand, Contraction):
        exponent = node.params[0]
        if exponent.is_Integer and 1 <= int(exponent) <= 4:
            for _ in range(int(exponent)):
                parts.multiply_out(node.operand)
            return
    if node.name == "exp" and parts.reads_both(node):
        parts.decay(node)
        return
    parts.split(node)


# lower (plan/base.LOWER): one elementwise step over its lowered operand (plan/elementwise.py)
LOWER.register(ElementwiseMap)(lower_map)
