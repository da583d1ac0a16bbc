"""`tdiag catalog`: the designs of a folder by family, with their cost formulas at one size, as
the Markdown page docs/designs.md (kept current by a test, never edited by hand)."""

import pytest
from conftest import DESIGNS, ROOT

from tdiag.catalog import OTHER, catalog, header
from tdiag.cli import main

PAGE = ROOT / "docs" / "designs.md"
AT = "N=1024,F=512,H=8"  # the size docs/designs.md is generated at
DESIGN = """# A tiny attention, for the catalog's tests.
# Paper: none.
{family}design tiny
size F = 8, H = 2, D = F / H
size N
input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1)
param WO[h: H, d: D, g: F] = normal(std = 1)
A[h n m] = softmax[m](X[n f] WQ[f h d] X[m g] WO[h d g])
Y[n f] = A[h n m] X[m f]
output Y
"""


@pytest.mark.slow
def test_the_committed_designs_page_is_what_the_command_writes(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["catalog", "designs", "--at", AT, "-o", str(tmp_path / "designs.md")]) == 0
    fresh = (tmp_path / "designs.md").read_text(encoding="utf-8")
    assert fresh == PAGE.read_text(encoding="utf-8"), (
        f"docs/designs.md is stale: run `tdiag catalog designs --at {AT} -o docs/designs.md`"
    )


def test_the_family_is_the_family_line_of_the_leading_comment(write_td):
    path = write_td(DESIGN.format(family="# family: Tuformer\n"))
    assert header(path) == ("tuformer", "A tiny attention, for the catalog's tests")


def test_a_design_without_a_family_line_is_listed_under_other(write_td):
    path = write_td(DESIGN.format(family=""))
    assert header(path)[0] == OTHER
    page = catalog([path, DESIGNS / "mhsa.td"], {"N": 64}, "tdiag catalog")
    assert page.index("## Common attention designs") < page.index("## Other") < page.index("`tiny`")


def test_a_family_of_its_own_gets_a_section_named_after_it(write_td):
    page = catalog([write_td(DESIGN.format(family="# family: positions\n"))], {"N": 64}, "tdiag catalog")
    assert "## Positions" in page and "| `tiny` |" in page


def test_every_bundled_design_has_a_family_line():
    assert [p.name for p in sorted(DESIGNS.glob("*.td")) if header(p)[0] == OTHER] == []


def test_a_path_that_is_neither_a_folder_nor_a_design_is_a_usage_error(tmp_path, capsys):
    assert main(["catalog", str(tmp_path / "missing")]) == 2
    assert "neither a folder nor a .td file" in capsys.readouterr().err


def test_a_size_no_design_has_is_an_error_listing_their_sizes(write_td, capsys):
    path = write_td(DESIGN.format(family=""))
    assert main(["catalog", str(path), "--at", "N=64,Z=3"]) == 1
    assert capsys.readouterr().err == "tdiag: error: --at: no design has a size Z\nhint: their sizes are: D, F, H, N\n"
