"""Points -> a cost table: each point's parameters, FLOPs, softmax-box entries, activation memory
and estimated training-step time, each a sympy formula (cost.py; the time model's own, plan/prices.py) and a number at
the given sizes; points that compute the same function grouped (canonical.py); the Pareto front
over chosen axes; ratios to a baseline and the sizes where the order changes. Nothing here builds a
module or imports torch."""

from __future__ import annotations

import csv
import io
import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import sympy

from ..cost import cost_report
from ..device import planning_device
from ..errors import Diagnostic, TdiagError
from ..files import OutputRefusedError, write_output
from ..graph import size_symbol
from ..plan import Plan
from ..plan.prices import priced_plan_time
from .canonical import CANONICAL_DEVICE, canonical_plan, canonical_program, trainable_products
from .points import Point, SpacePoints

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..design import Design

METRICS = ("params", "flops", "softmax_entries", "peak_memory", "time")
METRIC_TEXT = {
    "params": "params",
    "flops": "FLOPs",
    "softmax_entries": "softmax entries",
    "peak_memory": "saved memory",
    "time": "time (ms)",
}


@dataclass
class Row:
    """One point with its costs; `same` lists the other points that compute the same function."""

    point: Point
    formulas: dict[str, sympy.Expr] = field(default_factory=dict)
    numbers: dict[str, float] = field(default_factory=dict)
    key: tuple | None = None
    same: list[str] = field(default_factory=list)
    known: list[str] = field(default_factory=list)
    reparameterized: list[str] = field(default_factory=list)
    representative: bool = True
    front: bool = False
    ratios: dict[str, sympy.Expr] = field(default_factory=dict)
    crossovers: dict[str, list[float]] = field(default_factory=dict)
    base: dict[str, float] = field(default_factory=dict)  # the baseline's numbers, with --vs

    @property
    def label(self) -> str:
        return self.point.label


def cost_plan(design: Design, sizes: Mapping[str, int], objective: str) -> Plan:
    """The plan a point is costed by. Under `time` the planning device chooses it, so every
    column may differ from machine to machine (the report names the device); under `flops` and
    `memory` ties are priced on the canonical roofline, so only the time columns do."""
    if objective == "time":
        return design.plan(sizes, objective=objective)
    return design.plan(sizes, objective=objective, device=CANONICAL_DEVICE)


def cost_rows(points: Sequence[Point], at: Mapping[str, int], objective: str = "flops") -> list[Row]:
    """Plan and cost every point that built; group points with equal canonical forms (read from
    the canonical plan, whatever the objective: canonical.canonical_plan)."""
    rows = []
    groups: dict[tuple, Row] = {}
    for point in points:
        row = Row(point)
        rows.append(row)
        if not point.ok:
            continue
        design = point.design
        runtime = {k: v for k, v in at.items() if k in design.graph.sizes and design.graph.sizes[k].is_free}
        plan = cost_plan(design, runtime, objective)
        report = cost_report(plan)
        graph = design.graph
        # a size the point chooses is part of the point, not a variable: its value goes in
        chosen = {graph.sizes[k].symbol: graph.expand(graph.sizes[k].definition) for k in point.chosen_sizes}
        formulas = {k: v for k, v in report.formulas(named=False).items() if k in METRICS}
        row.formulas = {k: graph.expand(v).xreplace(chosen) for k, v in formulas.items()}
        sizes = {k: v for k, v in plan.sizes.items() if k != "B"}
        row.numbers = {k: float(graph.evaluate_at(v, sizes)) for k, v in row.formulas.items()}
        time = priced_plan_time(plan, planning_device(), lambda e, chosen=chosen: e.xreplace(chosen), B=1)
        row.formulas["time"], row.numbers["time"] = time.formula, 1000.0 * time.value
        canonical = canonical_plan(design, runtime)
        row.key = canonical_program(canonical)
        row.reparameterized = sorted(set(trainable_products(canonical)))
        first = groups.setdefault(row.key, row)
        if first is not row:
            row.representative = False
            first.same.append(point.label)
            row.same.append(first.label)
    return rows


