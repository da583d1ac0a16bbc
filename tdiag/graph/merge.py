"""Reading a design's files: parse one file into its `design` line and its items, follow an
`extends` chain of base designs, and merge each derived design into its base (`replace` swaps an
item in place, a new item is appended, a new output list replaces the old). The merged items are
what the builder reads."""

from __future__ import annotations

import os
from pathlib import Path

from .. import parse as syn
from ..errors import Diagnostic, Span, TdiagError, did_you_mean
from ..resources import design_file


def item_name(item: syn.Item) -> str | None:
    if isinstance(item, syn.SizeDef | syn.Declaration):
        return item.name
    if isinstance(item, syn.Statement):
        return item.target.name
    return None


def item_kind_text(item: syn.Item) -> str:
    if isinstance(item, syn.Declaration):
        return f"declared as {item.kind}"
    if isinstance(item, syn.SizeDef):
        return "as a size"
    return "computed by a statement"


def item_name_span(item: syn.Item) -> Span:
    if isinstance(item, syn.SizeDef) and item.name_span is not None:
        return item.name_span
    if isinstance(item, syn.Declaration):
        return item.name_span
    if isinstance(item, syn.Statement):
        return item.target.name_span
    return item.span


def load_items(path: str) -> tuple[syn.DesignDecl, list[syn.Item], tuple[str, ...]]:
    """Parse `path` and, when it `extends` a base design, merge it into the base's items; also
    return the files read (the design's, then its bases'), which a command must never write over.
    The chain of bases is followed in a loop, not by recursion, so its length has no limit. A
    bundled design may be named instead of a path (`fish`)."""
    chain = _chain(path)
    items = chain[-1][2]
    for _, _, body in reversed(chain[:-1]):
        items = merged_items(items, body)
    return chain[0][1], items, tuple(file for file, _, _ in chain)


def design_chain(path: str) -> list[Path]:
    """The files a design is read from: its own, then each base it `extends`, in order; a run
    folder keeps copies of them all so that the design can be read again from there."""
    return [Path(file) for file, _, _ in _chain(path)]


def _chain(path: str) -> list[tuple[str, syn.DesignDecl, list[syn.Item]]]:
    """Each file of the `extends` chain with its `design` line and its other items."""
    path = str(design_file(path))
    chain: list[tuple[str, syn.DesignDecl, list[syn.Item]]] = []
    seen = {os.path.realpath(path)}
    current = path
    while True:
        head, body = design_file_items(current) if not chain else _base_file(current, chain[-1][1])
        chain.append((current, head, body))
        if head.base is None:
            break
        base_path = str(Path(current).parent / f"{head.base}.td")
        if os.path.realpath(base_path) in seen:
            raise TdiagError(
                Diagnostic(f"design '{head.name}' extends itself through '{head.base}'", (head.base_span,))
            )
        if not os.path.lexists(base_path):
            siblings = [p.stem for p in Path(current).parent.glob("*.td")]
            raise TdiagError(
                Diagnostic(
                    f"no base design '{head.base}' (looked for {base_path})",
                    (head.base_span,),
                    did_you_mean(head.base, siblings),
                )
            )
        seen.add(os.path.realpath(base_path))
        current = base_path
    return chain


def _base_file(path: str, derived: syn.DesignDecl) -> tuple[syn.DesignDecl, list[syn.Item]]:
    """A base design's file; when it cannot be read at all (a folder, a FIFO, too large), the
    error points at the `extends` that named it."""
    try:
        return design_file_items(path)
    except TdiagError as error:
        if any(d.spans for d in error.diagnostics):
            raise
        raise TdiagError(
            Diagnostic(
                d.message,
                (derived.base_span,),
                f"the base of 'extends {derived.base}' is the file {derived.base}.td beside this design",
            )
            for d in error.diagnostics
        ) from None


