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


@pytest.mark.parametrize("path", DESIGN_FILES, ids=lambda p: p.stem)
def test_every_design_renders_to_dot(path):
    text = to_dot(tdiag.load(path).graph)
    assert text.startswith("graph ") and text.rstrip().endswith("}")


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
