"""Planning: DesignGraph + sizes -> Plan, the lowered program (program.py) that codegen prints
and cost reads. The passes that build it live one per module in this package."""

from .base import OPTIMAL_UP_TO
from .build import build_plan
from .context import RESERVED
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
