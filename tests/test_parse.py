"""The .td syntax (grammar/tdiag.lark) and its positioned syntax errors."""

import pytest

from tdiag import TdiagError
from tdiag.parse import BinOp, Call, Declaration, Indexed, LegGroup, SizeDef, Statement, parse_text


def parse_one(line: str):
    return parse_text(f"design t\n{line}\n", "t.td").items[1]


def test_sizes_on_one_line_become_separate_definitions():
    items = parse_text("design t\nsize F = 512, H = 8, D = F / H\n").items
    assert [i.name for i in items if isinstance(i, SizeDef)] == ["F", "H", "D"]


def test_size_without_default_is_free():
    assert parse_one("size N").value is None


def test_declaration_keeps_axes_and_initializer():
    decl = parse_one("param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))")
    assert isinstance(decl, Declaration)
    assert (decl.kind, [a.leg for a in decl.axes]) == ("param", ["f", "h", "d"])
    assert isinstance(decl.init, Call) and decl.init.keywords[0].name == "std"


def test_juxtaposition_is_a_product():
    statement = parse_one("Q[n h d] = X[n f] WQ[f h d]")
    assert isinstance(statement, Statement)
    assert isinstance(statement.expr, BinOp) and statement.expr.op == "juxt"


def test_box_call_separates_legs_from_options():
    statement = parse_one("A[h n m] = softmax[m, scale = 1 / sqrt(D)](Q[n h d] K[m h d])")
    box = statement.expr
    assert isinstance(box, Call) and box.name == "softmax"
    assert [leg.name for leg in box.legs] == ["m"] and box.options[0].name == "scale"


def test_an_options_value_runs_to_the_next_comma_with_juxtaposition_as_anywhere():
    """Issue 39: `scale = s[h] log(N) / sqrt(D)` was a syntax error inside [...]."""
    box = parse_one("A[h n m] = softmax[m, scale = s[h] log(N) / sqrt(D), mask = causal(n, m)](Q[n h d] K[m h d])").expr
    assert [leg.name for leg in box.legs] == ["m"] and [o.name for o in box.options] == ["scale", "mask"]
    scale = box.options[0].value
    assert isinstance(scale, BinOp) and scale.op == "/" and scale.left.op == "juxt"


def test_a_leg_after_an_option_without_a_comma_is_part_of_its_value():
    box = parse_one("A[h n m] = softmax[scale = 2 m](Q[n h d] K[m h d])").expr
    assert box.legs == () and box.options[0].value.op == "juxt"


def test_grouped_legs_are_a_reshape():
    statement = parse_one("C[(h d) (g e)] = I[h g] J[d e]")
    assert all(isinstance(item, LegGroup) for item in statement.target.legs)


def test_line_breaks_inside_brackets_continue_the_item():
    items = parse_text("design t\nY[n g] = (A[n m]\n   B[m g]) + C[n\n g]\n").items
    assert len(items) == 2


def test_comments_are_ignored_everywhere():
    text = "# header\ndesign t  # name\n\n# a comment line\nsize F = 1  # width\n"
    assert len(parse_text(text).items) == 2


def test_spans_point_into_the_file():
    indexed = parse_one("Y[n] = A[n m] B[m]").expr.right
    assert isinstance(indexed, Indexed)
    assert (indexed.span.line, indexed.span.column) == (2, 15)


@pytest.mark.parametrize(
    ("text", "position", "fragment"),
    [
        ("design t\nsize F = \n", (2, 10), "expected one of: '(', '-', a name, a number"),
        ("design t\ninput X[n: N f: F]\n", (2, 14), "unexpected 'f'"),
        ("design t\nY[n] = A[n] é\n", (2, 13), "unexpected character 'é'"),
        ("design t\nY[n] = softmax[m](A[n m]\n", (2, 25), "unexpected end of file"),
    ],
)
def test_syntax_errors_are_positioned(text, position, fragment):
    with pytest.raises(TdiagError) as caught:
        parse_text(text, "bad.td")
    (diag,) = caught.value.diagnostics
    assert (diag.spans[0].line, diag.spans[0].column) == position
    assert fragment in diag.message


def test_non_ascii_character_gets_a_hint():
    with pytest.raises(TdiagError) as caught:
        parse_text("design t\nsize F = 5１2\n", "bad.td")
    assert "ASCII" in caught.value.diagnostics[0].hint
