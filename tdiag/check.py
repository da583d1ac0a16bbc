"""DesignGraph -> diagnostics: the whole-design checks that need the finished graph (design notes
§3). Name, leg-size, reshape and box-leg errors are found while the graph is built (graph/);
here are the ones about how tensors connect: what reaches an output, and what nothing uses."""

from __future__ import annotations

import math
from collections.abc import Callable

import networkx as nx
import sympy

from .errors import Diagnostic
from .graph import LIMITS, DesignGraph
from .ir import Expr, Tensor, walk
from .rules import Rules


def check(design: DesignGraph) -> list[Diagnostic]:
    """Every problem of a built design, errors and warnings, in file order."""
    found = [
        *_outputs_depend_on_an_input(design),
        *_unused_tensors(design),
        *_legs_sized_by_unused_declarations(design),
        *_buffers_without_update(design),
        *_scale_is_a_number(design),
        *_numbers_in_range(design),
        *_initializers_in_range(design),
        *_stored_tensors_fit_in_memory(design),
        *_stored_tensors_have_fixed_sizes(design),
        *_run_time_sizes_are_bound(design),
    ]
    return sorted(found, key=lambda d: (d.spans[0].file, d.spans[0].line, d.spans[0].column) if d.spans else ("", 0, 0))


def _outputs_depend_on_an_input(design: DesignGraph) -> list[Diagnostic]:
    reached = _downstream(design, [t.name for t in design.inputs])
    problems = []
    for name in design.outputs:
        if name not in reached:
            tensor = design.tensors[name]
            problems.append(
                Diagnostic(
                    f"output '{name}' depends on no input",
                    (tensor.span,),
                    "an attention design computes its output from an input tensor",
                )
            )
    return problems


def _downstream(design: DesignGraph, sources: list[str]) -> set[str]:
    """Tensors computed (in the forward pass) from any of `sources`, and the sources: one walk."""
    forward = design.forward_graph()
    seen = set(sources).union(*(nx.descendants(forward, source) for source in sources))
    return {n for n in seen if n in design.tensors}


def _used_tensors(design: DesignGraph) -> set[str]:
    """Outputs, tensors an update rule reads, and everything they or the updated buffers are
    computed from (one walk for all of them)."""
    read = set(design.outputs)
    for update in design.updates:
        read |= {n.name for n in walk(update.expr) if getattr(n, "name", None) in design.tensors}
    return read | design.depends_on(*read, *(u.target for u in design.updates))


def _unused_tensors(design: DesignGraph) -> list[Diagnostic]:
    used = _used_tensors(design)
    problems = []
    for tensor in design.tensors.values():
        if tensor.name in used:
            continue
        what = {"derived": "is computed but never used"}.get(tensor.kind, "is never used")
        problems.append(
            Diagnostic(
                f"{tensor.kind} '{tensor.name}' {what}",
                (tensor.span,),
                "remove it, or use it on the way to an output",
                severity="warning",
            )
        )
    return problems


def _legs_sized_by_unused_declarations(design: DesignGraph) -> list[Diagnostic]:
    """A declaration's axes size their legs for the whole file, whether or not anything reads the
    tensor; a leg that a used statement writes and that only unused tensors size (a leftover
    `const Blk[j: 2]` giving a chunk leg j the size 2) is warned of at the use and the declaration."""
    used = _used_tensors(design) | {u.target for u in design.updates}
    problems = []
    for name, leg in design.legs.items():
        binders = design.leg_binders.get(name, ())
        if not binders or any(b in used or b not in design.tensors for b in binders):
            continue
        use = next(((s, span) for s, span in design.leg_uses.get(name, ()) if s in used), None)
        if use is None:
            continue
        statement, span = use
        source = design.tensors[leg.bound_by] if leg.bound_by in design.tensors else design.tensors[binders[0]]
        problems.append(
            Diagnostic(
                f"leg '{name}' of {statement} takes its size ({leg.size}) only from the unused "
                f"{source.kind} '{source.name}'",
                (span, leg.span),
                f"a declaration's axes size their legs even when nothing reads it: remove '{source.name}' "
                f"or give '{name}' the size meant where it is used (a tensor axis it indexes, index({name}, SIZE))",
                severity="warning",
            )
        )
    return problems


