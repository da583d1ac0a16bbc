"""The time model as a formula: a plan's estimated training-step time (timing.py) in the sizes.

The time model compares numbers (a thin matmul, a measured factor that depends on the bytes an op
moves), so it is run once over `Priced` numbers: each carries its value at the planned sizes and
its formula, arithmetic builds both, comparisons read the values. The result is the model's own
estimate, equal to `plan_time` at those sizes; its formula keeps each op's roofline as a Max of
its FLOPs and its bytes, and takes the model's other branches and measured factors as they are at
the planned sizes. The space report's time column and formula come from here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sympy

from ..device import DeviceModel
from .footprint import footprint
from .program import BATCH_SIZE, Plan
from .timing import op_time


@dataclass(frozen=True, eq=False)
class Priced:
    """A number of the time model (module docstring): its value at the planned sizes and its
    formula in the sizes."""

    value: float
    formula: sympy.Expr

    def larger(self, other: Priced | float) -> Priced:
        """max(self, other) whose formula is a Max of both (a roofline's two bounds)."""
        other = _priced(other)
        return Priced(max(self.value, other.value), sympy.Max(self.formula, other.formula, evaluate=False))

    def __add__(self, other: Priced | float) -> Priced:
        other = _priced(other)
        return Priced(self.value + other.value, self.formula + other.formula)

    __radd__ = __add__

    def __sub__(self, other: Priced | float) -> Priced:
        other = _priced(other)
        return Priced(self.value - other.value, self.formula - other.formula)

    def __rsub__(self, other: Priced | float) -> Priced:
        return _priced(other) - self

    def __mul__(self, other: Priced | float) -> Priced:
        other = _priced(other)
        return Priced(self.value * other.value, self.formula * other.formula)

    __rmul__ = __mul__

    def __truediv__(self, other: Priced | float) -> Priced:
        other = _priced(other)
        return Priced(self.value / other.value, self.formula / other.formula)

    def __rtruediv__(self, other: Priced | float) -> Priced:
        return _priced(other) / self

    def __neg__(self) -> Priced:
        return Priced(-self.value, -self.formula)

    def __float__(self) -> float:
        return float(self.value)

    def __bool__(self) -> bool:
        return bool(self.value)

    def __lt__(self, other: Priced | float) -> bool:
        return self.value < float(other)

    def __le__(self, other: Priced | float) -> bool:
        return self.value <= float(other)

    def __gt__(self, other: Priced | float) -> bool:
        return self.value > float(other)

    def __ge__(self, other: Priced | float) -> bool:
        return self.value >= float(other)


def _priced(x: Priced | float) -> Priced:
    """A plain number as a priced one; a whole number stays exact, so a factor of 1 leaves no 1.0 in
    the formula."""
    if isinstance(x, Priced):
        return x
    value = float(x)
    return Priced(value, sympy.Integer(int(value)) if value.is_integer() else sympy.Float(value))


def priced_plan_time(
    plan: Plan,
    device: DeviceModel,
    formula: Callable[[sympy.Expr], sympy.Expr] | None = None,
    **sizes: int,
) -> Priced:
    """The time model's seconds of a training step of `plan` at its planned sizes (or `sizes`, B
    included) with their formula; `formula` rewrites each op's formulas before they are priced
    (the space report substitutes a point's chosen sizes and B = 1)."""
    at = plan.sizes | sizes
    graph = plan.graph
    batch = at.get("B", 1)

    def number(expr: sympy.Expr) -> Priced:
        expr = sympy.sympify(expr)
        value = graph.evaluate(expr, **{k: v for k, v in at.items() if k in graph.sizes})
        expanded = graph.expand(expr).xreplace({BATCH_SIZE: batch})
        return Priced(float(value.xreplace({BATCH_SIZE: batch})), formula(expanded) if formula else expanded)

    records = footprint(plan).steps
    total = Priced(0.0, sympy.Integer(0))
    for step, record in zip([*plan.steps, *plan.update_steps], records, strict=True):
        total = total + op_time(device, step, record, number)
    return total
