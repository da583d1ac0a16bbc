"""The design graph: legs bound to sizes, contractions and batch legs, boxes (Tuformer App. A-B,
spec tuformer.md §1-2), reshapes, derivation, and the networkx dataflow view."""

import itertools

import networkx as nx
import pytest
import sympy
from conftest import DESIGNS, LEG_READERS, ORDER_BASE, order_variants

import tdiag
from tdiag import TdiagError
from tdiag.ir import Contraction, SoftmaxBox, SumNode, walk
from tdiag.render import network


def mhsa(**sizes):
    return tdiag.load(DESIGNS / "mhsa.td", **sizes)


def statement(design, target):
    return design.graph.tensors[target].statement


def test_mhsa_box_has_head_batch_leg_and_latent_contraction():
    """Inside the box, h is a batch leg and d the latent contraction (App. C)."""
    (box,) = mhsa().boxes
    assert set(box.legs) == {"h", "n", "m"} and box.normalized == ("m",)
    assert box.scale == 1 / sympy.sqrt(sympy.Symbol("D", positive=True))
    (inner,) = [n for n in walk(box) if isinstance(n, Contraction)]
    assert inner.summed == ("d",) and inner.batch == ("h",)


def test_mhsa_output_contracts_heads_keys_and_latent_legs():
    """Y = A V WO: the head contraction over h is three-way, with m and e (spec §2.1)."""
    expr = statement(mhsa(), "Y").expr
    assert isinstance(expr, Contraction)
    assert set(expr.summed) == {"h", "m", "e"} and expr.batch == ()
    assert expr.legs == ("n", "g")


def test_mhsa_network_is_tuformer_fig_3b():
    """Edges F (X-W), D (WQ-WK), D (WV-WO), one H hyperedge through the four weights, the ball on
    the key leg M, and dangling N and F (spec tuformer.md §2.1)."""
    legs = {(h.leg, h.tensors, h.is_open, h.has_ball) for h in network(mhsa().graph)}
    assert ("h", ("WK", "WO", "WQ", "WV"), False, False) in legs
    assert ("d", ("WK", "WQ"), False, False) in legs
    assert ("e", ("WO", "WV"), False, False) in legs
    assert ("m", ("X", "X"), False, True) in legs
    assert {(h.leg, h.size) for h in network(mhsa().graph) if h.is_open} == {("n", "N"), ("g", "F")}
    assert sorted(h.tensors for h in network(mhsa().graph) if h.leg == "f") == [
        ("WK", "X"),
        ("WQ", "X"),
        ("WV", "X"),
    ]


def test_thsa_box_output_has_legs_r_n_m():
    """P6: the THSA box output has legs {R, N, M}; the core's s leg is summed inside."""
    design = tdiag.load(DESIGNS / "thsa.td")
    (box,) = design.boxes
    assert {design.legs[leg] for leg in box.legs} == {sympy.Symbol(s, positive=True) for s in "RN"}
    assert len(box.legs) == 3


def test_sizes_can_be_overridden_at_load():
    design = mhsa(F=256, H=4)
    assert design.size_values == {"F": 256, "H": 4, "D": 64}


def test_parameter_count_is_a_formula_in_the_size_symbols():
    F, H, D = sympy.symbols("F H D", positive=True)
    assert sympy.simplify(mhsa().graph.parameter_count() - 4 * F * H * D) == 0
    assert mhsa().parameter_count() == 1_048_576


@pytest.mark.parametrize(
    ("name", "count"),
    [
        ("mhsa", 1_048_576),
        ("thsa", 1_310_720),
        ("skip_right", 1_048_640),
        ("skip_left", 1_048_704),
        ("heads_only", 16_384),
        ("trainable_heads_only", 16_448),
    ],
)
def test_tuformer_parameter_counts_match_spec_p13(name, count):
    assert tdiag.load(DESIGNS / f"{name}.td").parameter_count() == count


def test_derived_design_replaces_only_the_core():
    base = tdiag.load(DESIGNS / "thsa.td")
    variant = tdiag.load(DESIGNS / "skip_right.td")
    assert variant.graph.base == "thsa"
    assert variant.tensors["C"].kind == "derived" and base.tensors["C"].kind == "param"
    assert statement(variant, "Y").expr == statement(base, "Y").expr


def test_reshaped_core_is_a_kronecker_product_of_legs():
    """skip_right writes C = C1 ⊗ J_D with legs, so its structure is visible (design notes §1)."""
    core = statement(tdiag.load(DESIGNS / "skip_right.td"), "C")
    assert core.groups[0] == ("h", "d") or len(core.groups[0]) == 2
    assert core.expr.legs and set(core.legs) == set(core.expr.legs)


def test_dataflow_graph_is_acyclic_and_reaches_the_output_from_the_input():
    g = mhsa().graph
    forward = g.forward_graph()
    assert nx.is_directed_acyclic_graph(forward)
    assert nx.has_path(forward, "X", "Y") and nx.has_path(forward, "WO", "Y")


