"""Points -> a cost table: each point's parameters, FLOPs, softmax-box entries, activation memory
and estimated training-step time, each a sympy formula (cost.py, plan/timing.py) and a number at
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

import sympy

from ..cost import cost_report
from ..device import planning_device
from ..errors import Diagnostic, TdiagError
from ..files import OutputRefusedError, write_output
from ..graph import size_symbol
from ..plan import BATCH_SIZE
from ..plan.footprint import footprint
from ..plan.timing import FORWARD_AND_BACKWARD, KERNELS_PER_OP, plan_time
from .canonical import CANONICAL_DEVICE, canonical_plan, canonical_program, trainable_products
from .points import Point, SpacePoints

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


def time_formula(plan, chosen: Mapping[sympy.Symbol, sympy.Expr] | None = None) -> sympy.Expr:
    """The `time` objective's estimate (plan/timing.py) as a formula in the sizes: per op, the
    longer of its FLOPs at the device's peak and its bytes at the bandwidth, forward and backward,
    plus the per-kernel overhead; B = 1."""
    device = planning_device()
    records = footprint(plan).steps
    total = sympy.Integer(0)
    graph = plan.graph

    def expanded(expr: object) -> sympy.Expr:  # before the Max is built: rebuilding one is slow
        return graph.expand(sympy.sympify(expr)).xreplace({BATCH_SIZE: 1, **(chosen or {})})

    for step, record in zip([*plan.steps, *plan.update_steps], records, strict=True):
        flops = expanded(step.flops) * FORWARD_AND_BACKWARD / sympy.Float(device.peak_flops)
        moved = expanded(record.moved) * FORWARD_AND_BACKWARD / sympy.Float(device.bandwidth)
        total += sympy.Max(flops, moved, evaluate=False) + KERNELS_PER_OP * sympy.Float(device.overhead)
    return total


def cost_plan(design, sizes: Mapping[str, int], objective: str):
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
        formulas = {k: v for k, v in report.formulas().items() if k in METRICS}
        row.formulas = {k: graph.expand(v).xreplace(chosen) for k, v in formulas.items()}
        sizes = {k: v for k, v in plan.sizes.items() if k != "B"}
        row.numbers = {k: float(graph.evaluate_at(v, sizes)) for k, v in row.formulas.items()}
        row.formulas["time"] = time_formula(plan, chosen)
        row.numbers["time"] = 1000.0 * plan_time(plan, planning_device(), B=1)
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


def _show(value: float, metric: str) -> str:
    if metric == "time":
        return f"{value:.3g}"
    return f"{round(value):,}" if float(value).is_integer() else f"{value:.4g}"


def text_table(rows: Sequence[Row], at: Mapping[str, int], axes: Sequence[str], title: str) -> str:
    shown = ", ".join(f"{k}={v}" for k, v in at.items())
    header = ["", "point", *(METRIC_TEXT[m] for m in METRICS), "same function as"]
    body = []
    for r in rows:
        if not r.point.ok:
            body.append(["x", r.label, *["-"] * len(METRICS), "fails check: " + r.point.problems[0].message])
            continue
        same = ", ".join([*(f"{k}.td" for k in r.known), *r.same]) or "-"
        mark = "*" if r.front else ("=" if not r.representative else "")
        cells = [_show(r.numbers[m], m) for m in METRICS]
        if r.base:
            cells = [
                f"{c} ({r.numbers[m] / r.base[m]:.3g}x)" if r.base[m] else c
                for c, m in zip(cells, METRICS, strict=True)
            ]
        body.append([mark + ("r" if r.reparameterized else ""), r.label, *cells, same])
    widths = [max(len(row[k]) for row in [header, *body]) for k in range(len(header))]
    lines = [f"{title} at {shown or 'the base sizes'} (per sequence; time on {planning_device().name})", ""]
    for row in [header, *body]:
        lines.append(
            "  ".join(
                c.rjust(w) if 2 <= k < 2 + len(METRICS) else c.ljust(w)
                for k, (c, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
        )
    ok = [r for r in rows if r.point.ok]
    lines += [
        "",
        f"{len(rows)} points, {len(ok)} pass check, {sum(r.representative for r in ok)} distinct functions; "
        f"* Pareto front over ({', '.join(axes)}), = same function as an earlier point, "
        "r a product of trainable tensors where one would do",
    ]
    lines += ["", "formulas (per sequence; derived sizes expanded)"]
    for r in ok:
        if not r.representative:
            continue
        lines.append(f"  {r.label}")
        lines += [
            f"    {m:<16} {sympy.sstr(r.formulas[m]) if m != 'time' else _time_text(r.formulas[m])}" for m in METRICS
        ]
        lines += [f"    reparameterization: {note}" for note in r.reparameterized]
        if r.ratios:
            lines += [f"    {m + ' ratio':<16} {sympy.sstr(r.ratios[m])}" for m in METRICS if m != "time"]
            for m, roots in r.crossovers.items():
                if roots:
                    lines.append(f"    {m} crosses the baseline at N = {', '.join(f'{x:.4g}' for x in roots)}")
    return "\n".join(lines)


def _time_text(expr: sympy.Expr) -> str:
    return (
        sympy.sstr(expr.evalf(4))
        if len(sympy.sstr(expr)) < 400
        else f"{len(expr.args)} roofline terms (see --format json)"
    )


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


def plot(rows: Sequence[Row], path: Path, x: str = "params", y: str = "flops") -> Path:
    """Points on `x` against `y` (log scales), the Pareto front highlighted, points labelled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.point.ok and r.representative]
    fig, ax = plt.subplots(figsize=(9, 6))
    ax.scatter(
        [r.numbers[x] for r in ok], [r.numbers[y] for r in ok], c=["tab:red" if r.front else "tab:gray" for r in ok]
    )
    front = sorted((r for r in ok if r.front), key=lambda r: r.numbers[x])
    ax.plot([r.numbers[x] for r in front], [r.numbers[y] for r in front], "r--", lw=1, label="Pareto front")
    for r in ok:
        name = ", ".join(r.known) or r.label
        ax.annotate(name, (r.numbers[x], r.numbers[y]), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(METRIC_TEXT[x])
    ax.set_ylabel(METRIC_TEXT[y])
    ax.legend()
    fig.tight_layout()
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
