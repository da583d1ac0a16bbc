"""DesignGraph -> diagnostics: the whole-design checks that need the finished graph (design notes
§3). Name, leg-size, reshape and box-leg errors are found while the graph is built (graph.py);
here are the ones about how tensors connect: what reaches an output, and what nothing uses."""

from __future__ import annotations

from .errors import Diagnostic
from .graph import DesignGraph
from .ir import walk


def check(design: DesignGraph) -> list[Diagnostic]:
    """Every problem of a built design, errors and warnings, in file order."""
    found = [
        *_outputs_depend_on_an_input(design),
        *_unused_tensors(design),
        *_buffers_without_update(design),
        *_scale_is_a_number(design),
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
    seen = set(sources)
    stack = list(sources)
    while stack:
        for user in forward.successors(stack.pop()):
            if user not in seen:
                seen.add(user)
                stack.append(user)
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
