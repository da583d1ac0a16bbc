"""Plan -> CostReport: parameters, FLOPs of the chosen plan, softmax-box entries and the
activation memory a training step holds, each a sympy formula in the size symbols (per sequence,
B = 1) and a number at given sizes. Costs are read off the same ops that codegen prints, so they
describe the code: `peak_memory` is what autograd keeps for the backward pass after the forward
(plan/footprint.py: copies included, parameters and inputs excluded), in float32 entries (a
boolean mask entry counts a quarter), the peak of a training step's activations.

Conventions for contractions (FiSH App. D, MGK App. B count differently from opt_einsum):
- flop: 2 per multiply-add (the default);
- mac: 1 per multiply-add (fvcore's count);
- paper: a k-term sum costs 2k − 1 per output element (a multiply and an add each).
Softmax exponentials and divisions, and other elementwise work, are reported apart: every
elementwise map (exp log relu elu1 sigmoid tanh softplus silu gelu sin cos sqrt abs clamp pow, and
max or min with a bound) counts one elementwise operation per element it produces, whatever its
inner arithmetic, in `elementwise`, never in `flops`; so does each addition of a sum node and each scaling.

`flops` counts every entry of a causal attention, the papers' convention; `kernel_flops` counts
what a kernel that skips the key blocks above the diagonal does (SDPA's is_causal, a
FlexAttention causal block mask: about half at long N, plan/program.py `causal_kernel_flops`),
which the `time` objective's model uses. The two differ only where a causal box is fused so.

The fields are the executed counts, every planner-chosen number in them a number; `formulas()`
writes them in the design's sizes with those numbers named (cost_constants.py: the chunk C of a
chunked causal order), each with a legend line (`legend()`), and `at()` puts the numbers back."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import sympy

from .cost_constants import Naming, PlannerConstant, naming, step_spaces
from .graph import DesignGraph
from .plan import BATCH_SIZE, Plan, Step
from .plan.abstract import Footprint
from .plan.footprint import FLOAT, footprint
from .plan.program import executed_flops

CONVENTIONS = ("flop", "mac", "paper")
FUSED = ("sdpa", "flex")  # attention kernels: one step for the scores, the softmax and the values
METRICS = ("params", "flops", "softmax_entries", "peak_memory")


METRIC_TEXT = {
    "params": "parameters",
    "flops": "FLOPs",
    "kernel_flops": "FLOPs a block-skipping kernel does",
    "score_flops": "FLOPs of the box arguments",
    "exps": "exponentials",
    "divisions": "divisions",
    "elementwise": "other elementwise ops",
    "softmax_entries": "softmax-box entries",
    "peak_memory": "activation entries kept for backward",
}


@dataclass(repr=False)
class CostReport:
    """Formulas for one design's plan. `at(...)` gives numbers; `formulas()` sympy strings.
    In Jupyter it shows as a table of each metric's formula and its number at the planned sizes."""

    design: str
    graph: DesignGraph
    convention: str
    params: sympy.Expr
    flops: sympy.Expr
    kernel_flops: sympy.Expr  # causal boxes fused so that the kernel skips the masked blocks
    score_flops: sympy.Expr  # only the computation of the softmax boxes' arguments (attention scores)
    exps: sympy.Expr
    divisions: sympy.Expr
    elementwise: sympy.Expr
    softmax_entries: sympy.Expr
    saved_bytes: sympy.Expr  # kept for backward with float32 activations, for a batch of B
    sizes: dict[str, int]
    plan: Plan | None = field(default=None, compare=False)  # the plan costed, for its footprint at other sizes
    named: dict[str, sympy.Expr] = field(default_factory=dict)  # metric -> its formula, planner constants named
    constants: tuple[PlannerConstant, ...] = ()  # the planner's numbers the named formulas hold as symbols

    @property
    def peak_memory(self) -> sympy.Expr:
        """Activation entries a training step keeps for backward, per sequence (float32 entries)."""
        return _per_sequence(self.saved_bytes / FLOAT)

    def _number(self, expr: sympy.Expr, sizes: Mapping[str, int]) -> sympy.Expr:
        expr = sympy.sympify(expr).xreplace({c.symbol: sympy.Integer(c.value) for c in self.constants})
        value = self.graph.evaluate(expr, **{k: v for k, v in sizes.items() if k in self.graph.sizes})
        return sympy.nsimplify(value.xreplace({BATCH_SIZE: sizes.get("B", 1)}))

    def saved_bytes_at(self, **sizes: int) -> int:
        """Bytes kept for backward when the plan's code runs at `sizes`, the batch B included
        (default 1). torch's layout rules depend on the sizes (a batch of one is a matrix to
        torch.matmul, a unit axis lets a reshape be a view), so the footprint is found again at
        these sizes rather than read off the formula found at the planned ones."""
        at = self.sizes | sizes
        saved = self.saved_bytes if self.plan is None else footprint(self.plan, at | {"B": at.get("B", 1)}).saved_bytes
        return int(self._number(saved, at))

    def formulas(self, named: bool = True) -> dict[str, sympy.Expr]:
        """Each metric's formula per sequence in the design's sizes, the planner's constants
        named (`legend()` says what each is), or with `named=False` as numbers, as executed."""
        executed = self.executed()
        return {key: self.named.get(key, expr) for key, expr in executed.items()} if named else executed

    def legend(self) -> list[str]:
        """A line for each planner constant the formulas name: `C = 64: the chunk of ...`."""
        return [c.legend() for c in self.constants]

    def executed(self) -> dict[str, sympy.Expr]:
        """Each metric's formula with every number the plan chose as a number."""
        return {
            "params": self.params,
            "flops": self.flops,
            "kernel_flops": self.kernel_flops,
            "score_flops": self.score_flops,
            "exps": self.exps,
            "divisions": self.divisions,
            "elementwise": self.elementwise,
            "softmax_entries": self.softmax_entries,
            "peak_memory": self.peak_memory,
        }

    def at(self, **sizes: int) -> dict[str, int | float]:
        """Every metric as a number at `sizes` (default: the sizes planned for)."""
        sizes = {k: v for k, v in (self.sizes | sizes).items() if k != "B"}
        numbers: dict[str, int | float] = {}
        for key, expr in self.formulas().items():
            value = self._number(expr, sizes)
            numbers[key] = int(value) if value.is_Integer else float(value)
        return numbers

    def __repr__(self) -> str:
        numbers = self.at()
        shown = ", ".join(f"{key} {_show_number(numbers[key])}" for key in METRICS)
        return f"<tdiag.CostReport {self.design} ({self.convention}) at {_sizes_text(self.sizes)}: {shown}>"

    def _rows(self, show) -> list[list[str]]:
        numbers = self.at()
        return [
            [METRIC_TEXT[key], show(expr), _show_number(numbers[key])]
            for key, expr in self.formulas().items()
            if key != "kernel_flops" or self.skips_blocks
        ]

    @property
    def skips_blocks(self) -> bool:
        """Whether a kernel of the plan skips masked blocks, so that its FLOPs differ from `flops`."""
        return sympy.simplify(self.kernel_flops - self.flops) != 0

    def _title(self) -> str:
        return (
            f"cost of {self.design} per sequence at {_sizes_text(self.sizes)} "
            f"({self.convention} convention; memory in float32 entries)"
        )

    def _repr_html_(self) -> str:
        from .notebook import formula_text, heading_html, html_table

        header = ["metric", "formula", "at these sizes"]
        legend = "".join(f"<p>{html.escape(line)}</p>" for line in self.legend())
        return heading_html(self._title()) + html_table(header, self._rows(formula_text), right=[2]) + legend

    def _repr_markdown_(self) -> str:
        from .notebook import formula_latex, markdown_table, markdown_text

        header = ["metric", "formula", "at these sizes"]
        legend = "".join(f"\n\n{markdown_text(line)}" for line in self.legend())
        return (
            f"**{markdown_text(self._title())}**\n\n"
            + markdown_table(header, self._rows(formula_latex), right=[2])
            + legend
        )

    def as_dict(self, **sizes: int) -> dict[str, object]:
        numbers = self.at(**sizes)
        out: dict[str, object] = {"design": self.design, "convention": self.convention}
        for key, expr in self.formulas().items():
            out[key] = numbers[key]
            out[f"{key}_formula"] = sympy.sstr(expr)
        out["sizes"] = {k: v for k, v in (self.sizes | sizes).items() if k != "B"}
        out["constants"] = [c.as_dict() for c in self.constants]
        return out


