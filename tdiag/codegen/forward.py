"""forward as a whole: its signature, the decoding cache's door, the entry, the body (a
checkpointed segment as a nested function), the state updates and the outputs, with the
planner's fresh names numbered again from 1 so that equal programs print equal text."""

from __future__ import annotations

import re

from ..graph.causal import hides_the_future
from ..plan import Plan, reads
from .entry import entry_lines
from .state import TABLED, TABLES_END
from .steps import step_lines, steps_lines
from .tables import table_lines, table_steps
from .text import IDENTIFIER, shape_args, size_code, source


def forward_method(plan: Plan) -> list[str]:
    """forward: read and check the inputs, run the steps, return the outputs."""
    return forward_and_tables(plan)[0]


def forward_and_tables(plan: Plan) -> tuple[list[str], list[str]]:
    """forward's lines and the lines that make its constant tables (TABLE_PREFIX buffers), the two
    renumbered together so that the names forward reads are the names the tables define."""
    token = TABLED.set(frozenset(id(step) for step in table_steps(plan)))
    try:
        forward = _forward_lines(plan)
    finally:
        TABLED.reset(token)
    tables = table_lines(plan)
    lines = _renumbered([*tables, TABLES_END, *forward], plan)
    end = lines.index(TABLES_END)
    return lines[end + 1 :], lines[:end]


def _forward_lines(plan: Plan) -> list[str]:
    graph = plan.graph
    inputs = [source(plan.names[t.name], "name") for t in graph.inputs]
    masks = [source(plan.names[t.name], "name") for t in graph.tensors_of_kind("mask")]
    signature = ", ".join(
        ["self", *(f"{v}: torch.Tensor" for v in inputs)]
        + (["*", *(f"{m}: torch.Tensor | None = None" for m in masks)] if masks else [])
        + _cache_parameter(plan, keywords=bool(masks))
    )
    returns = "torch.Tensor" if len(graph.outputs) == 1 else "tuple[torch.Tensor, ...]"
    lines = [f"    def forward({signature}) -> {returns}:"]
    lines += ["        " + line for line in _cache_entry(plan, inputs, masks)]
    lines += ["        " + line for line in entry_lines(plan)]
    lines += _body(plan)
    if plan.update_steps:
        lines.append("        if self.training:  # state updates, never by gradient")
        lines.append("            with torch.no_grad():")
        for step in plan.update_steps:
            lines += ["        " + line for line in step_lines(step, plan)]
    outs = []
    for name, value in plan.outputs:
        tensor = graph.tensors[name]
        shape = ", ".join(size_code(graph, a.size) for a in tensor.axes)
        batch = "*batch_shape" if value.is_batched else ""
        outs.append(f"{source(value.var, 'name')}.reshape({shape_args(batch, shape)})")
    lines.append(f"        return {', '.join(outs)}")
    return _renumbered(lines, plan)


def _renumbered(lines: list[str], plan: Plan) -> list[str]:
    """forward with the planner's fresh names (t_2871, causal_2880, and X_chunks_2869 made from
    them) numbered again from 1 per stem in the order they first appear, so that a reader sees
    t_1, t_2, ... and two plans that print the same steps print the same text (calls.py
    shares one body between them). Names of the .td file, sizes and stored tensors stay."""
    graph = plan.graph
    counts = {c.name for c in plan.chunks if not re.fullmatch(r".+_[0-9]+_[0-9]+", c.name)}  # chunks_8: 8 a size
    kept = {*graph.tensors, *graph.sizes, *plan.names.values(), *plan.attributes, *counts}
    fresh = {step.out.var for step in [*plan.steps, *plan.update_steps] if step.out is not None}
    fresh |= set(plan.causal.values()) | {c.name for c in plan.chunks}
    fresh = {var for var in fresh if var not in kept and _NUMBERED.fullmatch(var)}
    if not fresh:
        return lines
    text = "\n".join(lines)
    pattern = re.compile(
        r"(?<![\w.])(" + "|".join(sorted(map(re.escape, fresh), key=len, reverse=True)) + r")(?![0-9A-Za-z])"
    )
    before = set(IDENTIFIER.findall(text))
    taken = before - fresh
    new: dict[str, str] = {}
    counts: dict[str, int] = {}
    for found in pattern.finditer(text):
        var = found.group(1)
        if var in new:
            continue
        stem = _NUMBERED.fullmatch(var).group(1)  # type: ignore[union-attr]
        while True:
            counts[stem] = counts.get(stem, 0) + 1
            name = f"{stem}_{counts[stem]}"
            if name not in taken:
                break
        new[var] = name
        taken.add(name)
    renamed = pattern.sub(lambda found: new[found.group(1)], text)
    if len(set(IDENTIFIER.findall(renamed))) != len(before):  # a derived name met another: keep the plan's
        return lines
    return renamed.split("\n")


