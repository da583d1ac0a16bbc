"""Lone sums: a leg that one factor alone carries and that the leg rule sums away. Between factors
a leg absent from the result is a contraction (`Q[n h d] K[m h d]` sums d); a leg in one factor only
is a plain sum over that factor, which is what a typo gives (`V[m g ee]` for `V[m g e]`) and what
a map hides (`exp(S[h n k])` is exp(Σ_k S), easily read as Σ_k exp(S)). Both are warned of, at the
leg. `sum[k](x)`, the sum written out, says a lone sum is meant: its legs stay legs of x's maps and
boxes and are summed over x, and no warning names them."""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from .. import parse as syn
from ..errors import Diagnostic, Span, did_you_mean
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
    walk,
)
from ..ir import TensorRef as Ref
from .syntax import available_legs, syntax_nodes, syntax_text

if TYPE_CHECKING:
    from .protocols import ExpressionBuilder

# nodes that apply the leg rule at their own boundary: a sum inside them is theirs, not the map's
_BOUNDARIES = (ElementwiseMap, SoftmaxBox, Reduction, Scan, SegmentSum, Convolution, SquaredDistance)
_SHOWN = 40  # characters of a factor quoted in a message
_GUESSED = 8  # a product with more lone legs in other factors gets no guess of the leg meant


class MeantSums:
    """The legs that a `sum[...]` names, kept per factor that carries them: sums the file says
    are meant, which neither lone-sum warning reports."""

    def __init__(self) -> None:
        self._marks: dict[tuple[int, str], Expr] = {}  # the factor is kept, so its id stays its own

    def mark(self, node: Expr, legs: Iterable[str]) -> None:
        """Mark `legs` on every factor that carries them in the products `node` sums them in."""
        legs = set(legs)
        for product in _products(node):
            for leg in legs.intersection(product.summed):
                for factor in product.factors:
                    if leg in factor.legs:
                        self._marks[id(factor), leg] = factor

    def __contains__(self, key: tuple[Expr, str]) -> bool:
        factor, leg = key
        return (id(factor), leg) in self._marks


def _products(node: Expr) -> list[Contraction]:
    """The products in `node` outside any nested map, box or reduction."""
    found, stack = [], [node]
    while stack:
        here = stack.pop()
        if isinstance(here, _BOUNDARIES):
            continue
        if isinstance(here, Contraction):
            found.append(here)
        stack.extend(child for child in here.children() if child is not None)
    return found


def explicit_sum(builder: ExpressionBuilder, e: syn.Call, keep: set[str]) -> Expr:
    """`sum[k](x)`: Σ_k x, the sum the leg rule would take, written out. k stays a leg inside x
    (`sum[k](exp(S[h n k]))` is Σ_k exp(S)) and is summed over x as a whole; the sum is meant, so
    no lone-sum warning names k."""
    b = builder.b
    over = builder.legs_of(e)
    argument = builder.one_argument(e)
    if not over:
        b.error("sum needs the legs it sums", e.name_span, hint="e.g. sum[k](S[n k])")
    for option in e.options:
        b.error(
            f"sum takes no option '{option.name}'",
            option.span,
            hint="a masked sum is a product with the mask: sum[m](S[n m] causal(n, m))",
        )
    crossing = [item for item in e.legs or () if isinstance(item, syn.Leg) and item.name in keep]
    for item in crossing:
        b.error(
            f"sum over leg '{item.name}', which is also used outside the sum",
            item.span,
            hint=f"sum[{item.name}](...) sums '{item.name}' away, so it is no leg of the result or of "
            "another factor; rename one of the two",
        )
    if argument is None or not over or e.options or crossing:
        return builder.poison(e)
    operand = builder.inside(argument, keep | set(over))
    missing = [item for item in e.legs or () if isinstance(item, syn.Leg) and item.name not in operand.legs]
    available = sorted(available_legs(argument, b.tensors))
    for item in missing:
        b.error(
            f"sum over leg '{item.name}', which its argument does not have",
            item.span,
            hint=did_you_mean(item.name, available) or f"its legs are: {', '.join(available) or 'none'}",
        )
    if missing:
        return builder.poison(e)
    node = builder.restrict(operand, keep, e.span)
    b.meant_sums.mark(node, over)
    return node


def lone_sums(operand: Expr, tensors: Mapping[str, Tensor], meant: MeantSums) -> list[str]:
    """Legs that a product in `operand` (outside any nested map, box or reduction) sums over one
    factor only, masks aside, and that no `sum[...]` names: a reduction of that factor, not a
    contraction between factors."""
    found: list[str] = []
    for product in reversed(_products(operand)):
        for leg in product.summed:
            carriers = [f for f in product.factors if leg in f.legs and not _is_mask(f, tensors)]
            if len(carriers) == 1 and (carriers[0], leg) not in meant and leg not in found:
                found.append(leg)
    return found