def _per_sequence(expr: sympy.Expr) -> sympy.Expr:
    return sympy.factor(sympy.expand(expr.xreplace({BATCH_SIZE: 1})))


def step_cost(step: Step, plan: Plan, convention: str, names: Naming | None = None) -> sympy.Expr:
    """Contraction work of one step under a counting convention. `paper` follows FiSH App. D.1
    and MGK App. B: a k-term sum costs 2k − 1 per output; one op per element a sum node adds
    (noise, biases); nothing for products that sum nothing (σ·ε), for single-tensor sums (the
    mixing Σ_r), for the norm terms of a squared distance, or for exp and softmax. With
    `names`, the planner's constants in it are named."""
    if step.out is None:
        return sympy.Integer(0)
    if convention == "paper":
        return _paper_cost(step, plan, names)
    if step.kind not in ("contraction", "conv", "norm", "sum", *FUSED):
        return sympy.Integer(0)
    flops = _named(step.flops, step, names)
    macs = flops / 2 if step.kind in ("contraction", "conv", "norm", *FUSED) else flops
    return macs if convention == "mac" else flops


def _paper_cost(step: Step, plan: Plan, names: Naming | None = None) -> sympy.Expr:
    if step.kind in FUSED or step.paper != 0:  # fused steps, and sums with nested sums flattened in
        return _named(step.paper, step, names)
    if step.kind == "sum" and step.description == "sum":  # a sum node: one add per extra term
        return _named(step.elementwise, step, names)
    if step.kind not in ("contraction", "conv") or not step.summed:  # a convolution sums its kernel's taps
        return sympy.Integer(0)
    size = plan.leg_sizes.__getitem__ if names is None else names.leg_size
    outputs = sympy.Mul(*(size(leg) for leg in step.out.legs))  # type: ignore[union-attr]
    summed = sympy.Mul(*(size(leg) for leg in step.summed))
    return outputs * (2 * summed - 1)


