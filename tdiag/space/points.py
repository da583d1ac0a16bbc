"""Space -> points. A point takes one option of every choice (and of every choice nested in the
options it takes); its design is the base's syntax items with the space's own items and the chosen
options' items applied as a derived design's body is (graph/merge.py: `replace` swaps the item in
place, anything else is added). Nothing is printed and re-parsed: the point's items are the very
syntax dataclasses the base file and the space file parsed to, so every diagnostic about a point
points into one of those two files.

Mistakes in the space itself (a `replace` of a name the base lacks, a name defined twice, a size
choice for a size the base lacks, two options of one name) are positioned errors naming the choice,
raised before any point is built. A point whose design does not build or check (a size that does
not divide, say) is reported with that point and does not stop the others."""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .. import parse as syn
from ..check import check
from ..design import Design
from ..errors import Diagnostic, Span, TdiagError, did_you_mean
from ..graph import build_graph, load_items
from ..graph.merge import item_name, item_name_span, merged_items
from ..resources import design_file
from .syntax import Choice, Option, Space, parse_space_file, span_text


@dataclass
class Point:
    """One combination of choices: `choices` maps each choice taken to its option's name."""

    space: Space
    choices: dict[str, str]
    items: list[syn.Item]
    chosen_sizes: frozenset[str]
    design: Design | None = None
    problems: list[Diagnostic] = field(default_factory=list)

    @property
    def name(self) -> str:
        """An identifier for the point's design: the space's name and its options, in order."""
        parts = [f"{c}{o}" if c in self.chosen_sizes else o for c, o in self.choices.items()]
        text = "_".join([self.space.name, *parts])
        return re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9_]", "_", text)).strip("_")

    @property
    def label(self) -> str:
        """The point as a reader says it: `core=kronecker C1=trainable H=4`."""
        return " ".join(f"{c}={o}" for c, o in self.choices.items())

    @property
    def ok(self) -> bool:
        return self.design is not None

    def build(self, sizes: Mapping[str, int] | None = None) -> Point:
        """Build and check the point's design with `sizes` for the sizes it does not choose."""
        overrides = {k: v for k, v in (sizes or {}).items() if k not in self.chosen_sizes}
        head = syn.DesignDecl(self.space.span, self.name, None, None)
        try:
            fixed = {i.name for i in self.items if isinstance(i, syn.SizeDef) and i.value is not None}
            graph = build_graph(head, self.items, {k: v for k, v in overrides.items() if k in fixed})
            found = graph.warnings + check(graph)
        except TdiagError as error:
            self.problems = error.diagnostics
            return self
        errors = [d for d in found if d.is_error]
        if errors:
            self.problems = errors
            return self
        self.design = Design(graph, [d for d in found if not d.is_error])
        return self

    def text(self) -> str:
        """The point as a standalone `.td` file: a header naming its choices, then its items,
        each as written in the base or the space file (`--write`)."""
        lines = [
            f"# Point of the design space '{self.space.name}' ({Path(self.space.file).name}), "
            f"base design '{self.space.base}'.",
            f"# Choices: {self.label or '(none)'}",
            f"design {self.name}",
            "",
        ]
        lines += [_item_text(item) for item in self.items]
        return "\n".join(lines) + "\n"


def _item_text(item: syn.Item) -> str:
    if isinstance(item, syn.SizeDef):
        value = f" = {span_text(item.value.span)}" if item.value is not None else ""
        return f"size {item.name}{value}"
    if isinstance(item, syn.Statement | syn.Declaration) and item.replace:
        text = span_text(item.span)  # the item's own span starts after the word `replace`
        return text
    return span_text(item.span)


@dataclass
class SpacePoints:
    """A parsed, validated space with its base design's items; `points()` enumerates it."""

    space: Space
    base_items: list[syn.Item]

    def count(self) -> int:
        """How many points the choices imply: a product over top-level choices, each the sum
        over its options of the product over the choices nested in that option."""
        return _product(self.space.choices)

    def points(self) -> Iterator[Point]:
        """Every point, in the order of the choices and of their options (unbuilt)."""
        for combination in _combinations(self.space.choices):
            choices: dict[str, str] = {}
            derived = list(self.space.items)
            sizes: set[str] = set()
            for choice, option in combination:
                choices[choice.name] = option.name
                derived += option.items
                if choice.size:
                    sizes.add(choice.name)
            point = Point(self.space, choices, merged_items(self.base_items, derived), frozenset(sizes))
            yield point

    def point(self, name_or_label: str) -> Point:
        for point in self.points():
            if name_or_label in (point.name, point.label):
                return point
        raise KeyError(name_or_label)


def _combinations(choices: tuple[Choice, ...]) -> Iterator[list[tuple[Choice, Option]]]:
    if not choices:
        yield []
        return
    first, rest = choices[0], choices[1:]
    for option in first.options:
        for inner in _combinations(option.choices):
            for tail in _combinations(rest):
                yield [(first, option), *inner, *tail]