def _is_mask(factor: Expr, tensors: Mapping[str, Tensor]) -> bool:
    if isinstance(factor, CausalFactor | WindowFactor):
        return True
    return isinstance(factor, Ref) and factor.name in tensors and tensors[factor.name].kind == "mask"


def map_sum_warning(call: syn.Call | syn.BinOp, argument: syn.Expr, legs: list[str]) -> Diagnostic:
    """The warning for `call` (a map, reduction or power) whose `argument` sums `legs` that one
    factor carries: what it computes, and both readings written with `sum[...]`."""
    sigma = _sigma(legs)
    summed = _summed_text(argument, legs)
    meant = _summed_text(argument, legs, _sum_call)
    if isinstance(call, syn.BinOp):  # a power: (Σ_k x) ^ p
        exponent = syntax_text(call.right)
        where, computes = "the power", f"({summed}) ^ {exponent}"
        written = f"{meant if _is_one_sum(argument) else f'({meant})'} ^ {exponent}"
    else:
        where, computes = call.name, _with_argument(call, argument, summed)
        written = _with_argument(call, argument, meant)
    text = syntax_text(call)
    return Diagnostic(
        f"{text} sums {' and '.join(legs)} inside {where}: it computes {computes}",
        _leg_spans(argument, set(legs)) or (argument.span,),
        f"to sum the values instead, {sigma} {_operand(call)}, write {_sum_call(legs, call)}; "
        f"if the sum inside {where} is meant, write it out: {written}",
        severity="warning",
    )


def _with_argument(call: syn.Call, argument: syn.Expr, text: str) -> str:
    placeholder = syn.Name(argument.span, text)
    return syntax_text(dataclasses.replace(call, args=(placeholder, *call.args[1:])))


def _is_one_sum(argument: syn.Expr) -> bool:
    """Whether the sum goes around the whole argument (not into the terms of a sum or a quotient)."""
    return not (isinstance(argument, syn.BinOp) and argument.op in "+-/")


def _sum_call(legs: list[str], e: syn.Expr) -> str:
    return f"sum[{' '.join(legs)}]({syntax_text(e)})"


def _sigma_of(legs: list[str], e: syn.Expr) -> str:
    return f"{_sigma(legs)} {_operand(e)}"


def _sigma(legs: list[str]) -> str:
    return "Σ_" + (legs[0] if len(legs) == 1 else "(" + " ".join(legs) + ")")


def _summed_text(e: syn.Expr, legs: list[str], sum_of: Callable[[list[str], syn.Expr], str] = _sigma_of) -> str:
    """`e` with a sum (`sum_of`: Σ, or `sum[...]`) where the leg rule sums `legs`: within each term
    of a sum that has them, within the side of a quotient that alone has them, else around the
    whole expression."""
    here = [leg for leg in legs if leg in _written_legs(e)]
    if not here:
        return syntax_text(e)
    if isinstance(e, syn.BinOp) and e.op in "+-":
        right = _summed_text(e.right, here, sum_of)
        left = _summed_text(e.left, here, sum_of)
        return f"{left} {e.op} {f'({right})' if e.op == '-' and right.startswith('Σ') else right}"
    if isinstance(e, syn.BinOp) and e.op == "/":
        numerator, denominator = _written_legs(e.left), _written_legs(e.right)
        if numerator and denominator and not any(leg in numerator and leg in denominator for leg in here):
            sides = [_summed_text(side, here, sum_of) for side in (e.left, e.right)]
            return " / ".join(
                f"({t})" if t.startswith("Σ") or isinstance(side, syn.BinOp) else t
                for t, side in zip(sides, (e.left, e.right), strict=True)
            )
    return sum_of(here, e)


def _written_legs(e: syn.Expr) -> set[str]:
    """Legs written in `e`'s tensor uses and index(...) calls."""
    found = set()
    for node in syntax_nodes(e):
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
    text = syntax_text(e)
    return text if isinstance(e, syn.Indexed | syn.Call | syn.Name) else f"({text})"


def _leg_spans(argument: syn.Expr, legs: set[str]) -> tuple[Span, ...]:
    """Where the argument writes the summed legs, in file order (the carets)."""
    spans = []
    for node in syntax_nodes(argument):
        for item in node.legs if isinstance(node, syn.Indexed) else ():
            for leg in _item_legs(item):
                if leg.name in legs:
                    spans.append(leg.span)
    return tuple(sorted(spans, key=lambda s: (s.line, s.column)))


