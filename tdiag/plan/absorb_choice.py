"""The absorbed form of a whole design as a rewrite the planner takes where its objective finds it
cheaper (issue 24: "MLA chooses absorbed or not by cost").

MLA computes each head's keys and values from one small latent, K[m h c] = C[m l] W[l h c]
(DeepSeek-V2 Sec. 2.1.2); its absorbed form multiplies W into the query side of the scores and
the output side of the values instead, so that the attention reads the latent itself
(graph/absorb.py `absorbed`). Both are the same function; which is cheaper depends on the sizes:
the scores cost 2·N²·H·C as written and 2·N²·H·L absorbed (L the latent's width, C the head's),
the extra products of the query with W cost 2·N·H·C·L. So, as a rewrite elsewhere is taken
where the objective finds it cheaper (distribute.py, on trial), a design with an absorbed form is
planned whole in both forms, each plan priced as a whole by the objective's order of figures
(forms/cost.py ORDER: estimated training-step seconds on the planning device, bytes kept for
backward, FLOPs), and the cheaper taken: the design as written on a tie. A design without an
absorbed form is planned once, as before. `Plan.forms` records both forms' figures; the plan's
"rewrites taken / refused" lines say which was taken and why."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sympy

from ..device import planning_device
from ..graph import DesignGraph
from ..ir import TensorRef, walk
from .chooser import Cost, choose, key, worse
from .footprint import footprint
from .program import BATCH_SIZE, Plan
from .timing import plan_time
from .trials import planned_flops

WRITTEN, ABSORBED = "as written", "absorbed"


@dataclass(frozen=True)
class FormChoice:
    """The whole-graph form a plan took (`taken`: "as written" or "absorbed"), each form's
    figures at the planned sizes, and the tensors the absorbed form replaces by their factors."""

    taken: str
    costs: dict[str, Cost]
    replaced: tuple[str, ...]


def plan_cost(plan: Plan) -> Cost:
    """A whole plan's figures at its planned sizes, as a box's candidates are priced: the
    estimated seconds of a training step on the planning device, the bytes kept for backward,
    and the FLOPs as the rewrites count them."""
    graph = plan.graph
    at = {k: v for k, v in plan.sizes.items() if k in graph.sizes}

    def number(expr: sympy.Expr) -> float:
        value = graph.evaluate(sympy.sympify(expr), **at)
        return float(value.xreplace({BATCH_SIZE: plan.sizes.get("B", 1)}))

    steps = [*plan.steps, *plan.update_steps]
    return Cost(
        plan_time(plan, plan.device or planning_device()),
        number(footprint(plan).saved_bytes),
        int(number(sum((planned_flops(step) for step in steps), sympy.Integer(0)))),
    )


def replaced_tensors(graph: DesignGraph, other: DesignGraph) -> tuple[str, ...]:
    """The tensors `graph`'s statements read that `other`'s (its absorbed form) no longer do."""

    def read(g: DesignGraph) -> set[str]:
        return {node.name for s in g.statements for node in walk(s.expr) if isinstance(node, TensorRef)}

    return tuple(sorted(read(graph) - read(other)))


def cheaper_form(plan: Plan, objective: str, replaced: tuple[str, ...], build: Callable[[], Plan]) -> Plan:
    """`plan` (the design as written) or the plan `build` makes of its absorbed form, whichever
    the objective's order of figures finds cheaper (the design as written on a tie), with the
    choice recorded (`Plan.forms`) and said in the taken plan's rewrite notes. The taken plan's
    graph is the design's either way: its ops are what the form changes, and a decoding cache
    of its module chooses its own form from the design (decode_step.decode_form)."""
    other = build()
    costs = {WRITTEN: plan_cost(plan), ABSORBED: plan_cost(other)}
    taken = choose(objective, [(WRITTEN, costs[WRITTEN]), (ABSORBED, costs[ABSORBED])])
    best, loser = (other, WRITTEN) if taken == ABSORBED else (plan, ABSORBED)
    best.forms = FormChoice(taken, costs, replaced)
    best.graph = plan.graph
    what = f"the absorbed form ({', '.join(replaced)} replaced by their factors in their readers' products)"
    figures = f"{_figures(costs[taken])} against {_figures(costs[loser])} {_named(loser)}"
    if taken == ABSORBED:
        best.lowered.append(f"whole graph: {what} taken, by the {objective} objective: {figures}")
    else:
        tie = key(objective, costs[ABSORBED]) == key(objective, costs[WRITTEN])
        how = "costs the same as (a tie keeps)" if tie else worse(objective, costs[ABSORBED], costs[WRITTEN])
        best.refused.append(
            f"whole graph: {what} refused: it {how} the design as written, by the {objective} objective "
            f"({_figures(costs[ABSORBED])} against {_figures(costs[WRITTEN])})"
        )
    return best


def _named(form: str) -> str:
    return "for the design as written" if form == WRITTEN else "for the absorbed form"


def _figures(cost: Cost) -> str:
    return f"{cost.time * 1e3:.3g} ms, {cost.kept:,.0f} bytes kept, {cost.flops:,} FLOPs"
