"""Every expression kind's rules, one module per kind (named by the kind: `softmax.py` for the
softmax box), each filling every converted stage's table for its kind, or declaring the kind
unsupported there with a reason, as JAX's primitives register their lowerings. The tables live in
their stages' layers: build (graph/calls.BUILD, keyed on the call's word as well), check
(check.CHECK: the numbers a node carries), print and describe (printing.py), render
(render.RENDER), evaluate (evaluation.EVALUATE, for the reference evaluator) and lower
(plan/base.LOWER: a nonlinear kind's lowering into program steps, a function of the lowering's
context; the factors of a multilinear region declare it unsupported, since plan/regions.py
collects them with their region). Importing the package registers them all; design.py imports
it, lower layers never do. Nothing here imports torch at module level: an evaluate rule imports
it when it runs.

Decoding (decode*.py) is not a table yet; a new kind still needs its branches there. Adding a
construct: an ir dataclass, its word in graph/vocabulary.py (and graph/syntax.py's leg rule where
legs are summed inside it), and one module here; tests/test_constructs.py fails until every table has a rule for it."""

from __future__ import annotations

from collections.abc import Iterable

from ..check import CHECK
from ..evaluation import EVALUATE
from ..graph.calls import BUILD
from ..plan.base import LOWER
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
    norm,
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
    LOWER,
)  # the stages converted to rule tables so far


def missing_rules(kinds: Iterable[type], stages: Iterable[Rules] = STAGES) -> list[tuple[str, str]]:
    """(stage, kind) for each kind that a stage has neither a rule for nor declares unsupported."""
    return [(rules.stage, kind.__name__) for rules in stages for kind in kinds if kind not in rules.kinds()]
