"""What each expression kind means for a design's positions, as rule tables (tdiag/rules.py) that
each construct module under tdiag/constructs fills for its kind: with_causal_mask (causal.py), the
call masks (call_masks.py) and MLA's absorbed form (absorb.py) walk the expressions and ask these
tables, never the kind itself, so a new kind is one construct module.

with_causal_mask and the call masks: where a mask over (query, key) goes on a node (`MASK_SITE`).
with_causal_mask: whether the node hides those keys already (`SEEN`), the (query, key) pairs along
which a node is zero past the query (`ZEROS`) or −inf there (`MINUS_INFINITY`), the legs it mixes
(`MIXING`), a read of later positions that no mask can hide (`FUTURE`) and whether it hides the
future as written (`HIDES`). The call masks: the pairs a node hides by the call mask already
(`CALL_HIDDEN`), a reached node's head legs (`HEADS`), how a refusal names it (`CALL_WORD`) and
the node with the call bias added to its scores, where it takes one (`BIAS`). The absorbed form:
the legs a node reads at every key (`KEY_LEGS`).

A kind that none of this concerns (a tensor read, a number, a gather) takes every table's neutral
rule with `plain(kind)`; one that concerns some tables takes the rest with `plain(kind, but=...)`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeGuard

from ..errors import Diagnostic, Span
from ..ir import CausalMask, Expr, Mask, TensorRef, WindowMask, walk
from ..rules import Rules

if TYPE_CHECKING:
    from .model import DesignGraph

Pairs = set[tuple[str, str]]  # (query leg, key leg)
Hidden = Mapping[str, set[tuple[int, int]]]  # a statement's target -> (query axis, key axis) hidden
Site = Literal["masks", "factor"]  # a mask joins the node's masks, or a factor its product

MASK_SITE: Rules[Callable[[Expr, str, str], Site | None]] = Rules("mask site")
SEEN: Rules[Callable[[Expr, str, str, Hidden], bool]] = Rules("causal seen")
ZEROS: Rules[Callable[[Expr, Hidden], Pairs]] = Rules("causal zeros")
MINUS_INFINITY: Rules[Callable[[Expr], Pairs]] = Rules("causal minus infinity")
MIXING: Rules[Callable[[Expr], Mixing | None]] = Rules("causal mixing")
FUTURE: Rules[Callable[[Expr, Positions], Diagnostic | None]] = Rules("causal future")
HIDES: Rules[Callable[[Expr, str, str, Hidden], bool]] = Rules("causal as written")
CALL_HIDDEN: Rules[Callable[[Expr, str, Hidden], Pairs]] = Rules("call mask hidden")
HEADS: Rules[Callable[[Expr, str, str], tuple[tuple[str, ...], tuple[str, ...]]]] = Rules("call mask heads")
CALL_WORD: Rules[Callable[[Expr], str]] = Rules("call mask word")
BIAS: Rules[Callable[[Expr, Bias], Expr | None]] = Rules("call bias")
KEY_LEGS: Rules[Callable[[Expr, set[str]], set[str]]] = Rules("absorbed keys")


@dataclass(frozen=True)
class Mixing:
    """The legs a node sums, reduces or normalizes `over`, how an error names it (`what`), and
    whether it normalizes (a box over a query leg mixes the later queries even beside the query)."""

    over: tuple[str, ...]
    what: str
    normalizes: bool = False


@dataclass(frozen=True)
class Positions:
    """A statement's query and key legs as with_causal_mask reads them, the design, and the pairs
    each earlier statement is masked on: what a `FUTURE` rule decides by."""

    queries: set[str]
    keys: set[str]
    graph: DesignGraph
    hidden: Hidden

    def positional(self, leg: str) -> bool:
        """Whether `leg` runs over positions: a query or key leg, or a leg of the key's size."""
        graph, keys = self.graph, self.keys
        size = graph.legs[next(iter(keys))].size if keys and next(iter(keys)) in graph.legs else None
        return leg in self.queries or leg in keys or (leg in graph.legs and graph.legs[leg].size == size)


@dataclass(frozen=True)
class Bias:
    """The call bias a `BIAS` rule adds: the input's `name`, the query and key legs, where it is
    declared (`span`) and whether it is per head."""

    name: str
    query: str
    key: str
    span: Span
    per_head: bool


def hides_future(mask: object) -> TypeGuard[CausalMask | WindowMask]:
    """A causal mask, or a one-sided window (`window(n, m, W)`), which hides the future too."""
    return isinstance(mask, CausalMask) or (isinstance(mask, WindowMask) and mask.is_causal)


