"""`tdiag.load`: parse, build the design graph and check it, giving a Design that later stages
(render, cost, compile) read. A Design shows its diagram inline in Jupyter."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import sympy

from .check import check
from .errors import SOURCES, Diagnostic, Span, TdiagError
from .files import check_path
from .graph import LIMITS, DesignGraph, build_graph, load_items
from .ir import (
    CausalFactor,
    CausalMask,
    Contraction,
    Convolution,
    ElementwiseMap,
    Expr,
    Gather,
    PaddingMask,
    PositionIndex,
    Quotient,
    Reduction,
    Scalar,
    Scan,
    SegmentSum,
    SoftmaxBox,
    SquaredDistance,
    SumNode,
    Tensor,
    TensorRef,
    WindowFactor,
    WindowMask,
    walk,
)
from .resources import shown_path

if TYPE_CHECKING:
    from .device import DeviceModel

# How the planner chooses between equivalent plans (plan.build_plan): fewest FLOPs; fused
# kernels wherever they apply because they never store a softmax box's entries; or the least
# estimated time of a training step on the planning device (a roofline per op, device.py).
OBJECTIVES = ("flops", "memory", "time")
# What modules, compiled files and plans are built for unless told: the estimated time ranks plans
# at least as well as FLOPs on the benchmark (docs/results/bench-cpu/objective). Cost reports keep
# COST_OBJECTIVE, the FLOP-minimal plan: its formulas are the papers' counts and no machine's.
DEFAULT_OBJECTIVE = "time"
COST_OBJECTIVE = "flops"


class Design:
    """A checked design. `graph` is the design graph every later stage reads."""

    def __init__(self, graph: DesignGraph, warnings: list[Diagnostic], origin: Mapping[str, object] | None = None):
        self.graph = graph
        self.warnings = warnings
        # what it was built from, as data (the texts of its files, the sizes given, the causal
        # masks added): a compiled file carries it so that it decodes (tdiag/decode.py)
        self.origin = dict(origin) if origin is not None else None
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
            return Design(masked, self.warnings, self.origin)
        origin = self.origin and {**self.origin, "causal": (*self.origin.get("causal", ()), (query, key))}  # type: ignore[misc]
        return Design(masked, self.warnings, origin)

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
        from .module import plan_for
        from .plan.forms import planning_forms

        sizes = checked_sizes(self.graph, {**(sizes or {}), **more})
        if objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
        # a plan depends on the candidate forms (only_forms) and on the device that prices them
        priced = device if device is not None else planning_device()
        forms = tuple(form.name for form in planning_forms())
        key = (tuple(sorted(sizes.items())), checkpoint_boxes, objective, attention, priced, forms)
        if key not in self._plans:
            self._plans[key] = plan_for(
                self.graph,
                sizes,
                checkpoint_boxes=checkpoint_boxes,
                objective=objective,
                attention=attention,
                device=device,
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
            from .reference import ReferenceModule

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


def checked_sizes(graph: DesignGraph | None, sizes: Mapping[str, object]) -> dict[str, int]:
    """Sizes given through the Python API: positive whole numbers within LIMITS.max_size, each a
    size of the design (or B, the batch size a plan assumes); anything else is a TdiagError."""
    for key, value in sizes.items():
        if isinstance(value, Mapping):
            raise TdiagError(
                Diagnostic(
                    f"{key}={value!r} is not a size",
                    hint="give sizes as keywords (N=512) or as a mapping in first place ({'N': 512})",
                )
            )
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise TdiagError(Diagnostic(f"size {key} must be a positive whole number, got {value!r}"))
        if value > LIMITS.max_size:
            raise TdiagError(Diagnostic(f"size {key} = {value:,} is over the limit of {LIMITS.max_size:,}"))
        if graph is not None and key not in graph.sizes and key != "B":
            raise TdiagError(
                Diagnostic(
                    f"design '{graph.name}' has no size '{key}'",
                    hint=f"its sizes are: {', '.join(sorted(graph.sizes)) or 'none'}",
                )
            )
    return dict(sizes)  # type: ignore[arg-type]


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
    return Design(graph, [d for d in found if not d.is_error], {"files": texts, "sizes": sizes})


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
    return Design(graph, [d for d in found if not d.is_error], {"files": ((name, text),), "sizes": sizes})


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
        [f"{'update ' if s.is_update else ''}{s.target}[{_groups(s.groups)}] = {format_expr(s.expr)}"]
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
        lines.append(f"  {'update ' if s.is_update else ''}{s.target}[{_groups(s.groups)}] = {format_expr(s.expr)}")
        lines += [f"      {d}" for d in _describe_nodes(s.expr)]
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


def _groups(groups: tuple[tuple[str, ...], ...]) -> str:
    return " ".join(g[0] if len(g) == 1 else "(" + " ".join(g) + ")" for g in groups)


def _sliced_groups(ref: TensorRef) -> str:
    """`h, r: 0..R, f` or `h, n: N, m: N`: the axes of a table read in slices, as written."""
    parts = []
    for k, (group, extent) in enumerate(zip(ref.groups, ref.slices, strict=True)):
        start = ref.offset(k)
        cut = "" if extent is None else f": {extent}" if start == 0 else f": {start}..{start + extent}"
        parts.append(_groups((group,)) + cut)
    return ", ".join(parts)


def _describe_nodes(expr: Expr) -> list[str]:
    out = []
    for node in walk(expr):
        if isinstance(node, Contraction) and (node.summed or node.batch):
            summed = ", ".join(node.summed) or "none"
            batch = ", ".join(node.batch) or "none"
            factors = len(node.factors)
            way = f"{factors}-way " if factors > 2 else ""
            out.append(f"{way}contraction [{' '.join(node.legs)}]: contracted {summed}; batch legs {batch}")
        elif isinstance(node, Reduction) and node.masks:
            masks = ", ".join(_format_mask(m) for m in node.masks)
            out.append(f"{node.name} over {' '.join(node.over)} [{' '.join(node.legs)}], masks {masks}")
        elif isinstance(node, Scan):
            out.append(f"scan: {format_expr(node)} [{' '.join(node.legs)}]")
        elif isinstance(node, SegmentSum):
            out.append(f"segment sums along {node.along} over [{' '.join(node.legs)}]")
        elif isinstance(node, Convolution):
            out.append(f"convolution: {format_expr(node)} [{' '.join(node.legs)}], summed {' '.join(node.taps)}")
        elif isinstance(node, SoftmaxBox):
            masks = ", ".join(_format_mask(m) for m in node.masks)
            scale = f", scale {node.scale}" if node.is_exp else ""
            sink = f", sink {format_expr(node.sink)}" if node.sink is not None else ""
            out.append(
                f"{node.box_name} box over [{' '.join(node.legs)}], normalized leg {' '.join(node.normalized)}{scale}"
                + sink
                + (f", masks {masks}" if masks else "")
            )
    return out


def _format_mask(mask: CausalMask | WindowMask | PaddingMask) -> str:
    if isinstance(mask, PaddingMask):
        return f"{mask.tensor.name}[{' '.join(mask.tensor.legs)}]"
    if isinstance(mask, WindowMask):
        return str(mask)
    return f"causal({mask.query}, {mask.key})"


def format_expr(e: Expr) -> str:
    """An expression node as `.td`-like text (for show, codegen comments and errors)."""
    if isinstance(e, TensorRef) and e.is_sliced:
        return f"{e.name}[{_sliced_groups(e)}]"
    if isinstance(e, TensorRef):
        return f"{e.name}[{_groups(e.groups)}]"
    if isinstance(e, Scalar):
        return str(e.value)
    if isinstance(e, Contraction):
        text = " ".join(_wrap(f) for f in e.factors)
        if e.coefficient == 1:
            return text
        coefficient = str(e.coefficient)
        if not (e.coefficient.is_Atom or e.coefficient.is_Pow):
            coefficient = f"({coefficient})"
        return f"{coefficient} * {text}"
    if isinstance(e, SumNode):
        parts = [
            ("- " if s < 0 else ("+ " if i else "")) + format_expr(t)
            for i, (t, s) in enumerate(zip(e.terms, e.signs, strict=True))
        ]
        return " ".join(parts)
    if isinstance(e, Quotient):
        return f"{_wrap(e.numerator)} / {_wrap(e.denominator)}"  # type: ignore[arg-type]
    if isinstance(e, SoftmaxBox):
        sink = f", sink = {format_expr(e.sink)}" if e.sink is not None else ""
        return f"{e.box_name}[{' '.join(e.normalized)}{sink}]({format_expr(e.content)})"  # type: ignore[arg-type]
    if isinstance(e, ElementwiseMap):
        if e.name == "pow":
            return f"{_wrap(e.operand)} ^ {e.params[0]}"  # type: ignore[arg-type]
        params = "".join(f", {p}" for p in e.params)
        name = {"maximum": "max", "minimum": "min"}.get(e.name, e.name)
        return f"{name}({format_expr(e.operand)}{params})"  # type: ignore[arg-type]
    if isinstance(e, Reduction):
        masks = "".join(f", mask = {_format_mask(m)}" for m in e.masks)
        return f"{e.name}[{' '.join(e.over)}{masks}]({format_expr(e.operand)})"  # type: ignore[arg-type]
    if isinstance(e, Scan):
        flags = "".join(f", {word} = 1" for word, flag in (("exclusive", e.exclusive), ("reverse", e.reverse)) if flag)
        masks = "".join(f", mask = {_format_mask(m)}" for m in e.masks)
        return f"{e.name}[{e.along}{flags}{masks}]({format_expr(e.operand)})"  # type: ignore[arg-type]
    if isinstance(e, SegmentSum):
        return f"segsum[{e.along}, {e.key}]({format_expr(e.operand)})"  # type: ignore[arg-type]
    if isinstance(e, Convolution):
        options = [f"{s.leg} = {s.source()}" for s in e.shifts] + [f"mask = {_format_mask(m)}" for m in e.masks]
        return f"conv[{', '.join(options)}]({format_expr(e.operand)}, {format_expr(e.kernel)})"  # type: ignore[arg-type]
    if isinstance(e, CausalFactor):
        return f"causal({e.query}, {e.key})"
    if isinstance(e, WindowFactor):
        return str(e.mask)
    if isinstance(e, SquaredDistance):
        return f"sqdist[{' '.join(e.over)}]({format_expr(e.left)}, {format_expr(e.right)})"  # type: ignore[arg-type]
    if isinstance(e, PositionIndex):
        return f"index({e.leg})"
    if isinstance(e, Gather) and e.source is not None:
        legs = [f"{leg} = {e.position}" if leg == e.axis else leg for leg in e.source.legs]
        return f"{e.source.name}[{', '.join(legs)}]"
    return type(e).__name__


def _wrap(e: Expr) -> str:
    text = format_expr(e)
    return f"({text})" if isinstance(e, SumNode | Quotient | Contraction) else text
