"""Planning: DesignGraph + sizes -> Plan, the lowered program (program.py) that codegen prints
and cost reads. The passes that build it live one per module in this package.

The planner is itself layered, each part importing only those before it: the program IR
(program.py: ops, Values, Steps, Plan); its prices (strides, abstract, footprint, timing,
objective: what a program costs); the lowering (context.py, the one context; base.py, the walk
and the lower stage's rule table; one module per construct, each a set of functions of the
context: regions, contractions, boxes, SDPA, chunked sums, ...); the candidate forms of a box (forms/*); the chooser
(forms/__init__, forms/choice.py); and the passes over the whole design (build.py, absorb_choice,
layout, report, call_variants). It may import the core and the language, never the backends,
the runtime or the facade. Its public names are imported on first use (PEP 562), so
`import tdiag.plan.program` loads the program IR alone."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:
    from .build import build_plan
    from .context import RESERVED
    from .contraction import OPTIMAL_UP_TO
    from .program import BATCH, BATCH_SIZE, Operand, Plan, Step, Value, reads

__all__ = [
    "BATCH",
    "BATCH_SIZE",
    "OPTIMAL_UP_TO",
    "RESERVED",
    "Operand",
    "Plan",
    "Step",
    "Value",
    "build_plan",
    "reads",
]

_HOMES = {
    "OPTIMAL_UP_TO": "contraction",
    "RESERVED": "context",
    "build_plan": "build",
    **dict.fromkeys(("BATCH", "BATCH_SIZE", "Operand", "Plan", "Step", "Value", "reads"), "program"),
}

__getattr__, __dir__ = lazy_exports(__name__, _HOMES, __all__)
