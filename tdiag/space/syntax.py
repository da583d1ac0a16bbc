"""`.tds` text -> Space: a base design and the choices that make its points.

The grammar is `grammar/space.lark`, loaded after `grammar/tdiag.lark` so that a space's items are
that grammar's own rules and become the same syntax dataclasses as a `.td` file's (parse.py's
transformer builds them). Nothing here gives them meaning: points.py applies the chosen items to the
base the way `extends`/`replace` do, at the level of syntax items."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from lark import Lark, Token, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedToken

from .. import parse as syn
from ..errors import SOURCES, Diagnostic, Span, TdiagError
from ..files import read_source
from ..resources import grammar_text, missing_space, package_folder, space_file


@dataclass(frozen=True)
class Option:
    """One alternative of a choice: items applied to the base, and choices nested inside it."""

    name: str
    span: Span
    items: tuple[syn.Item, ...]
    choices: tuple[Choice, ...]


@dataclass(frozen=True)
class Choice:
    """`choose NAME {...}` (options of items) or `choose NAME in v1, v2` (values of a size)."""

    name: str
    span: Span
    options: tuple[Option, ...]
    size: bool = False


@dataclass(frozen=True)
class Space:
    """A `.tds` file: `space NAME extends BASE`, items every point takes, and the choices."""

    name: str
    span: Span
    base: str
    base_span: Span
    items: tuple[syn.Item, ...]
    choices: tuple[Choice, ...]

    @property
    def file(self) -> str:
        return self.span.file


def space_grammar_text() -> str:
    """The .tds grammar: tdiag.lark's rules followed by space.lark's."""
    return grammar_text() + "\n" + (package_folder("grammar") / "space.lark").read_text(encoding="utf-8")


@cache
def _parser() -> Lark:
    return Lark(
        space_grammar_text(),
        parser="lalr",
        start="space_file",
        postlex=syn._JoinLines(),
        propagate_positions=True,
        maybe_placeholders=False,
    )


def _flat(children: list) -> tuple[list[syn.Item], list[Choice]]:
    items: list[syn.Item] = []
    choices: list[Choice] = []
    for child in children:
        if isinstance(child, Choice):
            choices.append(child)
        elif isinstance(child, list):
            items += child
        elif not isinstance(child, Token):
            items.append(child)
    return items, choices


@v_args(meta=True)
class _ToSpace(syn._ToSyntax):
    """parse.py's transformer plus one method per rule of space.lark."""

    def space_file(self, meta, children):
        head, *rest = children
        items, choices = _flat(rest)
        name, base = head
        return Space(name[1], self._s(meta), base[1], base[0], tuple(items), tuple(choices))

    def space_head(self, meta, children):
        name, _, base = children
        return (self._s(name), str(name)), (self._s(base), str(base))

    def choose_sizes(self, meta, children):
        name, *values = children
        options = []
        for value in values:
            text = span_text(value.span)
            size = syn.SizeDef(value.span, str(name), value, replace=True, name_span=self._s(name))
            options.append(Option(text, value.span, (size,), ()))
        return Choice(str(name), self._s(name), tuple(options), size=True)

    def choose_options(self, meta, children):
        name, *options = children
        return Choice(str(name), self._s(name), tuple(o for o in options if isinstance(o, Option)))

    def _option(self, meta, children):
        name, *rest = children
        items, choices = _flat(rest)
        return Option(str(name), self._s(name), tuple(items), tuple(choices))

    option_line = _option
    option_block = _option


def span_text(span: Span) -> str:
    """The text a span covers (the file is in SOURCES: it was just parsed)."""
    lines = [SOURCES.line(span.file, k) or "" for k in range(span.line, span.end_line + 1)]
    if len(lines) == 1:
        return lines[0][span.column - 1 : span.end_column - 1]
    return "\n".join([lines[0][span.column - 1 :], *lines[1:-1], lines[-1][: span.end_column - 1]])


def _enclosing_choice(text: str, line: int) -> str | None:
    """The innermost `choose NAME` open at `line` (for a syntax error inside a choice)."""
    stack: list[str | None] = []  # one entry per open brace: the choice it opens, or None (an option)
    pending = None
    for number, raw in enumerate(text.split("\n")[:line], start=1):
        code = raw.split("#", 1)[0]
        pending = None
        for match in re.finditer(r"choose\s+([A-Za-z_]\w*)(\s+in\b)?|\{|\}", code):
            if match.group(1):
                pending = match.group(1)
                if match.group(2) and number < line:
                    pending = None  # a one-line size choice ends with its line
            elif match.group(0) == "{":
                stack.append(pending)
                pending = None
            elif stack:
                stack.pop()
    named = [name for name in [*stack, pending] if name]
    return named[-1] if named else None


_SPACE_WORDS = {"LBRACE": "'{'", "RBRACE": "'}'", "SEMICOLON": "';'", "IN": "'in'", "CHOOSE": "'choose'"}


def parse_space_text(text: str, file: str = "<string>") -> Space:
    """Parse `.tds` text, or raise TdiagError positioned at the mistake, naming the choice it is in."""
    text = syn.prepared_text(text, file)
    try:
        tree = _parser().parse(text)
    except (UnexpectedCharacters, UnexpectedToken, UnexpectedEOF) as error:
        diagnostic = syn.syntax_error(file, text, error, _parser(), _SPACE_WORDS)
        choice = _enclosing_choice(text, diagnostic.spans[0].line if diagnostic.spans else 1)
        if choice:
            diagnostic = Diagnostic(f"in choice '{choice}': {diagnostic.message}", diagnostic.spans, diagnostic.hint)
        raise TdiagError(diagnostic) from None
    syn._check_depth(tree, file)
    return _ToSpace(file).transform(tree)


def parse_space_file(path: str | Path) -> Space:
    """Read (safely: files.read_source) and parse a `.tds` file."""
    path = space_file(path)
    text = read_source(path, "design space", lambda file: missing_space(file))
    return parse_space_text(text, str(path))