def load_texts(texts: tuple[tuple[str, str], ...]) -> tuple[syn.DesignDecl, list[syn.Item]]:
    """The merged items of an `extends` chain given as (file name, text) pairs, the design's first
    and then each base in order, as `load_items` reads them from files: what a compiled file
    carries of its design (tdiag/decode.py). Each text is parsed under its name, so an error
    points into it; a base that is not the next text's design is an error at its `extends`."""
    chain = [_design_items(syn.parse_text(text, name), name) for name, text in texts]
    if not chain:
        raise TdiagError(Diagnostic("no design text given", (Span("<design>", 1, 1, 1, 2),), None))
    for (head, _), following in zip(chain, [*chain[1:], None], strict=True):
        named = None if following is None else following[0].name
        if head.base != named:
            base = f"extends '{head.base}'" if head.base else "extends no design"
            what = f"the next text holds design '{named}'" if named else "no text of it follows"
            raise TdiagError(Diagnostic(f"design '{head.name}' {base} but {what}", (head.base_span or head.span,)))
    items = chain[-1][1]
    for _, body in reversed(chain[:-1]):
        items = merged_items(items, body)
    return chain[0][0], items


def design_file_items(path: str) -> tuple[syn.DesignDecl, list[syn.Item]]:
    """One file's `design` line and its other items."""
    return _design_items(syn.parse_file(path), path)


def _design_items(source: syn.SourceFile, path: str) -> tuple[syn.DesignDecl, list[syn.Item]]:
    """A parsed file's `design` line and its other items."""
    items = list(source.items)
    if not items or not isinstance(items[0], syn.DesignDecl):
        span = items[0].span if items else Span(path, 1, 1, 1, 2)
        span = Span(span.file, span.line, 1, span.line, 2)
        raise TdiagError(
            Diagnostic("a design file starts with 'design NAME'", (span,), "add a first line: design my_attention")
        )
    head = items[0]
    extra = [i for i in items[1:] if isinstance(i, syn.DesignDecl)]
    if extra:
        raise TdiagError(Diagnostic("a file holds one design; 'design' appears again", (extra[0].span,), None))
    body = items[1:]
    if head.base is None:
        stray = [i for i in body if getattr(i, "replace", False)]
        if stray:
            raise TdiagError(
                [
                    Diagnostic(
                        f"'replace {item_name(i)}' needs a base design",
                        (i.span,),
                        f"write 'design {head.name} extends BASE' to derive from BASE.td",
                    )
                    for i in stray
                ]
            )
    return head, body


def merged_items(base: list[syn.Item], derived: list[syn.Item]) -> list[syn.Item]:
    """The base's items with the derived file's: a `replace` takes the place of the base item of
    its name, anything else is added, and the derived file's `output` lines (all of them) stand for
    the base's, as its update rule for a buffer stands for the base's rule for it."""
    items = list(base)
    position = {item_name(i): k for k, i in enumerate(items) if item_name(i)}
    problems: list[Diagnostic] = []
    for item in derived:
        name = item_name(item)
        if getattr(item, "replace", False):
            if name not in position:
                problems.append(
                    Diagnostic(
                        f"nothing named '{name}' in the base design to replace",
                        (item_name_span(item),),
                        did_you_mean(name or "", [n for n in position if n]),
                    )
                )
                continue
            items[position[name]] = item
        else:
            items.append(item)
            if name and name not in position:
                position[name] = len(items) - 1
    if problems:
        raise TdiagError(problems)
    has_outputs = any(isinstance(i, syn.Output) for i in derived)
    updated = {i.target.name for i in derived if isinstance(i, syn.Update)}
    return [i for k, i in enumerate(items) if k >= len(base) or not _stood_for(i, has_outputs, updated)]


def _stood_for(item: syn.Item, has_outputs: bool, updated: set[str]) -> bool:
    """Whether a base item gives way to the derived file's: its output lines when it has any, and
    the update rule of a buffer it gives a rule of its own."""
    return (has_outputs and isinstance(item, syn.Output)) or (
        isinstance(item, syn.Update) and item.target.name in updated
    )
