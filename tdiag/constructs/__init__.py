"""Every expression kind's rules, one module per kind (named by the kind: `softmax.py` for the
softmax box), each filling every stage's table for its kind, or declaring the kind unsupported
there with a reason, as JAX's primitives register their lowerings. The tables live in their
stages' layers: build (graph/calls.BUILD, keyed on the call's word as well), check (check.CHECK:
the numbers a node carries), print and describe (printing.py), render (render.RENDER), evaluate
(evaluation.EVALUATE, for the reference evaluator), the position tables of
graph/position_rules.py (what a kind means to with_causal_mask, the call masks and the absorbed
form: where a mask goes, what it hides, mixes or reads ahead), lower (plan/base.LOWER: a
nonlinear kind's lowering into program steps, a function of the lowering's context; the factors
of a multilinear region declare it unsupported, since plan/regions.py collects them with their
region) and decoding's tables (decode_rules.py: what a kind means to a "kv" cache's rows and step
programs and to a recurrent state), each construct's blocks in its module. Importing the package
registers them all; design.py imports it, lower layers never do. Nothing here imports torch at
module level: an evaluate rule imports it when it runs.

Adding a construct: an ir dataclass, its word in graph/vocabulary.py (and graph/syntax.py's leg
rule where legs are summed inside it), and one module here, found by `_register_all` (no list to
edit); tests/test_constructs.py fails until every table has a rule for it."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable

from ..check import CHECK
from ..decode_rules import STAGES as DECODE_STAGES
from ..evaluation import EVALUATE
from ..graph.calls import BUILD
from ..graph.position_rules import TABLES as POSITIONS
from ..plan.base import LOWER
from ..printing import DESCRIBE, PRINT
from ..render import RENDER
from ..rules import Rules


def _register_all() -> tuple[str, ...]:
    """Import every module of this package (each registers its kind's rules at import), so that a
    new construct is one new module here: no list of them to edit."""
    names = tuple(m.name for m in pkgutil.iter_modules(__path__) if not m.ispkg)
    for name in names:
        importlib.import_module(f"{__name__}.{name}")
    return names


MODULES = _register_all()  # the construct modules, by name, in the order they registered

STAGES: tuple[Rules, ...] = (
    BUILD,
    CHECK,
    PRINT,
    DESCRIBE,
    RENDER,
    EVALUATE,
    *POSITIONS,
    *DECODE_STAGES,
    LOWER,
)  # the stages converted to rule tables so far


def missing_rules(kinds: Iterable[type], stages: Iterable[Rules] = STAGES) -> list[tuple[str, str]]:
    """(stage, kind) for each kind that a stage has neither a rule for nor declares unsupported."""
    return [(rules.stage, kind.__name__) for rules in stages for kind in kinds if kind not in rules.kinds()]
