"""Rendering in the papers' notation (design notes §5): DOT always, SVG/PNG/PDF with `dot`."""

import re
import struct
from collections import Counter

import pytest
from conftest import DESIGN_FILES, DESIGNS

import tdiag
from tdiag.ir import PaddingMask, TensorRef, walk
from tdiag.render import fitted_dot, has_dot, network, to_dot

needs_dot = pytest.mark.skipif(not has_dot(), reason="Graphviz 'dot' is not installed")


def dot_of(name: str) -> str:
    return to_dot(tdiag.load(DESIGNS / f"{name}.td").graph)


@pytest.mark.parametrize("name", ["mhsa", "thsa"])
def test_dot_has_a_dotted_softmax_box_cluster(name):
    assert re.search(r'subgraph cluster_\d+ \{\s*graph \[label="softmax" style=dotted', dot_of(name))


@pytest.mark.parametrize(("name", "alpha"), [("mhsa", "1/√D"), ("thsa", "1/√R")])
def test_dot_has_a_filled_ball_labelled_with_the_scale(name, alpha):
    assert f'style=filled fillcolor=black width=0.14 fixedsize=true label="" xlabel="{alpha}"' in dot_of(name)


@pytest.mark.parametrize("name", ["mhsa", "thsa"])
def test_dot_has_hyperedge_junction_dots(name):
    junctions = re.findall(r'(h\d+) \[shape=point width=0.08 label=""\]', dot_of(name))
    assert junctions, "a leg shared by three or more tensors is drawn through a junction dot"


def test_thsa_network_has_the_two_r_hyperedges_of_fig_4b():
    """R-hyperedge {WQ, WK, C} summed inside the box; {C, WV, WO} summed outside (spec §2.3)."""
    edges = {(h.leg, h.tensors) for h in network(tdiag.load(DESIGNS / "thsa.td").graph)}
    assert ("s", ("C", "WK", "WQ")) in edges and ("r", ("C", "WO", "WV")) in edges


def test_parameters_inputs_and_constants_are_drawn_differently():
    text = dot_of("skip_right")
    styles = {kind: re.search(rf'tooltip="{kind} \w+"', text) is not None for kind in ("input", "param", "const")}
    assert all(styles.values())
    shapes = {
        re.search(rf'(shape=\w+ style=[^ ]+)[^\]]*tooltip="{kind} ', text).group(1)
        for kind in ("input", "param", "const")
    }
    assert len(shapes) == 3


def test_output_legs_dangle():
    assert sorted((h.leg, h.size) for h in network(tdiag.load(DESIGNS / "mhsa.td").graph) if h.is_open) == [
        ("g", "F"),
        ("n", "N"),
    ]


@pytest.mark.parametrize("inline", [True, False], ids=["inlined", "statements"])
@pytest.mark.parametrize("path", DESIGN_FILES, ids=lambda p: p.stem)
def test_every_design_renders_to_dot(path, inline):
    text = to_dot(tdiag.load(path).graph, inline=inline)
    assert text.startswith("graph ") and text.rstrip().endswith("}")


@needs_dot
@pytest.mark.parametrize("path", DESIGN_FILES, ids=lambda p: p.stem)
def test_every_design_is_valid_dot_both_ways(path):
    import subprocess

    for inline in (True, False):
        text = to_dot(tdiag.load(path).graph, inline=inline)
        run = subprocess.run(["dot", "-Tsvg"], input=text.encode(), capture_output=True, check=False)
        assert run.returncode == 0 and not run.stderr, run.stderr.decode()


@needs_dot
@pytest.mark.parametrize("suffix", ["svg", "png", "pdf"])
def test_render_writes_image_formats(tmp_path, suffix):
    path = tdiag.load(DESIGNS / "mhsa.td").render(tmp_path / f"mhsa.{suffix}")
    assert path.stat().st_size > 500


@needs_dot
def test_design_shows_its_diagram_in_jupyter():
    svg = tdiag.load(DESIGNS / "thsa.td")._repr_svg_()
    assert svg is not None and "<svg" in svg


