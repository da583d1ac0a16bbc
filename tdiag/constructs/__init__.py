"""Every expression kind's rules, one module per kind (named by the kind: `softmax.py` for the
softmax box), each filling every converted stage's table for its kind or declaring the kind
unsupported there, as JAX's primitives register their lowerings. Importing the package registers
them all; design.py imports it, lower layers never do. Nothing here imports torch at module level:
an evaluate rule imports it when it runs.

Adding a construct: an ir dataclass and one module here (plus its grammar and vocabulary entry
where it has a new name); tests/test_constructs.py fails until every stage has a rule for it."""

from __future__ import annotations

from collections.abc import Iterable

from ..check import CHECK
from ..evaluation import EVALUATE
from ..graph.calls import BUILD
from ..printing import DESCRIBE, PRINT
from ..render import RENDER
from ..rules import Rules
from . import (  # noqa: F401  (registered at import)
    causal,
    contraction,
    conv,
    gather,
    index,
    map,
    quotient,
    reduction,
    scalar,
    scan,
    segsum,
    softmax,
    sqdist,
    sum,
    tensor,
    window,
)

STAGES: tuple[Rules, ...] = (
    BUILD,
    CHECK,
    PRINT,
    DESCRIBE,
    RENDER,
    EVALUATE,
)  # the stages converted to rule tables so far


def missing_rules(kinds: Iterable[type], stages: Iterable[Rules] = STAGES) -> list[tuple[str, str]]:
    """(stage, kind) for each kind that a stage has neither a rule for nor declares unsupported."""
    return [(rules.stage, kind.__name__) for rules in stages for kind in kinds if kind not in rules.kinds()]
