"""Ranges of stored tables, `W[f, j: a..b]` (docs/language.md, "Ranges"): entries a .. b − 1 of
an axis, so the parts of a fused projection are read where a checkpoint stores them. Each stage:
the lexer (`0..4` is not `0.` `.4`), the design graph (the leg's size b − a, positioned errors),
the reference evaluator and the compiled module (equal to torch's narrow, values and gradients),
the plan and generated code (a view), the cost and the diagram."""

from __future__ import annotations

import pytest
import torch

import tdiag
from tdiag import TdiagError
from tdiag.ir import TensorRef, walk
from tdiag.parse import _parser, parse_text

F64 = torch.float64

PREFIX = """design t
size F = 4, J = 12, L = 16
size N
input X[n: N, f: F]
param W[f: F, j: J]
param T[i: L, f: F]
"""


def load(body: str) -> tdiag.Design:
    return tdiag.loads(PREFIX + body + "\noutput Y", "t.td")


def modules(design: tdiag.Design) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(compiled, reference) float64 modules with the same parameters."""
    compiled = design.module(dtype=F64, seed=1)
    reference = design.module(dtype=F64, impl="reference")
    reference.load_state_dict(compiled.state_dict())
    return compiled, reference


def x_input(n: int) -> torch.Tensor:
    return torch.randn(2, n, 4, dtype=F64, generator=torch.Generator().manual_seed(n))


def tokens(text: str) -> list[tuple[str, str]]:
    return [(t.type, str(t)) for t in _parser().lex(text) if t.type != "_NL"]


def table_uses(design: tdiag.Design, name: str) -> list[TensorRef]:
    return [e for s in design.graph.statements for e in walk(s.expr) if isinstance(e, TensorRef) and e.name == name]


# ---- lexing ----------------------------------------------------------------------------------


def test_a_range_between_whole_numbers_lexes_as_number_range_number():
    assert tokens("W[j: 0..4]")[4:7] == [("NUMBER", "0"), ("_RANGE", ".."), ("NUMBER", "4")]


def test_a_range_from_a_decimal_number_keeps_the_decimal():
    assert tokens("W[j: 2.5..3]")[4:7] == [("NUMBER", "2.5"), ("_RANGE", ".."), ("NUMBER", "3")]


def test_numbers_with_a_trailing_or_leading_point_still_lex_as_numbers():
    assert tokens("1. .5 2.e3") == [("NUMBER", "1."), ("NUMBER", ".5"), ("NUMBER", "2.e3")]


def test_three_points_read_as_a_range_to_a_decimal():
    item = parse_text("design t\nY[n] = W[j: 0...4]\n").items[1]
    (leg,) = item.expr.legs
    assert (leg.start.value, leg.size.value) == (0, 0.4)


def test_a_range_is_refused_in_a_declaration():
    with pytest.raises(TdiagError, match=r"unexpected '\.\.'"):
        parse_text("design t\nparam W[j: 0..4]\n")


# ---- meaning ---------------------------------------------------------------------------------


def test_a_range_reads_entries_from_its_start_to_before_its_end():
    compiled, reference = modules(load("Y[n k] = X[n f] W[f, k: 3..7]"))
    x = x_input(5)
    want = x @ compiled.W[:, 3:7]
    torch.testing.assert_close(compiled(x), want, rtol=0, atol=1e-12)
    torch.testing.assert_close(reference(x), want, rtol=0, atol=1e-12)


def test_a_range_from_zero_is_the_first_entries_slice():
    ranged, first = load("Y[n k] = X[n f] W[f, k: 0..5]"), load("Y[n k] = X[n f] W[f, k: 5]")
    (ranged_use,), (first_use,) = (table_uses(d, "W") for d in (ranged, first))
    assert (ranged_use.slices, ranged_use.offsets) == (first_use.slices, first_use.offsets) == ((None, 5), ())


def test_the_leg_of_a_range_has_its_length():
    design = load("Y[n k] = X[n f] W[f, k: F..2 * F + 1]")
    assert design.graph.legs["k"].size == design.graph.sizes["F"].symbol + 1


def test_the_gradient_of_a_range_lands_in_its_entries_only():
    compiled, _ = modules(load("Y[n k] = X[n f] W[f, k: 2..5] + X[n f] W[f, k: 8..11]"))
    compiled(x_input(3)).sum().backward()
    grad = compiled.W.grad
    assert grad[:, 2:5].abs().min() > 0 and grad[:, 8:11].abs().min() > 0
    assert grad[:, [0, 1, 5, 6, 7, 11]].abs().max() == 0


def test_a_range_at_a_run_time_offset_follows_the_length():
    compiled, reference = modules(load("Y[n f] = X[n f] T[k: N - 2..N, f]"))
    for n in (2, 9):
        x = x_input(n)
        want = x * compiled.T[n - 2 : n].sum(0)
        torch.testing.assert_close(compiled(x), want, rtol=0, atol=1e-12)
        torch.testing.assert_close(reference(x), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("impl", ["compiled", "reference"])
def test_a_range_outside_the_axis_at_run_time_is_a_value_error_naming_the_table(impl: str):
    compiled, reference = modules(load("Y[n f] = X[n f] T[k: N - 2..N, f]"))
    module = compiled if impl == "compiled" else reference
    with pytest.raises(ValueError, match=r"T\[i: N - 2\.\.N\] is -1\.\.1 here"):
        module(x_input(1))


def test_a_range_viewed_in_pieces_is_cut_then_viewed():
    """The range of 4 entries viewed as (s p) of 2 × 2, head-major, as an unsliced table is."""
    design = tdiag.loads(
        PREFIX
        + "const S[s: 2, t: 2] = values(0, 1, 1, 0)\n"
        + "C[n k] = X[n f] W[f, k: 6..10]\n"
        + "Y[n s p] = S[s t] C[n (t p)]\noutput Y",
        "t.td",
    )
    compiled, reference = modules(design)
    x = x_input(4)
    part = (x @ compiled.W[:, 6:10]).unflatten(-1, (2, 2))
    want = part.flip(-2)
    torch.testing.assert_close(compiled(x), want, rtol=0, atol=1e-12)
    torch.testing.assert_close(reference(x), want, rtol=0, atol=1e-12)


# ---- computed tensors -------------------------------------------------------------------------


COMPUTED = "P[n j] = X[n f] W[f j]\nY[n k] = P[n, k: 2..5] + P[n, k: 8..11] P[n, k: 5..8]"


def test_a_range_of_a_computed_tensor_equals_torch_values_and_gradients():
    compiled, reference = modules(load(COMPUTED))
    x = x_input(4).requires_grad_()
    p = x @ compiled.W
    want = p[..., 2:5] + p[..., 8:11] * p[..., 5:8]
    for module in (compiled, reference):
        got = module(x)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
        got_grads = torch.autograd.grad(got.sum(), [x, module.W])
        want_grads = torch.autograd.grad(want.sum(), [x, compiled.W], retain_graph=True)
        for got_grad, want_grad in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=1e-12)


def test_a_computed_tensor_read_in_ranges_is_computed_once_and_split_once():
    source = load(COMPUTED).source(N=5)
    assert sum("X @ self.W" in line for line in source.splitlines()) == 1
    assert source.count(".split([2, 3, 3, 3, 1], 2)") == 1


def test_a_computed_tensor_is_not_sliced_along_a_run_time_axis():
    with pytest.raises(TdiagError, match="a computed tensor is sliced only along an axis of a size known"):
        load("P[n j] = X[n f] W[f j]\nY[k j] = P[k: 0..N - 1, j]")


# ---- plan, code, cost, diagram ---------------------------------------------------------------


def test_the_generated_code_reads_a_range_as_a_view():
    source = load("Y[n k] = X[n f] W[f, k: 3..7]").source(N=5)
    assert "self.W[:, 3:7]" in source
    assert "index_select" not in source and "clone" not in source


def test_ranges_that_do_not_overlap_read_one_split_of_the_table():
    design = load("Y[n k] = X[n f] W[f, k: 2..5] + X[n f] W[f, k: 8..11]")
    assert design.source(N=5).count("self.W.split([2, 3, 3, 3, 1], 1)") == 1


def test_overlapping_ranges_are_sliced_each():
    source = load("Y[n k] = X[n f] W[f, k: 2..5] + X[n f] W[f, k: 4..7]").source(N=5)
    assert "split" not in source and "self.W[:, 2:5]" in source and "self.W[:, 4:7]" in source


def test_a_range_costs_what_a_separate_table_of_its_size_costs():
    ranged = load("Y[n k] = X[n f] W[f, k: 3..7]").cost(N=8).at(N=8)
    separate = tdiag.loads(PREFIX + "param V[f: F, k: 4]\nY[n k] = X[n f] V[f k]\noutput Y", "t.td").cost(N=8).at(N=8)
    assert ranged["flops"] == separate["flops"]


def test_the_plan_shows_the_range_as_written():
    plan = str(load("Y[n k] = X[n f] W[f, k: F..2 * F]").plan(N=8))
    assert "W[j: F..2*F]" in plan


def test_the_diagram_labels_the_table_with_its_range():
    dot = load("Y[n k] = X[n f] W[f, k: 3..7]").dot()
    assert "W[k: 3..7]" in dot


# ---- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("use", "message"),
    [
        ("W[f, k: 4..2]", "slice k: 4..2 is reversed: it reads 2 - 4 = -2 entries"),
        ("W[f, k: 4..4]", "slice k: 4..4 is empty: it reads 4 - 4 = 0 entries"),
        ("W[f, k: 10..14]", "slice k: 10..14 ends at 14, past the end of axis j of W (J = 12 entries)"),
        ("W[f, k: J..J + 1]", "slice k: J..J + 1 starts at 12, beyond axis j of W (J = 12 entries: 0 .. 11)"),
        ("W[f, k: 0.5..2]", "slice k: 0.5..2 starts at 1/2, not at a whole number of entries >= 0"),
        ("W[f, k: -1..2]", "slice k: -1..2 starts at -1, not at a whole number of entries >= 0"),
        ("X[n, k: 1..3]", "only a stored table (param, const or buffer) or a computed tensor is sliced; X is an input"),
    ],
)
def test_a_bad_range_is_a_positioned_error(use: str, message: str):
    with pytest.raises(TdiagError) as caught:
        load(f"Y[n k] = X[n f] {use}")
    (diagnostic,) = [d for d in caught.value.diagnostics if d.is_error]
    assert diagnostic.message == message
    assert diagnostic.spans[0].line == 7


def test_show_writes_the_range_and_the_first_entries_slice_as_written():
    shown = load("Y[n k] = X[n f] W[f, k: F..2 * F] + X[n f] W[f, k: F]").show()
    assert "W[f, k: F..2*F]" in shown and "W[f, k: F]" in shown
