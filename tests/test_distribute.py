"""A product of a sum of softmax boxes with values is distributed over the sum where the
objective finds it cheaper, (A1 − λ A2) V = A1 V − λ (A2 V) (differential attention, Ye et al.
2024, eq. 1): each box then meets the values alone and is one SDPA call. Equal to the
difference of softmaxes written here in plain torch (float64, 1e-10), plain and causal, values
and gradients; the FLOP count (cost reports) keeps the undistributed form."""

import math

import pytest
import torch

import tdiag
from tdiag.plan.program import Attention
from tdiag.plan.regions import DISTRIBUTED_NOTE

TOL = 1e-10
B, N = 2, 6
F64 = torch.float64
PLANNED = 512  # a length where two fused attentions cost less than two stored boxes

TWO_BOXES = """
design two_boxes
size F = 8, H = 2, D = 4
size N
input X[n: N, f: F]
param WQ1[f: F, h: H, d: D]
param WK1[f: F, h: H, d: D]
param WQ2[f: F, h: H, d: D]
param WK2[f: F, h: H, d: D]
param WV[f: F, h: H, e: D]
param WO[h: H, e: D, g: F]
param lam[] = fill(0.5)
Q1[n h d] = X[n f] WQ1[f h d]
K1[m h d] = X[m f] WK1[f h d]
Q2[n h d] = X[n f] WQ2[f h d]
K2[m h d] = X[m f] WK2[f h d]
V[m h e] = X[m f] WV[f h e]
A1[h n m] = softmax[m, scale = 1 / sqrt(D)](Q1[n h d] K1[m h d])
A2[h n m] = softmax[m, scale = 1 / sqrt(D)](Q2[n h d] K2[m h d])
Y[n g] = (A1[h n m] - lam[] A2[h n m]) V[m h e] WO[h e g]
output Y
"""


def design(causal: bool) -> tdiag.Design:
    loaded = tdiag.loads(TWO_BOXES)
    return loaded.with_causal_mask() if causal else loaded


def two_boxes(p: dict[str, torch.Tensor], x: torch.Tensor, causal: bool) -> torch.Tensor:
    """(softmax(q1·k1/√D) − λ softmax(q2·k2/√D)) v, then the output projection."""

    def proj(w):
        return torch.einsum("bnf,fhd->bhnd", x, w)

    def attention(wq, wk):
        scores = proj(p[wq]) @ proj(p[wk]).transpose(-1, -2) / math.sqrt(p[wq].shape[-1])
        if causal:
            n = x.shape[-2]
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
        return scores.softmax(-1)

    difference = attention("WQ1", "WK1") - p["lam"] * attention("WQ2", "WK2")
    return torch.einsum("bhnm,bhme,heg->bng", difference, proj(p["WV"]), p["WO"])


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_a_difference_of_softmax_boxes_times_values_takes_one_attention_per_box(causal):
    plan = design(causal).plan(N=PLANNED, objective="time")
    assert [type(s.op) for s in plan.steps].count(Attention) == 2
    assert DISTRIBUTED_NOTE in plan.lowered


def test_counting_flops_the_sum_of_boxes_meets_the_values_once():
    plan = design(False).plan(N=PLANNED, objective="flops")
    assert DISTRIBUTED_NOTE not in plan.lowered


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_the_distributed_form_equals_the_difference_of_softmaxes_values_and_gradients(causal):
    module = design(causal).module(N=PLANNED, dtype=F64)
    params = {name: value for name, value in module.named_parameters()}
    x = torch.randn(B, N, 8, dtype=F64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    out, expected = module(x), two_boxes(params, x, causal)
    torch.testing.assert_close(out, expected, rtol=TOL, atol=TOL)
    weights = torch.randn_like(out)
    got = torch.autograd.grad((out * weights).sum(), [x, *params.values()])
    want = torch.autograd.grad((expected * weights).sum(), [x, *params.values()])
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=TOL, atol=TOL)


def test_the_distributed_form_gradcheck():
    module = design(True).module(N=PLANNED, dtype=F64)
    x = torch.randn(1, 3, 8, dtype=F64, requires_grad=True, generator=torch.Generator().manual_seed(2))
    assert torch.autograd.gradcheck(module, (x,))
