"""Reading a design's files: parse one file into its `design` line and its items, follow an
`extends` chain of base designs, and merge each derived design into its base (`replace` swaps an
item in place, a new item is appended, a new output list replaces the old). The merged items are
what the builder reads."""

from __future__ import annotations

from pathlib import Path

from .. import parse as syn
from ..errors import Diagnostic, Span, TdiagError, did_you_mean
from ..resources import design_file


def _item_name(item: syn.Item) -> str | None:
    if isinstance(item, syn.SizeDef | syn.Declaration):
        return item.name
    if isinstance(item, syn.Statement):
        return item.target.name
    return None


def _what(item: syn.Item) -> str:
    if isinstance(item, syn.Declaration):
        return f"declared as {item.kind}"
    if isinstance(item, syn.SizeDef):
        return "as a size"
    return "computed by a statement"


def _item_name_span(item: syn.Item) -> Span:
    if isinstance(item, syn.SizeDef) and item.name_span is not None:
        return item.name_span
    if isinstance(item, syn.Declaration):
        return item.name_span
    if isinstance(item, syn.Statement):
        return item.target.name_span
    return item.span


def load_items(path: str) -> tuple[syn.DesignDecl, list[syn.Item]]:
    """Parse `path` and, when it `extends` a base design, merge it into the base's items. The
    chain of bases is followed in a loop, not by recursion, so its length has no limit. A bundled
    design may be named instead of a path (`fish`)."""
    chain = [(head, body) for _, head, body in _chain(path)]
    items = chain[-1][1]
    for _, body in reversed(chain[:-1]):
        items = _merge(items, body)
    return chain[0][0], items


def design_chain(path: str) -> list[Path]:
    """The files a design is read from: its own, then each base it `extends`, in order; a run
    folder keeps copies of them all so that the design can be read again from there."""
    return [Path(file) for file, _, _ in _chain(path)]


def _chain(path: str) -> list[tuple[str, syn.DesignDecl, list[syn.Item]]]:
    """Each file of the `extends` chain with its `design` line and its other items."""
    path = str(design_file(path))
    chain: list[tuple[str, syn.DesignDecl, list[syn.Item]]] = []
    seen = {Path(path).resolve()}
    current = path
    while True:
        head, body = _design_file(current)
        chain.append((current, head, body))
        if head.base is None:
            break
        base_path = str(Path(current).parent / f"{head.base}.td")
        if Path(base_path).resolve() in seen:
            raise TdiagError(
                Diagnostic(f"design '{head.name}' extends itself through '{head.base}'", (head.base_span,))
            )
        if not Path(base_path).exists():
            siblings = [p.stem for p in Path(current).parent.glob("*.td")]
            raise TdiagError(
                Diagnostic(
                    f"no base design '{head.base}' (looked for {base_path})",
                    (head.base_span,),
                    did_you_mean(head.base, siblings),
                )
            )
        seen.add(Path(base_path).resolve())
        current = base_path
    return chain


def _design_file(path: str) -> tuple[syn.DesignDecl, list[syn.Item]]:
    """One file's `design` line and its other items."""
    source = syn.parse_file(path)
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
                        f"'replace {_item_name(i)}' needs a base design",
                        (i.span,),
                        f"write 'design {head.name} extends BASE' to derive from BASE.td",
                    )
                    for i in stray
                ]
            )
    return head, body


def _merge(base: list[syn.Item], derived: list[syn.Item]) -> list[syn.Item]:
    items = list(base)
    position = {_item_name(i): k for k, i in enumerate(items) if _item_name(i)}
    problems: list[Diagnostic] = []
    for item in derived:
        name = _item_name(item)
        if getattr(item, "replace", False):
            if name not in position:
                problems.append(
                    Diagnostic(
                        f"nothing named '{name}' in the base design to replace",
                        (_item_name_span(item),),
                        did_you_mean(name or "", [n for n in position if n]),
                    )
                )
                continue
            items[position[name]] = item
        else:
            if isinstance(item, syn.Output):
                items = [i for i in items if not isinstance(i, syn.Output)]
            items.append(item)
            if name and name not in position:
                position[name] = len(items) - 1
    if problems:
        raise TdiagError(problems)
    return items