def _named(count: sympy.Expr, step: Step, names: Naming | None) -> sympy.Expr:
    """A step's count with the planner's constants named (as it is without `names`)."""
    return count if names is None else names.named(count, step_spaces(step))


def kernel_cost(step: Step, plan: Plan, convention: str, names: Naming | None = None) -> sympy.Expr:
    """`step_cost` for the entries the step's kernel computes (a block-skipping causal kernel's)."""
    if step.kernel_flops is None:
        return step_cost(step, plan, convention, names)
    share = executed_flops(step) / step.flops if names is None else names.kernel_share(step)
    return step_cost(step, plan, convention, names) * share


def score_cost(step: Step, plan: Plan, convention: str, names: Naming | None = None) -> sympy.Expr:
    """The part of a step that computes a softmax box's argument (FiSH App. D.1's scope)."""
    if step.kind in FUSED:
        score, paper = _named(step.score_flops, step, names), _named(step.score_paper, step, names)
        return {"paper": paper, "mac": score / 2}.get(convention, score)
    return step_cost(step, plan, convention, names) if step.in_box else sympy.Integer(0)


def cost_report(plan: Plan, convention: str = "flop") -> CostReport:
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown cost convention '{convention}'; expected one of: {', '.join(CONVENTIONS)}")
    steps = plan.steps
    graph = plan.graph

    def total(values: Sequence[sympy.Expr]) -> sympy.Expr:
        return _per_sequence(sympy.Add(*values))

    prints = footprint(plan)
    names = naming(plan)
    named = {}
    if names.constants:
        named = {
            "flops": total([step_cost(s, plan, convention, names) for s in steps]),
            "kernel_flops": total([kernel_cost(s, plan, convention, names) for s in steps]),
            "score_flops": total([score_cost(s, plan, convention, names) for s in steps]),
            "exps": total([_named(s.exps, s, names) for s in steps]),
            "divisions": total([_named(s.divisions, s, names) for s in steps]),
            "elementwise": total([_named(s.elementwise, s, names) for s in steps]),
            "softmax_entries": total([_named(s.entries, s, names) for s in steps if s.kind in ("softmax", *FUSED)]),
            "peak_memory": _per_sequence(_named_saved_bytes(plan, prints, names) / FLOAT),
        }
    return CostReport(
        design=graph.name,
        graph=graph,
        convention=convention,
        params=graph.parameter_count(),
        flops=total([step_cost(s, plan, convention) for s in steps]),
        kernel_flops=total([kernel_cost(s, plan, convention) for s in steps]),
        score_flops=total([score_cost(s, plan, convention) for s in steps]),
        exps=total([s.exps for s in steps]),
        divisions=total([s.divisions for s in steps]),
        elementwise=total([s.elementwise for s in steps]),
        softmax_entries=total([s.entries for s in steps if s.kind in ("softmax", *FUSED)]),
        saved_bytes=sympy.factor(sympy.expand(prints.saved_bytes)),
        sizes={k: v for k, v in plan.sizes.items() if k != "B"},
        plan=plan,
        named=named,
        constants=names.constants,
    )