# ---- a leg in one factor of a statement's product --------------------------------------------


@dataclasses.dataclass(frozen=True)
class _LoneLeg:
    leg: str
    factor: Expr
    product: Contraction


def lone_leg_warnings(
    expr: Expr, written: syn.Expr, result: Iterable[str], meant: MeantSums, warned: set[Span]
) -> list[Diagnostic]:
    """A warning for each leg that a product anywhere in statement `expr` (`written` as its syntax)
    sums over the one factor that carries it (a mask or `causal` counts as a factor here: the leg
    joins it to the other), unless a `sum[...]` names it or a map's warning has that leg already
    (`warned`). A typo (`V[m g ee]` for `e`) is such a leg, so the hint guesses the leg meant."""
    lone = [
        _LoneLeg(leg, carriers[0], product)
        for product in (node for node in walk(expr) if isinstance(node, Contraction))
        for leg in product.summed
        if len(carriers := [f for f in product.factors if leg in f.legs]) == 1 and (carriers[0], leg) not in meant
    ]
    if not lone:
        return []
    uses = _LegUses(written)
    others = sorted({*result, *(leg for node in walk(expr) for leg in node.legs)})
    found: list[Diagnostic] = []
    for item in lone:
        span = uses.first_within(item.leg, item.factor.span)
        if span in warned:
            continue
        warned.add(span)  # type: ignore[arg-type]
        guess = _meant_leg(item, lone, others)
        factor = uses.text(item.factor)
        found.append(
            Diagnostic(
                f"leg '{item.leg}' occurs only in {_factor_name(item.factor, factor)} and is summed away"
                + (f"; did you mean '{guess}'?" if guess else ""),
                (span or item.factor.span,),
                f"a leg that one factor alone carries is summed over that factor; if that is meant, "
                f"write sum[{item.leg}]({factor or '...'})",
                severity="warning",
            )
        )
    return found


def _meant_leg(item: _LoneLeg, lone: list[_LoneLeg], others: list[str]) -> str | None:
    """The leg a lone leg was likely meant to be: a close name among the legs lone in another
    factor of the same product (the other end of the intended edge), the only such leg, or a close
    name among the statement's other legs."""
    across = sorted({o.leg for o in lone if o.product is item.product and o.factor is not item.factor} - {item.leg})
    if len(across) > _GUESSED:
        return None  # many lone legs in one product are sums, not a typo's pair
    hint = did_you_mean(item.leg, across) or did_you_mean(item.leg, others)
    if hint is None and len(across) == 1:
        return across[0]
    return hint.split("'")[1] if hint else None


def _factor_name(factor: Expr, text: str | None) -> str:
    if isinstance(factor, Ref) and factor.name:
        return factor.name
    if text is None:
        return "one factor"
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


class _LegUses:
    """Where a statement's syntax writes each leg (tensor uses, reshapes, slices, positions, the
    legs of index, causal and window, a call's legs in brackets), sorted, so the leg that a factor
    carries is found by its name and the factor's span."""

    def __init__(self, written: syn.Expr):
        self._nodes = list(syntax_nodes(written))
        spans: dict[str, list[tuple[int, int, Span]]] = {}
        for name, span in _leg_uses(self._nodes):
            spans.setdefault(name, []).append((span.line, span.column, span))
        self._spans = {name: sorted(found, key=lambda t: t[:2]) for name, found in spans.items()}
        self._by_span: dict[Span, syn.Expr] = {}
        for node in self._nodes:
            self._by_span.setdefault(node.span, node)

    def first_within(self, leg: str, where: Span) -> Span | None:
        found = self._spans.get(leg, [])
        k = bisect.bisect_left(found, (where.line, where.column), key=lambda t: t[:2])
        if k < len(found):
            span = found[k][2]
            if (span.file == where.file) and (span.end_line, span.end_column) <= (where.end_line, where.end_column):
                return span
        return None

    def text(self, factor: Expr) -> str | None:
        node = self._by_span.get(factor.span)
        return syntax_text(node) if node is not None else None


def _leg_uses(nodes: Iterable[syn.Expr]) -> Iterable[tuple[str, Span]]:
    for node in nodes:
        if isinstance(node, syn.Name):
            yield node.name, node.span
        elif isinstance(node, syn.Indexed | syn.Call):
            for item in node.legs or ():
                for leg in _item_legs(item):
                    yield leg.name, leg.span