def test_sum_node_broadcasts_over_missing_legs(write_td):
    path = write_td(
        "design t\nsize N, F = 4\ninput X[n: N, f: F]\nparam b[g: F] = zeros\n"
        "param W[f: F, g: F] = normal(std = 0.5)\nY[n g] = X[n f] W[f g] + b[g]\noutput Y\n"
    )
    expr = statement(tdiag.load(path), "Y").expr
    assert isinstance(expr, SumNode) and expr.legs == ("n", "g")
    assert expr.terms[1].legs == ("g",)


def test_leg_only_inside_a_box_is_summed_inside_it(write_td):
    path = write_td("design t\nsize N, F = 4\ninput X[n: N, f: F]\nY[n m] = softmax[m](X[n f] X[m f])\noutput Y\n")
    (box,) = tdiag.load(path).boxes
    assert box.legs == ("n", "m") and box.content.summed == ("f",)


def test_every_error_in_a_file_is_reported(write_td):
    path = write_td(
        "design t\nsize N, F = 4\ninput X[n: N, f: F]\nparam W[f: F, g: F] = normal(std = 1)\n"
        "Y[n g] = X[n f] WW[f g]\nZ[n] = X[n f g]\noutput Y, Z\n"
    )
    with pytest.raises(TdiagError) as caught:
        tdiag.load(path)
    messages = [d.message for d in caught.value.diagnostics]
    assert messages == ["unknown tensor 'WW'", "X has 2 axes (n f) but is used with 3 legs"]


def test_leg_with_two_sizes_is_reported_at_both_uses(write_td):
    path = write_td(
        "design t\nsize N, F = 4, R = 3\ninput X[n: N, f: F]\nparam W[r: R, g: F] = zeros\n"
        "Y[n g] = X[n f] W[f g]\noutput Y\n"
    )
    with pytest.raises(TdiagError) as caught:
        tdiag.load(path)
    (diag,) = [d for d in caught.value.diagnostics if "leg 'f'" in d.message]
    assert "bound to F" in diag.message and "but to R" in diag.message
    assert len(diag.spans) == 2 and diag.hint


def test_normalized_leg_contracted_inside_its_box_is_an_error(write_td):
    path = write_td("design t\nsize N, F = 4\ninput X[n: N, f: F]\nY[n m] = softmax[f](X[n f] X[m f])\noutput Y\n")
    with pytest.raises(TdiagError) as caught:
        tdiag.load(path)
    assert "normalized leg 'f' is contracted inside its softmax box" in str(caught.value)


def test_reshape_whose_sizes_do_not_multiply_is_an_error(write_td):
    path = write_td(
        "design t\nsize N, F = 4, H = 2, D = 3\ninput X[n: N, f: F]\nparam A[h: H, d: D] = zeros\n"
        "Y[n h d] = X[n (h d)] A[h d]\noutput Y\n"
    )
    with pytest.raises(TdiagError) as caught:
        tdiag.load(path)
    assert "reshape mismatch: axis f of X has size F but (h d) has size H·D" in str(caught.value)


def test_size_that_is_not_whole_is_an_error():
    with pytest.raises(TdiagError) as caught:
        mhsa(H=3)
    assert "size D = F/H is 512/3" in str(caught.value)


def test_unknown_size_override_lists_the_sizes():
    with pytest.raises(TdiagError) as caught:
        mhsa(K=4)
    assert "has no size 'K'" in str(caught.value) and "D, F, H, N" in str(caught.value)


def test_misspelt_tensor_gets_did_you_mean(write_td):
    path = write_td(
        "design t\nsize N, F = 4\ninput X[n: N, f: F]\nparam WK[f: F, g: F] = zeros\n"
        "Y[n g] = X[n f] WKK[f g]\noutput Y\n"
    )
    with pytest.raises(TdiagError) as caught:
        tdiag.load(path)
    assert caught.value.diagnostics[0].hint == "did you mean 'WK'?"


def test_cycle_of_definitions_is_an_error(write_td):
    path = write_td("design t\nsize N\ninput X[n: N]\nA[n] = B[n] X[n]\nB[n] = A[n]\noutput A\n")
    with pytest.raises(TdiagError) as caught:
        tdiag.load(path)
    assert "cycle of definitions" in str(caught.value)


def test_every_box_is_listed_with_its_statement():
    design = tdiag.load(DESIGNS / "thsa.td")
    assert [(s.target, type(b)) for s, b in design.graph.boxes()] == [
        (s.target, SoftmaxBox) for s, _ in design.graph.boxes()
    ]


@pytest.mark.parametrize(
    ("declaration", "what"),
    [
        ("mask P[a: N, c: N]", "a mask input"),
        ("param P[a: F, c: F]", "a param"),
        ("const P[a: F, c: F] = identity", "a const"),
        ("random P[a: N, c: F] = normal(mode = always)", "random noise"),
        ("buffer P[a: F, c: F] = fill(2)", "a buffer"),
    ],
)
def test_output_naming_a_declared_tensor_other_than_an_input_is_refused_at_the_output(write_td, declaration, what):
    path = write_td(f"design t\nsize N, F = 4\ninput X[n: N, f: F]\n{declaration}\nY[n f] = X[n f]\noutput Y, P\n")
    with pytest.raises(TdiagError) as caught:
        tdiag.load(path)
    (diag,) = caught.value.diagnostics
    assert diag.message == f"output 'P' is {what}, not computed from an input"
    assert (diag.spans[0].line, diag.spans[0].column) == (6, 11)


