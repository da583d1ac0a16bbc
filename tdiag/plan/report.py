"""The lowered program as a table a person reads, like opt_einsum's PathInfo: one row per op with
its result and layout, FLOPs, bytes moved, bytes kept for backward and copies it makes, then the
totals and the rewrites taken and refused (and why)."""

from __future__ import annotations

from collections.abc import Mapping

import sympy

from .footprint import footprint
from .program import BATCH_SIZE, Plan, show_legs


def _number(plan: Plan, expr: sympy.Expr, sizes: Mapping[str, int]) -> int:
    graph = plan.graph
    value = graph.evaluate(sympy.sympify(expr), **{k: v for k, v in sizes.items() if k in graph.sizes})
    return int(sympy.ceiling(value.xreplace({BATCH_SIZE: sizes.get("B", 1)})))


def _show(value: int) -> str:
    return f"{value:,}" if value else "-"


def plan_table(plan: Plan, sizes: Mapping[str, int] | None = None) -> str:
    """The plan at `sizes` (default: the sizes it was planned for), per sequence unless B is given."""
    at = {k: v for k, v in plan.sizes.items() if k != "B"} | dict(sizes or {})
    fp = footprint(plan)
    rows = []
    for k, (step, record) in enumerate(zip([*plan.steps, *plan.update_steps], fp.steps, strict=True)):
        result = f"{step.out.var}[{' '.join(show_legs(step.out.legs))}]" if step.out else ""
        notes = [step.description] if step.description else []
        copies = _number(plan, record.copies, at)
        if copies:
            notes.append(f"copies {copies:,} entries")
        if record.kernel:
            notes.append(f"SDPA kernel: {record.kernel}")
        rows.append(
            (
                str(k + 1),
                step.kind,
                result,
                _show(_number(plan, step.flops, at)),
                _show(_number(plan, record.moved, at)),
                _show(_number(plan, fp.saved_at(k), at)),
                "; ".join(notes),
            )
        )
    header = ("#", "op", "result [layout]", "FLOPs", "bytes moved", "bytes saved", "what")
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header) - 1)]
    right = {0, 3, 4, 5}

    def line(row: tuple[str, ...]) -> str:
        cells = [row[c].rjust(w) if c in right else row[c].ljust(w) for c, w in enumerate(widths)]
        return "  ".join([*cells, row[-1]]).rstrip()

    shown = ", ".join(f"{k}={v}" for k, v in at.items())
    flops = sum(_number(plan, s.flops, at) for s in plan.steps)
    moved = sum(_number(plan, r.moved, at) for r in fp.steps)
    copies = sum(_number(plan, r.copies, at) for r in fp.steps)
    saved = _number(plan, fp.saved_bytes, at)
    lines = [f"plan of {plan.graph.name} at {shown}, per sequence (B={at.get('B', 1)}), float32", ""]
    lines += [line(header), *map(line, rows), ""]
    lines.append(
        f"total: {flops:,} FLOPs, {moved:,} bytes moved, {saved:,} bytes kept for backward, "
        f"{copies:,} entries copied by reshapes and matmuls"
    )
    lines += ["", "rewrites taken:"] + [f"  {note}" for note in plan.lowered or ["none"]]
    lines += ["rewrites refused:"] + [f"  {note}" for note in plan.refused or ["none"]]
    return "\n".join(lines)
