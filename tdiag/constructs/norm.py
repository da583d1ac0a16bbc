"""A layer norm found by the planner (plan/norms.py: `LayerNormNode`, a written-out LayerNorm or
GroupNorm read as one kernel). It exists only in the planner's copy of the design graph, made
after the design was built and checked, so its one rule is the lowering's; every other stage
declares it unsupported, saying so."""

from __future__ import annotations

from ..check import CHECK
from ..evaluation import EVALUATE
from ..graph.calls import BUILD
from ..plan.base import LOWER
from ..plan.norms import LayerNormNode, lower_layer_norm
from ..printing import DESCRIBE, PRINT
from ..render import RENDER

PLANNER_ONLY = (
    "a layer norm the planner read into one kernel (plan/norms.py) is in the planner's copy of the graph "
    "only; this stage sees the design as written"
)

BUILD.unsupported(LayerNormNode, PLANNER_ONLY)
CHECK.unsupported(LayerNormNode, PLANNER_ONLY)
PRINT.unsupported(LayerNormNode, PLANNER_ONLY)
DESCRIBE.unsupported(LayerNormNode, PLANNER_ONLY)
RENDER.unsupported(LayerNormNode, PLANNER_ONLY)
EVALUATE.unsupported(LayerNormNode, PLANNER_ONLY)


# lower (plan/base.LOWER): one layer_norm step over the normalized legs (plan/norms.py)
LOWER.register(LayerNormNode)(lower_layer_norm)