def identify(rows: Sequence[Row], known: Mapping[str, tuple]) -> None:
    """Name the designs (by file stem) whose canonical programs equal each point's."""
    for row in rows:
        row.known = sorted(name for name, key in known.items() if row.key is not None and key == row.key)


def known_programs(files: Sequence[Path], at: Mapping[str, int]) -> dict[str, tuple]:
    """Canonical forms of other designs (e.g. the files beside the base) at the same sizes;
    a design that does not build at these sizes is left out."""
    from ..design import load

    found = {}
    for path in files:
        try:
            design = load(str(path))
            own = {k: v for k, v in at.items() if k in design.graph.sizes}
            fixed = {k: v for k, v in own.items() if not design.graph.sizes[k].is_free}
            if fixed:
                design = load(str(path), **fixed)
            runtime = {k: v for k, v in own.items() if design.graph.sizes[k].is_free}
            found[path.stem] = canonical_program(canonical_plan(design, runtime))
        except TdiagError:
            continue
    return found


def mark_front(rows: Sequence[Row], axes: Sequence[str]) -> None:
    """A point is on the Pareto front when no other point is as good on every axis and better on
    one (all axes are costs, smaller is better); one point per function."""
    candidates = [r for r in rows if r.point.ok and r.representative]
    for row in candidates:
        mine = [row.numbers[a] for a in axes]
        row.front = not any(
            all(o <= m for o, m in zip(other, mine, strict=True)) and other != mine
            for other in ([r.numbers[a] for a in axes] for r in candidates if r is not row)
        )


def compare_to(rows: Sequence[Row], baseline: Row, at: Mapping[str, int], along: str = "N") -> None:
    """Each point's cost over the baseline's as a formula, and the values of `along` (default N)
    where a point's FLOPs, memory or time cross the baseline's, the other sizes at `at`."""
    symbol = size_symbol(along)
    for row in rows:
        if not row.point.ok:
            continue
        row.base = baseline.numbers
        for metric in METRICS:
            mine, theirs = row.formulas[metric], baseline.formulas[metric]
            ratio = mine / theirs if theirs != 0 else sympy.nan
            row.ratios[metric] = ratio if metric == "time" else sympy.cancel(ratio)
            if metric == "params":
                continue
            values = row.point.design.graph.size_values() | baseline.point.design.graph.size_values()
            fixed = {size_symbol(k): v for k, v in (values | dict(at)).items() if k != along}
            difference = (mine - theirs).xreplace(fixed)
            row.crossovers[metric] = _roots(difference, symbol)


def _roots(expr: sympy.Expr, symbol: sympy.Symbol) -> list[float]:
    if expr == 0 or symbol not in expr.free_symbols:
        return []
    if expr.has(sympy.Max, sympy.Min):  # piecewise (the time roofline): scan for sign changes
        f = sympy.lambdify(symbol, expr, "math")
        points = [2.0**k for k in range(0, 25)]  # N from 1 to 16M
        found = []
        for lo, hi in itertools.pairwise(points):
            if (f(lo) > 0) != (f(hi) > 0):
                found.append(_bisect(f, lo, hi))
        return found
    try:
        numerator = sympy.numer(sympy.together(expr))
        roots = (
            sympy.Poly(numerator, symbol).nroots()
            if numerator.is_polynomial(symbol)
            else sympy.solve(numerator, symbol)
        )
    except (NotImplementedError, TypeError, sympy.PolynomialError, sympy.polys.polyerrors.DomainError):
        return []
    roots = [sympy.re(r) for r in roots if abs(sympy.im(r)) < 1e-9]
    return sorted(float(r) for r in roots if r.is_real and r >= 1)  # a size is at least 1


def _bisect(f, lo: float, hi: float) -> float:
    for _ in range(60):
        mid = (lo + hi) / 2
        if (f(lo) > 0) == (f(mid) > 0):
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def sort_rows(rows: list[Row], by: str) -> list[Row]:
    return sorted(rows, key=lambda r: (not r.point.ok, r.numbers.get(by, 0.0), r.label))


