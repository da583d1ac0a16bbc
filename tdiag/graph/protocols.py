"""What the parts of the design builder see of each other, as protocols: the file's builder
(builder.py `DesignBuilder`: its tables of sizes, legs and tensors, its diagnostics, binding a
leg, reading a size) and one statement's expression builder (expressions.py `ExprBuilder`: the
leg rule, stand-ins for mistakes). The construct parts (products.py, positions.py, calls.py,
lone_sums.py, the build rules in tdiag/constructs) are typed against these, never against the
classes, so that no part imports the builder that assembles it."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import sympy

    from .. import parse as syn
    from ..errors import Diagnostic, Span
    from ..ir import Expr, Leg, Tensor
    from .sizes import SizeTable


class SumMarks(Protocol):
    """The legs a `sum[...]` names, per factor (lone_sums.py `MeantSums`)."""

    def mark(self, node: Expr, legs: Iterable[str]) -> None: ...

    def __contains__(self, key: tuple[Expr, str]) -> bool: ...


class GraphBuilder(Protocol):
    """The file's builder, as the parts that build one statement use it."""

    items: list[syn.Item]
    diagnostics: list[Diagnostic]
    sizes: SizeTable
    legs: dict[str, Leg]
    tensors: dict[str, Tensor]
    runtime_sizes: set[sympy.Symbol]
    meant_sums: SumMarks
    lone_sum_spans: set[Span]

    def error(self, message: str, *spans: Span, hint: str | None = None) -> None: ...

    def warn(self, message: str, *spans: Span, hint: str | None = None) -> None: ...

    def find_leg(self, leg: str) -> bool: ...

    def bind_leg(self, leg: str, size: sympy.Expr, span: Span, where: str) -> None: ...

    def scalar_of(self, e: syn.Expr, *, sizes_only: bool = False, known: Collection[str] = ()) -> sympy.Expr: ...


class ExpressionBuilder(Protocol):
    """One statement's expression builder, as its parts and the build rules use it."""

    b: GraphBuilder
    gathered: list[tuple[str, Span]]

    def poison(self, e: syn.Expr) -> Expr: ...

    def inside(self, e: syn.Expr, keep: set[str]) -> Expr: ...

    def restrict(self, node: Expr, keep: set[str], span: Span) -> Expr: ...

    def legs_of(self, e: syn.Call) -> tuple[str, ...]: ...

    def one_argument(self, e: syn.Call) -> syn.Expr | None: ...

    def wrong_axis_count(self, e: syn.Indexed, tensor: Tensor, used: str) -> Expr: ...