def _product(choices: tuple[Choice, ...]) -> int:
    total = 1
    for choice in choices:
        total *= sum(_product(option.choices) for option in choice.options)
    return total


# ---- loading and validating -------------------------------------------------------------------


def base_path(space: Space) -> Path:
    """The base design: BASE.td beside the space file or in the folder above it, else bundled."""
    folder = Path(space.file).parent
    for candidate in (folder / f"{space.base}.td", folder.parent / f"{space.base}.td"):
        if os.path.lexists(candidate):  # even a folder or a FIFO: reading it says why it is no design
            return candidate
    found = design_file(space.base)
    if os.path.isfile(found):
        return found
    raise TdiagError(
        Diagnostic(
            f"no base design '{space.base}' (looked beside {space.file}, in the folder above it "
            "and in the bundled designs)",
            (space.base_span,),
        )
    )


def load_space(path: str | Path) -> SpacePoints:
    """Parse a `.tds` file, load its base design and validate every choice against it."""
    space = parse_space_file(path)
    _, base_items, _ = load_items(str(base_path(space)))
    problems = _validate(space, base_items)
    if problems:
        raise TdiagError(problems)
    return SpacePoints(space, base_items)


def _validate(space: Space, base: list[syn.Item]) -> list[Diagnostic]:
    problems: list[Diagnostic] = []
    base_names = {n: i for i in base if (n := item_name(i))}
    problems += _check_items("the space's own items", list(space.items), dict(base_names), base_names)
    known = dict(base_names) | {n: i for i in space.items if (n := item_name(i))}
    seen: dict[str, Span] = {}
    problems += _check_choices(space.choices, known, base_names, seen)
    return problems


def _check_choices(
    choices: tuple[Choice, ...], known: dict[str, syn.Item], base: dict[str, syn.Item], seen: dict[str, Span]
) -> list[Diagnostic]:
    problems: list[Diagnostic] = []
    subtrees = [_subtree(c) for c in choices]
    for k, choice in enumerate(choices):
        if choice.name in seen:
            problems.append(
                Diagnostic(
                    f"choice '{choice.name}' appears twice (first at line {seen[choice.name].line})",
                    (choice.span, seen[choice.name]),
                    "give each choice its own name: a point is named by its choices",
                )
            )
        seen[choice.name] = choice.span
        # a nested choice is taken together with the enclosing ones and with every choice beside
        # them (and theirs); under another option of the same choice it never is
        inner = dict(seen)
        for j, other in enumerate(subtrees):
            if j != k:
                inner |= {n: sp for n, sp in other.items() if n not in inner}
        if choice.size and not isinstance(base.get(choice.name), syn.SizeDef):
            problems.append(
                Diagnostic(
                    f"choice '{choice.name}': the base design has no size '{choice.name}'",
                    (choice.span,),
                    did_you_mean(choice.name, [n for n, i in base.items() if isinstance(i, syn.SizeDef)]),
                )
            )
            continue
        names: dict[str, Span] = {}
        for option in choice.options:
            if option.name in names:
                problems.append(
                    Diagnostic(
                        f"choice '{choice.name}' has two options named '{option.name}'",
                        (option.span, names[option.name]),
                    )
                )
            names[option.name] = option.span
            where = f"choice '{choice.name}', option '{option.name}'"
            own = dict(known)
            problems += _check_items(where, list(option.items), own, base)
            problems += _check_choices(option.choices, own, base, dict(inner))
    return problems


def _subtree(choice: Choice) -> dict[str, Span]:
    """The names of a choice and of every choice nested in its options."""
    names = {choice.name: choice.span}
    for option in choice.options:
        for nested in option.choices:
            names |= {n: sp for n, sp in _subtree(nested).items() if n not in names}
    return names


def _check_items(where: str, items: list[syn.Item], known: dict[str, syn.Item], base: dict) -> list[Diagnostic]:
    """`replace` must name something defined before (in the base, the space or an enclosing
    option); anything else must not. `known` gains the names these items define."""
    problems = []
    for item in items:
        name = item_name(item)
        if name is None:
            continue
        if getattr(item, "replace", False):
            if name not in known:
                problems.append(
                    Diagnostic(
                        f"{where}: nothing named '{name}' in the base design to replace",
                        (item_name_span(item),),
                        did_you_mean(name, list(known)),
                    )
                )
        elif name in known:
            first = known[name]
            problems.append(
                Diagnostic(
                    f"{where}: '{name}' is already defined (line {first.span.line} of {Path(first.span.file).name})",
                    (item_name_span(item),),
                    f"write 'replace' before it to change the base's '{name}'",
                )
            )
        known[name] = item
    return problems


def all_points(space: SpacePoints, sizes: Mapping[str, int] | None = None) -> list[Point]:
    """Every point, built and checked at `sizes`."""
    return [point.build(sizes) for point in space.points()]


def take(iterator: Iterator[Point], count: int) -> list[Point]:
    return list(itertools.islice(iterator, count))
