"""DesignGraph -> diagnostics: the whole-design checks that need the finished graph (design notes
§3). Name, leg-size, reshape and box-leg errors are found while the graph is built (graph.py);
here are the ones about how tensors connect: what reaches an output, and what nothing uses."""

from __future__ import annotations

import math

import networkx as nx
import sympy

from .errors import Diagnostic
from .graph import LIMITS, DesignGraph
from .ir import Contraction, ElementwiseMap, Scalar, SoftmaxBox, Tensor, walk


def check(design: DesignGraph) -> list[Diagnostic]:
    """Every problem of a built design, errors and warnings, in file order."""
    found = [
        *_outputs_depend_on_an_input(design),
        *_unused_tensors(design),
        *_buffers_without_update(design),
        *_scale_is_a_number(design),
        *_numbers_in_range(design),
        *_initializers_in_range(design),
        *_stored_tensors_fit_in_memory(design),
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


def _buffers_without_update(design: DesignGraph) -> list[Diagnostic]:
    updated = {u.target for u in design.updates}
    return [
        Diagnostic(
            f"buffer '{t.name}' has no update rule, so it never changes",
            (t.span,),
            f"add 'update {t.name}[{' '.join(t.legs)}] = ...', or make it a const",
            severity="warning",
        )
        for t in design.tensors_of_kind("buffer")
        if t.name not in updated
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


def _scalars(design: DesignGraph):
    """(what, value, span, rule) for every number in the statements; rule(x) says what is wrong."""
    for statement in [*design.statements, *design.updates]:
        for node in walk(statement.expr):
            if isinstance(node, Contraction):
                yield "the coefficient", node.coefficient, node.span, None
            elif isinstance(node, Scalar):
                yield "the number", node.value, node.span, None
            elif isinstance(node, SoftmaxBox):
                yield f"the {node.box_name} box's scale", node.scale, node.span, None
                yield f"the {node.box_name} box's eps", node.eps, node.span, _eps_rule
            elif isinstance(node, ElementwiseMap):
                rule = _exponent_rule if node.name == "pow" else None
                for value in node.params:
                    yield f"the {'exponent' if rule else node.name + ' bound'}", value, node.span, rule
                if node.name == "clamp" and len(node.params) == 2:
                    yield "clamp's hi - lo =", node.params[1] - node.params[0], node.span, _order_rule("lo", "hi")


def _eps_rule(x: float) -> str | None:
    return None if 0 <= x <= 1 else "must be between 0 and 1 (a small number added to the sum)"


def _exponent_rule(x: float) -> str | None:
    return None if abs(x) <= 64 else "is out of range (at most 64)"


def _order_rule(low: str, high: str):
    return lambda x: None if x >= 0 else f"is negative: {low} is greater than {high}"


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