# ---- text, JSON, CSV, plot --------------------------------------------------------------------


TABLE = ("params", "flops", "peak_memory", "time")  # the columns a reader compares; all are in JSON/CSV
PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def _show(value: float, metric: str) -> str:
    """Parameters exactly (a trainable H x H factor is a few entries more); other figures in
    three significant digits with an SI prefix (`4.29G`); time in ms."""
    if metric == "time":
        return f"{value:.3g}"
    if metric == "params" and float(value).is_integer():
        return f"{round(value):,}"
    for scale, prefix in PREFIXES:
        if abs(value) >= scale:
            return f"{value / scale:.3g}{prefix}"
    return f"{round(value)}" if float(value).is_integer() else f"{value:.3g}"


def _same_text(row: Row, numbers: Mapping[str, int]) -> str:
    """The designs a point equals and the rows (by number) of the other points it equals."""
    return ", ".join([*(f"{k}.td" for k in row.known), *(f"#{numbers[label]}" for label in row.same)]) or "-"


def text_table(
    rows: Sequence[Row],
    at: Mapping[str, int],
    axes: Sequence[str],
    title: str,
    *,
    formulas: bool = False,
    objective: str = "flops",
) -> str:
    """One numbered row per point with the columns a reader compares (TABLE), the legend, and
    with `formulas` each distinct point's formulas in full below."""
    shown = ", ".join(f"{k}={v}" for k, v in at.items())
    numbers = {r.label: k for k, r in enumerate(rows, 1)}
    header = ["#", "", "point", *(METRIC_TEXT[m] for m in TABLE), "same function as"]
    body = []
    for k, r in enumerate(rows, 1):
        if not r.point.ok:
            body.append([str(k), "x", r.label, *["-"] * len(TABLE), "fails check: " + r.point.problems[0].message])
            continue
        mark = "*" if r.front else ("=" if not r.representative else "")
        cells = [_show(r.numbers[m], m) for m in TABLE]
        if r.base:
            cells = [
                f"{c} ({r.numbers[m] / r.base[m]:.3g}x)" if r.base[m] else c for c, m in zip(cells, TABLE, strict=True)
            ]
        body.append([str(k), mark + ("r" if r.reparameterized else ""), r.label, *cells, _same_text(r, numbers)])
    widths = [max(len(row[k]) for row in [header, *body]) for k in range(len(header))]
    device = planning_device().name
    planned = f"plans chosen by time on {device}" if objective == "time" else f"time on {device}"
    lines = [f"{title} at {shown or 'the base sizes'} (per sequence; {planned})", ""]
    numeric = {0, *range(3, 3 + len(TABLE))}
    for row in [header, *body]:
        cells = [c.rjust(w) if k in numeric else c.ljust(w) for k, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    ok = [r for r in rows if r.point.ok]
    lines += [
        "",
        f"{len(rows)} points, {len(ok)} pass check, {sum(r.representative for r in ok)} distinct functions",
        f"* on the Pareto front over ({', '.join(axes)})   = the same function as an earlier row",
        "r a product of trainable tensors where one parameter would do (a reparameterization)",
    ]
    if not formulas:
        lines.append("formulas: --formulas; softmax entries and every formula: --format json or csv")
        return "\n".join(lines)
    lines += ["", "formulas (per sequence; derived sizes expanded)"]
    for k, r in enumerate(rows, 1):
        if r.point.ok and r.representative:
            lines += _formula_lines(k, r)
    return "\n".join(lines)


def _formula_lines(number: int, row: Row) -> list[str]:
    """A distinct point's formulas, the time roofline in full (four significant digits)."""
    lines = [f"  #{number} {row.label}"]
    for m in METRICS:
        text = sympy.sstr(row.formulas[m].evalf(4)) if m == "time" else sympy.sstr(row.formulas[m])
        name = "time (s)" if m == "time" else METRIC_TEXT[m]  # the formula is in seconds, the column in ms
        lines.append(f"    {name:<16} {text}")
    lines += [f"    reparameterization: {note}" for note in row.reparameterized]
    if row.ratios:
        lines += [f"    {METRIC_TEXT[m] + ' ratio':<16} {sympy.sstr(row.ratios[m])}" for m in METRICS if m != "time"]
        for m, roots in row.crossovers.items():
            if roots:
                lines.append(f"    {METRIC_TEXT[m]} crosses the baseline at N = {', '.join(f'{x:.4g}' for x in roots)}")
    return lines


def as_dicts(rows: Sequence[Row]) -> list[dict]:
    out = []
    for r in rows:
        item: dict = {"point": r.point.name, "choices": r.point.choices, "ok": r.point.ok}
        if not r.point.ok:
            item["problems"] = [d.message for d in r.point.problems]
            out.append(item)
            continue
        for m in METRICS:
            item[m] = r.numbers[m]
            item[f"{m}_formula"] = sympy.sstr(r.formulas[m])
        item |= {
            "pareto": r.front,
            "distinct": r.representative,
            "same_function_as": r.same,
            "equals_design": r.known,
            "reparameterization": r.reparameterized,
        }
        if r.ratios:
            item["ratio"] = {m: sympy.sstr(v) for m, v in r.ratios.items()}
            item["crossover_N"] = r.crossovers
        out.append(item)
    return out


def to_json(rows: Sequence[Row], at: Mapping[str, int], objective: str = "flops") -> str:
    """The sizes, the objective and the devices the costs depend on, and every point."""
    devices = {"time_device": planning_device().describe(), "plan_device": CANONICAL_DEVICE.describe()}
    if objective == "time":
        devices["plan_device"] = devices["time_device"]  # the planning device chooses the plans
    return json.dumps({"sizes": dict(at), "objective": objective, **devices, "points": as_dicts(rows)}, indent=2)


def to_csv(rows: Sequence[Row]) -> str:
    buffer = io.StringIO()
    columns = ["point", "label", "ok", "pareto", "distinct", "equals_design", "same_function_as", "reparameterization"]
    columns += [*METRICS, *(f"{m}_formula" for m in METRICS)]
    writer = csv.DictWriter(buffer, columns, lineterminator="\n")
    writer.writeheader()
    for r, item in zip(rows, as_dicts(rows), strict=True):
        row = {"point": r.point.name, "label": r.label, "ok": r.point.ok}
        if r.point.ok:
            row |= {k: item[k] for k in columns if k in item and k not in ("point",)}
            for k in ("equals_design", "same_function_as", "reparameterization"):
                row[k] = "; ".join(item[k])
        writer.writerow(row)
    return buffer.getvalue()


def family(point: Point) -> str:
    """The family a point is drawn in: its option of the first top-level choice that is not a
    size (tuformer's core, fish's mixing, mgk's keys), else of the first choice."""
    choices = point.space.choices
    named = next((c for c in choices if not c.size), choices[0] if choices else None)
    if named is None or named.name not in point.choices:
        return point.space.name
    return f"{named.name}={point.choices[named.name]}"


def plot_figure(rows: Sequence[Row], x: str = "params", y: str = "flops", axes: Sequence[str] | None = None) -> Figure:
    """The figure `plot` writes: each distinct point on `x` against `y` (log scales), coloured by
    family, the Pareto front over `axes` (default x, y) ringed and joined by a line, and each point
    labelled with its row number (and the design it equals) where the label overlaps nothing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    numbers = {r.label: k for k, r in enumerate(rows, 1)}
    ok = [r for r in rows if r.point.ok and r.representative]
    fig, ax = plt.subplots(figsize=(9, 6))
    families = sorted({family(r.point) for r in ok})
    colours = plt.get_cmap("tab10" if len(families) <= 10 else "tab20")
    for k, name in enumerate(families):
        mine = [r for r in ok if family(r.point) == name]
        ax.scatter([r.numbers[x] for r in mine], [r.numbers[y] for r in mine], color=colours(k), label=name, zorder=3)
    front = sorted((r for r in ok if r.front), key=lambda r: (r.numbers[x], r.numbers[y]))
    over = ", ".join(axes or (x, y))
    ax.scatter(
        [r.numbers[x] for r in front],
        [r.numbers[y] for r in front],
        s=140,
        facecolors="none",
        edgecolors="black",
        zorder=4,
    )
    ax.plot(
        [r.numbers[x] for r in front],
        [r.numbers[y] for r in front],
        "-",
        color="black",
        lw=1.5,
        drawstyle="steps-post" if len(axes or (x, y)) == 2 else "default",
        label=f"Pareto front ({over})",
        zorder=2,
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(METRIC_TEXT[x])
    ax.set_ylabel(METRIC_TEXT[y])
    ax.margins(0.08)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    names = [(r, f"#{numbers[r.label]}" + "".join(f" {k}" for k in r.known)) for r in ok]
    _place_labels(fig, ax, [(r.numbers[x], r.numbers[y], text) for r, text in names])
    return fig


# where a label may go around its point, in points: right, left, above, below, then farther out
_OFFSETS = [(dx * k, dy * k) for k in (1, 2, 3, 4) for dx, dy in ((5, 3), (-5, 3), (5, -9), (-5, -9), (0, 8), (0, -14))]


def _place_labels(fig, ax, points: Sequence[tuple[float, float, str]]) -> list:
    """Annotate each point at the first offset where its label overlaps no placed label, no
    marker, the legend or the frame (beyond the nearest ring, with a leader line to its point);
    a label with no such place is left out (its row number is in the table)."""
    from matplotlib.text import Text
    from matplotlib.transforms import Bbox

    fig.canvas.draw()  # places the legend ("best") and fixes the transforms
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    taken = [ax.get_legend().get_window_extent(renderer)] if ax.get_legend() else []
    for px, py, _ in points:
        cx, cy = ax.transData.transform((px, py))
        taken.append(Bbox([[cx - 4, cy - 4], [cx + 4, cy + 4]]))
    placed = []
    for px, py, text in points:
        for ring, (dx, dy) in enumerate(_OFFSETS):
            leader = {"arrowprops": {"arrowstyle": "-", "lw": 0.5, "color": "0.5"}} if ring >= 6 else {}
            label = ax.annotate(
                text,
                (px, py),
                xytext=(dx, dy),
                textcoords="offset points",
                fontsize=7,
                ha="left" if dx >= 0 else "right",
                **leader,
            )
            label.update_positions(renderer)
            box = Text.get_window_extent(label, renderer)  # the text alone, not its leader line
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            if inside and not any(box.overlaps(other) for other in taken):
                taken.append(box)
                placed.append(label)
                break
            label.remove()
    return placed


def plot(
    rows: Sequence[Row], path: Path, x: str = "params", y: str = "flops", axes: Sequence[str] | None = None
) -> Path:
    """Write `plot_figure` to `path` in the format its suffix names."""
    import matplotlib.pyplot as plt

    fig = plot_figure(rows, x, y, axes)
    image = io.BytesIO()
    try:
        fig.savefig(image, format=path.suffix.lstrip(".").lower() or "png", dpi=120)
    except ValueError as error:  # a format matplotlib does not write
        raise OutputRefusedError(Diagnostic(f"--plot {path}: {error}")) from None
    finally:
        plt.close(fig)
    return write_output(path, image.getvalue(), flag="--plot")


def evaluate(
    space: SpacePoints,
    at: Mapping[str, int],
    *,
    axes: Sequence[str] = ("params", "flops"),
    known: Mapping[str, tuple] | None = None,
    objective: str = "flops",
) -> list[Row]:
    """Build, check and cost every point at `at`; group, identify and mark the front."""
    points = [p.build(at) for p in space.points()]
    rows = cost_rows(points, at, objective)
    identify(rows, known or {})
    mark_front(rows, axes)
    return rows
