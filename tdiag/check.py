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
    problems = []
    for name in design.outputs:
        sources = design.depends_on(name) | {name}
        if not any(design.tensors[s].kind == "input" for s in sources):
            tensor = design.tensors[name]
            problems.append(
                Diagnostic(
                    f"output '{name}' depends on no input",
                    (tensor.span,),
                    "an attention design computes its output from an input tensor",
                )
            )
    return problems


def _used_tensors(design: DesignGraph) -> set[str]:
    used: set[str] = set()
    for name in design.outputs:
        used |= design.depends_on(name) | {name}
    for update in design.updates:
        used |= design.depends_on(update.target)
        for node in walk(update.expr):
            name = getattr(node, "name", None)
            if name in design.tensors:
                used |= design.depends_on(name) | {name}
    return used


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