def test_dot_output_works_without_the_dot_program(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert not has_dot()
    path = tdiag.load(DESIGNS / "mhsa.td").render(tmp_path / "mhsa.dot")
    assert path.read_text().startswith('graph "mhsa"')


def _edges_at(text: str, node: str) -> list[str]:
    return [line for line in text.splitlines() if re.search(rf"\b{node} -- |-- {node} ", line)]


def _open_ends(text: str) -> list[str]:
    return re.findall(r"(o\d+) \[shape=point style=invis", text)


def test_every_leg_is_labelled_with_its_name_and_size():
    text = dot_of("mhsa")
    assert 'label="n: N"' in text and 'label="m: N"' in text and 'label="d: D"' in text


def test_a_leg_summed_within_one_factor_is_closed_by_an_all_ones_vector_not_left_dangling():
    """MGK eq. 10 sums r, which only the box's output carries: its leg ends at a `1` node."""
    text = dot_of("mgk")
    ones = re.findall(r'(u\d+) \[shape=circle [^\]]*label="1" tooltip="sum over r"', text)
    assert len(ones) == 1
    assert any('label="r: M"' in line for line in _edges_at(text, ones[0]))


def test_only_output_legs_dangle():
    text = dot_of("mgk")
    labels = sorted(re.search(r'label="([^"]*)"', _edges_at(text, end)[0]).group(1) for end in _open_ends(text))
    assert labels == ["g: F", "n: N"]


def test_a_summed_leg_is_never_open_in_the_network():
    open_legs = {h.leg for h in network(tdiag.load(DESIGNS / "mgk.td").graph) if h.is_open}
    assert open_legs == {"n", "g"}


def test_a_subtracted_scaled_term_is_boxed_with_its_sign_and_coefficient():
    assert re.search(r'graph \[label="− 1/\(2·√D\) ×" style=dashed', dot_of("mgk"))


def test_statements_are_drawn_one_cluster_each_labelled_with_the_statement():
    text = to_dot(tdiag.load(DESIGNS / "mhsa.td").graph, inline=False)
    labels = re.findall(r'graph \[label="([^"]*)" style=rounded', text)
    assert labels == [
        "Q[n h d] = X[n f] WQ[f h d]",
        "K[m h d] = X[m f] WK[f h d]",
        "V[m h e] = X[m f] WV[f h e]",
        "A[h n m] = softmax[m](Q[n h d] K[m h d])",
        "Y[n g] = A[h n m] V[m h e] WO[h e g]",
    ]


def test_statements_draw_each_earlier_result_as_one_node():
    text = to_dot(tdiag.load(DESIGNS / "mhsa.td").graph, inline=False)
    assert sorted(re.findall(r'tooltip="derived (\w+)"', text)) == ["A", "K", "Q", "V"]


def test_statements_keep_the_softmax_box_inside_its_statement():
    text = to_dot(tdiag.load(DESIGNS / "mhsa.td").graph, inline=False)
    statement = text.index('label="A[h n m] = softmax')
    box = text.index('graph [label="softmax" style=dotted')
    assert statement < box < text.index('label="Y[n g] =')


def test_statements_link_each_result_to_its_uses_with_an_arrow():
    text = to_dot(tdiag.load(DESIGNS / "mhsa.td").graph, inline=False)
    assert sorted(re.findall(r'style=dashed[^\]]*dir=forward[^\]]*tooltip="(\w+) is used here"', text)) == [
        "A",
        "K",
        "Q",
        "V",
    ]


def test_a_tensor_named_after_a_greek_letter_is_drawn_with_the_letter():
    assert 'label="π" tooltip="param pi"' in dot_of("mgk")


def test_render_overwrites_an_existing_output(tmp_path):
    from tdiag.cli import main

    out = tmp_path / "mhsa.dot"
    out.write_text("old")
    assert main(["render", str(DESIGNS / "mhsa.td"), "-o", str(out)]) == 0
    assert out.read_text().startswith('graph "mhsa"')


# ---- the default drawing of a long design: each tensor once, one screen ----------------------

RWKV6ISH = """\
# An RWKV-6-style time mix: the token-shifted input feeds the r, k, v, decay and gate projections.
design rwkv6ish

size F = 256, H = 4, D = F / H, R = 32
size N

input X[n: N, f: F]
param u[f: F, i: 2] = normal(std = 0.5)
param Wr[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param Wk[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param Wv[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param Wd1[f: F, r: R] = normal(std = 1 / sqrt(F))
param Wd2[r: R, h: H, d: D] = normal(std = 1 / sqrt(R))
param Wg[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))

Xs[n f]   = conv[n = n - i](X[n f], u[f i])              # token shift
Rr[n h d] = Xs[n f] Wr[f h d]
K[m h d]  = Xs[m f] Wk[f h d]
V[m h e]  = Xs[m f] Wv[f h e]
La[n h d] = -exp(Xs[n f] Wd1[f r] Wd2[r h d])            # data-dependent decay, log w
O[n h e]  = exp(segsum[n, m](La[n h d])) Rr[n h d] K[m h d] V[m h e]
Y[n g]    = silu(Xs[n f] Wg[f h e]) O[n h e] WO[h e g]

output Y
"""

DRAWN = re.compile(r'tooltip="(input|mask|param|const|random|buffer|derived) (\w+)"')


def rwkv6ish(tmp_path):
    path = tmp_path / "rwkv6ish.td"
    path.write_text(RWKV6ISH)
    return tdiag.load(path).graph


def long_chain(tmp_path, steps: int):
    """A residual chain T_i = T_{i-1} W_i + T_{i-1}: every T is used twice."""
    lines = ["design chain", "size F = 8", "size N", "input X[n: N, f: F]"]
    lines += [f"param W{i}[f: F, g: F] = normal(std = 1)" for i in range(1, steps + 1)]
    lines.append("T0[n f] = X[n f]")
    lines += [f"T{i}[n g] = T{i - 1}[n f] W{i}[f g] + T{i - 1}[n g]" for i in range(1, steps + 1)]
    lines.append(f"output T{steps}")
    path = tmp_path / "chain.td"
    path.write_text("\n".join(lines) + "\n")
    return path


def written_uses(design) -> Counter:
    """How often each tensor is written on a right-hand side (padding masks included)."""
    uses: Counter = Counter()
    for statement in design.statements:
        for node in walk(statement.expr):
            if isinstance(node, TensorRef):
                uses[node.name] += 1
            uses.update(m.tensor.name for m in getattr(node, "masks", ()) if isinstance(m, PaddingMask))
    return uses


def test_a_computed_tensor_used_more_than_once_is_drawn_once_as_a_derived_node(tmp_path):
    text = to_dot(rwkv6ish(tmp_path))
    assert [name for kind, name in DRAWN.findall(text) if name == "Xs"] == ["Xs"]
    assert 'tooltip="derived Xs"' in text
    assert text.count('label="conv[n = n - i]"') == 1, "the token shift's sub-diagram is drawn once"


def test_each_use_of_a_shared_tensor_is_a_leg_from_its_one_node(tmp_path):
    partners = {t for h in network(rwkv6ish(tmp_path)) if h.leg == "f" and "Xs" in h.tensors for t in h.tensors}
    assert {"Wr", "Wk", "Wv", "Wd1", "Wg"} <= partners


def test_a_shared_tensor_is_drawn_beside_its_own_statement_with_an_arrow_to_its_node(tmp_path):
    text = to_dot(rwkv6ish(tmp_path))
    assert re.findall(r'graph \[label="([^"]*)" style=rounded', text) == ["Xs[n f] = conv[n = n - i](X[n f], u[f i])"]
    assert re.findall(r'dir=forward[^\]]*tooltip="(\w+) is used here"', text) == ["Xs"]


def test_a_computed_tensor_used_once_stays_inlined():
    assert not re.findall(r'tooltip="derived (\w+)"', dot_of("mhsa"))


@pytest.mark.parametrize("path", DESIGN_FILES, ids=lambda p: p.stem)
def test_no_tensor_is_drawn_more_often_than_it_is_written(path):
    """An input or parameter is one node per written use (the papers' X^Q, X^K, X^V); a computed
    tensor is inlined once or drawn as one node: no sub-diagram is copied."""
    design = tdiag.load(path).graph
    drawn = Counter(name for _, name in DRAWN.findall(to_dot(design)))
    uses = written_uses(design)
    over = {
        name: (count, uses[name])
        for name, count in drawn.items()
        if count > (1 if design.tensors[name].statement is not None else max(uses[name], 1))
    }
    assert not over, f"drawn more often than written: {over}"


@pytest.mark.parametrize("path", DESIGN_FILES, ids=lambda p: p.stem)
def test_every_design_draws_as_one_network_under_the_size_limit(path):
    assert fitted_dot(tdiag.load(path).graph)[1] is None


def test_a_diagram_too_large_for_one_screen_is_drawn_one_panel_per_statement(tmp_path):
    design = tdiag.load(long_chain(tmp_path, 30)).graph
    text, note = fitted_dot(design)
    assert note is not None and "--statements" in note
    assert text == to_dot(design, inline=False)


def test_render_names_its_fallback_to_statement_panels_on_stderr(tmp_path, capsys):
    from tdiag.cli import main

    out = tmp_path / "chain.dot"
    assert main(["render", str(long_chain(tmp_path, 30)), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "tdiag render: note:" in err and "one panel per statement" in err
    assert out.read_text().count("style=rounded") == 31


def test_render_of_a_design_that_fits_says_nothing_on_stderr(tmp_path, capsys):
    from tdiag.cli import main

    assert main(["render", str(long_chain(tmp_path, 3)), "-o", str(tmp_path / "chain.dot")]) == 0
    assert capsys.readouterr().err == ""


def png_size(text: str) -> tuple[int, int]:
    import subprocess

    png = subprocess.run(["dot", "-Tpng"], input=text.encode(), capture_output=True, check=True).stdout
    return struct.unpack(">II", png[16:24])


@needs_dot
@pytest.mark.slow
@pytest.mark.parametrize("path", [*DESIGN_FILES, "rwkv6ish"], ids=lambda p: getattr(p, "stem", p))
def test_every_design_fits_one_screen(path, tmp_path):
    """Neither side over 4000 px, and no strip: the longer side at most four times the shorter."""
    design = rwkv6ish(tmp_path) if path == "rwkv6ish" else tdiag.load(path).graph
    width, height = png_size(fitted_dot(design)[0])
    assert max(width, height) <= 4000 and max(width, height) <= 4 * min(width, height), (width, height)


BOXED_TWICE = """\
design boxed
size F = 8
size N
input X[n: N, f: F]
param WK[f: F, d: F] = normal(std = 1)
K[m d] = X[m f] WK[f d]
A[n m] = softmax[m](X[n d] K[m d])
Y[n g] = A[n m] K[m g]
output Y
"""


def test_a_shared_tensor_used_inside_a_softmax_box_meets_its_ball_from_inside(tmp_path):
    """K is read in the box and after it: its normalized leg m runs from K into the ball (the box's
    part) and from the ball out to K's second use; no use bypasses the ball."""
    path = tmp_path / "boxed.td"
    path.write_text(BOXED_TWICE)
    text = to_dot(tdiag.load(path).graph)
    node = re.search(r'(t\d+) \[[^\]]*tooltip="derived K"', text).group(1)
    ball = re.search(r"(b\d+) \[shape=circle style=filled fillcolor=black", text).group(1)
    assert [line.split(" [")[0].strip() for line in _edges_at(text, ball)] == [f"{node} -- {ball}"] * 2


@needs_dot
def test_statement_panels_stand_left_to_right_by_statement():
    """gla's eight panels side by side (the fallback reads along a screen, not down a strip)."""
    width, height = png_size(to_dot(tdiag.load(DESIGNS / "gla.td").graph, inline=False))
    assert width > height and width <= 4000, (width, height)


def test_a_statement_panel_writes_positions_and_gathers_as_the_design_wrote_them():
    # the --statements panels and `tdiag show` print each statement with format_expr, which
    # printed index(n) as "PositionIndex" and a gather as "Gather"
    from tdiag.design import format_expr

    retnet = {s.target: format_expr(s.expr) for s in tdiag.load("retnet").graph.statements}
    bias = {s.target: format_expr(s.expr) for s in tdiag.load("relative_bias").graph.statements}
    assert retnet["Ang"] == "index(n) theta[p]"
    assert "Rel[h, r = clamp(m - n, -C, C) + C]" in bias["A"]
