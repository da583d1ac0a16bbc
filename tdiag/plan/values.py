"""Values of the lowered program and how an op reads them. A Value is a tensor of the forward
whose `legs` are its axes in memory order (BATCH first when it carries the batch); an Operand
reads a value permuted, regrouped and broadcast, all views; a Binary tree adds or divides aligned
operands. Everything above the program IR (ops, steps, the footprint, codegen) names tensors
through these."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import sympy

BATCH = "#b"
BATCH_SIZE = sympy.Symbol("B", positive=True)


@dataclass(frozen=True)
class Value:
    """A tensor of the forward: a variable whose axes are `legs`. `broadcast` legs are logical
    legs the value is constant along and so does not store."""

    var: str
    legs: tuple[str, ...]
    broadcast: frozenset[str] = frozenset()

    @property
    def is_batched(self) -> bool:
        return BATCH in self.legs


def show_legs(legs: Iterable[str]) -> list[str]:
    """Legs as the user wrote them: the batch is b, a renamed copy d'3 is shown as d."""
    return ["b" if leg == BATCH else leg.split("'")[0] for leg in legs]


@dataclass(frozen=True)
class Operand:
    """How an op reads `value`: axes permuted, then regrouped to `shape`, then unit axes
    inserted where `index` is False so that it broadcasts; `invert` negates a boolean mask."""

    value: Value
    permutation: tuple[int, ...] | None = None
    shape: tuple[sympy.Expr, ...] | None = None
    index: tuple[bool, ...] | None = None
    invert: bool = False


def align(value: Value, target: tuple[str, ...], invert: bool = False) -> Operand:
    """Read `value` so it broadcasts against axes `target` (permuted, unit axes inserted)."""
    legs = value.legs
    present = [leg for leg in target if leg in legs]
    permutation = None
    if list(legs) != present:
        permutation = tuple(legs.index(leg) for leg in present)
    if present == list(target):
        return Operand(value, permutation, invert=invert)
    return Operand(value, permutation, index=tuple(leg in legs for leg in target), invert=invert)


def read_groups(value: Value, groups: list[list[str]], group_size: Callable[[list[str]], sympy.Expr]) -> Operand:
    """`value` permuted to the legs of `groups` in order, one axis per group (of size
    `group_size(group)`); an empty group is a unit axis inserted by indexing."""
    order = [leg for g in groups for leg in g]
    permutation = None
    if list(value.legs) != order:
        permutation = tuple(value.legs.index(leg) for leg in order)
    kept = [g for g in groups if g]
    index = tuple(bool(g) for g in groups) if len(kept) < len(groups) else None
    if all(len(g) == 1 for g in kept):
        return Operand(value, permutation, index=index)
    return Operand(value, permutation, tuple(group_size(g) for g in kept), index)


@dataclass(frozen=True)
class Binary:
    """An elementwise `left op right` of aligned operands (a node of a sum or quotient tree)."""

    op: str  # "+", "-" or "/"
    left: Binary | Operand
    right: Binary | Operand


def operands(tree: Binary | Operand) -> Iterator[Operand]:
    """The leaves of a sum or quotient tree, left to right."""
    if isinstance(tree, Operand):
        yield tree
    else:
        yield from operands(tree.left)
        yield from operands(tree.right)
