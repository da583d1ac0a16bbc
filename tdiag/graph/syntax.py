"""Helpers on syntax that the builders share: walking a syntax expression (its nodes, the tensors it
names, the legs it could expose before the leg rule), reading juxtaposition, products, sums and
calls the way the diagram does, the bounds of a position, cycles in definitions, and where in the
files a name was bound. Pure functions; no diagnostics."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import networkx as nx

from .. import parse as syn
from ..errors import Span
from ..ir import Position, Tensor
from .vocabulary import (
    BOUNDS,
    CONVOLUTIONS,
    FUNCTIONS,
    MASK_FACTORS,
    PAIRINGS,
    POSITION_FUNCTIONS,
    REDUCTIONS,
    SCALAR_FUNCTIONS,
    SUMS,
)


def place(tensor: str, span: Span, relative_to: Span) -> str:
    """`WQ (line 4)`, naming the file too when it is not the one being reported on."""
    return f"{tensor} ({place_line(span, relative_to)})"


def place_line(span: Span, relative_to: Span) -> str:
    return f"line {span.line}" if span.file == relative_to.file else f"{Path(span.file).name}, line {span.line}"


def syntax_cycles(deps: nx.DiGraph, order: list[str]) -> list[list[str]]:
    """One cycle per strongly connected component, each starting at its first name in the file,
    in file order, so the report is the same on every run."""
    position = {name: k for k, name in enumerate(order)}
    found = []
    for component in nx.strongly_connected_components(deps):
        first = min(component, key=lambda n: position.get(n, len(order)))
        if len(component) == 1 and not deps.has_edge(first, first):
            continue
        cycle = nx.find_cycle(deps.subgraph(component), source=first)
        found.append([u for u, _ in cycle])
    return sorted(found, key=lambda c: position.get(c[0], len(order)))


def call_parts(e: syn.Expr):
    """An initializer written `ones` or `normal(std = 0.1)` -> (name, args, keywords, span)."""
    if isinstance(e, syn.Name):
        return e.name, (), (), e.span
    if isinstance(e, syn.Call) and e.legs is None:
        return e.name, e.args, e.keywords, e.name_span
    return None, (), (), e.span


def leg_names(item: syn.Leg | syn.LegGroup) -> tuple[str, ...]:
    return tuple(leg.name for leg in item.legs) if isinstance(item, syn.LegGroup) else (item.name,)


def group_name(group: tuple[str, ...]) -> str:
    return group[0] if len(group) == 1 else "(" + " ".join(group) + ")"


def product_op(e: syn.Expr, tensors: Mapping[str, Tensor]) -> bool:
    """Juxtaposition, `*`, negation and division by a scalar all make an Einstein product."""
    if isinstance(e, syn.Neg):
        return True
    if isinstance(e, syn.BinOp) and e.op == "/":
        return is_scalar_syntax(e.right, tensors)
    return isinstance(e, syn.BinOp) and (e.op in ("juxt", "*"))


def flatten_sum(e: syn.Expr, sign: int = 1) -> tuple[list[syn.Expr], list[int]]:
    if isinstance(e, syn.BinOp) and e.op in "+-":
        left, ls = flatten_sum(e.left, sign)
        right, rs = flatten_sum(e.right, sign if e.op == "+" else -sign)
        return left + right, ls + rs
    return [e], [sign]


def is_scalar_syntax(e: syn.Expr, tensors: Mapping[str, Tensor]) -> bool:
    """Numbers, sizes and sqrt/arithmetic/max/min of them: things that carry no legs."""
    if isinstance(e, syn.Number):
        return True
    if isinstance(e, syn.Name):
        return e.name not in tensors and e.name not in FUNCTIONS
    if isinstance(e, syn.Neg):
        return is_scalar_syntax(e.operand, tensors)
    if isinstance(e, syn.BinOp):
        return is_scalar_syntax(e.left, tensors) and is_scalar_syntax(e.right, tensors)
    if isinstance(e, syn.Call) and e.name in BOUNDS:
        scalars = all(is_scalar_syntax(a, tensors) for a in e.args)
        return e.legs is None and not e.options and len(e.args) == 2 and scalars
    if isinstance(e, syn.Call):
        return e.name in SCALAR_FUNCTIONS and e.legs is None and all(is_scalar_syntax(a, tensors) for a in e.args)
    return False


def call_as_product(e: syn.Expr, tensors: Mapping[str, Tensor]) -> syn.Expr:
    """`P[k h] (A + B)` reads as a call; when P is a tensor it is the product P[k h] * (A + B),
    and `P[k h] (A + B) ^ p` is P[k h] * (A + B) ^ p: the power binds to the parentheses, as
    it would after `*`."""
    if isinstance(e, syn.BinOp) and e.op == "^":
        product = call_as_product(e.left, tensors)
        if product is not e.left and isinstance(product, syn.BinOp):
            first, last = product.right.span, e.right.span
            span = Span(first.file, first.line, first.column, last.end_line, last.end_column)
            power = syn.BinOp(span, "^", product.right, e.right)
            return syn.BinOp(e.span, "juxt", product.left, power)
        return e
    if not (isinstance(e, syn.Call) and e.name in tensors and e.legs is not None):
        return e
    if e.options or e.keywords or len(e.args) != 1:
        return e
    tensor = syn.Indexed(e.name_span, e.name, e.name_span, e.legs, ())
    return syn.BinOp(e.span, "juxt", tensor, e.args[0])


def available_legs(e: syn.Expr, tensors: Mapping[str, Tensor]) -> set[str]:
    """Legs a sub-expression could expose to its surroundings (before the leg rule)."""
    e = call_as_product(e, tensors)
    if isinstance(e, syn.Indexed):
        legs = {leg for item in e.legs for leg in leg_names(item)}
        return legs | {n for o in e.options for n in _position_names(o.value, tensors)}
    if isinstance(e, syn.Neg):
        return available_legs(e.operand, tensors)
    if isinstance(e, syn.BinOp):
        if e.op == "^":
            return available_legs(e.left, tensors)
        return available_legs(e.left, tensors) | available_legs(e.right, tensors)
    if isinstance(e, syn.Call) and e.name in MASK_FACTORS:
        return {a.name for a in e.args if isinstance(a, syn.Name)}
    if isinstance(e, syn.Call) and e.name in POSITION_FUNCTIONS:
        return {a.name for a in e.args[:1] if isinstance(a, syn.Name)}
    if isinstance(e, syn.Call) and e.name in CONVOLUTIONS:  # the kernel's offset legs are summed inside
        return available_legs(e.args[0], tensors) if e.args else set()
    if isinstance(e, syn.Call):
        inner = set().union(*(available_legs(a, tensors) for a in e.args)) if e.args else set()
        over = {leg for item in e.legs or () for leg in leg_names(item)}
        if e.name in REDUCTIONS or e.name in SUMS or e.name in PAIRINGS:
            return inner - over
        if e.name in SCALAR_FUNCTIONS and is_scalar_syntax(e, tensors):
            return set()
        return inner
    return set()


def _position_names(e: syn.Expr, tensors: Mapping[str, Tensor]) -> set[str]:
    """Names in a position expression that may be legs (sizes among them stand for no leg)."""
    if isinstance(e, syn.Name):
        return set() if e.name in tensors or e.name in FUNCTIONS else {e.name}
    if isinstance(e, syn.Neg):
        return _position_names(e.operand, tensors)
    if isinstance(e, syn.BinOp):
        return _position_names(e.left, tensors) | _position_names(e.right, tensors)
    if isinstance(e, syn.Call):
        return set().union(*(_position_names(a, tensors) for a in e.args)) if e.args else set()
    return set()


class UnboundedError(ValueError):
    """A position whose range interval arithmetic cannot bound (a log of a value that may be 0
    or negative, a quotient by a value that may be 0); args: the message (which part), a hint."""


_REAL_SLACK = 2.0**-20  # relative: covers float32 rounding (2^-24 an op) of a position's real part


def position_bounds(position: Position, leg_max, number) -> tuple[float, float]:
    """The smallest and largest value of a position over its legs' ranges 0 .. leg_max(leg):
    interval arithmetic, sound for every op (min, max, abs, floor are monotone or piecewise so);
    a real part (a quotient, a log) is widened by a relative 2^-20 each op before it is floored,
    so float32 rounding never takes a value outside, while an exact 0 stays 0 (log(1) = 0).
    Raises UnboundedError where the value is undefined somewhere in the range."""
    if position.op == "leg":
        return 0.0, leg_max(position.name)
    if position.op == "number":
        value = number(position.value)
        return (value, value) if not math.isinf(value) else (-math.inf, math.inf)
    parts = [position_bounds(o, leg_max, number) for o in position.operands]
    if position.op == "neg":
        return -parts[0][1], -parts[0][0]
    if position.op == "+":
        return _real(position, [(x + y, x, y) for x, y in zip(parts[0], parts[1], strict=True)])
    if position.op == "-":
        return _real(position, [(x - y, x, y) for x, y in zip(parts[0], parts[1][::-1], strict=True)])
    if position.op == "*":
        products = [(x * y, x, y) for x in parts[0] for y in parts[1] if not (x == 0 or y == 0)] or [(0.0,)]
        products += [(0.0,)] if any(v == 0 for v in (*parts[0], *parts[1])) else []
        return _real(position, products)
    if position.op == "/":
        (low, high), (lo, hi) = parts
        if lo <= 0 <= hi:
            raise UnboundedError(
                f"the divisor {position.operands[1]} may be 0 (it ranges over {_shown(lo)} .. {_shown(hi)})",
                f"divide by a number or size, or keep the divisor positive: max({position.operands[1]}, 1)",
            )
        quotients = [(_quotient(x, y), x, y) for x in (low, high) for y in (lo, hi)]
        if any(math.isnan(q[0]) for q in quotients):
            return -math.inf, math.inf
        return _real(position, quotients)
    if position.op == "log":
        low, high = parts[0]
        if low <= 0:
            raise UnboundedError(
                f"log's argument {position.operands[0]} may be 0 or negative "
                f"(it ranges over {_shown(low)} .. {_shown(high)})",
                f"keep it positive, e.g. log(max({position.operands[0]}, 1))",
            )
        return _real(position, [(math.log(low), low), (math.log(high) if not math.isinf(high) else math.inf, high)])
    if position.op == "floor":
        return tuple(v if math.isinf(v) else float(math.floor(v)) for v in parts[0])  # type: ignore[return-value]
    if position.op == "abs":
        low, high = parts[0]
        if low >= 0:
            return low, high
        if high <= 0:
            return -high, -low
        return 0.0, max(-low, high)
    if position.op == "min":
        return min(parts[0][0], parts[1][0]), min(parts[0][1], parts[1][1])
    if position.op == "max":
        return max(parts[0][0], parts[1][0]), max(parts[0][1], parts[1][1])
    (low, high), (lo, _), (_, hi) = parts
    return min(max(low, lo), hi), min(max(high, lo), hi)


def _real(position: Position, corners: list[tuple[float, ...]]) -> tuple[float, float]:
    """The bounds of a node from its corner values (value, then the operand values it is made
    of). A real node's corners are widened outward by the float32 slack, except a whole corner
    made of whole operands below 2^24: float32 computes those exactly (8 / 8, log(1) = 0; a
    quotient of such numbers that double rounds to a whole number is one). Whole nodes are exact."""
    if not position.is_real():
        return min(c[0] for c in corners), max(c[0] for c in corners)
    low, high = math.inf, -math.inf
    for value, *operands in corners:
        exact = all(_small_whole(v) for v in (value, *operands))
        slack = 0.0 if exact or math.isinf(value) else abs(value) * _REAL_SLACK
        low, high = min(low, value - slack), max(high, value + slack)
    return low, high


def _small_whole(value: float) -> bool:
    return not math.isinf(value) and value == int(value) and abs(value) < 2**24


def _quotient(a: float, b: float) -> float:
    if math.isinf(a) and math.isinf(b):
        return math.nan
    return 0.0 if math.isinf(b) else a / b


def _shown(value: float) -> str:
    if math.isinf(value):
        return "-inf" if value < 0 else "+inf"
    return str(int(value)) if value == int(value) else f"{value:.6g}"


def syntax_nodes(e: syn.Expr) -> Iterator[syn.Expr]:
    """Every node of a syntax expression (iteratively: nesting is bounded by the parser)."""
    stack = [e]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, syn.Neg):
            stack.append(node.operand)
        elif isinstance(node, syn.BinOp):
            stack += [node.left, node.right]
        elif isinstance(node, syn.Call):
            stack += [*node.args, *(k.value for k in node.keywords), *(o.value for o in node.options)]
        elif isinstance(node, syn.Indexed):
            stack += [o.value for o in node.options]


def tensor_names(e: syn.Expr) -> Iterator[str]:
    if isinstance(e, syn.Indexed):
        yield e.name
    elif isinstance(e, syn.Neg):
        yield from tensor_names(e.operand)
    elif isinstance(e, syn.BinOp):
        yield from tensor_names(e.left)
        yield from tensor_names(e.right)
    elif isinstance(e, syn.Call):
        if e.name not in FUNCTIONS:
            yield e.name
        for a in e.args:
            yield from tensor_names(a)
        for o in e.options:
            yield from tensor_names(o.value)


def statement_targets(items: list[syn.Item]) -> list[str]:
    return [i.target.name for i in items if isinstance(i, syn.Statement)]


def ordered_union(leg_lists: Iterable[Iterable[str]]) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for legs in leg_lists:
        for leg in legs:
            seen.setdefault(leg, None)
    return tuple(seen)


_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2, "juxt": 2, "^": 4}


def syntax_text(e: syn.Expr) -> str:
    """A syntax expression written back as `.td` text (spacing normalized, parentheses only
    where precedence needs them), to quote the user's construct in a message."""
    if isinstance(e, syn.Number):
        return str(e.value)
    if isinstance(e, syn.Name):
        return e.name
    if isinstance(e, syn.Neg):
        return "-" + _operand_text(e.operand, 3)
    if isinstance(e, syn.Indexed):
        return f"{e.name}[{_items_text(e.items or (*e.legs, *e.options))}]"
    if isinstance(e, syn.Call):
        bracket = "" if e.legs is None else f"[{_items_text((*e.legs, *e.options))}]"
        args = [syntax_text(a) for a in e.args] + [f"{k.name} = {syntax_text(k.value)}" for k in e.keywords]
        return f"{e.name}{bracket}({', '.join(args)})"
    precedence = _PRECEDENCE[e.op]
    left = _operand_text(e.left, precedence + (e.op == "^"))
    right = _operand_text(e.right, precedence + (e.op in "-/"))
    return f"{left} {right}" if e.op == "juxt" else f"{left} {e.op} {right}"


def _operand_text(e: syn.Expr, least: int) -> str:
    """An operand, parenthesized when it binds less tightly than `least`."""
    text = syntax_text(e)
    if (isinstance(e, syn.BinOp) and _PRECEDENCE[e.op] < least) or (isinstance(e, syn.Neg) and least > 3):
        return f"({text})"
    return text


def _items_text(items: Iterable[syn.Leg | syn.LegGroup | syn.Option]) -> str:
    parts = []
    for item in items:
        if isinstance(item, syn.LegGroup):
            parts.append("(" + " ".join(leg.name for leg in item.legs) + ")")
        elif isinstance(item, syn.SlicedLeg) and item.start is not None:
            parts.append(f"{item.name}: {syntax_text(item.start)}..{syntax_text(item.size)}")
        elif isinstance(item, syn.SlicedLeg):
            parts.append(f"{item.name}: {syntax_text(item.size)}")
        elif isinstance(item, syn.Option):
            parts.append(f"{item.name} = {syntax_text(item.value)}")
        else:
            parts.append(item.name)
    separator = ", " if any(isinstance(i, syn.Option | syn.SlicedLeg) for i in items) else " "
    return separator.join(parts)
