"""The one door from a design into generated source (`source`) and the printers of what goes
through it: names, numbers, string literals, sizes and formulas in run-time sizes as Python.
Nothing of a `.td` file reaches the generated text except through here."""

from __future__ import annotations

import keyword
import math
import re
from collections.abc import Mapping, Sequence

import sympy
from sympy.printing.pycode import PythonCodePrinter

from ..graph import DesignGraph

_ESCAPES = {"\\": "\\\\", '"': '\\"', "'": "\\'", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def python_text(text: object) -> str:
    """`text` made safe for the inside of a string literal or docstring of generated code: quotes,
    backslashes, line breaks and every non-ASCII or unprintable character become escapes, so the
    literal reads back as `text` and nothing in it (a design file's path, say) can end the literal
    and run as code."""
    return "".join(
        _ESCAPES.get(c) or (c if c.isascii() and c.isprintable() else c.encode("unicode_escape").decode("ascii"))
        for c in str(text)
    )


def source(value: object, context: str) -> str:
    """The one door from a design into generated source: every name, number and piece of text
    that a `.td` file, its path or its sizes put into the module's source passes here, written for
    the place it goes.

    - "name": a Python identifier (a `.td` name that check accepted, or a variable the plan made
      fresh); anything else is refused, so no name can become code. Names are not rewritten here:
      check refuses, per role, those the generated module uses for itself (tdiag/names.py) and the
      plan gives locals fresh names outside the generated ones, so a valid design never gets here
      with a bad name; an error here is a tdiag bug, not a user mistake.
    - "number": a finite int, float or sympy number, as a Python literal.
    - "text": the inside of a string literal or docstring (python_text).
    - "fstring": the literal part of an f-string: text with braces doubled.
    - "comment": the rest of a `#` line: line breaks and NUL escaped, nothing else touched."""
    if context == "name":
        if not (isinstance(value, str) and value.isascii() and value.isidentifier()) or keyword.iskeyword(value):
            raise ValueError(f"tdiag bug: {value!r} reached generated code as a name")
        return value
    if context == "number":
        if isinstance(value, sympy.Basic):
            if not value.is_number:
                raise ValueError(f"tdiag bug: {value} reached generated code as a number")
            value = int(value) if value.is_Integer else float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"tdiag bug: {value!r} reached generated code as a number")
        return repr(value)
    if context == "text":
        return python_text(value)
    if context == "fstring":
        return python_text(value).replace("{", "{{").replace("}", "}}")
    if context == "comment":
        return str(value).replace("\r", "\\r").replace("\n", "\\n").replace("\0", "\\0")
    raise ValueError(f"unknown source context {context!r}")


def class_name(design: str) -> str:
    """The generated class: the design's name in CamelCase, prefixed where that is not a Python
    identifier (`design _3`, `design none`)."""
    name = "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]+", design) if part)
    if not name.isidentifier() or keyword.iskeyword(name):
        name = "Design" + name
    return source(name, "name")


def number_code(graph: DesignGraph, value: object, sizes: dict[str, int]) -> str:
    return source(float(graph.evaluate(sympy.sympify(value), **sizes)), "number")


def quoted(text: str) -> str:
    return '"' + source(text, "text") + '"'


def data_literal(value: object) -> str:
    """A Python literal of `value`, built only of str, int, bool, None, tuples (or lists) and
    dicts with str keys (exactly these types: a subclass could repr itself as code); anything else
    is refused, so nothing but data reaches the text."""
    if value is None or type(value) in (bool, int, str):
        return repr(value)
    if isinstance(value, tuple | list):
        return tuple_code([data_literal(v) for v in value]) if value else "()"
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return "{" + ", ".join(f"{data_literal(k)}: {data_literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"a design record holds data only, got {type(value).__name__}")


def tuple_code(items: list[str]) -> str:
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


def batch_dims(var: str, rank: int) -> str:
    """The leading batch dims of a tensor with `rank` trailing axes (all of them for a scalar:
    `shape[:-0]` would be empty)."""
    return f"{var}.shape[:-{rank}]" if rank else f"{var}.shape"


def shape_args(first: str, shape: str) -> str:
    """Arguments of reshape, expand, ones or randn: `first` (B, -1 or *batch_shape) and the
    trailing sizes; a scalar's batch shape alone is passed as the tuple it is."""
    if not shape:
        return "batch_shape" if first == "*batch_shape" else first or "()"
    return f"{first}, {shape}" if first else shape


def size_code(graph: DesignGraph, expr: sympy.Expr) -> str:
    """A size as Python in forward: known sizes are numbers, run-time ones locals."""
    return expr_code(graph.expand(expr).xreplace(known_sizes(graph)))


def known_sizes(graph: DesignGraph) -> dict:
    return {graph.sizes[k].symbol: v for k, v in graph.size_values().items()}


# ---- ops as Python -----------------------------------------------------------------------------


def expr_code(expr: sympy.Expr) -> str:
    """A size as Python: numbers stay numbers, run-time sizes are locals of forward. A size with a
    denominator (the N/C blocks of a split position leg) is floor-divided, so that it stays an
    int; the entry checks that the division is exact (_split_checks)."""
    if expr.is_Integer:
        return source(expr, "number")
    for symbol in expr.free_symbols:
        source(symbol.name, "name")
    numerator, denominator = sympy.fraction(sympy.together(expr))
    if denominator == 1:
        return str(expr)
    return f"{operand_code(numerator)} // {operand_code(denominator)}"


def operand_code(expr: sympy.Expr) -> str:
    """A size as an operand of `//` or `%`: a symbol or a number bare, anything else parenthesized."""
    return str(expr) if expr.is_Symbol or expr.is_Integer else f"({expr})"


class _ScalarPrinter(PythonCodePrinter):
    """Formulas in run-time sizes with Python operators only (`N**(-1/2)`, not `math.sqrt`), so the
    generated module needs no import for them."""

    def _print_Pow(self, expr, rational=False):
        return self._hprint_Pow(expr, rational=True)


def scalar_code(value: sympy.Expr) -> str:
    """A coefficient as Python: an int, a float, or a parenthesized formula in run-time sizes."""
    if value.is_Integer or value.is_number:
        return source(value, "number")
    for symbol in value.free_symbols:
        source(symbol.name, "name")
    return "(" + _ScalarPrinter().doprint(value) + ")"


def sizes_code(sizes: Sequence[sympy.Expr]) -> str:
    return ", ".join(expr_code(s) for s in sizes)


def dims_code(dims: Sequence[int]) -> str:
    return str(dims[0]) if len(dims) == 1 else "(" + ", ".join(map(str, dims)) + ")"


IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
