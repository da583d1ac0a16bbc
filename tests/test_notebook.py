"""Notebook display (issue 12): Design, CostReport and Plan show as tables with formulas and
numbers at the built sizes; a compiled module's repr lists its sizes and stored tensors."""

import re
import subprocess
import sys

import pytest
from conftest import DESIGNS, ROOT, standalone_module

import tdiag
from tdiag.notebook import formula_text, markdown_text
from tdiag.render import has_dot

needs_dot = pytest.mark.skipif(not has_dot(), reason="Graphviz 'dot' is not installed")


def mhsa(**sizes):
    return tdiag.load(DESIGNS / "mhsa.td", **sizes)


def test_cost_report_repr_is_one_short_line_with_its_numbers():
    text = repr(mhsa().cost())
    assert "\n" not in text and len(text) < 300
    assert text.startswith("<tdiag.CostReport mhsa (flop) at F=512, H=8, D=64, N=1024:")
    assert "params 1,048,576" in text


def test_cost_report_html_has_each_formula_next_to_its_number():
    html = mhsa().cost()._repr_html_()
    assert '<td style="text-align:left">4·D·F·H</td><td style="text-align:right">1,048,576</td>' in html
    assert "H·N²" in html


def test_cost_report_markdown_writes_formulas_in_latex():
    text = mhsa().cost()._repr_markdown_()
    assert "| parameters | $4 D F H$ | 1,048,576 |" in text
    assert r"$4 D H N \left(2 F + N\right)$" in text


def test_cost_report_numbers_are_at_the_sizes_it_was_built_for():
    text = mhsa(F=256, H=4).cost(N=128)._repr_markdown_()
    assert "at F=256, H=4, D=64, N=128" in text and "| parameters | $4 D F H$ | 262,144 |" in text


def test_plan_repr_is_one_short_line():
    text = repr(mhsa().plan())
    assert text == "<tdiag.Plan mhsa at F=512, H=8, D=64, N=1024, B=8: 5 ops (4 contraction, 1 sdpa)>"


def test_plan_tables_have_a_row_per_op_with_its_flops_formula_and_number():
    plan = mhsa().plan()
    markdown = plan._repr_markdown_()
    html = plan._repr_html_()
    rows = [line for line in markdown.splitlines() if re.match(r"\| \d+ \|", line)]
    assert len(rows) == len(plan.steps)
    assert "| $4 D H N^{2}$ | 2,147,483,648 |" in rows[3]
    ops = html.split("</table>")[0]  # the candidate forms of each box follow in tables of their own
    assert ops.count("<tr>") == len(plan.steps) + 1 and "4·D·H·N²" in ops


def test_plan_str_is_the_plan_table():
    assert str(mhsa().plan()).startswith("plan of mhsa at F=512, H=8, D=64, N=1024")


def test_design_markdown_lists_sizes_tensors_and_statements():
    text = mhsa()._repr_markdown_()
    assert "| D | $\\frac{F}{H}$ | 64 |" in text
    assert "| param | WQ\\[f: F, h: H, d: D\\] | normal(std=1/sqrt(F)) | $D F H$ | 262,144 |" in text
    assert "| A\\[h n m\\] = softmax\\[m\\](Q\\[n h d\\] K\\[m h d\\]) |" in text


@needs_dot
def test_design_html_embeds_its_diagram_before_the_tables():
    html = mhsa()._repr_html_()
    assert html.index("<svg") < html.index("<table>")


def test_markdown_text_escapes_emphasis_and_links_but_not_formulas():
    assert markdown_text("a*b [x] $N^{2}_{k}$") == r"a\*b \[x\] $N^{2}_{k}$"


def test_formula_text_uses_superscripts_and_roots():
    import sympy

    n, d = sympy.symbols("N D", positive=True)
    assert formula_text(2 * n**2 / sympy.sqrt(d)) == "2·N²/√D"


def test_module_repr_lists_sizes_and_parameters_with_legs_and_shapes():
    import torch

    text = repr(tdiag.load(DESIGNS / "mgk.td", F=64, D=8).module(dtype=torch.float64))
    assert text.splitlines() == [
        "Mgk(",
        "  sizes: F=64, H=4, M=2, D=8; bound at run time: N (planned at 1024)",
        "  param WQ[f h d]: (64, 4, 8)",
        "  param WK[f h r d]: (64, 4, 2, 8)",
        "  param WV[f h e]: (64, 4, 8)",
        "  param WO[h e g]: (4, 8, 64)",
        "  param pi[h r]: (4, 2)",
        ")",
    ]


def test_module_repr_lists_buffers():
    text = repr(tdiag.load(DESIGNS / "mgk_softe.td", F=8, H=2, D=4).module(N=5))
    assert "  buffer pi[h m r]: (2, 5, 2)" in text.splitlines()


def test_standalone_file_has_the_same_repr_as_the_in_process_module(tmp_path):
    design = tdiag.load(DESIGNS / "thsa.td", F=8, H=2)
    generated = standalone_module(design.source(), "thsa_repr", tmp_path)
    assert repr(generated.Thsa()) == repr(design.module())


def test_notebook_displays_never_import_torch():
    code = (
        "import sys, tdiag\n"
        f"d = tdiag.load({str(DESIGNS / 'mgk.td')!r})\n"
        "d._repr_html_(); d._repr_markdown_(); repr(d)\n"
        "c = d.cost(); c._repr_html_(); c._repr_markdown_(); repr(c)\n"
        "p = d.plan(); p._repr_html_(); p._repr_markdown_(); repr(p); str(p)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