def _buffers_without_update(design: DesignGraph) -> list[Diagnostic]:
    """A buffer no rule updates is a constant, except one drawn at random (a fixed random
    projection such as Performer's features), which only a buffer can hold and save."""
    updated = {u.target for u in design.updates}
    return [
        Diagnostic(
            f"buffer '{t.name}' has no update rule, so it never changes",
            (t.span,),
            f"add 'update {t.name}[{' '.join(t.legs)}] = ...', or make it a const",
            severity="warning",
        )
        for t in design.tensors_of_kind("buffer")
        if t.name not in updated and not (t.init and t.init.name in ("normal", "uniform"))
    ]


def _scale_is_a_number(design: DesignGraph) -> list[Diagnostic]:
    return [
        Diagnostic(
            f"the {box.box_name} box in {statement.target} has scale 0, which makes it uniform",
            (box.span,),
            severity="warning",
        )
        for statement, box in design.boxes()
        if box.scale == 0
    ]


# ---- run-time sizes ------------------------------------------------------------------------


def _free_sizes(design: DesignGraph, expr: object) -> set[str]:
    """The run-time sizes (no default, like N) that `expr` depends on, derived sizes expanded."""
    if not isinstance(expr, sympy.Basic):
        return set()
    return {s.name for s in design.expand(expr).free_symbols if s.name in design.sizes and design.sizes[s.name].is_free}


def _stored_tensors_have_fixed_sizes(design: DesignGraph) -> list[Diagnostic]:
    """A buffer is allocated once, when the module is built: an axis over a run-time size (N, read
    from the input at each call) has no size then. (A param over one is refused while the graph is
    built, with the max-length form as the hint.)"""
    problems = []
    for tensor in design.tensors_of_kind("buffer"):
        free = sorted(set().union(*(_free_sizes(design, a.size) for a in tensor.axes)))
        if free:
            problems.append(
                Diagnostic(
                    f"{tensor.kind} '{tensor.name}' has an axis of run-time size {', '.join(free)}, "
                    f"but a {tensor.kind} is stored at one size when the module is built",
                    (tensor.span,),
                    f"give {free[0]} a default (size {free[0]} = 1024) or load the design with {free[0]}=..., "
                    "or use a const or an input for a tensor that follows the sequence length",
                )
            )
    return problems


def _uses_of_sizes(design: DesignGraph):
    """(run-time sizes, span) for every declared tensor but the inputs, every statement's result
    and every number in the statements and initializers: what the module needs to know at a call."""
    for tensor in design.tensors.values():
        if tensor.kind == "input":
            continue
        for axis in tensor.axes:
            yield _free_sizes(design, axis.size), (tensor.statement.target_span if tensor.statement else tensor.span)
        for _, value in tensor.init.params if tensor.init else ():
            yield _free_sizes(design, value), tensor.init.span or tensor.span  # type: ignore[union-attr]
    for _, value, span, _ in _scalars(design):
        yield _free_sizes(design, value), span


def _run_time_sizes_are_bound(design: DesignGraph) -> list[Diagnostic]:
    """A run-time size is read from an input's axis of exactly that size at each call (masks are
    optional, so they do not bind one); a size no input has cannot be known, so a design that uses
    it is refused at its first use."""
    bound = {
        str(a.size)
        for t in design.inputs
        for a in t.axes
        if a.size.is_Symbol and str(a.size) in design.sizes and design.sizes[str(a.size)].is_free
    }
    first: dict[str, object] = {}
    for free, span in _uses_of_sizes(design):
        for name in sorted(free - bound):
            if name not in first or (span.file, span.line, span.column) < first[name][1:]:  # type: ignore[index]
                first[name] = (span, span.file, span.line, span.column)
    return [
        Diagnostic(
            f"run-time size {name} is used here, but no input has an axis of size {name}, "
            "so its value is not known when the module runs",
            (first[name][0],),  # type: ignore[index]
            f"give {name} a default (size {name} = ...), or declare an input with an axis of size {name}",
        )
        for name in sorted(first)
    ]


# ---- numbers that compile or run would refuse ----------------------------------------------


def _number(design: DesignGraph, value: sympy.Expr) -> float | str | None:
    """`value` at the design's sizes as a float; None while it depends on a run-time size; a
    text saying why when it is no real number (1/0, sqrt(-1))."""
    value = design.evaluate(value)
    if value.free_symbols:
        return None
    if value.has(sympy.zoo, sympy.oo, -sympy.oo, sympy.nan):
        return "is a division by zero at these sizes"
    if not value.is_real:
        return "is not a real number"
    number = float(value)
    if not math.isfinite(number) or abs(number) > LIMITS.max_literal:
        return f"is out of range (at most {LIMITS.max_literal:.0e} in size)"
    return number


