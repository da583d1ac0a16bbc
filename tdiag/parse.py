"""Text -> syntax. `grammar/tdiag.lark` is the reference for the syntax; this module only turns its
parse tree into frozen dataclasses that remember their Span, and turns lark's errors into
positioned diagnostics. It adds no meaning: names, legs and sizes are resolved in graph/."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from .errors import SOURCES, Diagnostic, Span, TdiagError
from .files import read_source
from .resources import grammar_text, missing_design

MAX_DIGITS = 300  # a longer whole number is read as a float: inf, which graph/ reports as out of range
MAX_DEPTH = 64  # expression nesting (each operator, call or term of a sum is a level); deeper is an error


# ---- syntax dataclasses --------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    span: Span


@dataclass(frozen=True)
class Number(Node):
    value: float | int


@dataclass(frozen=True)
class Name(Node):
    name: str


@dataclass(frozen=True)
class Leg(Node):
    name: str


@dataclass(frozen=True)
class SlicedLeg(Leg):
    """`n: N` in a use `P[n: N, f]`: leg n reads the first N entries of that axis (a table
    declared over a maximum length, used at the run-time length). `j: a..b` (`start` = a,
    `size` = b) reads entries a .. b − 1 of the axis, b − a of them (a fused weight's part at an
    offset); `n: N` is `n: 0..N`."""

    size: Expr
    start: Expr | None = None


@dataclass(frozen=True)
class LegGroup(Node):
    """`(h d)`: one axis viewed as several legs (a reshape), head-major."""

    legs: tuple[Leg, ...]


@dataclass(frozen=True)
class Option(Node):
    name: str
    value: Expr


@dataclass(frozen=True)
class Indexed(Node):
    """`NAME[items]`: a tensor used with legs (or a box head before its arguments)."""

    name: str
    name_span: Span
    legs: tuple[Leg | LegGroup, ...]
    options: tuple[Option, ...]
    items: tuple[Leg | LegGroup | Option, ...] = ()  # legs and options in written order (axes)


@dataclass(frozen=True)
class Keyword(Node):
    name: str
    value: Expr


@dataclass(frozen=True)
class Call(Node):
    """`NAME(args)` or `NAME[legs, options](args)`: a map, box, reduction or initializer."""

    name: str
    name_span: Span
    legs: tuple[Leg | LegGroup, ...] | None
    options: tuple[Option, ...]
    args: tuple[Expr, ...]
    keywords: tuple[Keyword, ...]


@dataclass(frozen=True)
class BinOp(Node):
    op: str  # one of + - * / juxt ^
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Neg(Node):
    operand: Expr


Expr = Number | Name | Indexed | Call | BinOp | Neg


@dataclass(frozen=True)
class DesignDecl(Node):
    name: str
    base: str | None
    base_span: Span | None


@dataclass(frozen=True)
class SizeDef(Node):
    name: str
    value: Expr | None
    replace: bool = False
    name_span: Span | None = None


@dataclass(frozen=True)
class Axis(Node):
    leg: str
    size: Expr


@dataclass(frozen=True)
class Declaration(Node):
    kind: str  # input | mask | param | const | random | buffer
    name: str
    name_span: Span
    axes: tuple[Axis, ...]
    init: Expr | None
    replace: bool = False


@dataclass(frozen=True)
class Target(Node):
    name: str
    name_span: Span
    legs: tuple[Leg | LegGroup, ...]


@dataclass(frozen=True)
class Statement(Node):
    target: Target
    expr: Expr
    replace: bool = False


@dataclass(frozen=True)
class Update(Node):
    target: Target
    expr: Expr


@dataclass(frozen=True)
class Output(Node):
    names: tuple[Name, ...]


Item = DesignDecl | SizeDef | Declaration | Statement | Update | Output


@dataclass(frozen=True)
class SourceFile:
    path: str
    items: tuple[Item, ...]


# ---- lark plumbing -------------------------------------------------------------------------


class _JoinLines:
    """Drop line breaks inside (...) and [...] so an item may continue on the next line."""

    always_accept = ("_NL",)

    def __init__(self) -> None:
        self.open: list[Token] = []  # brackets not yet closed, for the "not closed" hint

    def process(self, stream: Iterator[Token]) -> Iterator[Token]:
        self.open = []
        for token in stream:
            if token.type in ("LPAR", "LSQB"):
                self.open.append(token)
            elif token.type in ("RPAR", "RSQB") and self.open:
                self.open.pop()
            if token.type == "_NL" and self.open:
                continue
            yield token


@cache
def _parser() -> Lark:
    return Lark(
        grammar_text(),
        parser="lalr",
        postlex=_JoinLines(),
        propagate_positions=True,
        maybe_placeholders=False,
    )


def _span(file: str, meta_or_token: object) -> Span:
    m = meta_or_token
    return Span(file, m.line, m.column, m.end_line, m.end_column)  # type: ignore[attr-defined]


@v_args(meta=True)
class _ToSyntax(Transformer):
    """Parse tree -> syntax dataclasses; one method per aliased grammar alternative."""

    def __init__(self, file: str):
        super().__init__()
        self.file = file

    def _s(self, m: object) -> Span:
        return _span(self.file, m)

    # items
    def start(self, meta, children):
        return list(children)

    def design(self, meta, children):
        children = [c for c in children if not (isinstance(c, Token) and c.type == "EXTENDS")]
        base = children[1] if len(children) > 1 else None
        return DesignDecl(self._s(meta), str(children[0]), str(base) if base else None, self._s(base) if base else None)

    def sizes(self, meta, children):
        return list(children)

    def size_def(self, meta, children):
        name = children[0]
        return SizeDef(self._s(meta), str(name), children[1] if len(children) > 1 else None, name_span=self._s(name))

    def declaration(self, meta, children):
        kind, name, *rest = children
        axes = tuple(c for c in rest if isinstance(c, Axis))
        init = next((c for c in rest if not isinstance(c, Axis)), None)
        return Declaration(self._s(meta), str(kind), str(name), self._s(name), axes, init)

    def axis(self, meta, children):
        return Axis(self._s(meta), str(children[0]), children[1])

    def statement(self, meta, children):
        return Statement(self._s(meta), children[0], children[1])

    def target(self, meta, children):
        name, legs = children
        return Target(self._s(meta), str(name), self._s(name), legs)

    def replace(self, meta, children):
        (item,) = children
        if isinstance(item, list):
            return [SizeDef(s.span, s.name, s.value, replace=True, name_span=s.name_span) for s in item]
        if isinstance(item, Declaration):
            return Declaration(item.span, item.kind, item.name, item.name_span, item.axes, item.init, True)
        return Statement(item.span, item.target, item.expr, replace=True)

    def update(self, meta, children):
        return Update(self._s(meta), children[0], children[1])

    def output(self, meta, children):
        return Output(self._s(meta), tuple(Name(self._s(t), str(t)) for t in children))

    # legs and options
    def leg_items(self, meta, children):
        return tuple(children)

    def bracket_items(self, meta, children):
        return tuple(children)

    def leg(self, meta, children):
        return Leg(self._s(meta), str(children[0]))

    def leg_group(self, meta, children):
        return LegGroup(self._s(meta), tuple(Leg(self._s(t), str(t)) for t in children))

    def sliced_leg(self, meta, children):
        return SlicedLeg(self._s(meta), str(children[0]), children[1])

    def ranged_leg(self, meta, children):
        name, start, stop = children
        return SlicedLeg(self._s(meta), str(name), stop, start)

    def option(self, meta, children):
        return Option(self._s(meta), str(children[0]), children[1])

    # expressions
    def _binop(op):  # noqa: N805
        def method(self, meta, children):
            return BinOp(self._s(meta), op, children[0], children[1])

        return method

    add = _binop("+")
    sub = _binop("-")
    mul = _binop("*")
    div = _binop("/")
    juxt = _binop("juxt")
    pow = _binop("^")

    def neg(self, meta, children):
        return Neg(self._s(meta), children[0])

    def number(self, meta, children):
        text = str(children[0])
        # float() of a 5,000-digit literal is inf (reported as out of range), where int() would raise
        value: float | int = int(text) if text.isdigit() and len(text) <= MAX_DIGITS else float(text)
        return Number(self._s(meta), value)

    def name(self, meta, children):
        return Name(self._s(meta), str(children[0]))

    def indexed(self, meta, children):
        name, items = children
        legs = tuple(i for i in items if not isinstance(i, Option))
        options = tuple(i for i in items if isinstance(i, Option))
        return Indexed(self._s(meta), str(name), self._s(name), legs, options, tuple(items))

    def call(self, meta, children):
        name, (args, keywords) = children
        return Call(self._s(meta), str(name), self._s(name), None, (), args, keywords)

    def box_call(self, meta, children):
        name, items, (args, keywords) = children
        legs = tuple(i for i in items if not isinstance(i, Option))
        options = tuple(i for i in items if isinstance(i, Option))
        return Call(self._s(meta), str(name), self._s(name), legs, options, args, keywords)

    def arguments(self, meta, children):
        args = tuple(c for c in children if not isinstance(c, Keyword))
        keywords = tuple(c for c in children if isinstance(c, Keyword))
        return args, keywords

    def keyword(self, meta, children):
        return Keyword(self._s(meta), str(children[0]), children[1])


# ---- errors --------------------------------------------------------------------------------

_TOKEN_WORDS = {
    "NAME": "a name",
    "NUMBER": "a number",
    "KIND": "a declaration kind (input, mask, param, const, random, buffer)",
    "_NL": "end of line",
    "LSQB": "'['",
    "RSQB": "']'",
    "LPAR": "'('",
    "RPAR": "')'",
    "EQUAL": "'='",
    "COMMA": "','",
    "COLON": "':'",
    "PLUS": "'+'",
    "MINUS": "'-'",
    "STAR": "'*'",
    "SLASH": "'/'",
    "CIRCUMFLEX": "'^'",
    "_RANGE": "'..'",
    "$END": "end of file",
}
_KEYWORDS = {"DESIGN": "design", "EXTENDS": "extends", "SIZE": "size", "REPLACE": "replace"}
_KEYWORDS |= {"UPDATE": "update", "OUTPUT": "output"}


def _describe(terminal: str, words: Mapping[str, str]) -> str:
    if terminal in _KEYWORDS:
        return f"'{_KEYWORDS[terminal]}'"
    return _TOKEN_WORDS.get(terminal, words.get(terminal, terminal.lower()))


def _expected(allowed: set[str], names: Mapping[str, str]) -> str:
    words = sorted({_describe(t, names) for t in allowed if not t.startswith("__")})
    if not words:
        return ""
    if len(words) == 1:
        return f"expected {words[0]}"
    return "expected one of: " + ", ".join(words)


def _found(token: Token) -> str:
    if token.type == "_NL":
        return "end of line"
    if token.type == "$END":
        return "end of file"
    return f"'{token}'"


_UNICODE_LOOKALIKES = {
    "×": "*",
    "·": "*",
    "∕": "/",
    "÷": "/",
    "−": "-",
    "–": "-",
    "√": "sqrt(...)",
    "⊗": "a product of legs",
}
_RESERVED = {"DESIGN", "EXTENDS", "SIZE", "REPLACE", "UPDATE", "OUTPUT", "KIND"}


def _accepted(error: UnexpectedInput, fallback: set[str]) -> set[str]:
    """What the parser could take at the error (the lexer's own list is wider than that)."""
    parser = getattr(error, "interactive_parser", None)
    if parser is None:
        return fallback
    try:
        return set(parser.accepts())
    except Exception:  # lark cannot always replay the state; its own list is still right
        return fallback


def _continuation_hint(token: Token, error: UnexpectedToken, text: str) -> str | None:
    """An indented line that was meant to continue the previous one."""
    if token.type != "_NL" or "EQUAL" not in error.expected:
        return None
    lines = text.split("\n")
    line = lines[token.line - 1] if token.line <= len(lines) else ""
    if line[:1].isspace():
        return "an item continues on the next line only inside ( ) or [ ]; wrap the expression in parentheses"
    return None


def _unclosed_hint(token: Token, postlex: object) -> str | None:
    """When a bracket opened on an earlier line is still open, say where it was opened."""
    opened = getattr(postlex, "open", [])
    if opened and (opened[-1].line < token.line or token.type in ("$END", "_NL", "EQUAL")):
        return f"the '{opened[-1]}' at line {opened[-1].line}, column {opened[-1].column} is not closed"
    return None


def _token_hint(token: Token, previous: Token | None, text: str) -> str | None:
    if token.type == "STAR" and previous is not None and previous.type == "STAR":
        return "write powers with '^', e.g. x ^ 2"
    if token.type == "LSQB" and previous is not None and previous.type in _RESERVED:
        return f"'{previous}' is a reserved word; give the tensor another name"
    if token.type == "COLON":
        return "'leg: SIZE' axes belong in a declaration; start the line with its kind: input, mask, param, const, ..."
    if token.type == "LPAR" and previous is not None and previous.type in ("RSQB", "NAME"):
        return "to multiply by a parenthesised expression write '*' before '('"
    return None


def syntax_error(
    file: str, text: str, error: UnexpectedInput, parser: Lark | None = None, words: Mapping[str, str] | None = None
) -> Diagnostic:
    """The positioned message for lark's error from `parser` (the .td parser by default); `words`
    names the terminals a grammar built over the .td rules adds."""
    postlex = (parser or _parser()).options.postlex
    words = words or {}
    hint = None
    if isinstance(error, UnexpectedCharacters):
        char = text[error.pos_in_stream] if error.pos_in_stream < len(text) else ""
        span = Span(file, error.line, error.column, error.line, error.column + 1)
        message = f"unexpected character {char!r}"
        if char in _UNICODE_LOOKALIKES:
            hint = f"write {_UNICODE_LOOKALIKES[char]!r} instead; .td files are ASCII"
        elif char == "@":
            hint = "juxtaposition (or '*') multiplies tensors; shared legs are contracted"
        elif char == "*" or char == "!":
            hint = None
        elif not char.isascii():
            hint = "names, numbers and operators are ASCII; remove or replace this character"
        expected = _expected(_accepted(error, set(error.allowed or ())), words)
        if expected:
            message += f"; {expected}"
        return Diagnostic(message, (span,), hint)
    if isinstance(error, UnexpectedToken):
        token = error.token
        if token.type == "$END":
            lines = text.rstrip("\n").split("\n")
            line = len(lines)
            column = len(lines[-1]) + 1
            span = Span(file, line, column, line, column + 1)
        else:
            end = token.end_column if token.end_line == token.line else token.column + 1
            span = Span(file, token.line, token.column, token.line, max(end or 0, token.column + 1))
        message = f"unexpected {_found(token)}"
        expected = _expected(_accepted(error, set(error.expected)), words)
        if expected:
            message += f"; {expected}"
        previous = error.token_history[-1] if error.token_history else None
        nested_group = token.type == "LPAR" and _accepted(error, set(error.expected)) <= {"RPAR", "NAME"}
        hint = (
            "a leg group does not nest: (g r s p) splits one axis into the legs g, r, s and p" if nested_group else None
        ) or (
            _unclosed_hint(token, postlex)
            or _token_hint(token, previous, text)
            or _continuation_hint(token, error, text)
        )
        return Diagnostic(message, (span,), hint)
    span = Span(file, getattr(error, "line", 1) or 1, getattr(error, "column", 1) or 1, 0, 0)
    return Diagnostic("unexpected end of input", (span,))


def prepared_text(text: str, file: str) -> str:
    """The text as the parsers read it: without a UTF-8 byte order mark (as some editors save),
    registered for positioned messages, ending in a line break."""
    text = text.removeprefix("\ufeff")
    SOURCES.add(file, text)
    return text if text.endswith("\n") else text + "\n"


def parse_text(text: str, file: str = "<string>") -> SourceFile:
    """Parse one `.td` text into syntax items, or raise TdiagError with a positioned message."""
    text = prepared_text(text, file)
    try:
        tree = _parser().parse(text)
    except (UnexpectedCharacters, UnexpectedToken, UnexpectedEOF) as error:
        raise TdiagError(syntax_error(file, text, error)) from None
    _check_depth(tree, file)
    items = _ToSyntax(file).transform(tree)
    return SourceFile(file, tuple(_flatten(items)))


def _check_depth(tree: Tree, file: str) -> None:
    """Refuse an expression nested deeper than MAX_DEPTH before anything recurses into it, so no
    input reaches Python's recursion limit; the walk itself is iterative."""
    stack: list[tuple[Tree, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH + 2:  # start and the item take two levels
            meta = node.meta
            span = Span(file, meta.line, meta.column, meta.end_line, meta.end_column)
            raise TdiagError(
                Diagnostic(
                    f"expression nested too deeply (more than {MAX_DEPTH} levels of operators, calls and terms)",
                    (span,),
                    "split it into several statements, e.g. a partial sum T[...] = ... then Y[...] = T[...] + ...",
                )
            )
        stack += [(child, depth + 1) for child in node.children if isinstance(child, Tree)]


def _flatten(items: object) -> Iterator[Item]:
    for item in items if isinstance(items, list) else [items]:
        if isinstance(item, list):
            yield from _flatten(item)
        elif isinstance(item, Tree):
            raise AssertionError(f"untransformed grammar rule {item.data!r}")
        else:
            yield item


def parse_file(path: str | Path) -> SourceFile:
    """Read (safely: files.read_source) and parse a `.td` file; an unreadable file is an error too."""
    return parse_text(read_source(path, "design", missing_design), str(path))