def masks_hide(masks: Iterable[Mask], query: str, key: str) -> bool:
    """Whether one of `masks` hides every key after the query over (query, key)."""
    return any(hides_future(m) and (m.query, m.key) == (query, key) for m in masks)


def zeros(expr: Expr, hidden: Hidden) -> Pairs:
    """The (query, key) leg pairs along which `expr` is causally masked or zeroed already."""
    return ZEROS.lookup(expr)(expr, hidden)


def minus_infinity(expr: Expr) -> Pairs:
    """The (query, key) pairs along which `expr` is −inf past the query, so that its exp is zero
    there (Mamba-2's decay mask exp(segsum(a)))."""
    return MINUS_INFINITY.lookup(expr)(expr)


def call_hidden(expr: Expr, name: str, hidden: Hidden) -> Pairs:
    """The (query, key) pairs along which `expr` is hidden by the call mask `name` already."""
    return CALL_HIDDEN.lookup(expr)(expr, name, hidden)


def read_hidden(ref: TensorRef, hidden: Hidden) -> Pairs:
    """The pairs an earlier statement's result is masked on, as `ref` names its legs (a head axis
    read as (g k) keeps n, m)."""
    if ref.name not in hidden:
        return set()
    groups = ref.groups
    return {(groups[q][0], groups[k][0]) for q, k in hidden[ref.name] if len(groups[q]) == len(groups[k]) == 1}


def all_zeros(exprs: Iterable[Expr], pairs: Callable[[Expr], Pairs]) -> Pairs:
    """The pairs along which every one of `exprs` is zero (a sum: zero where every term is)."""
    return set.intersection(*(pairs(e) for e in exprs))


def reads_an_input(expr: Expr, graph: DesignGraph) -> bool:
    """Whether `expr` depends on an input, mask or noise (a sum of parameters or positions over
    a key leg mixes nothing that arrives later)."""
    for node in walk(expr):
        if isinstance(node, TensorRef):
            tensor = graph.tensors[node.name]
            if tensor.is_batched or (tensor.statement is not None and reads_an_input(tensor.statement.expr, graph)):
                return True
    return False


def legs_beside(node: Expr, query: str, key: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A node's legs other than the query and key legs, in its order, as its head legs, and none
    that only its query side holds."""
    return tuple(leg for leg in node.legs if leg not in (query, key)), ()


def mask_keys(masks: Iterable[Mask], positional: set[str]) -> set[str]:
    """The position legs whose future a node's masks hide (their key legs)."""
    return {m.key for m in masks if hasattr(m, "key") and m.key in positional}


def _no_site(node: Expr, query: str, key: str) -> None:
    return None


def _unseen(node: Expr, query: str, key: str, hidden: Hidden) -> bool:
    return False


def _no_zeros(node: Expr, hidden: Hidden) -> Pairs:
    return set()


def _finite(node: Expr) -> Pairs:
    return set()


def _no_mixing(node: Expr) -> None:
    return None


def _no_future(node: Expr, positions: Positions) -> None:
    return None


def _no_call_mask(node: Expr, name: str, hidden: Hidden) -> Pairs:
    return set()


def _sum_word(node: Expr) -> str:
    return "a sum over the keys (a map such as sigmoid or relu^2, or linear attention)"


def _no_bias(node: Expr, bias: Bias) -> None:
    return None


def _no_keys(node: Expr, positional: set[str]) -> set[str]:
    return set()


NEUTRAL: dict[Rules, Callable] = {
    MASK_SITE: _no_site,
    SEEN: _unseen,
    ZEROS: _no_zeros,
    MINUS_INFINITY: _finite,
    MIXING: _no_mixing,
    FUTURE: _no_future,
    HIDES: _unseen,
    CALL_HIDDEN: _no_call_mask,
    HEADS: legs_beside,
    CALL_WORD: _sum_word,
    BIAS: _no_bias,
    KEY_LEGS: _no_keys,
}  # each table's rule for a kind that takes no mask, hides nothing and mixes no positions
TABLES: tuple[Rules, ...] = tuple(NEUTRAL)


def plain(kind: type, but: Iterable[Rules] = ()) -> None:
    """Register every table's neutral rule for `kind`, except in the tables `but` names (where
    its construct module registers its own)."""
    skipped = set(map(id, but))
    for table, rule in NEUTRAL.items():
        if id(table) not in skipped:
            table.register(kind)(rule)
