"""Decoding's rule tables, keyed on the expression kind (tdiag/rules.py): what each kind means to
a decoding cache, filled in by the construct modules (tdiag/constructs), so that decode_rows.py,
decode_products.py and decode_graphs.py dispatch by one lookup and a new kind needs no edit there.

- KV_ROWS: why a kind cannot be computed from cached rows (a "kv" cache), or None;
- STATE_ROWS: why a kind cannot be evaluated at the new rows alone (a "state" cache), or None;
- INNER_LEGS: the legs a node names besides its own (the legs a product sums, a reduction's);
- STATE_WHAT: the node as a refusal names it ("softmax over m");
- STATE_FACTOR: how a factor takes part in a causal product (query side, key side, decay, the
  causal factor itself, or multiplied out);
- DECAY_TERM: how a term of a decay's exponent splits (query side, key side, a running sum);
- STATE_STATEMENT: the rewrite a statement of this kind takes before causal products are found
  (a causal normalize box into its linear order), or None;
- STEP_REWRITE: the node in a step program of a "kv" cache (position masks as mask inputs,
  `index` of a new position read from the positions input, a gather's address offset).

The module holds no torch and imports no stage above the language, so construct modules register
into it at import; the contexts the rules receive are given as Protocols of what they read, met
by the classes of the modules that call them (which import this one, never the reverse)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

from .ir import Expr, Statement, walk
from .rules import Rules

if TYPE_CHECKING:
    import sympy

    from .graph import DesignGraph
    from .ir import (
        CausalFactor,
        CausalMask,
        Contraction,
        ElementwiseMap,
        Position,
        PositionIndex,
        Tensor,
        TensorRef,
        WindowMask,
    )


class RowRequests(Protocol):
    """What a KV_ROWS rule reads of decode_rows.RowRequests."""

    graph: DesignGraph

    def is_position(self, size: sympy.Expr) -> bool: ...


class StatePlanner(Protocol):
    """What the STATE_ROWS and STATE_STATEMENT rules read of decode_products.StatePlanner."""

    graph: DesignGraph
    tensors: dict[str, Tensor]
    symbol: sympy.Expr
    labels: dict[int, str]

    def positional(self, leg: str) -> bool: ...

    def fresh(self, leg: str, tag: str) -> str: ...


class ProductParts(Protocol):
    """What the STATE_FACTOR and DECAY_TERM rules call of decode_products.ProductParts."""

    query: str
    key: str
    running: list

    def reads_both(self, e: Expr) -> bool: ...

    def split(self, factor: Expr) -> None: ...

    def mark_causal(self, factor: Expr) -> None: ...

    def multiply_out(self, product: Contraction) -> None: ...

    def decay(self, factor: ElementwiseMap) -> None: ...

    def split_term(self, sign: int, term: Expr) -> None: ...


class StepProgram(Protocol):
    """What the STEP_REWRITE rules call of decode_graphs.StepProgram."""

    roles: Mapping[str, str]
    rows_only: bool

    def finish(self, node: Expr) -> Expr: ...

    def ref(self, ref: TensorRef) -> TensorRef: ...

    def positions_ref(self, node: PositionIndex) -> TensorRef: ...

    def hides_nothing(self, mask: CausalMask | CausalFactor) -> bool: ...

    def mask_ref(self, mask: CausalMask | WindowMask) -> TensorRef: ...

    def offset_address(self, position: Position) -> Position: ...


__all__ = [
    "ALL",
    "DECAY_TERM",
    "INNER_LEGS",
    "KV_ROWS",
    "NEW",
    "STAGES",
    "STATE_FACTOR",
    "STATE_ROWS",
    "STATE_STATEMENT",
    "STATE_WHAT",
    "STEP_REWRITE",
    "NoStateError",
    "NotCompiledError",
    "legs_in",
]

KV_ROWS: Rules[Callable[[RowRequests, Expr, str, Mapping[str, str]], str | None]] = Rules("decode rows")
STATE_ROWS: Rules[Callable[[StatePlanner, Expr, str], str | None]] = Rules("decode state rows")
INNER_LEGS: Rules[Callable[[Expr], Iterable[str]]] = Rules("decode legs")
STATE_WHAT: Rules[Callable[[Expr], str]] = Rules("decode what")
STATE_FACTOR: Rules[Callable[[ProductParts, Expr], None]] = Rules("decode factor")
DECAY_TERM: Rules[Callable[[ProductParts, int, Expr], None]] = Rules("decode decay term")
StatementRewrite = Callable[[list[Statement]], list[Statement]]
STATE_STATEMENT: Rules[Callable[[StatePlanner, Statement], StatementRewrite | None]] = Rules("decode statement")
STEP_REWRITE: Rules[Callable[[StepProgram, Expr], Expr]] = Rules("decode step")

NEW, ALL = "new", "all"  # the rows a position axis covers in a step: the new positions, or all so far

STAGES: tuple[Rules, ...] = (
    KV_ROWS,
    STATE_ROWS,
    INNER_LEGS,
    STATE_WHAT,
    STATE_FACTOR,
    DECAY_TERM,
    STATE_STATEMENT,
    STEP_REWRITE,
)


class NoStateError(Exception):
    """The design has no recurrent state; the message says why."""


class NotCompiledError(ValueError):
    """A design whose step the generated programs cannot take: the reason."""


def legs_in(e: Expr) -> set[str]:
    """Every leg a sub-expression reads (its nodes' legs and those named inside them, INNER_LEGS)."""
    legs: set[str] = set()
    for node in walk(e):
        legs |= set(node.legs)
        legs |= INNER_LEGS.lookup(node)(node)
    return legs


# ---- the rules of a kind that means nothing of its own to a stage


def no_row_problem(requests: RowRequests, node: Expr, target: str, legs: Mapping[str, str]) -> None:
    """KV_ROWS: the kind is computed at any rows its readers ask for."""
    return None


def reads_own_rows(planner: StatePlanner, node: Expr, target: str) -> None:
    """STATE_ROWS: the kind reads positions only along the legs it has."""
    return None


def no_inner_legs(node: Expr) -> set[str]:
    """INNER_LEGS: the kind names no leg besides its own."""
    return set()


def its_legs(node: Expr) -> str:
    """STATE_WHAT: the node named by its legs."""
    return ", ".join(node.legs)


def split_factor(parts: ProductParts, factor: Expr) -> None:
    """STATE_FACTOR: the factor is on the query side or the key side, by the legs it reads."""
    parts.split(factor)


def split_term(parts: ProductParts, sign: int, term: Expr) -> None:
    """DECAY_TERM: the term is on the query side or the key side, by the legs it reads."""
    parts.split_term(sign, term)


def no_rewrite(planner: StatePlanner, statement: Statement) -> None:
    """STATE_STATEMENT: the statement enters the state analysis as written."""
    return None


def unchanged_in_step(program: StepProgram, node: Expr) -> Expr:
    """STEP_REWRITE: the node as written, its masks and sizes those of the step."""
    return program.finish(node)


NEUTRAL: dict[Rules, Callable] = {
    KV_ROWS: no_row_problem,
    STATE_ROWS: reads_own_rows,
    INNER_LEGS: no_inner_legs,
    STATE_WHAT: its_legs,
    STATE_FACTOR: split_factor,
    DECAY_TERM: split_term,
    STATE_STATEMENT: no_rewrite,
    STEP_REWRITE: unchanged_in_step,
}


def plain(kind: type, but: Iterable[Rules] = ()) -> None:
    """Register every decode table's neutral rule for `kind`, except in the tables `but` names
    (where its construct module registers its own), as graph/position_rules.plain does."""
    skipped = set(map(id, but))
    for table, rule in NEUTRAL.items():
        if id(table) not in skipped:
            table.register(kind)(rule)
