"""`tdiag.load`: parse, build the design graph and check it, giving a Design that later stages
(render, cost, compile) read. A Design shows its diagram inline in Jupyter."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import sympy

from . import constructs  # noqa: F401  (registers every construct's rules)
from .check import check
from .errors import SOURCES, Diagnostic, Span, TdiagError
from .files import check_path
from .graph import DesignGraph, build_graph, load_items
from .graph.model import checked_sizes
from .ir import (
    SoftmaxBox,
    Tensor,
)
from .objectives import COST_OBJECTIVE, DEFAULT_OBJECTIVE, OBJECTIVES  # importable from here too
from .printing import describe_nodes, format_expr, groups_text
from .resources import shown_path
from .shared_plans import shared_plan

if TYPE_CHECKING:
    from .device import DeviceModel


class Design:
    """A checked design. `graph` is the design graph every later stage reads."""

    def __init__(
        self,
        graph: DesignGraph,
        warnings: list[Diagnostic],
        origin: Mapping[str, object] | None = None,
        made_from: tuple | None = None,
    ):
        self.graph = graph
        self.warnings = warnings
        # what it was built from, as data (the texts of its files, the sizes given, the causal
        # masks added): a compiled file carries it so that it decodes (tdiag/decode.py)
        self.origin = dict(origin) if origin is not None else None
        # how its graph was made, as a key: designs made alike share their plans (shared_plans.py)
        self.made_from = made_from
        self._plans: dict[tuple, object] = {}  # plans are cached by size

    @property
    def name(self) -> str:
        return self.graph.name

    @property
    def sizes(self) -> dict[str, sympy.Expr | None]:
        return {n: s.definition for n, s in self.graph.sizes.items()}

    @property
    def size_values(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.graph.size_values().items()}

    @property
    def tensors(self) -> dict[str, Tensor]:
        return self.graph.tensors

    @property
    def legs(self) -> dict[str, sympy.Expr]:
        return {n: leg.size for n, leg in self.graph.legs.items()}

    @property
    def boxes(self) -> list[SoftmaxBox]:
        return [box for _, box in self.graph.boxes()]

    def parameter_count(self, **at: int) -> sympy.Expr:
        """Σ of the leg-size products of the trainable tensors; a number when all sizes are known."""
        count = self.graph.parameter_count()
        return self.graph.evaluate(count, **at) if at or not self._free_in(count) else count

    def _free_in(self, expr: sympy.Expr) -> bool:
        return bool(self.graph.evaluate(expr).free_symbols)

    # -- text --
    def summary(self) -> str:
        """One line: sizes, tensors and the parameter count as a formula and a number."""
        g = self.graph
        values = self.size_values
        sizes = ", ".join(f"{n}={values[n]}" if n in values else n for n in g.sizes)
        kinds = [t.kind for t in g.tensors.values() if t.kind != "derived"]
        counts = ", ".join(f"{kinds.count(k)} {k}{'s' if kinds.count(k) != 1 else ''}" for k in dict.fromkeys(kinds))
        formula = g.parameter_count()
        number = g.evaluate(formula)
        params = f"{formula} = {_thousands(number)}" if number.is_number and formula != number else str(number)
        return f"{g.name}: ok ({sizes}; {counts}; {len(g.statements)} statements; params {params})"

    def show(self) -> str:
        """The design graph as text: sizes with formulas, tensors with legs, statements with
        their contracted and batch legs, and each box."""
        return "\n".join(_show(self.graph, self.size_values))

    def __repr__(self) -> str:
        return f"<tdiag.Design {self.summary()}>"

    def with_causal_mask(self, query: str = "n", key: str = "m") -> Design:
        """This design with a causal mask on every box normalized over `key` (decoder use)."""
        from .graph import with_causal_mask

        masked = with_causal_mask(self.graph, query, key)
        if masked is self.graph:  # causal as written: the same design, the same record
            return Design(masked, self.warnings, self.origin, self.made_from)
        origin = self.origin and {**self.origin, "causal": (*self.origin.get("causal", ()), (query, key))}  # type: ignore[misc]
        return Design(masked, self.warnings, origin, self.made_from and ("causal", self.made_from, query, key))

    # -- compile and cost --
    def plan(
        self,
        sizes: Mapping[str, int] | None = None,
        /,
        *,
        checkpoint_boxes: bool = False,
        objective: str = DEFAULT_OBJECTIVE,
        attention: str = "sdpa",
        device: DeviceModel | None = None,
        **more: int,
    ):
        """The evaluation plan for these sizes (run-time sizes such as N default to 1024),
        cached by size. `checkpoint_boxes` recomputes each box in the backward pass;
        `objective`: "time" (the default) the least estimated training-step time on the planning
        device, "flops" the fewest FLOPs, "memory" fused attention kernels wherever they apply;
        `device` prices the candidates (each objective's tie-break) instead of the planning device.
        `attention="flex"` lowers fusable softmax boxes to FlexAttention instead of SDPA (torch
        2.13 on CPU: inference only, float32/16/bf16 under torch.compile; docs/language.md).
        Sizes are keywords (`N=512`) or a mapping, for a size named like a keyword here."""
        from .device import planning_device
        from .plan.forms import planning_forms
        from .planning import plan_for

        sizes = checked_sizes(self.graph, {**(sizes or {}), **more})
        if objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
        # a plan depends on the candidate forms (only_forms) and on the device that prices them
        priced = device if device is not None else planning_device()
        forms = tuple(form.name for form in planning_forms())
        key = (tuple(sorted(sizes.items())), checkpoint_boxes, objective, attention, priced, forms)
        if key not in self._plans:
            self._plans[key] = shared_plan(
                self.made_from and (self.made_from, key, device is None),
                lambda: plan_for(
                    self.graph,
                    sizes,
                    checkpoint_boxes=checkpoint_boxes,
                    objective=objective,
                    attention=attention,
                    device=device,
                ),
            )
        return self._plans[key]

    def module(
        self,
        sizes: Mapping[str, int] | None = None,
        /,
        *,
        seed: int = 0,
        dtype=None,
        device=None,
        impl: str = "compiled",
        checkpoint_boxes: bool = False,
        objective: str = DEFAULT_OBJECTIVE,
        attention: str = "sdpa",
        plan_calls: bool = False,
        **more: int,
    ):
        """An ordinary torch.nn.Module: the compiled plan (`impl="compiled"`) or the plain
        materialized evaluation of the same graph (`impl="reference"`, the test oracle).
        `checkpoint_boxes=True` recomputes softmax boxes in the backward pass (spec §3.4).
        A design with query and key legs (n, m) takes `attn_mask`, `key_padding_mask` and
        `is_causal` when called (docs/module.md); their plans are made the first time a call uses
        one, or here with `plan_calls=True` (needed before torch.compile traces such a call).
        Stored tensors that would not fit in memory are refused before anything is allocated."""
        import torch

        from .check import too_big

        dtype = dtype or torch.float32
        _check_module_options(seed, dtype, device)
        sizes = checked_sizes(self.graph, {**(sizes or {}), **more})
        problems = too_big(self.graph, sizes, element=torch.empty((), dtype=dtype).element_size())
        if problems:
            raise TdiagError(problems)
        if impl == "reference":
            from .reference_module import ReferenceModule

            return ReferenceModule(self.graph, sizes or None, seed=seed, dtype=dtype).to(device)
        if impl != "compiled":
            raise ValueError(f"impl must be 'compiled' or 'reference', got {impl!r}")
        from .call_plans import call_plans
        from .module import build_module

        options = {"checkpoint_boxes": checkpoint_boxes, "objective": objective, "attention": attention}
        plan = self.plan(sizes, **options)  # type: ignore[arg-type]
        calls = call_plans(self, sizes, planned=plan_calls, **options)
        source_name = shown_path(self.graph.file)
        return build_module(
            plan,
            seed=seed,
            dtype=dtype,
            device=device,
            source_name=source_name,
            calls=calls,
            planner=lambda: call_plans(self, sizes, **options),  # type: ignore[arg-type,return-value]
            design=self.record(sizes, options),
        )

    def source(
        self,
        sizes: Mapping[str, int] | None = None,
        /,
        *,
        checkpoint_boxes: bool = False,
        objective: str = DEFAULT_OBJECTIVE,
        attention: str = "sdpa",
        calls: bool = True,
        **more: int,
    ) -> str:
        """The standalone Python module `tdiag compile` writes for these sizes: with `calls`, its
        forward takes attn_mask, key_padding_mask and is_causal and the file holds a body for each
        (docs/module.md); without, forward is the plain plan alone."""
        from .call_plans import call_plans
        from .codegen import generate

        sizes = checked_sizes(self.graph, {**(sizes or {}), **more})
        options = {"checkpoint_boxes": checkpoint_boxes, "objective": objective, "attention": attention}
        plan = self.plan(sizes, **options)  # type: ignore[arg-type]
        variants = call_plans(self, sizes, **options) if calls else None
        return generate(
            plan, source_name=shown_path(self.graph.file), calls=variants, design=self.record(sizes, options)
        )

    def record(self, sizes: Mapping[str, int], options: Mapping[str, object]) -> dict[str, object] | None:
        """The design record a compiled module's source carries (its texts, sizes, masks and
        planning options, as data) so that a module imported from the file decodes (decode_file.py)."""
        return self.origin and {**self.origin, "plan_sizes": dict(sizes), "options": dict(options)}

    def cost(
        self,
        sizes: Mapping[str, int] | None = None,
        /,
        convention: str = "flop",
        objective: str = COST_OBJECTIVE,
        **more: int,
    ):
        """Parameters, FLOPs, softmax entries and peak memory as formulas (CostReport)."""
        from .cost import cost_report

        if isinstance(sizes, str):  # cost("mac"): the convention, given positionally as before
            sizes, convention = None, sizes
        return cost_report(self.plan({**(sizes or {}), **more}, objective=objective), convention)

    # -- diagram --
    def dot(self, **options: object) -> str:
        from .render import to_dot

        return to_dot(self.graph, **options)  # type: ignore[arg-type]

    def render(self, path: str | Path, **options: object) -> Path:
        from .render import render

        return render(self.graph, path, **options)  # type: ignore[arg-type]

    def _repr_svg_(self) -> str | None:
        from .render import to_svg

        return to_svg(self.graph)

    def _repr_html_(self) -> str:
        """The diagram (when Graphviz's `dot` exists: Jupyter shows HTML before SVG, so it is
        embedded here), then the sizes, tensors and statements as tables."""
        from .notebook import formula_text, heading_html, html_table

        parts = [heading_html(self.summary())]
        svg = self._repr_svg_()
        if svg:
            parts.append(svg[svg.index("<svg") :])
        for title, header, rows, right in _tables(self, formula_text):
            parts.append(heading_html(title) + html_table(header, rows, right=right))
        return "".join(parts)

    def _repr_markdown_(self) -> str:
        from .notebook import formula_latex, markdown_table, markdown_text

        parts = [f"**{markdown_text(self.summary())}**"]
        for title, header, rows, right in _tables(self, formula_latex):
            parts.append(f"{title}\n\n" + markdown_table(header, rows, right=right))
        return "\n\n".join(parts)


def _check_module_options(seed: object, dtype: object, device: object) -> None:
    """`module()`'s seed, dtype and device, refused by name before anything is built: a seed is a
    whole number, a dtype a floating-point torch.dtype, a device one that torch has here."""
    import operator

    import torch

    try:
        operator.index(seed)  # type: ignore[arg-type]  # an int, a numpy integer, ...; not a float, a string or a bool
    except TypeError:
        raise TypeError(f"seed must be a whole number, got {seed!r}") from None
    if isinstance(seed, bool):
        raise TypeError(f"seed must be a whole number, got {seed!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype such as torch.float32, got {dtype!r}")
    if device is None:
        return
    try:
        torch.empty(0, device=device)  # type: ignore[call-overload]
    except (RuntimeError, AssertionError, TypeError, ValueError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"device {device!r} cannot hold tensors here: {reason}") from None


def load(path: str | Path, sizes: Mapping[str, int] | None = None, /, **more: int) -> Design:
    """Parse, build and check a `.td` file; `sizes` (a mapping, or keywords) override the file's
    size defaults. Raises TdiagError listing every mistake."""
    sizes = checked_sizes(None, {**(sizes or {}), **more})
    check_path(path)
    head, items, files = load_items(str(path))
    graph = build_graph(head, items, sizes)
    graph.sources = files
    found = graph.warnings + check(graph)
    errors = [d for d in found if d.is_error]
    if errors:
        raise TdiagError(errors)
    texts = tuple((shown_path(file), SOURCES.text(file)) for file in files)
    made_from = ("load", tuple(files), texts, tuple(sorted(sizes.items())))
    return Design(graph, [d for d in found if not d.is_error], {"files": texts, "sizes": sizes}, made_from)


def loads(text: str, name: str = "<string>", sizes: Mapping[str, int] | None = None, /, **more: int) -> Design:
    """Like `load`, from text (no `extends`)."""
    from .parse import DesignDecl, parse_text

    sizes = checked_sizes(None, {**(sizes or {}), **more})
    source = parse_text(text, name)
    items = list(source.items)
    if not items or not isinstance(items[0], DesignDecl) or items[0].base:
        first = items[0] if items else None
        span = first.base_span if isinstance(first, DesignDecl) else getattr(first, "span", None)
        message = "a design given as text cannot extend another (no file to find it next to)"
        if not isinstance(first, DesignDecl):
            message = "a design text starts with 'design NAME'"
        raise TdiagError(
            Diagnostic(
                message,
                (span or Span(name, 1, 1, 1, 2),),
                hint="use tdiag.load(path) for a design that extends another"
                if isinstance(first, DesignDecl)
                else None,
            )
        )
    graph = build_graph(items[0], items[1:], sizes)  # type: ignore[arg-type]
    found = graph.warnings + check(graph)
    errors = [d for d in found if d.is_error]
    if errors:
        raise TdiagError(errors)
    made_from = ("loads", name, text, tuple(sorted(sizes.items())))
    return Design(graph, [d for d in found if not d.is_error], {"files": ((name, text),), "sizes": sizes}, made_from)


# ---- the notebook tables ---------------------------------------------------------------------


def _tables(design: Design, show) -> list[tuple[str, list[str], list[list[str]], list[int]]]:
    """Sizes, stored tensors and statements, formulas shown by `show` and numbers at the built sizes."""
    from .notebook import number_text

    g = design.graph
    values = design.size_values

    def value(expr: sympy.Expr) -> str:
        number = g.evaluate(expr)
        return number_text(int(number)) if number.is_Integer else "-"

    sizes = [
        [n, "bound at run time" if s.definition is None else show(s.definition), number_text(values.get(n, "-"))]
        for n, s in g.sizes.items()
    ]
    tensors = []
    for t in g.tensors.values():
        if t.kind == "derived":
            continue
        legs = ", ".join(f"{a.leg}: {a.size}" for a in t.axes)
        count = [show(t.numel), value(t.numel)] if t.kind == "param" else ["", ""]
        tensors.append([t.kind, f"{t.name}[{legs}]", str(t.init or ""), *count])
    count = g.parameter_count()
    tensors.append(["", "all parameters", "", show(count), value(count)])
    statements = [
        [f"{'update ' if s.is_update else ''}{s.target}[{groups_text(s.groups)}] = {format_expr(s.expr)}"]
        for s in [*g.statements, *g.updates]
    ]
    statements += [["output " + ", ".join(f"{o}[{' '.join(g.tensors[o].legs)}]" for o in g.outputs)]]
    return [
        ("sizes", ["size", "definition", "value"], sizes, [2]),
        ("tensors", ["kind", "tensor [leg: size]", "initializer", "parameters", "at these sizes"], tensors, [4]),
        ("statements", ["statement"], statements, []),
    ]


# ---- the show text -------------------------------------------------------------------------


def _thousands(value: sympy.Expr) -> str:
    return f"{int(value):,}" if value.is_integer else str(value)  # type: ignore[attr-defined]


def _show(g: DesignGraph, values: Mapping[str, int]) -> list[str]:
    lines = [f"design {g.name}" + (f" (extends {g.base})" if g.base else "") + f"  [{g.file}]", "", "sizes"]
    for size in g.sizes.values():
        if size.definition is None:
            lines.append(f"  {size.name}  (bound at run time)")
        elif size.definition.is_number:
            lines.append(f"  {size.name} = {size.definition}")
        else:
            lines.append(f"  {size.name} = {size.definition} = {values.get(size.name, '?')}")
    lines += ["", "legs"]
    lines += [f"  {leg.name}: {leg.size}" for leg in g.legs.values()]
    lines += ["", "tensors"]
    for t in g.tensors.values():
        if t.kind == "derived":
            continue
        axes = ", ".join(f"{a.leg}: {a.size}" for a in t.axes)
        extra = f"  = {t.init}" if t.init else ""
        if t.kind == "param":
            count = g.evaluate(t.numel)
            extra += (
                f"   ({t.numel} = {_thousands(count)} parameters)" if t.numel != count else f"   ({count} parameters)"
            )
        lines.append(f"  {t.kind:<6} {t.name}[{axes}]{extra}")
    lines += ["", "statements"]
    for s in [*g.statements, *g.updates]:
        lines.append(f"  {'update ' if s.is_update else ''}{s.target}[{groups_text(s.groups)}] = {format_expr(s.expr)}")
        lines += [f"      {d}" for d in describe_nodes(s.expr)]
    lines += [
        "",
        "outputs: " + ", ".join(f"{o}[{' '.join(g.tensors[o].legs)}]" for o in g.outputs),
    ]
    count = g.parameter_count()
    lines.append(
        f"parameters: {count} = {_thousands(g.evaluate(count))}"
        if g.evaluate(count).is_number
        else f"parameters: {count}"
    )
    return lines
