"""A layer norm found by the planner (plan/norms.py: `LayerNormNode`, a written-out LayerNorm or
GroupNorm read as one kernel). It exists only in the planner's copy of the design graph, made
after the design was built and checked, so its rules are the lowering's and decoding's (a
compiled module's graph holds it); every stage of the design as written declares it
unsupported, saying so."""

from __future__ import annotations

from ..check import CHECK
from ..decode_rules import (
    DECAY_TERM,
    INNER_LEGS,
    KV_ROWS,
    STATE_FACTOR,
    STATE_ROWS,
    STATE_STATEMENT,
    STATE_WHAT,
    STEP_REWRITE,
    no_row_problem,
    unchanged_in_step,
)
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

# decoding (decode_rules.py): a compiled module's graph (Plan.graph) holds the fused node; a "kv"
# cache's rows and step programs take it as it is, the state analysis writes it out first
# (decode_fused.written_out)
KV_ROWS.register(LayerNormNode)(no_row_problem)
STEP_REWRITE.register(LayerNormNode)(unchanged_in_step)
for stage in (STATE_ROWS, INNER_LEGS, STATE_WHAT, STATE_FACTOR, DECAY_TERM, STATE_STATEMENT):
    stage.unsupported(LayerNormNode, "the state analysis writes a fused layer norm out first (written_out)")


# lower (plan/base.LOWER): one layer_norm step over the normalized legs (plan/norms.py)
LOWER.register(LayerNormNode)(lower_layer_norm)