_NUMBERED = re.compile(r"(.+)_([0-9]+)")


def decodes(plan: Plan) -> bool:
    """Whether the module takes a decoding cache: a causal design of one input (tdiag/decode.py)."""
    return len(plan.graph.inputs) == 1 and hides_the_future(plan.graph)


def _cache_parameter(plan: Plan, *, keywords: bool) -> list[str]:
    """`cache=None` among the keyword arguments of a module that decodes."""
    if not decodes(plan):
        return []
    return ["cache=None"] if keywords else ["*", "cache=None"]


def _cache_entry(plan: Plan, inputs: list[str], masks: list[str]) -> list[str]:
    """With a cache (tdiag.DecodeCache, from module.new_cache()), the positions of the input come
    after those the cache holds: the cache computes them from what it holds and extends itself."""
    if not decodes(plan):
        return []
    given = "".join(f", {m}={m}" for m in masks)
    return ["if cache is not None:", f"    return _extend(cache, {inputs[0]}, self{given})"]


def _body(plan: Plan) -> list[str]:
    """The steps; a checkpointed segment becomes a nested function run by torch's checkpoint."""
    lines: list[str] = []
    starts = {start: end for start, end in plan.segments}
    k = 0
    while k < len(plan.steps):
        if k not in starts:
            end = min([start for start in starts if start > k], default=len(plan.steps))
            lines += steps_lines(plan.steps[k:end], plan)
            k = end
            continue
        end = starts[k]
        inner = steps_lines(plan.steps[k : end + 1], plan)
        results = _escaping(plan, k, end)
        name = _fresh(f"_box_{k}", plan)
        lines.append(f"        def {name}():  # recomputed in the backward pass instead of kept")
        lines += ["    " + line for line in inner]
        lines.append(f"            return {', '.join(results)}{',' if len(results) == 1 else ''}")
        lines.append(f"        {', '.join(results)}, = torch.utils.checkpoint.checkpoint({name}, use_reentrant=False)")
        k = end + 1
    return lines


def _fresh(stem: str, plan: Plan) -> str:
    """A name for a generated helper that no variable of the plan and no size uses."""
    taken = {*plan.graph.sizes, *plan.names.values(), *plan.attributes, *(c.name for c in plan.chunks)}
    taken |= {step.out.var for step in [*plan.steps, *plan.update_steps] if step.out is not None}
    name = stem
    while name in taken:
        name += "_"
    return source(name, "name")


def _escaping(plan: Plan, start: int, end: int) -> list[str]:
    """Variables that steps start..end define and later steps, the outputs or updates read."""
    later = [*plan.steps[end + 1 :], *plan.update_steps]
    read = {v.var for step in later for v in reads(step.op)} | {v.var for _, v in plan.outputs}
    defined = [step.out.var for step in plan.steps[start : end + 1] if step.out is not None]
    return [var for var in dict.fromkeys(defined) if var in read]