def _named_saved_bytes(plan: Plan, prints: Footprint, names: Naming) -> sympy.Expr:
    """The bytes kept for backward with the planner's constants named: each storage kept is
    named by the legs of a value the step that made it reads or writes."""
    steps = [*plan.steps, *plan.update_steps]
    kept = []
    for index in prints.saved:
        storage = prints.storages[index]
        spaces = step_spaces(steps[storage.step]) if 0 <= storage.step < len(steps) else []
        kept.append(names.named(storage.numel, spaces) * storage.itemsize)
    return sympy.Add(*kept)


# ---- the side-by-side table ----------------------------------------------------------------


def _sizes_text(sizes: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sizes.items()) or "no sizes"


def _show_number(value: float | int) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:.4g}"


def _assumed_lengths(reports: Sequence[CostReport], given: Mapping[str, int]) -> dict[str, int]:
    """The run-time sizes (sequence lengths) the numbers were taken at without being given
    (planning.PLANNING_DEFAULTS), by name."""
    assumed: dict[str, int] = {}
    for r in reports:
        for k, size in r.graph.sizes.items():
            if size.is_free and k not in given and k in r.sizes:
                assumed.setdefault(k, int(r.sizes[k]))
    return assumed


def table(reports: Sequence[CostReport], sizes: Mapping[str, int]) -> str:
    """Numbers side by side with ratios to the first design, then each design's formulas."""
    numbers = [r.at(**{k: v for k, v in sizes.items() if k in r.graph.sizes}) for r in reports]
    skipping = any(r.skips_blocks for r in reports)
    metrics = (
        *METRICS[:2],
        *(["kernel_flops"] * skipping),
        *METRICS[2:],
        "score_flops",
        "exps",
        "divisions",
        "elementwise",
    )
    cells = {}
    for metric in metrics:
        base = numbers[0][metric]
        cells[metric] = [
            _show_number(n[metric]) + (f" ({n[metric] / base:.3g}x)" if k and base else "")
            for k, n in enumerate(numbers)
        ]
    width = 2 + max(len(text) for row in [*cells.values(), [r.design for r in reports]] for text in row)
    shown = ", ".join(f"{k}={v}" for k, v in sizes.items())
    assumed = _assumed_lengths(reports, sizes)
    where = ", ".join(filter(None, [shown, _sizes_text(assumed) if assumed else ""])) or "the design sizes"
    note = f"; {', '.join(assumed)} not given: the planning default, set with --at" if assumed else ""
    lines = [
        f"cost per sequence at {where} ({reports[0].convention} convention{note})",
        "",
        f"{'metric':<17}" + "".join(f"{r.design:>{width}}" for r in reports),
    ]
    lines += [f"{metric:<17}" + "".join(f"{cell:>{width}}" for cell in cells[metric]) for metric in metrics]
    lines += ["", "formulas (size symbols; per sequence)"]
    for r in reports:
        lines.append(f"  {r.design}")
        for key, expr in r.formulas().items():
            if key == "kernel_flops" and not r.skips_blocks:
                continue
            lines.append(f"    {key:<16} {sympy.sstr(expr)}")
        lines += [f"    {line}" for line in r.legend()]
    return "\n".join(lines)


def to_json(reports: Sequence[CostReport], sizes: Mapping[str, int]) -> str:
    return json.dumps([r.as_dict(**{k: v for k, v in sizes.items() if k in r.graph.sizes}) for r in reports], indent=2)
