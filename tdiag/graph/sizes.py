"""Sizes: the sympy symbol of a size, the table of sizes that remembers their dependency order, and
the two operations every later stage uses on it, expanding a derived size into base sizes (D = F /
H) and evaluating every size known before any input. The builder binds every leg to one of these
symbols."""

from __future__ import annotations

from collections.abc import Mapping

import sympy

from ..ir import Size
from .vocabulary import POISON_SIZE


def size_symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, positive=True)


class SizeTable(dict[str, Size]):
    """Sizes by name that remember, until one is set again, the order in which they depend on
    each other and each derived size in base sizes only: expanding or evaluating a size is then
    one substitution, and a file of 10,000 sizes checks in linear time."""

    _order: list[str] | None = None
    _expansion: dict[sympy.Symbol, sympy.Expr] | None = None

    def __setitem__(self, name: str, size: Size) -> None:
        self._order = self._expansion = None
        super().__setitem__(name, size)

    def order(self) -> list[str]:
        """Names, each after the sizes its definition uses (Kahn's algorithm; sizes in a cycle,
        which the builder reports, are left out)."""
        if self._order is None:
            users: dict[str, list[str]] = {name: [] for name in self}
            waiting = {}
            for name, size in self.items():
                used = (
                    {str(s) for s in size.definition.free_symbols} & self.keys()
                    if size.definition is not None
                    else set()
                )
                waiting[name] = len(used)
                for other in used:
                    users[other].append(name)
            ready = [name for name, count in waiting.items() if count == 0]
            order = []
            while ready:
                name = ready.pop()
                order.append(name)
                for user in users[name]:
                    waiting[user] -= 1
                    if waiting[user] == 0:
                        ready.append(user)
            self._order = order
        return self._order

    def expansion(self) -> dict[sympy.Symbol, sympy.Expr]:
        """Each size defined by other sizes -> its definition in sizes with no such definition."""
        if self._expansion is None:
            expansion: dict[sympy.Symbol, sympy.Expr] = {}
            for name in self.order():
                definition = self[name].definition
                if definition is not None and definition.free_symbols:
                    expansion[self[name].symbol] = definition.xreplace(expansion)
            self._expansion = expansion
        return self._expansion


def _table(sizes: Mapping[str, Size]) -> SizeTable:
    return sizes if isinstance(sizes, SizeTable) else SizeTable(sizes)


def expand_sizes(expr: sympy.Expr, sizes: Mapping[str, Size]) -> sympy.Expr:
    """Substitute derived sizes (D = F / H) until only base sizes remain."""
    return sympy.sympify(expr).xreplace(_table(sizes).expansion())


def size_values(sizes: Mapping[str, Size]) -> dict[str, int]:
    """Numbers for every size that does not depend on a run-time size, in one pass in dependency order."""
    table = _table(sizes)
    numbers: dict[sympy.Symbol, sympy.Expr] = {}
    values: dict[str, int] = {}
    for name in table.order():
        definition = table[name].definition
        if definition is None:
            continue
        value = definition.xreplace(numbers)
        if value.has(sympy.Float):
            value = sympy.nsimplify(value)
        if value.is_number:
            numbers[table[name].symbol] = value
            values[name] = value  # type: ignore[assignment]
    return {name: values[name] for name in table if name in values}


def same_size(a: sympy.Expr, b: sympy.Expr, sizes: Mapping[str, Size]) -> bool:
    if POISON_SIZE in a.free_symbols | b.free_symbols:
        return True
    return sympy.simplify(expand_sizes(a, sizes) - expand_sizes(b, sizes)) == 0


def number_text(value: sympy.Expr) -> str:
    if value.is_Rational and not value.is_integer:  # type: ignore[attr-defined]
        return f"{value} = {float(value):.4g}"
    return str(value)
