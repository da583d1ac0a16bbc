"""A step as lines of forward: its op's expression assigned to its value, with its legs and cost
as a comment, the run-time checks its reads need before it, and runs of float32 steps under one
`torch.autocast(..., enabled=False)`."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import sympy

from ..plan import BATCH_SIZE, Plan, Step, reads
from ..plan.program import GatherAt, Slice, show_legs
from . import box_ops  # noqa: F401  (registers the box ops' printers on op_code)
from .ops import op_code, read_code
from .state import TABLED, WIDE_LIKE, WIDENED
from .stored import dtype_reference
from .text import expr_code, source


def steps_lines(steps: Sequence[Step], plan: Plan) -> list[str]:
    """The lines of consecutive steps; a run of steps computed in float32 (a normalize box's, a
    scan's, a decayed causal sum's) goes under one `torch.autocast(..., enabled=False)`, its
    operands from outside widened."""
    lines: list[str] = []
    k = 0
    steps = [step for step in steps if id(step) not in TABLED.get()]
    while k < len(steps):
        if not steps[k].wide:
            lines += step_lines(steps[k], plan)
            k += 1
            continue
        inputs = [source(plan.names[t.name], "name") for t in plan.graph.inputs]
        device = f"{inputs[0]}.device.type" if inputs else '"cpu"'
        run = list(itertools.takewhile(lambda step: step.wide, steps[k:]))
        what = _wide_run(run, plan)
        lines.append(f"        with torch.autocast({device}, enabled=False):  # {what}, in float32 under autocast")
        for step in run:
            lines += ["    " + line for line in step_lines(step, plan)]
        k += len(run)
    return lines


def _wide_run(run: Sequence[Step], plan: Plan) -> str:
    """What a run of float32 steps computes, in the design's words: a normalize box only where the
    run divides by a sum and the design has one (a decayed causal sum or a scan is widened too)."""
    kinds = {step.kind for step in run}
    if kinds <= {"scan", "segsum"}:
        return "a scan"
    if kinds == {"sdpa"}:
        return "an attention with a key bias"
    if kinds & {"normalize", "quotient"} and any(not box.is_exp for _, box in plan.graph.boxes()):
        return "a normalize box"
    if "prefix" in kinds:
        return "a causal sum in chunks"
    if kinds & {"scan", "segsum"}:
        return "a decayed causal sum"
    return "a sum over positions"


def step_lines(step: Step, plan: Plan) -> list[str]:
    legs = " ".join(show_legs(step.out.legs)) if step.out else ""
    cost = ""
    if step.flops != 0:
        cost = f"; {sympy.sstr(sympy.factor(step.flops.subs(BATCH_SIZE, 1)))} flops"
    comment = "  # " + source(f"{step.description} [{legs}]{cost}", "comment") if step.description else ""
    wide = {s.out.var for s in plan.steps if s.wide and s.out is not None} | set(plan.causal.values())
    widened = WIDENED.set(frozenset(v.var for v in reads(step.op) if v.var not in wide) if step.wide else frozenset())
    like = WIDE_LIKE.set(dtype_reference(plan) if step.wide else "None")
    try:
        code = op_code(step.op, plan.attributes)
        if step.training_only:  # zero in eval mode: neither computed nor allocated there
            code = f"{code} if self.training else None"
        elif step.eval_op is not None:  # the same sum without its train-mode noise terms
            code = f"{code} if self.training else {op_code(step.eval_op, plan.attributes)}"
    finally:
        WIDENED.reset(widened)
        WIDE_LIKE.reset(like)
    if step.out is not None:
        code = f"{source(step.out.var, 'name')} = {code}"
    return [*_slice_checks(step), *_gather_checks(step), f"        {code}{comment}"]


def _gather_checks(step: Step) -> list[str]:
    """A read at a position into an axis of run-time length needs the largest position (proved
    by check) inside it: checked when the module runs, a ValueError naming the table."""
    if not isinstance(step.op, GatherAt) or step.op.checked is None:
        return []
    length = f"{read_code(step.op.x, frozenset())}.shape[{step.op.dim}]"
    text = source(f"{step.op.name}: reads position {step.op.checked} of axis {step.op.axis}, which has ", "fstring")
    hint = source(" entries; clamp the position into the axis", "fstring")
    return [
        f"        if {length} <= {step.op.checked}:",
        f'            raise ValueError(f"{text}{{{length}}}{hint}")',
    ]


def _slice_checks(step: Step) -> list[str]:
    """A table read at its first N entries needs N <= its length, a range a..b needs
    0 <= a < b <= its length: checked when the module runs, where planning could not."""
    if not isinstance(step.op, Slice):
        return []
    lines = []
    for k, ((_, extent, size), (leg, shown_extent, shown_size)) in enumerate(
        zip(step.op.dims, step.op.labels, strict=True)
    ):
        start = step.op.start(k)
        if start == 0:
            if (extent - size).is_number:
                continue  # both known when planning: graph/positions.py refused a slice longer than its axis
            more = source(f" entries of axis {leg} of {shown_size} = ", "fstring")
            hint = source("; declare the table over a longer maximum length", "fstring")
            text = source(f"{step.op.name}: reads the first {shown_extent} = ", "fstring")
            lines.append(f"        if {expr_code(extent)} > {expr_code(size)}:")
            lines.append(
                f'            raise ValueError(f"{text}{{{expr_code(extent)}}}{more}{{{expr_code(size)}}}{hint}")'
            )
            continue
        tests = [(start, f"{expr_code(start)} < 0"), (extent - 1, f"{expr_code(extent)} < 1")]
        tests.append((size - start - extent, f"{expr_code(start + extent)} > {expr_code(size)}"))
        failing = [test for margin, test in tests if not margin.is_number]
        if not failing:
            continue  # all known when planning: graph/positions.py refused a range outside its axis
        text = source(f"{step.op.name}[{leg}: {shown_extent}] is ", "fstring")
        within = source(f" here: a range must hold at least one entry and lie within axis {leg}'s ", "fstring")
        here = f"{{{expr_code(start)}}}..{{{expr_code(start + extent)}}}{within}{{{expr_code(size)}}} entries"
        lines.append(f"        if {' or '.join(failing)}:")
        lines.append(f'            raise ValueError(f"{text}{here}")')
    return lines
