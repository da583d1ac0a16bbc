"""Small literal constants (`const C[...] = values(...)`, every axis at most 4 entries) are
unrolled into signed slices of the tensor they contract with (tdiag/plan/literals.py): never a
matmul, zero entries without a term, counted as elementwise work, nothing saved for backward;
values equal to the contraction written with the constant as a matrix (float64, 1e-10)."""

from __future__ import annotations

import pytest
import torch
from conftest import DESIGNS

import tdiag
from tdiag.measure import saved_for_backward
from tdiag.plan.program import Einsum, LiteralCombination, Matmul, Multiply

F64 = torch.float64

HEADER = """
size F = 16, P = F / 2, Q = F / 4
size N
input X[n: N, f: F]
"""


def small(body: str) -> tdiag.Design:
    return tdiag.loads("design small\n" + HEADER + body)


def combinations(plan) -> list[LiteralCombination]:
    return [step.op for step in plan.steps if isinstance(step.op, LiteralCombination)]


def x_input(n: int = 5) -> torch.Tensor:
    return torch.randn(2, n, 16, dtype=F64, generator=torch.Generator().manual_seed(3))


ROTATE = """
const R[s: 2, t: 2] = values(0, -1, 1, 0)
Y[n (p s)] = R[s t] X[n (p t)]
output Y
"""


def test_the_rotation_generator_is_a_signed_pair_swap_not_a_matmul():
    plan = small(ROTATE).plan(N=8)
    (op,) = combinations(plan)
    assert op.rows == (((-1, (1,)),), ((1, (0,)),))  # out[..., 0] = −x[..., 1], out[..., 1] = x[..., 0]
    assert not [s for s in plan.steps if isinstance(s.op, Matmul | Multiply | Einsum)]


def test_an_unrolled_literal_is_elementwise_work_not_flops():
    plan = small(ROTATE).plan(N=8)
    (step,) = [s for s in plan.steps if s.kind == "literal"]
    assert step.flops == 0 and step.elementwise != 0


def test_zero_entries_of_a_literal_have_no_term():
    body = "const C[s: 2, t: 2] = values(0, 2, 0, 0)\nY[n (p s)] = C[s t] X[n (p t)]\noutput Y"
    (op,) = combinations(small(body).plan(N=8))
    assert op.rows == (((2, (1,)),), ())


@pytest.mark.parametrize(
    ("body", "einsum", "pieces"),
    [
        (ROTATE, "st,bnpt->bnps", (8, 2)),
        (  # a new leg of size 3 and coefficients other than ±1
            "const C[s: 3, t: 2] = values(1, 0, 0.5, -2, 0, 0)\nY[n p s] = C[s t] X[n (p t)]\noutput Y",
            "st,bnpt->bnps",
            (8, 2),
        ),
        (  # a leg kept on both sides (a), one summed (b), one new (c)
            "const C[a: 2, b: 2, c: 2] = values(1, 2, 3, 4, 0, -1, 0.25, 0)\n"
            "Y[n q a c] = C[a b c] X[n (q a b)]\noutput Y",
            "ijk,bnqij->bnqik",
            (4, 2, 2),
        ),
    ],
    ids=["rotation", "new_leg", "kept_summed_new"],
)
def test_an_unrolled_literal_equals_the_contraction_with_the_constant_as_a_matrix(body, einsum, pieces):
    design = small(body)
    (const,) = design.graph.tensors_of_kind("const")
    shape = [int(design.graph.evaluate(a.size)) for a in const.axes]
    c = torch.tensor([float(v) for v in const.init.values], dtype=F64).reshape(shape)
    x = x_input()
    got = design.module(N=5, dtype=F64)(x)
    want = torch.einsum(einsum, c, x.reshape(2, 5, *pieces)).reshape(got.shape)
    assert combinations(design.plan(N=5))
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_a_literal_whose_summed_legs_two_factors_share_is_left_to_the_contraction():
    body = (
        "const C[s: 2, t: 2] = values(0, -1, 1, 0)\n"
        "Y[n s] = C[s t] X[n (p t)] X[n (p t)]\noutput Y"  # t is summed but carried by both X's
    )
    design = small(body)
    x = x_input()
    c = torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=F64)
    xs = x.reshape(2, 5, 8, 2)
    want = torch.einsum("st,bnpt,bnpt->bns", c, xs, xs)
    torch.testing.assert_close(design.module(N=5, dtype=F64)(x), want, rtol=1e-10, atol=1e-10)


def test_rope_keeps_no_expanded_copy_of_the_rotation_for_backward():
    """Each storage autograd saves is at most one Q (B·N·F entries): the rotation's batched matmul,
    which torch expanded across batch and heads, is gone; the report's model agrees."""
    design = tdiag.load(DESIGNS / "rope.td", F=16, H=2)
    b, n = 2, 32
    module = design.module(N=n, B=b)
    x = torch.randn(b, n, 16, generator=torch.Generator().manual_seed(0))
    saved = saved_for_backward(module, x)
    assert max(s.nbytes for s in saved.storages) <= b * n * 16 * 4
    modelled = design.cost(N=n, B=b).saved_bytes_at(N=n, B=b)
    assert abs(modelled - saved.total_bytes) <= 0.1 * saved.total_bytes
    plan = design.plan(N=n, B=b)
    assert len(combinations(plan)) == 2  # one rotation for the queries, one for the keys


def test_a_literal_that_keeps_no_leg_selects_one_slice():
    """A selector over a leg it sums (`E[t] = values(0, 1, 0)`: the key third of a fused QKV
    product) is that slice; it was stacked over no axis (`unflatten: sizes must be non-empty`)."""
    body = (
        "const E[t: 4] = values(0, 1, 0, 0)\nparam W[f: F, t: 4, e: Q] = normal(std = 1)\n"
        "T[n t e] = X[n f] W[f t e]\nY[n e] = T[n t e] E[t]\noutput Y"
    )
    design = small(body)
    module = design.module(dtype=F64)
    (op,) = combinations(module.tdiag_plan)
    x = x_input()
    assert op.sizes == () and torch.allclose(module(x), x @ module.W[:, 1], atol=1e-12, rtol=0)
