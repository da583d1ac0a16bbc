"""What a candidate lowering costs, emitted on trial (context.trial) and priced at the planned
sizes: its FLOPs, or under the `time` objective its training-step time on the planning device
(timing.py's roofline, over the footprint of the program so far with the candidate's steps
after it). Functions of the lowering's context."""

from __future__ import annotations

from collections.abc import Callable

import sympy

from .abstract import Footprint
from .context import LoweringContext
from .footprint import footprint
from .program import Attention, ChunkCount, FlexAttention, Multiply, Plan, Step
from .timing import op_time


def program_with(ctx: LoweringContext, steps: list[Step]) -> Plan:
    """The program so far with `steps` after it, for the footprint pass."""
    chunks = [ChunkCount(str(symbol), extent, size) for (extent, size), symbol in ctx.chunk_counts.items()]
    return Plan(
        ctx.g,
        dict(ctx.sizes),
        dict(ctx.leg_sizes),
        steps=[*ctx.steps, *steps],
        names=dict(ctx.input_vars),
        attributes=frozenset(ctx.attributes),
        causal=dict(ctx.causal_masks),
        chunks=chunks,
    )


def estimated_time(ctx: LoweringContext, steps: list[Step], fp: Footprint | None = None) -> float:
    """Seconds a training step spends in `steps`, appended to the program so far (`fp`: the
    footprint of that program, when the caller has it already)."""
    ctx.count_estimate(any(isinstance(step.op, Attention | FlexAttention) for step in steps))
    records = (fp or footprint(program_with(ctx, steps))).steps[len(ctx.steps) :]
    return sum(
        op_time(ctx.device, step, record, ctx.at_planned_sizes) for step, record in zip(steps, records, strict=True)
    )


def trial_cost(ctx: LoweringContext, build: Callable[[], object]) -> float:
    """What a lowering would cost under the objective, at the planned sizes, without keeping
    its steps (a trial): its FLOPs, or under `time` the estimated seconds of a training step."""
    with ctx.trial() as steps:
        build()
        if ctx.objective == "time":
            return estimated_time(ctx, steps)
        return counted_flops(ctx, steps)


def counted_flops(ctx: LoweringContext, steps: list[Step]) -> int:
    """The FLOPs of `steps` at the planned sizes, as the rewrites compare them (planned_flops):
    each step's count evaluated on its own (the same counts recur from trial to trial) and summed
    exactly, unless a count holds a float, which the evaluation of the sum rationalizes."""
    terms = [sympy.sympify(planned_flops(s)) for s in steps]
    if not any(term.has(sympy.Float) for term in terms):
        return int(sum((ctx.at_sizes(term) for term in terms), sympy.Integer(0)))
    return int(ctx.at_sizes(sum(terms, sympy.Integer(0))))


def planned_flops(step: Step) -> sympy.Expr:
    """A step's FLOPs as the rewrites compare them: a product that sums nothing (one multiply per
    element) is weighed as the matmul with inner size 1 it replaced, 2 per element, as SDPA's
    count weighs a head of width 1; so choosing the product op moves no rewrite decision."""
    if isinstance(step.op, Multiply) and not step.op.summed:
        return 2 * step.flops
    return step.flops
