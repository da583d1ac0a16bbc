"""Constant tables: steps whose values depend on sizes fixed when the module is built (RoPE's
positions over half a head and their frequencies) are computed once there, as buffers named
TABLE_PREFIX + the variable, and forward reads them."""

from __future__ import annotations

import re

from ..plan import Plan, Step, reads
from ..plan.program import Positions
from .ops import op_code
from .state import TABLE_PREFIX, UNTABLED
from .steps import step_lines
from .text import IDENTIFIER, source


def table_steps(plan: Plan) -> list[Step]:
    """Steps whose values depend on sizes fixed at build time alone: positions over a fixed size
    (RoPE's index(p) over half a head) and what is computed from them only (its frequencies
    Θ^(−2p/D)). Computed once when the module is built, not on every call; positions over the
    call's length N, and anything reading an input, parameter, mask or noise, stay in forward."""
    graph = plan.graph
    inputs = {source(plan.names[t.name], "name") for t in graph.inputs}
    boxed = {k for start, end in plan.segments for k in range(start, end + 1)}
    forbidden = {*(k for k, size in graph.sizes.items() if size.is_free), "B", "batch_shape", "self"}
    forbidden |= {source(c.name, "name") for c in plan.chunks} | set(plan.causal.values())
    forbidden |= {v for t in graph.tensors.values() if t.name in plan.names for v in [plan.names[t.name]]} - inputs
    others = {step.out.var for step in [*plan.steps, *plan.update_steps] if step.out is not None}
    table: dict[str, Step] = {}
    if id(plan) in UNTABLED.get():
        return []
    for k, step in enumerate(plan.steps):
        if step.out is None or step.wide or step.training_only or step.eval_op is not None or k in boxed:
            continue
        read = {value.var for value in reads(step.op)}
        root = isinstance(step.op, Positions) and not read
        if not (root or (read and read <= set(table))):
            continue
        code = op_code(step.op, plan.attributes)
        names = set(IDENTIFIER.findall(re.sub(r"\b\w+\.(dtype|device)\b", "", code)))
        if names & (forbidden | inputs) or "rand" in code:
            continue
        if names & (others - set(table)):
            continue
        table[step.out.var] = step
    return list(table.values())


def table_reads(plan: Plan) -> list[str]:
    """The table values that forward reads (a later step, an update or an output)."""
    steps = table_steps(plan)
    defined = {step.out.var for step in steps if step.out is not None}
    tabled = {id(step) for step in steps}
    rest = [step for step in [*plan.steps, *plan.update_steps] if id(step) not in tabled]
    read = {v.var for step in rest for v in reads(step.op)} | {v.var for _, v in plan.outputs}
    return [
        var for var in dict.fromkeys(step.out.var for step in steps if step.out is not None) if var in read & defined
    ]


def table_lines(plan: Plan) -> list[str]:
    """The statements that make the tables, at the dtype and device of the empty inputs they see."""
    steps = table_steps(plan)
    if not steps:
        return []
    lines: list[str] = []
    for step in steps:
        lines += step_lines(step, plan)
    stored = table_reads(plan)
    lines += [f'        self.register_buffer("{TABLE_PREFIX}{var}", {var}, persistent=False)' for var in stored]
    return lines
