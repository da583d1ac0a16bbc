"""The bad-input corpus: every `tests/errors/**/X.td` is a broken design and `X.err` holds the exact
stderr of `tdiag check tests/errors/**/X.td` run from the repo root; the valid base designs in
`bases/` are not cases. Each message is one a user should read: position, line, caret, what was
found and expected, and a hint where one is obvious."""

from __future__ import annotations

from pathlib import Path

import pytest

from tdiag.cli import main

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
