"""Scores that are a sum of query·key products over different contracted legs (partial RoPE:
rotated dims plus passed-through dims, GPT-NeoX §2.1.1) take SDPA as one product of the
concatenated sides, Σ_i w_i q_i·k_i = [w_1 q_1, w_2 q_2]·[k_1, k_2]: equal to the softmax of the
summed scores written here in plain torch (float64, 1e-10), plain and causal, and keeping no
heads × N² tensor for backward."""

import math

import pytest
import torch
from conftest import DESIGNS

import tdiag
from tdiag.measure import saved_for_backward
from tdiag.plan.program import Attention, Concat

TOL = 1e-10
B, N = 2, 6
F64 = torch.float64

TWO_PRODUCTS = """
design two_products
size F = 8, H = 2, D = 4, C = 2
size N
input X[n: N, f: F]
param WQ[f: F, h: H, d: D]
param WK[f: F, h: H, d: D]
param WQ2[f: F, h: H, c: C]
param WK2[f: F, h: H, c: C]
param WV[f: F, h: H, e: D]
param WO[h: H, e: D, g: F]
Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
P[n h c] = X[n f] WQ2[f h c]
R[m h c] = X[m f] WK2[f h c]
V[m h e] = X[m f] WV[f h e]
A[h n m] = softmax[m, scale = 1 / sqrt(D)](Q[n h d] K[m h d] - 0.5 * P[n h c] R[m h c])
Y[n g] = A[h n m] V[m h e] WO[h e g]
output Y
"""


def design(causal: bool) -> tdiag.Design:
    loaded = tdiag.loads(TWO_PRODUCTS)
    return loaded.with_causal_mask() if causal else loaded


def two_products(p: dict[str, torch.Tensor], x: torch.Tensor, causal: bool) -> torch.Tensor:
    """softmax((q·k − 0.5 p·r)/√D) v, then the output projection."""

    def proj(w):
        return torch.einsum("bnf,fhd->bhnd", x, w)

    q, k, p2, r, v = (proj(p[w]) for w in ("WQ", "WK", "WQ2", "WK2", "WV"))
    scores = (q @ k.transpose(-1, -2) - 0.5 * p2 @ r.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        n = x.shape[-2]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
    return torch.einsum("bhnm,bhme,heg->bng", scores.softmax(-1), v, p["WO"])


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_a_sum_of_query_key_products_takes_sdpa_with_the_sides_concatenated(causal):
    plan = design(causal).plan(N=64)
    assert [type(s.op) for s in plan.steps].count(Attention) == 1
    assert [type(s.op) for s in plan.steps].count(Concat) == 2  # q and k
    assert any("2 query·key products" in note and "concatenated" in note for note in plan.lowered), plan.lowered


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_a_sum_of_query_key_products_equals_the_softmax_of_the_summed_scores(causal):
    module = design(causal).module(N=N, dtype=F64)
    params = {name: value.detach() for name, value in module.named_parameters()}
    x = torch.randn(B, N, 8, dtype=F64, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(module(x), two_products(params, x, causal), rtol=TOL, atol=TOL)


def test_a_sum_of_query_key_products_gradcheck():
    module = design(True).module(N=3, dtype=F64)
    x = torch.randn(1, 3, 8, dtype=F64, requires_grad=True, generator=torch.Generator().manual_seed(2))
    assert torch.autograd.gradcheck(module, (x,))


@pytest.mark.parametrize("name", ["two_products", "rope_partial"])
def test_a_sum_of_query_key_products_keeps_no_heads_by_n_squared_tensor(name):
    n = 64
    loaded = design(True) if name == "two_products" else tdiag.load(DESIGNS / "rope_partial.td", F=16, H=2)
    module = loaded.module(N=n)
    width = loaded.size_values["F"]
    saved = saved_for_backward(module, torch.randn(B, n, width))
    assert saved.storages and max(math.prod(s.shape) for s in saved.storages) < 2 * n * n  # H = 2 heads


def test_rope_partial_takes_sdpa():
    plan = tdiag.load(DESIGNS / "rope_partial.td", F=16, H=2).plan(N=64)
    assert any("scaled_dot_product_attention" in note for note in plan.lowered), plan.refused


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_saved_memory_of_a_sum_of_products_plan_is_what_the_model_predicts(causal):
    n = 64
    loaded = design(causal)
    saved = saved_for_backward(loaded.module(N=n, B=B), torch.randn(B, n, 8))
    modelled = loaded.cost(N=n, B=B).saved_bytes_at(N=n, B=B)
    assert abs(modelled - saved.total_bytes) <= 0.1 * saved.total_bytes
