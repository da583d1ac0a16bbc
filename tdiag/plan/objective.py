"""The whole-plan guard of the `time` objective: the planner decides box by box, each choice
estimated in the context of the program so far, and such local choices interact (a form that
is cheaper where it is met can make a later one dearer). So under `time` the plans of the
`flops` and `memory` objectives are built too (those that can differ), each whole plan's
training-step time is estimated on the planning device (timing.plan_time), and the fastest is
taken, the time plan on a tie. The default objective's plan is then never estimated slower than
the other two."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..device import DeviceModel
from .chooser import cheapest
from .program import Plan
from .timing import plan_time


def fastest_plan(plan: Plan, device: DeviceModel, rivals: Sequence[str], build: Callable[[str], Plan]) -> Plan:
    """The fastest on `device` of `plan` (made for `time`) and the plans `build` makes for the
    `rivals` objectives (context.rival_objectives: those whose plans may differ; none
    where the lowering met no choice the objective decides), with the device and each compared
    plan's estimated seconds recorded (`Plan.compared`)."""
    plan.device = device
    plan.compared = {"time": plan_time(plan, device)}
    plans = {"time": plan}
    for objective in rivals:
        plans[objective] = build(objective)
        plan.compared[objective] = plan_time(plans[objective], device)
    taken = taken_objective(plan)
    best = plans[taken]
    if best is plan:
        return plan
    best.device, best.compared = device, plan.compared
    best.lowered.append(
        f"whole plan: the {taken} objective's plan taken, estimated {_ms(plan.compared[taken])} against "
        f"{_ms(plan.compared['time'])} for the time objective's box-by-box choices"
    )
    return best


def taken_objective(plan: Plan) -> str:
    """Which compared objective's plan this is: the fastest, the time plan on a tie."""
    listed = sorted(plan.compared, key=lambda objective: objective != "time")
    return cheapest([(objective, plan.compared[objective]) for objective in listed])


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def comparison_text(plan: Plan) -> str:
    """`time objective, a step at B=8: 12.3 ms (flops plan 13.0 ms, memory plan 15.1 ms)`: each
    compared plan's estimated training-step time at the planned batch, the one taken first;
    empty when none was compared."""
    if not plan.compared:
        return ""
    taken = taken_objective(plan)
    others = [f"{objective} plan {_ms(seconds)}" for objective, seconds in plan.compared.items() if objective != taken]
    text = f"time objective, a step at B={plan.sizes.get('B', 1)}: {_ms(plan.compared[taken])}" + (
        f", the {taken} plan" if taken != "time" else ""
    )
    return text + (f" ({', '.join(others)})" if others else " (no choice the objective decides: no other plan)")
