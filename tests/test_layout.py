"""Layout assignment (tdiag/plan/layout.py): products that sum nothing are broadcast multiplies,
and intermediates are laid out so that their consumers read them as views."""

import pytest
import sympy
from conftest import DESIGNS

import tdiag
from tdiag.plan import BATCH_SIZE
from tdiag.plan.layout import Sizes, align, assign_layouts
from tdiag.plan.program import Matmul, Multiply, Operand, Softmax, Step, Value

SIZES = {"b": 2, "n": 5, "m": 5, "s": 6, "r": 6}
SIZED = Sizes(SIZES.__getitem__, lambda leg: sympy.Integer(SIZES[leg]))


def outer_then_scores() -> list[Step]:
    """THSA's score path as the planner emits it: C·Q as [b n s r], the scores as [b n r m],
    then a softmax over m that wants [b r n m] (a copy before the pass)."""
    q, c, k = Value("q", ("b", "n", "s")), Value("c", ("r", "s")), Value("k", ("b", "m", "s"))
    t, scores = Value("t", ("b", "n", "s", "r")), Value("scores", ("b", "n", "r", "m"))
    order = t.legs
    return [
        Step("contraction", Multiply(align(q, order), align(c, order)), t, inputs=(q, c)),
        Step("contraction", Matmul(Operand(t, (0, 1, 3, 2)), Operand(k, (0, 2, 1))), scores, inputs=(t, k)),
        Step("softmax", Softmax(Operand(scores, (0, 2, 1, 3)), 1, (5,)), Value("a", ("b", "r", "n", "m"))),
    ]


def test_outer_product_is_laid_out_for_the_matmul_that_feeds_the_softmax():
    steps = outer_then_scores()
    assign_layouts(steps, {"a"}, SIZED)
    product, scores, softmax = steps
    assert product.out.legs == ("b", "r", "n", "s")
    assert scores.out.legs == ("b", "r", "n", "m")
    assert softmax.op.x.permutation is None  # the softmax reads its content as produced
    assert scores.op.a.value.var == "t" and scores.op.a.permutation is None  # [b (r n) s]: a view


def test_kept_values_keep_their_layout():
    steps = outer_then_scores()
    assign_layouts(steps, {"a", "scores"}, SIZED)
    assert steps[1].out.legs == ("b", "n", "r", "m")
    assert steps[2].op.x.permutation == (0, 2, 1, 3)


THSA_SMALL = {"F": 16, "H": 2}


def plan(name: str, **sizes):
    return tdiag.load(DESIGNS / f"{name}.td", **sizes).plan(N=64, objective="flops")


def copies(operand: Operand, numbers: dict[str, int]) -> bool:
    """Does this read reshape legs that are not adjacent, in order, in memory?"""
    if operand.shape is None:
        return False
    legs = operand.value.legs
    permutation = operand.permutation or tuple(range(len(legs)))
    position = 0
    for expr in operand.shape:
        size = int(expr.subs({symbol: numbers[str(symbol)] for symbol in expr.free_symbols}))
        group, total = [], 1
        while total < size or (not group and position < len(permutation)):
            group.append(permutation[position])
            total *= numbers[legs[permutation[position]]]
            position += 1
            if total == size:
                break
        if group != list(range(group[0], group[0] + len(group))):
            return True
    return False


@pytest.mark.parametrize("name", ["thsa", "fish", "hard_fish", "skip_left", "skip_right", "kronecker", "mgk"])
def test_no_matmul_with_inner_size_one_and_no_copy_of_an_n_squared_tensor(name):
    p = tdiag.load(DESIGNS / f"{name}.td").plan(N=96)
    numbers = {leg: _number(p, leg) for leg in p.leg_sizes} | {"B": 3, "N": 96}
    for step in p.steps:
        if isinstance(step.op, Matmul):
            assert step.summed, f"{name}: a matmul that sums nothing: {step.description}"
            for operand in (step.op.a, step.op.b):
                scores = [leg for leg in operand.value.legs if numbers[leg] == 96]
                if len(scores) == 2:  # an N² tensor (query-side copies are O(N) and sometimes needed)
                    assert not copies(operand, numbers), f"{name}: {step.description} copies"
        if isinstance(step.op, Softmax):
            assert step.op.x.permutation is None, f"{name}: the softmax permutes its content"


def test_outer_products_are_multiplies_counted_one_flop_per_element():
    p = plan("thsa", **THSA_SMALL)  # N = 64 > R: C·Q first, an outer product
    (product,) = [s for s in p.steps if isinstance(s.op, Multiply)]
    n, r = (p.graph.sizes[k].symbol for k in ("N", "R"))
    assert not product.summed and "@" not in tdiag.codegen.op_code(product.op, p.attributes)
    assert sympy.expand(product.flops - BATCH_SIZE * n * r**2) == 0


def test_key_norm_is_one_reduction():
    source = tdiag.load(DESIGNS / "mgk.td").source(N=64)
    assert ".square().sum(" in source


def _number(p, leg):
    value = p.graph.evaluate(p.leg_sizes[leg], **p.sizes)
    return int(value.xreplace({BATCH_SIZE: 3}))


MIX_SIZES = {"b": 2, "k": 2, "i": 4, "h": 4, "n": 64, "m": 64, "d": 8}
MIX_SIZED = Sizes(MIX_SIZES.__getitem__, lambda leg: sympy.Integer(MIX_SIZES[leg]))


def matrix_mix(matrix: Value, x: Value, out: Value, summed: str) -> Step:
    """x [b k n m] mixed on its head axis by a matrix [k i], the matrix on the left (as the
    planner emits it: torch then folds x's transpose into rows, copying x and the result)."""
    n2 = sympy.Integer(MIX_SIZES["n"] * MIX_SIZES["m"])
    columns = sympy.Integer(MIX_SIZES[matrix.legs[0]])
    a = Operand(matrix, (1, 0), index=(False, True, True))
    b = Operand(x, shape=(sympy.Integer(MIX_SIZES["b"]), columns, n2))
    return Step("contraction", Matmul(a, b), out, inputs=(x, matrix), summed=(summed,))


def scores_mixed_twice() -> list[Step]:
    """Hard GFiSH's score path: scores [b k n m], mixed by P[k i], then by W[i h], then a
    softmax over m."""
    q, key = Value("q", ("b", "k", "n", "d")), Value("key", ("b", "k", "d", "m"))
    scores, first, second = (Value(v, ("b", leg, "n", "m")) for v, leg in (("s", "k"), ("u", "i"), ("w", "h")))
    return [
        Step("contraction", Matmul(Operand(q), Operand(key)), scores, inputs=(q, key)),
        matrix_mix(Value("P", ("k", "i")), scores, first, "k"),
        matrix_mix(Value("W", ("i", "h")), first, second, "i"),
        Step("softmax", Softmax(Operand(second), 1, (64,)), Value("a", ("b", "h", "n", "m"))),
    ]


def test_two_head_mixes_copy_the_scores_once_not_through_transposed_folds():
    steps = scores_mixed_twice()
    assign_layouts(steps, {"a"}, MIX_SIZED)
    _, first, second, _ = steps
    assert first.op.a.value.var == "s"  # the scores as (b n m) rows × k: one copy of the scores
    assert first.out.legs == ("b", "n", "m", "i")  # so the second mix reads them as rows, a view
    assert "u" in {second.op.a.value.var, second.op.b.value.var}
