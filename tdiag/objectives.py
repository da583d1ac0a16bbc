"""How the planner chooses between equivalent plans (plan.build_plan), by name: fewest FLOPs;
fused kernels wherever they apply because they never store a softmax box's entries; or the least
estimated time of a training step on the planning device (a roofline per op, device.py). A core
module: the planner, the runtime and the facade all read these names, and `tdiag.design` re-exports
them."""

from __future__ import annotations

OBJECTIVES = ("flops", "memory", "time")
# What modules, compiled files and plans are built for unless told: the estimated time ranks plans
# at least as well as FLOPs on the benchmark (docs/results/bench-cpu/objective). Cost reports keep
# COST_OBJECTIVE, the FLOP-minimal plan: its formulas are the papers' counts and no machine's.
DEFAULT_OBJECTIVE = "time"
COST_OBJECTIVE = "flops"
