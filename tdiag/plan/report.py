"""The lowered program as a table a person reads, like opt_einsum's PathInfo: one row per op with
its result and layout, FLOPs, bytes moved, bytes kept for backward and copies it makes, then the
totals, each box's candidate forms (forms/: predicted time, bytes kept, FLOPs, the one taken,
why the others do not apply) and the rewrites taken and refused (and why)."""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import dataclass

import sympy

from .footprint import footprint
from .program import BATCH_SIZE, PLAN_VIEWS, Plan, show_legs


def _number(plan: Plan, expr: sympy.Expr, sizes: Mapping[str, int]) -> int:
    graph = plan.graph
    value = graph.evaluate(sympy.sympify(expr), **{k: v for k, v in sizes.items() if k in graph.sizes})
    return int(sympy.ceiling(value.xreplace({BATCH_SIZE: sizes.get("B", 1)})))


def _show(value: int) -> str:
    return f"{value:,}" if value else "-"


def _bytes(count: float) -> str:
    """Bytes in decimal units, three digits: `4.21 MB`."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.3g} {unit}"
    return f"{count:.0f} B"


CHOICE_HEADER = ("", "form", "time (ms)", "kept", "FLOPs", "")
CHOICE_RIGHT = (2, 3, 4)
TAKEN = "*"


@dataclass
class _Choice:
    """One box's candidates as rows: mark, form, time, kept, FLOPs, and `taken` or the reason."""

    title: str
    rows: list[tuple[str, ...]]


def _choices(plan: Plan) -> list[_Choice]:
    """Each box decision of the plan (its `choices`), applicable forms first in FORMS order."""
    shown = []
    for choice in plan.choices:
        rows: list[tuple[str, ...]] = []
        for c in sorted(choice.candidates, key=lambda c: c.cost is None):
            mark = TAKEN if c.form == choice.taken else ""
            if c.cost is None:
                rows.append((mark, c.form, "-", "-", "-", f"does not apply: {c.refusal}"))
                continue
            note = "taken" if c.form == choice.taken else ""
            cost = c.cost
            rows.append((mark, c.form, f"{cost.time * 1e3:.3f}", _bytes(cost.kept), f"{cost.flops:,}", note))
        rule = f"; {choice.rule}" if choice.rule else ""
        shown.append(_Choice(f"{choice.site} (objective {choice.objective}{rule})", rows))
    return shown


def _choices_title(plan: Plan) -> str:
    at = ", ".join(f"{k}={v}" for k, v in plan.sizes.items())
    return f"box forms at the sizes planned for ({at}), a training step (forward and backward), {TAKEN} taken:"


@dataclass
class _Table:
    """The plan's rows and totals at some sizes, before they are formatted as text, HTML or Markdown."""

    title: str
    rows: list[tuple[str, ...]]
    formulas: list[sympy.Expr]  # each step's FLOPs per sequence, in the size symbols
    total: str
    lowered: list[str]
    refused: list[str]
    choices: list[_Choice]


HEADER = ("#", "op", "result [layout]", "FLOPs", "bytes moved", "bytes saved", "what")
RIGHT = (0, 3, 4, 5)


def _table(plan: Plan, sizes: Mapping[str, int] | None) -> _Table:
    at = {k: v for k, v in plan.sizes.items() if k != "B"} | dict(sizes or {})
    fp = footprint(plan, at | {"B": at.get("B", 1)})
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
        choices=_choices(plan),
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
    if table.choices:
        lines += ["", _choices_title(plan)]
        for choice in table.choices:
            lines += [f"  {choice.title}", *_aligned(choice.rows)]
    lines += ["", "rewrites taken:"] + [f"  {note}" for note in table.lowered or ["none"]]
    lines += ["rewrites refused:"] + [f"  {note}" for note in table.refused or ["none"]]
    return "\n".join(lines)


def _aligned(rows: list[tuple[str, ...]]) -> list[str]:
    """Candidate rows as text columns, under their header, indented under the box."""
    every = [CHOICE_HEADER, *rows]
    widths = [max(len(r[c]) for r in every) for c in range(len(CHOICE_HEADER) - 1)]

    def line(row: tuple[str, ...]) -> str:
        cells = [row[c].rjust(w) if c in CHOICE_RIGHT else row[c].ljust(w) for c, w in enumerate(widths)]
        return ("    " + "  ".join([*cells, row[-1]])).rstrip()

    return [line(row) for row in every]


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
    choices = ""
    if table.choices:
        choices = f"<p>{html.escape(_choices_title(plan))}</p>" + "".join(
            f"<p>{html.escape(c.title)}</p>" + html_table(CHOICE_HEADER, c.rows, right=CHOICE_RIGHT)
            for c in table.choices
        )
    return (
        heading_html(table.title)
        + html_table(header, rows, right=right)
        + f"<p>{html.escape(table.total)}</p>"
        + choices
        + notes
    )


def plan_markdown(plan: Plan, sizes: Mapping[str, int] | None = None) -> str:
    """The plan table as Markdown for Jupyter, FLOPs as LaTeX formulas and numbers."""
    from ..notebook import formula_latex, markdown_table, markdown_text

    table = _table(plan, sizes)
    header, rows, right = _with_formulas(table, formula_latex)
    lines = [f"**{markdown_text(table.title)}**", "", markdown_table(header, rows, right=right), ""]
    lines += [markdown_text(table.total), ""]
    if table.choices:
        lines += [markdown_text(_choices_title(plan)), ""]
        for c in table.choices:
            lines += [markdown_text(c.title), "", markdown_table(CHOICE_HEADER, c.rows, right=CHOICE_RIGHT), ""]
    lines.append(markdown_text("rewrites taken: " + ("; ".join(table.lowered) or "none")))
    lines.append("")
    lines.append(markdown_text("rewrites refused: " + ("; ".join(table.refused) or "none")))
    return "\n".join(lines)


PLAN_VIEWS.update(text=plan_table, html=plan_html, markdown=plan_markdown)
