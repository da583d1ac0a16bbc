"""What printing is in the middle of, as context variables that the generator sets around a
step or a body: the steps made once as tables, the plans that make none, and the variables a
float32 step reads widened."""

from __future__ import annotations

from contextvars import ContextVar

TABLED: ContextVar[frozenset[int]] = ContextVar("tabled", default=frozenset())  # steps made as tables
UNTABLED: ContextVar[frozenset[int]] = ContextVar("untabled", default=frozenset())  # plans that make none
TABLE_PREFIX = "_tdiag_table_"


TABLES_END = "# tables end"


# while a step computed in float32 under autocast is printed: the variables it reads through _wide
WIDENED: ContextVar[frozenset[str]] = ContextVar("widened", default=frozenset())
WIDE_LIKE: ContextVar[str] = ContextVar(
    "like", default="None"
)  # ... and the tensor whose dtype it takes ("None" outside)