CHECK: Rules = Rules("check")  # node -> the numbers it carries, each (what, value, rule or None)
NumberRule = Callable[[float], str | None]  # a number's value -> what is wrong with it, or None


def no_numbers(node: Expr) -> tuple[()]:
    """The check rule of a kind whose numbers (if any) are checked where the graph is built."""
    return ()


def _scalars(design: DesignGraph):
    """(what, value, span, rule) for every number in the statements, by each node's check rule;
    rule(x) says what is wrong."""
    for statement in [*design.statements, *design.updates]:
        for node in walk(statement.expr):
            for what, value, rule in CHECK.lookup(node)(node):
                yield what, value, node.span, rule


def _numbers_in_range(design: DesignGraph) -> list[Diagnostic]:
    problems = []
    for what, value, span, rule in _scalars(design):
        number = _number(design, value)
        reason = number if isinstance(number, str) else (rule(number) if rule and number is not None else None)
        if reason:
            problems.append(Diagnostic(f"{what} {_shown(value)} {reason}", (span,)))
    return problems


INIT_RULES = {
    ("normal", "std"): lambda x: None if x >= 0 else "must be >= 0",
}


def _initializers_in_range(design: DesignGraph) -> list[Diagnostic]:
    problems = []
    for tensor in design.tensors.values():
        init = tensor.init
        if init is None or tensor.kind == "random":
            continue
        span = init.span or tensor.span
        numbers = {}
        for key, value in init.params:
            number = _number(design, value)  # type: ignore[arg-type]
            reason = number if isinstance(number, str) else None
            if number is not None and reason is None and (init.name, key) in INIT_RULES:
                reason = INIT_RULES[init.name, key](number)
            if reason:
                problems.append(Diagnostic(f"{init.name}'s {key} = {_shown(value)} {reason}", (span,)))
            numbers[key] = number
        low, high = numbers.get("low"), numbers.get("high")
        if isinstance(low, float) and isinstance(high, float) and low > high:
            problems.append(
                Diagnostic(
                    f"uniform(low = {low:g}, high = {high:g}) is empty: low is greater than high",
                    (span,),
                    hint="swap them",
                )
            )
    return problems


ELEMENT_BYTES = 4  # float32, the default dtype; module() checks again with the dtype it is given


def stored_bytes(design: DesignGraph, tensor: Tensor, sizes: dict | None = None, element: int = 4) -> int | None:
    """Bytes of a stored tensor at the design's sizes (and `sizes`); None while a size is unknown."""
    numel = design.evaluate_at(tensor.numel, sizes or {})
    return int(numel) * element if numel.is_Integer else None


def too_big(design: DesignGraph, sizes: dict | None = None, element: int = ELEMENT_BYTES) -> list[Diagnostic]:
    """A stored tensor, or all of them together, larger than LIMITS.bytes_limit(): refused before
    anything is allocated, naming the tensor and its bytes."""
    limit = LIMITS.bytes_limit()
    problems, total, spans = [], 0, []
    for tensor in design.tensors_of_kind("param", "const", "buffer"):
        count = stored_bytes(design, tensor, sizes, element)
        if count is None:
            continue
        total += count
        spans.append(tensor.span)
        if count > limit:
            problems.append(
                Diagnostic(
                    f"{tensor.kind} {tensor.name} would take {_bytes(count)} ({tensor.numel} elements), "
                    f"more than the {_bytes(limit)} available",
                    (tensor.span,),
                    "use smaller sizes (--set / tdiag.load(..., F=...)), or raise tdiag.LIMITS.max_bytes",
                )
            )
    if not problems and total > limit:
        problems.append(
            Diagnostic(
                f"the stored tensors would take {_bytes(total)} together, more than the {_bytes(limit)} available",
                tuple(spans[:1]),
                "use smaller sizes, or raise tdiag.LIMITS.max_bytes",
            )
        )
    return problems


def _stored_tensors_fit_in_memory(design: DesignGraph) -> list[Diagnostic]:
    return too_big(design)


def _bytes(count: int) -> str:
    for unit, size in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if count >= size:
            return f"{count / size:.3g} {unit} ({count:,} bytes)"
    return f"{count} bytes"


def _shown(value: sympy.Expr) -> str:
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."
