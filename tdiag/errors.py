"""Positioned diagnostics. Every mistake in a `.td` file or on the command line becomes a
Diagnostic with the spans it concerns; `format_diagnostic` is the one place that turns it into
compiler-style text (file:line:col, the source line, carets under every span, a hint)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Span:
    """Where a construct came from: 1-based line and column, end column exclusive."""

    file: str
    line: int
    column: int
    end_line: int
    end_column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


@dataclass(frozen=True)
class Diagnostic:
    """One error or warning. `spans[0]` is the primary location; the others get carets too."""

    message: str
    spans: tuple[Span, ...] = ()
    hint: str | None = None
    severity: str = "error"

    @property
    def is_error(self) -> bool:
        return self.severity == "error"


class TdiagError(Exception):
    """Raised with every diagnostic of a failed stage, so a user sees all mistakes at once."""

    def __init__(self, diagnostics: Iterable[Diagnostic] | Diagnostic):
        if isinstance(diagnostics, Diagnostic):
            diagnostics = [diagnostics]
        self.diagnostics: list[Diagnostic] = list(diagnostics)
        super().__init__(self.diagnostics[0].message if self.diagnostics else "tdiag error")

    def __str__(self) -> str:
        return format_diagnostics(self.diagnostics)


@dataclass
class SourceRegistry:
    """Texts of the files read so far, so diagnostics can quote lines without re-reading."""

    texts: dict[str, list[str]] = field(default_factory=dict)
    whole: dict[str, str] = field(default_factory=dict)

    def add(self, file: str, text: str) -> None:
        self.texts[file] = split_lines(text)
        self.whole[file] = text

    def text(self, file: str) -> str:
        """The text of a file as the parser last read it (a compiled file carries it)."""
        return self.whole.get(file, "")

    def line(self, file: str, number: int) -> str | None:
        lines = self.texts.get(file)
        if lines is None:
            from .files import read_regular  # files.py builds on this module

            try:
                raw = read_regular(file)
            except (OSError, TdiagError):
                return None
            lines = split_lines(raw.decode("utf-8", errors="replace").removeprefix("\ufeff"))
            self.texts[file] = lines
        if 1 <= number <= len(lines):
            return lines[number - 1]
        return "" if number == len(lines) + 1 else None


SOURCES = SourceRegistry()


def split_lines(text: str) -> list[str]:
    """Lines as the parser counts them: only \\n (or \\r\\n) ends a line. str.splitlines would also
    break at a form feed or U+2028, and an error would then quote the wrong line."""
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    return lines[:-1] if lines and lines[-1] == "" else lines


_LOOKALIKE = str.maketrans({"0": "O", "1": "l", "O": "0"})


def did_you_mean(name: str, candidates: Iterable[str]) -> str | None:
    """A hint naming the closest candidate, or None when nothing is close."""
    candidates = sorted(set(candidates) - {name})
    folded = {c.lower(): c for c in candidates}
    for guess in (name.lower(), name.translate(_LOOKALIKE).lower()):
        if guess in folded:
            return f"did you mean '{folded[guess]}'?"
    # difflib's ratio is at most 2·min(len)/(sum of lens): drop candidates that cannot reach 0.6 first;
    # in a huge file, also those with another first letter, so each hint stays cheap
    close = [c for c in candidates if 2 * min(len(c), len(name)) >= 0.6 * (len(c) + len(name))]
    if len(close) > 200:
        close = [c for c in close if c[:1].lower() == name[:1].lower()][:200]
    matches = difflib.get_close_matches(name, close, n=1, cutoff=0.6)
    if not matches:
        matches = [c for c in candidates if len(c) == len(name) > 1 and _differ_by_one(c, name)]
    return f"did you mean '{matches[0]}'?" if matches else None


def _differ_by_one(a: str, b: str) -> bool:
    return sum(x != y for x, y in zip(a, b, strict=True)) == 1


def hint(*parts: str | None) -> str | None:
    """Join the non-empty parts of a hint with one space."""
    text = " ".join(p for p in parts if p)
    return text or None


def a_or_an(word: str) -> str:
    return f"an {word}" if word[:1] in "aeiou" else f"a {word}"


def one_of(choices: Iterable[str]) -> str:
    return "expected one of: " + ", ".join(sorted(set(choices)))


def _caret_line(text: str, spans: list[Span]) -> str:
    marks = [" "] * (len(text) + 1)
    for span in spans:
        start = max(span.column - 1, 0)
        end = span.end_column - 1 if span.end_line == span.line else len(text)
        end = max(end, start + 1)
        for i in range(start, end):
            if i >= len(marks):
                marks.extend(" " * (i - len(marks) + 1))
            marks[i] = "^"
    return "".join(marks).rstrip()


def _expand_tabs(text: str) -> str:
    return text.replace("\t", " ")


def format_diagnostic(diag: Diagnostic, sources: SourceRegistry = SOURCES) -> str:
    """`file:line:col: error: message`, then each quoted line with carets, then the hint."""
    if not diag.spans:
        lines = [f"tdiag: {diag.severity}: {diag.message}"]
    else:
        primary = diag.spans[0]
        lines = [f"{primary}: {diag.severity}: {diag.message}"]
        by_line: dict[tuple[str, int], list[Span]] = {}
        for span in diag.spans:
            by_line.setdefault((span.file, span.line), []).append(span)
        for (file, number), spans in by_line.items():
            text = sources.line(file, number)
            if text is None:
                continue
            text = _expand_tabs(text)
            prefix = "" if file == primary.file else f"{file}\n"
            width = len(str(number))
            lines.append(f"{prefix}{number:>5} | {text}")
            lines.append(f"{'':>5} | {_caret_line(text, spans)}".rstrip() or "      |")
            del width
    if diag.hint:
        lines.append(f"hint: {diag.hint}")
    return "\n".join(lines)


def format_diagnostics(diagnostics: Iterable[Diagnostic], sources: SourceRegistry = SOURCES) -> str:
    return "\n".join(format_diagnostic(d, sources) for d in diagnostics)
