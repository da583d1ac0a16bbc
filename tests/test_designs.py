"""The bundled library (designs/): every design checks, cites its paper, and states its readings."""

import pytest
from conftest import DESIGN_FILES

import tdiag

EXPECTED = {
    "mhsa",
    "single_head",
    "thsa",
    "skip_left",
    "skip_right",
    "kronecker",
    "heads_only",
    "trainable_heads_only",
    "thsa_elu",
    "thsa_poly",
    "fish",
    "hard_fish",
    "mish",
    "gfish",
    "hard_gfish",
    "lfish",
    "mgk",
    "mgk_softe",
    "mgk_harde",
    "smgk",
    "mlk",
    "smlk",
}


def test_library_has_every_design_of_the_three_papers():
    assert EXPECTED <= {p.stem for p in DESIGN_FILES}


@pytest.mark.parametrize("path", DESIGN_FILES, ids=lambda p: p.stem)
def test_design_checks_without_warnings(path):
    design = tdiag.load(path)
    assert design.name == path.stem and not design.warnings


@pytest.mark.parametrize("path", DESIGN_FILES, ids=lambda p: p.stem)
def test_design_header_cites_equations(path):
    header = path.read_text().split("\ndesign ")[0]
    assert "eq." in header and "Paper" in header


@pytest.mark.parametrize("path", DESIGN_FILES, ids=lambda p: p.stem)
def test_design_has_input_x_and_output_y_of_width_f(path):
    """The queries' sequence is X (a cross-attention's memory is a second input of the same width)."""
    design = tdiag.load(path)
    assert design.graph.inputs[0].name == "X" and design.graph.outputs == ["Y"]
    x, y = design.tensors["X"], design.tensors["Y"]
    assert x.shape[-1] == y.shape[-1] and len(y.axes) == 2
    assert all(t.shape[-1] == x.shape[-1] for t in design.graph.inputs)


@pytest.mark.parametrize(
    ("name", "base"),
    [
        (n, "thsa")
        for n in (
            "single_head",
            "skip_left",
            "skip_right",
            "kronecker",
            "heads_only",
            "trainable_heads_only",
            "thsa_elu",
            "thsa_poly",
        )
    ],
)
def test_thsa_variants_derive_from_thsa(name, base):
    assert tdiag.load(DESIGN_FILES[0].parent / f"{name}.td").graph.base == base
