"""Rendering in the papers' notation (design notes §5): DOT always, SVG/PNG/PDF with `dot`."""

import re

import pytest
from conftest import DESIGN_FILES, DESIGNS

import tdiag
from tdiag.render import has_dot, network, to_dot

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