# ---- a leg's size comes from any factor of its statement, whatever their order ---------------


@pytest.mark.parametrize("construct", LEG_READERS)
def test_a_leg_is_bound_from_a_later_factor_of_its_statement(construct):
    first, second = (tdiag.loads(text) for text in order_variants(construct))
    assert first.legs == second.legs
    assert {first.legs[leg] for leg in ("l", "p", "q") if leg in first.legs} <= set(
        sympy.symbols("N P Q", positive=True)
    )


def test_a_leg_no_factor_binds_is_still_refused_at_its_use():
    with pytest.raises(TdiagError) as caught:
        tdiag.loads(ORDER_BASE + "Y[n h] = causal(n, z) LF[l h] X[n f] W[f h]\noutput Y\n")
    (diag,) = caught.value.diagnostics
    assert diag.message == "causal mask leg 'z' is not bound to a size"
    assert (diag.spans[0].line, diag.spans[0].column) == (10, 20)


def test_a_refused_slice_read_before_its_leg_is_reported_once():
    with pytest.raises(TdiagError) as caught:
        tdiag.loads(ORDER_BASE + "Y[n f] = causal(n, l) Tab[h, n: N, l: 10] X[l f]\noutput Y\n")
    (diag,) = caught.value.diagnostics
    assert diag.message.startswith("slice l: 10 = 10 is longer than axis j of Tab")


@pytest.mark.parametrize("reader", ["causal(n, l)", "index(l)", "Rel[h, r = clamp(l - n, -1, 1) + 1]"])
def test_a_leg_bound_only_by_another_statement_is_found_whatever_the_order_of_statements(reader):
    statements = [f"Y[h n] = {reader} X[n f] W[f h]", "Z[l h] = LF[l h]", "LF[k h] = X[k f] W[f h]"]
    head = ORDER_BASE.split("LF[k h]")[0]
    for order in itertools.permutations(statements):
        design = tdiag.loads(head + "\n".join(order) + "\noutput Y, Z\n")
        assert design.legs["l"] == sympy.Symbol("N", positive=True), order


def test_a_reshape_whose_pieces_only_a_later_statement_sizes_is_split_by_those_sizes():
    design = tdiag.loads(ORDER_BASE + "Y[n a b] = X[n (a b)]\nZ[a b] = G[a b]\noutput Y\n")
    assert (design.legs["a"], design.legs["b"]) == sympy.symbols("P Q", positive=True)


# ---- extends: the derived file's outputs stand for the base's ---------------------------------

EXTENDED_BASE = "design base\nsize N, F = 4\ninput X[n: N, f: F]\noutput Y\nY[n f] = X[n f]\nZ[n f] = 2 X[n f]\n"


def test_a_replace_after_a_derived_output_replaces_the_named_statement(write_td):
    write_td(EXTENDED_BASE, "base.td")
    path = write_td("design d extends base\noutput Y, Z\nreplace Y[n f] = 3 X[n f]\n", "d.td")
    design = tdiag.load(path)
    assert design.graph.outputs == ["Y", "Z"]
    assert [s.expr.coefficient for s in design.graph.statements if s.target == "Y"] == [3]


def test_every_output_line_of_a_derived_design_counts_and_none_of_the_base(write_td):
    write_td(EXTENDED_BASE, "base.td")
    path = write_td("design d extends base\noutput Z\noutput X\n", "d.td")
    assert tdiag.load(path).graph.outputs == ["Z", "X"]


UPDATED_BASE = (
    "design base\nsize N, F = 4\ninput X[n: N, f: F]\nbuffer b[f: F] = zeros\nY[n f] = X[n f] + b[f]\n"
    "update b[f] = b[f] + 1\noutput Y\n"
)


def test_a_second_update_rule_for_a_buffer_is_refused_at_both_rules(write_td):
    with pytest.raises(TdiagError) as caught:
        tdiag.load(write_td(UPDATED_BASE.replace("output Y", "update b[f] = b[f] + 10\noutput Y")))
    (diag,) = caught.value.diagnostics
    assert diag.message == "buffer 'b' has two update rules (line 6 and here)"
    assert [(span.line, span.column) for span in diag.spans] == [(7, 8), (6, 8)]


def test_a_derived_design_s_update_rule_stands_for_the_base_s(write_td):
    write_td(UPDATED_BASE, "base.td")
    design = tdiag.load(write_td("design d extends base\nupdate b[f] = b[f] + 10\n", "d.td"))
    (rule,) = design.graph.updates
    assert rule.span.file.endswith("d.td")
