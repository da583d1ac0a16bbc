"""A projection with a bias (tdiag/plan/bias_fusion.py): a matmul by a 2-D weight plus a bias over
exactly the weight's output legs is one step, torch.addmm as nn.Linear runs it; it computes what
the reference evaluator computes, gradients included; a bias over any other leg is left to the sum."""

import pytest
import torch
from conftest import gradcheck_parameters

import tdiag
from tdiag.plan import build
from tdiag.plan.program import Elementwise, Matmul
from tdiag.space.canonical import canonical_program

HEADER = """
size F = 4, H = 2, D = 3
size N = 5
input X[n: N, f: F]
param W[f: F, g: F] = normal(std = 1)
param WQ[f: F, h: H, d: D] = normal(std = 1)
param b[g: F] = normal(std = 1)
param bq[h: H, d: D] = normal(std = 1)
param c[n: N] = normal(std = 1)
param WK[f: F, h: H, d: D] = normal(std = 1)
param bk[h: H, d: D] = normal(std = 1)
param WO[h: H, g: F, e: F] = normal(std = 1)
param bo[e: F] = normal(std = 1)
"""

ONE_LEG = "Y[n g] = X[n f] W[f g] + b[g]\noutput Y\n"
TWO_LEGS = "Q[n h d] = X[n f] WQ[f h d] + bq[h d]\noutput Q\n"
WITH_RESIDUAL = "Y[n g] = X[n f] W[f g] + b[g] + X[n g]\noutput Y\n"
OVER_ROWS = "Y[n g] = X[n f] W[f g] + c[n]\noutput Y\n"
ATTENTION = """
P[n g] = X[n f] W[f g] + b[g]
A[h n m] = softmax[m](P[n g] WQ[g h d] P[m f] WK[f h d])
Z[n e] = A[h n m] P[m g] WO[h g e] + bo[e]
output Z
"""
PRODUCT_TWICE = "Y[n g] = X[n f] W[f g] + b[g] + X[n f] W[f g]\noutput Y\n"


def design(body: str) -> tdiag.Design:
    return tdiag.loads("design projection\n" + HEADER + body)


def biased(body: str) -> list[Matmul]:
    return [s.op for s in design(body).plan(N=5).steps if isinstance(s.op, Matmul) and s.op.bias is not None]


def sums(body: str) -> list[Elementwise]:
    return [s.op for s in design(body).plan(N=5).steps if isinstance(s.op, Elementwise)]


def test_a_projection_with_a_bias_is_one_step():
    (op,) = biased(TWO_LEGS)
    assert op.bias.value.var == "bq" and not sums(TWO_LEGS)


def test_a_bias_beside_another_term_is_fused_and_the_other_term_kept():
    assert len(biased(WITH_RESIDUAL)) == 1 and len(sums(WITH_RESIDUAL)) == 1


def test_a_bias_over_the_rows_is_not_fused():
    assert not biased(OVER_ROWS) and len(sums(OVER_ROWS)) == 1


def test_a_product_the_sum_reads_twice_is_not_fused():
    assert not biased(PRODUCT_TWICE) and len(sums(PRODUCT_TWICE)) == 1


def test_the_fused_step_is_written_as_addmm():
    assert "torch.addmm(self.bq.reshape(6), X.flatten(0, -2), self.W" in design(TWO_LEGS).source()


def costs(body: str) -> list:
    return [
        (report.flops, report.elementwise)
        for report in (design(body).cost(N=5, convention=c) for c in ("flop", "mac", "paper"))
    ]


@pytest.mark.parametrize("body", [ONE_LEG, TWO_LEGS, WITH_RESIDUAL])
def test_the_fused_step_keeps_the_costs_of_the_matmul_and_the_sum(body, monkeypatch):
    fused = costs(body)
    monkeypatch.setattr(build, "fuse_linear_biases", lambda *_: [])
    assert not biased(body)
    assert fused == costs(body)


@pytest.mark.parametrize("body", [ONE_LEG, TWO_LEGS, WITH_RESIDUAL, OVER_ROWS, PRODUCT_TWICE])
def test_the_projection_equals_the_reference_with_its_gradients(body):
    compiled = design(body).module(dtype=torch.float64, seed=0)
    reference = design(body).module(impl="reference", dtype=torch.float64)
    reference.load_state_dict(compiled.state_dict(), strict=False)
    x = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    grads = []
    for module in (compiled, reference):
        out = module(x)
        weights = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
        found = torch.autograd.grad((out * weights).sum(), (x, *module.parameters()), allow_unused=True)
        grads.append([out, *(g for g in found if g is not None)])
    assert len(grads[0]) == len(grads[1]) > 2
    for mine, theirs in zip(*grads, strict=True):
        assert torch.allclose(mine, theirs, atol=1e-12, rtol=0)


@pytest.mark.parametrize("body", [TWO_LEGS, WITH_RESIDUAL])
def test_the_fused_projection_passes_gradcheck(body):
    module = design(body).module(dtype=torch.float64, seed=0)
    x = torch.randn(1, 5, 4, dtype=torch.float64, requires_grad=True)
    assert gradcheck_parameters(module, (x,))


def test_recomputed_boxes_keep_their_steps_when_sums_are_fused_away():
    plain = design(ATTENTION).module(dtype=torch.float64, seed=0, objective="flops")
    checkpointed = design(ATTENTION).module(dtype=torch.float64, seed=0, objective="flops", checkpoint_boxes=True)
    assert "torch.utils.checkpoint.checkpoint" in checkpointed.tdiag_source
    assert checkpointed.tdiag_source.count("torch.addmm") == 2
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    plain(x).square().sum().backward()
    checkpointed(x).square().sum().backward()
    for a, b in zip(plain.parameters(), checkpointed.parameters(), strict=True):
        assert (a.grad is None and b.grad is None) or torch.allclose(a.grad, b.grad, atol=1e-12, rtol=0)


def test_a_fused_bias_is_part_of_the_canonical_program():
    without = "Y[n g] = X[n f] W[f g]\noutput Y\n"
    assert biased(ONE_LEG)
    assert canonical_program(design(ONE_LEG).plan(N=5)) != canonical_program(design(without).plan(N=5))
