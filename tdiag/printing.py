"""The design's text form, for `tdiag show`, render's statement panels and messages: each
expression kind prints as `.td`-like text by its print rule, and may add a line describing it
under its statement by its describe rule (both registered in tdiag/constructs)."""

from __future__ import annotations

from .ir import CausalMask, Expr, Mask, PaddingMask, WindowMask, walk
from .rules import Rules

PRINT: Rules = Rules("print")  # node -> its .td-like text
DESCRIBE: Rules = Rules("describe")  # node -> a line saying what it does, or None
_PARENTHESIZED: set[type] = set()  # kinds written in parentheses as a factor or an operand


def format_expr(e: Expr) -> str:
    """An expression node as `.td`-like text (for show, codegen comments and errors)."""
    return PRINT.lookup(e)(e)


def describe_nodes(expr: Expr) -> list[str]:
    """The describe lines of an expression's nodes, parents first (show's lines under a statement)."""
    lines = (DESCRIBE.lookup(node)(node) for node in walk(expr))
    return [line for line in lines if line is not None]


def parenthesized(kind: type) -> None:
    """Write `kind` in parentheses where it is a factor or an operand (a sum, a product)."""
    _PARENTHESIZED.add(kind)


def wrapped(e: Expr) -> str:
    """`e`'s text, in parentheses where its kind binds more loosely than a factor."""
    text = format_expr(e)
    return f"({text})" if isinstance(e, tuple(_PARENTHESIZED)) else text


def format_mask(mask: Mask) -> str:
    """A mask as written: `causal(n, m)`, `window(n, m, W)`, or a padding mask's tensor `P[n m]`."""
    if isinstance(mask, PaddingMask):
        return f"{mask.tensor.name}[{' '.join(mask.tensor.legs)}]"
    if isinstance(mask, WindowMask):
        return str(mask)
    assert isinstance(mask, CausalMask)
    return f"causal({mask.query}, {mask.key})"


def groups_text(groups: tuple[tuple[str, ...], ...]) -> str:
    """Axes as written: `n (h d)`, a group of several legs in parentheses (a reshape)."""
    return " ".join(g[0] if len(g) == 1 else "(" + " ".join(g) + ")" for g in groups)


def nothing_to_describe(node: Expr) -> None:
    """The describe rule of a kind that adds no line under its statement."""
    return None
