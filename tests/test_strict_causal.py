"""A position mask used as a number, not only as a factor of a product: `causal(n, m) - I[n m]`
(the strictly causal mask m < n), `1 - causal(n, m)`, a map of it, a window less the diagonal, a
statement of its own. Each is lowered to its 0/1 numbers (tdiag/plan/base.py) and equals, values
and gradients in float64, the product written out by hand with the same mask, plain and under
with_causal_mask."""

import pytest
import torch
from conftest import assert_matches

import tdiag

TOL = 1e-10

HEAD = """design masks
size F = 8, H = 2, D = 3, E = 4, W = 3
size N
input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 0.3)
param WK[f: F, h: H, d: D] = normal(std = 0.3)
param WV[f: F, h: H, e: E] = normal(std = 0.3)
const I[n: N, m: N] = identity
const J[n: N, m: N] = ones
Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
"""


def below(n: int, diagonal: int = 0) -> torch.Tensor:
    """1 where m <= n + diagonal, as float64 [n, m]."""
    return torch.ones(n, n, dtype=torch.float64).tril(diagonal)


def band(n: int, before: int, after: int) -> torch.Tensor:
    """1 where n - before < m < n + after."""
    offset = torch.arange(n)[None, :] - torch.arange(n)[:, None]
    return ((offset > -before) & (offset < after)).double()


# (the mask as written, the same mask as numbers over (n, m), of the length)
MASKS = [
    ("causal(n, m) - I[n m]", lambda n: below(n, -1)),
    ("I[n m] - causal(n, m)", lambda n: -below(n, -1)),
    ("1 - causal(n, m)", lambda n: 1 - below(n)),
    ("J[n m] - causal(n, m)", lambda n: 1 - below(n)),
    ("exp(causal(n, m))", lambda n: torch.exp(below(n))),
    ("sigmoid(causal(n, m))", lambda n: torch.sigmoid(below(n))),
    ("relu(causal(n, m) - 0.5)", lambda n: torch.relu(below(n) - 0.5)),
    ("causal(n, m) ^ 2", below),
    ("causal(n, m) + causal(n, m)", lambda n: 2 * below(n)),
    ("causal(n, m) - causal(m, n)", lambda n: below(n) - below(n).T),
    ("window(n, m, W) - I[n m]", lambda n: band(n, 3, 0)),
    ("window(n, m, W, W) - causal(n, m)", lambda n: band(n, 3, 3) - below(n)),
    ("causal(n, m) window(n, m, W) - I[n m]", lambda n: band(n, 3, 0)),
]


def masked_product(x, p, mask):
    """Σ_m mask[n, m] (q_n · k_m) v_m per head."""
    q = torch.einsum("bnf,fhd->bnhd", x, p["WQ"])
    k = torch.einsum("bnf,fhd->bnhd", x, p["WK"])
    v = torch.einsum("bnf,fhe->bnhe", x, p["WV"])
    return torch.einsum("nm,bnhd,bmhd,bmhe->bnhe", mask, q, k, v)


def test_a_strictly_causal_factor_is_lowered_to_the_mask_below_the_diagonal():
    design = tdiag.loads(HEAD + "Y[n h e] = (causal(n, m) - I[n m]) Q[n h d] K[m h d] V[m h e]\noutput Y\n")
    assert "mask as 1 and 0" in str(design.plan(N=16))
    assert_matches(design.module(dtype=torch.float64), lambda x, p: masked_product(x, p, below(7, -1)))


def test_a_strictly_causal_design_is_causal_already_and_with_causal_mask_returns_it_unchanged():
    design = tdiag.loads(HEAD + "Y[n h e] = (causal(n, m) - I[n m]) Q[n h d] K[m h d] V[m h e]\noutput Y\n")
    assert design.with_causal_mask().graph is design.graph


def test_a_strictly_causal_factor_under_with_causal_mask_keeps_its_value():
    design = tdiag.loads(HEAD + "Y[n h e] = (causal(n, m) - I[n m]) Q[n h d] K[m h d] V[m h e]\noutput Y\n")
    module = design.with_causal_mask().module(dtype=torch.float64)
    assert_matches(module, lambda x, p: masked_product(x, p, below(7, -1)))


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "with_causal_mask"])
@pytest.mark.parametrize(("mask", "numbers"), MASKS, ids=[m for m, _ in MASKS])
def test_arithmetic_on_position_masks_is_lowered_as_their_numbers(mask, numbers, causal):
    design = tdiag.loads(HEAD + f"Y[n h e] = ({mask}) Q[n h d] K[m h d] V[m h e]\noutput Y\n")
    design = design.with_causal_mask() if causal else design
    expected = numbers(7) * below(7) if causal else numbers(7)
    assert_matches(design.module(dtype=torch.float64), lambda x, p: masked_product(x, p, expected))


@pytest.mark.parametrize(
    ("mask", "numbers"),
    [
        ("causal(n, m) - I[n m]", lambda n: below(n, -1)),
        ("causal(n, m)", below),
        ("exp(causal(n, m))", lambda n: torch.exp(below(n))),
    ],
    ids=["strict", "causal", "exp"],
)
def test_a_position_mask_computed_by_a_statement_of_its_own_is_lowered(mask, numbers):
    design = tdiag.loads(HEAD + f"M[n m] = {mask}\nY[n h e] = M[n m] Q[n h d] K[m h d] V[m h e]\noutput Y\n")
    assert_matches(design.module(dtype=torch.float64), lambda x, p: masked_product(x, p, numbers(7)))


def test_a_strictly_causal_bias_inside_a_softmax_box_is_added_to_the_scores():
    design = tdiag.loads(
        HEAD + "Y[n h e] = softmax[m](Q[n h d] K[m h d] + 2 (causal(n, m) - I[n m])) V[m h e]\noutput Y\n"
    )

    def reference(x, p):
        q = torch.einsum("bnf,fhd->bnhd", x, p["WQ"])
        k = torch.einsum("bnf,fhd->bnhd", x, p["WK"])
        v = torch.einsum("bnf,fhe->bnhe", x, p["WV"])
        scores = torch.einsum("bnhd,bmhd->bhnm", q, k) + 2 * below(7, -1)
        return torch.einsum("bhnm,bmhe->bnhe", scores.softmax(-1), v)

    assert_matches(design.module(dtype=torch.float64), reference)


def test_a_strictly_causal_mask_divided_by_positions_is_lowered():
    design = tdiag.loads(
        HEAD + "Y[n h e] = (causal(n, m) - I[n m]) / (1 + index(n)) Q[n h d] K[m h d] V[m h e]\noutput Y\n"
    )
    scale = 1 / (1 + torch.arange(7, dtype=torch.float64))[:, None]
    assert_matches(design.module(dtype=torch.float64), lambda x, p: masked_product(x, p, below(7, -1) * scale))
    assert design.cost().at(N=64)["flops"] > 0
