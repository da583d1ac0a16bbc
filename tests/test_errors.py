"""The bad-input corpus: every `tests/errors/**/X.td` is a broken design and `X.err` holds the exact
stderr of `tdiag check tests/errors/**/X.td` run from the repo root; the valid base designs in
`bases/` are not cases. Each message is one a user should read: position, line, caret, what was
found and expected, and a hint where one is obvious."""

from __future__ import annotations

from pathlib import Path

import pytest

import tdiag
from tdiag import TdiagError
from tdiag.cli import main
from tdiag.errors import format_diagnostics

REPO = Path(__file__).resolve().parent.parent
ERRORS = REPO / "tests" / "errors"
# Valid designs that cases in bases/ extend (extends looks for BASE.td next to the file).
VALID_BASES = {"bases/thsa.td", "bases/mhsa.td"}


def _relative(path: Path) -> str:
    return path.relative_to(ERRORS).as_posix()


def _corpus(suffix: str) -> list[str]:
    return sorted(_relative(p) for p in ERRORS.rglob(f"*{suffix}") if _relative(p) not in VALID_BASES)


CASES = [name.removesuffix(".td") for name in _corpus(".td")]


@pytest.mark.parametrize("case", CASES)
def test_error_message(case: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # messages carry the path as given: tests/errors/...
    code = main(["check", f"tests/errors/{case}.td"])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert code == 1
    assert out == ""
    expected = (ERRORS / f"{case}.err").read_text(encoding="utf-8")
    assert err == expected


@pytest.mark.parametrize("base", sorted(VALID_BASES))
def test_bases_are_valid(base: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    assert main(["check", f"tests/errors/{base}"]) == 0, capsys.readouterr().err


def test_every_case_has_its_expected_output() -> None:
    tds = {name.removesuffix(".td") for name in _corpus(".td")}
    errs = {name.removesuffix(".err") for name in _corpus(".err")}
    assert tds - errs == set(), "cases without a .err"
    assert errs - tds == set(), ".err files without a case"


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 30


def test_several_errors_are_reported_at_once() -> None:
    several = [c for c in CASES if (ERRORS / f"{c}.err").read_text(encoding="utf-8").count(": error: ") >= 3]
    assert len(several) >= 2, several


# ---- lines are quoted as the parser counts them ------------------------------------------------

GOOD = "design t\nsize N = 4, F = 3\ninput X[n: N, f: F]\n"


def _error_text(text: str) -> str:
    with pytest.raises(TdiagError) as error:
        tdiag.loads(text)
    return format_diagnostics(error.value.diagnostics)


@pytest.mark.parametrize("separator", ["\f", "\u2028", "\v", "\x85", "\u2029", "\x1c"])
def test_an_error_quotes_its_own_line_whatever_characters_precede_it(separator):
    text = GOOD.replace("input", f"# comment{separator}continues\ninput") + "Y[n f] = X[n f] Z[n]\noutput Y\n"
    message = _error_text(text)
    assert "<string>:5:17: error: unknown tensor 'Z'" in message
    assert "    5 | Y[n f] = X[n f] Z[n]\n      |                 ^" in message


def test_a_utf8_byte_order_mark_is_ignored(write_td):
    path = write_td("")
    path.write_bytes(("\ufeff" + GOOD + "Y[n f] = X[n f]\noutput Y\n").encode("utf-8"))
    assert tdiag.load(path).name == "t"


def test_extends_is_a_whole_word():
    message = _error_text("design b extendsa\n" + GOOD.split("\n", 1)[1] + "Y[n f] = X[n f]\noutput Y\n")
    assert "<string>:1:10: error: unexpected" in message


LONE_LEG = """design typo
size F = 64, G = 2, R = 2, D = 8
size N
input X[n: N, f: F]
param WQ[f: F, g: G, r: R, d: D]
param WK[f: F, g: G, d: D]
param WV[f: F, g: G, e: D]
param WO[g: G, r: R, e: D, o: F]
A[g r n m] = softmax[m](X[n f] WQ[f g r d] X[m c] WK[c g d])
Y[n o] = A[g r n m] X[m b] WV[b g ee] WO[g r e o]
output Y
"""


def test_check_prints_a_lone_leg_warning_at_the_leg_with_a_caret_and_exits_0(tmp_path, capsys):
    path = tmp_path / "typo.td"
    path.write_text(LONE_LEG, encoding="utf-8")
    assert main(["check", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"{path}: ok (")
    assert (
        f"{path}:10:35: warning: leg 'ee' occurs only in WV and is summed away; did you mean 'e'?\n"
        "   10 | Y[n o] = A[g r n m] X[m b] WV[b g ee] WO[g r e o]\n"
        "      |                                   ^^\n"
        "hint: a leg that one factor alone carries is summed over that factor; if that is meant, "
        "write sum[ee](WV[b g ee])\n"
    ) in err
    assert f"{path}:10:46: warning: leg 'e' occurs only in WO" in err


def test_check_passes_a_design_whose_lone_sum_is_said_with_sum_without_a_warning(tmp_path, capsys):
    said = LONE_LEG.replace("param WO[g: G, r: R, e: D, o: F]", "param WO[g: G, e: D, o: F]").replace(
        "Y[n o] = A[g r n m] X[m b] WV[b g ee] WO[g r e o]", "Y[n o] = sum[r](A[g r n m]) X[m b] WV[b g e] WO[g e o]"
    )
    path = tmp_path / "said.td"
    path.write_text(said, encoding="utf-8")
    assert main(["check", str(path)]) == 0
    assert "warning" not in capsys.readouterr().err
    path.write_text(said.replace("sum[r](A[g r n m])", "A[g r n m]"), encoding="utf-8")
    assert main(["check", str(path)]) == 0
    assert f"{path}:10:14: warning: leg 'r' occurs only in A and is summed away" in capsys.readouterr().err
