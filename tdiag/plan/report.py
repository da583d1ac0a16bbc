"""The lowered program as a table a person reads, like opt_einsum's PathInfo: one row per op with
its result and layout, FLOPs, bytes moved, bytes kept for backward and copies it makes, then the
totals and the rewrites taken and refused (and why)."""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import dataclass

import sympy

from .footprint import footprint
from .program import BATCH_SIZE, Plan, show_legs


def _number(plan: Plan, expr: sympy.Expr, sizes: Mapping[str, int]) -> int:
    graph = plan.graph
    value = graph.evaluate(sympy.sympify(expr), **{k: v for k, v in sizes.items() if k in graph.sizes})
    return int(sympy.ceiling(value.xreplace({BATCH_SIZE: sizes.get("B", 1)})))


def _show(value: int) -> str:
    return f"{value:,}" if value else "-"


@dataclass
class _Table:
    """The plan's rows and totals at some sizes, before they are formatted as text, HTML or Markdown."""

    title: str
    rows: list[tuple[str, ...]]
    formulas: list[sympy.Expr]  # each step's FLOPs per sequence, in the size symbols
    total: str
    lowered: list[str]
    refused: list[str]


HEADER = ("#", "op", "result [layout]", "FLOPs", "bytes moved", "bytes saved", "what")
RIGHT = (0, 3, 4, 5)


def _table(plan: Plan, sizes: Mapping[str, int] | None) -> _Table:
    at = {k: v for k, v in plan.sizes.items() if k != "B"} | dict(sizes or {})
    fp = footprint(plan)
    rows = []
    steps = [*plan.steps, *plan.update_steps]
    for k, (step, record) in enumerate(zip(steps, fp.steps, strict=True)):
        result = f"{step.out.var}[{' '.join(show_legs(step.out.legs))}]" if step.out else ""
        notes = [step.description] if step.description else []
        copies = _number(plan, record.copies, at)
        if copies:
            notes.append(f"copies {copies:,} entries")
        if record.kernel:
            notes.append(f"SDPA kernel: {record.kernel}")
        if step.training_only:
            notes.append("training only (train-mode noise: zero in eval)")
        elif step.eval_op is not None:
            notes.append("eval mode drops its noise terms")
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
    shown = ", ".join(f"{k}={v}" for k, v in at.items())
    flops = sum(_number(plan, s.flops, at) for s in plan.steps)
    moved = sum(_number(plan, r.moved, at) for r in fp.steps)
    copies = sum(_number(plan, r.copies, at) for r in fp.steps)
    saved = _number(plan, fp.saved_bytes, at)
    return _Table(
        title=f"plan of {plan.graph.name} at {shown}, per sequence (B={at.get('B', 1)}), float32",
        rows=rows,
        formulas=[sympy.factor(sympy.sympify(s.flops).xreplace({BATCH_SIZE: 1})) for s in steps],
        total=(
            f"total: {flops:,} FLOPs, {moved:,} bytes moved, {saved:,} bytes kept for backward, "
            f"{copies:,} entries copied by reshapes and matmuls"
        ),
        lowered=list(plan.lowered),
        refused=list(plan.refused),
    )


def plan_table(plan: Plan, sizes: Mapping[str, int] | None = None) -> str:
    """The plan at `sizes` (default: the sizes it was planned for), per sequence unless B is given."""
    table = _table(plan, sizes)
    widths = [max(len(r[c]) for r in [HEADER, *table.rows]) for c in range(len(HEADER) - 1)]

    def line(row: tuple[str, ...]) -> str:
        cells = [row[c].rjust(w) if c in RIGHT else row[c].ljust(w) for c, w in enumerate(widths)]
        return "  ".join([*cells, row[-1]]).rstrip()

    lines = [table.title, *_device_lines(plan), ""]
    lines += [line(HEADER), *map(line, table.rows), ""]
    lines.append(table.total)
    lines += ["", "rewrites taken:"] + [f"  {note}" for note in table.lowered or ["none"]]
    lines += ["rewrites refused:"] + [f"  {note}" for note in table.refused or ["none"]]
    return "\n".join(lines)


def _device_lines(plan: Plan) -> list[str]:
    """The device the `time` objective planned on, and the whole plans it compared (objective.py)."""
    from .objective import comparison_text

    if plan.device is None:
        return []
    return [f"planning device: {plan.device.describe()}", comparison_text(plan)]


def _with_formulas(table: _Table, show) -> tuple[tuple[str, ...], list[tuple[str, ...]], list[int]]:
    """The rows with a column for each step's FLOPs as a formula, next to the number."""
    header = (*HEADER[:3], "FLOPs formula", *HEADER[3:])
    rows = [(*row[:3], show(f) if f != 0 else "-", *row[3:]) for row, f in zip(table.rows, table.formulas, strict=True)]
    return header, rows, [0, 4, 5, 6]


def plan_html(plan: Plan, sizes: Mapping[str, int] | None = None) -> str:
    """The plan table as HTML for Jupyter, FLOPs as formulas and numbers."""
    from ..notebook import formula_text, heading_html, html_table

    table = _table(plan, sizes)
    header, rows, right = _with_formulas(table, formula_text)
    notes = "".join(
        f"<p>{html.escape(name)}: {html.escape('; '.join(items) or 'none')}</p>"
        for name, items in (("rewrites taken", table.lowered), ("rewrites refused", table.refused))
    )
    return (
        heading_html(table.title) + html_table(header, rows, right=right) + f"<p>{html.escape(table.total)}</p>" + notes
    )


def plan_markdown(plan: Plan, sizes: Mapping[str, int] | None = None) -> str:
    """The plan table as Markdown for Jupyter, FLOPs as LaTeX formulas and numbers."""
    from ..notebook import formula_latex, markdown_table, markdown_text

    table = _table(plan, sizes)
    header, rows, right = _with_formulas(table, formula_latex)
    lines = [f"**{markdown_text(table.title)}**", "", markdown_table(header, rows, right=right), ""]
    lines += [markdown_text(table.total), ""]
    lines.append(markdown_text("rewrites taken: " + ("; ".join(table.lowered) or "none")))
    lines.append("")
    lines.append(markdown_text("rewrites refused: " + ("; ".join(table.refused) or "none")))
    return "\n".join(lines)
