"""Tables for Jupyter: the `_repr_html_` and `_repr_markdown_` of Design, CostReport and Plan.
Formulas are sympy expressions in the size symbols: in Markdown they are LaTeX between `$`
(Jupyter typesets it), in HTML plain text with · and superscripts, which every front end shows
as is. Nothing here imports torch."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence

import sympy

SUPERSCRIPTS = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


def formula_text(expr: sympy.Expr) -> str:
    """`4*D*H*N*(2*F + N)` as `4·D·H·N·(2·F + N)`, `N**2` as `N²`, `sqrt(D)` as `√D`."""
    text = sympy.sstr(expr)
    text = re.sub(r"\*\*\((-?\d+)\)|\*\*(-?\d+)", lambda m: (m.group(1) or m.group(2)).translate(SUPERSCRIPTS), text)
    text = re.sub(r"sqrt\((\w+)\)", r"√\1", text).replace("sqrt", "√")
    return text.replace("**", "^").replace("*", "·")


def formula_latex(expr: sympy.Expr) -> str:
    return f"${sympy.latex(expr)}$"


def number_text(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:.4g}"


def html_table(header: Sequence[str], rows: Sequence[Sequence[str]], *, right: Sequence[int] = ()) -> str:
    """An HTML table; every cell is escaped, so names from a design file stay text."""

    def cell(tag: str, k: int, text: str) -> str:
        style = ' style="text-align:right"' if k in right else ' style="text-align:left"'
        return f"<{tag}{style}>{html.escape(text)}</{tag}>"

    head = "".join(cell("th", k, h) for k, h in enumerate(header))
    body = "".join("<tr>" + "".join(cell("td", k, c) for k, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def markdown_text(text: str) -> str:
    """`text` shown literally in Markdown: outside `$...$` formulas, the characters Markdown
    reads as emphasis, links, code or HTML are escaped."""
    pieces = text.split("$")
    for k in range(0, len(pieces), 2):
        pieces[k] = re.sub(r"([\\`*_\[\]<>#|])", r"\\\1", pieces[k])
    return "$".join(pieces)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], *, right: Sequence[int] = ()) -> str:
    def cell(text: str) -> str:
        return markdown_text(text).replace("\n", " ")

    rule = ["---:" if k in right else ":---" for k in range(len(header))]
    lines = [header, rule, *rows]
    return "\n".join("| " + " | ".join(cell(c) for c in line) + " |" for line in lines)


def heading_html(text: str) -> str:
    return f"<p><b>{html.escape(text)}</b></p>"
