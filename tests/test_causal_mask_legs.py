"""with_causal_mask reads legs as the statement names them (tdiag/graph/causal.py): a tensor with
one position axis, defined over the key leg m and read at the query leg n, is read at the query,
so a product holding n is masked, not refused as one "without the query leg". Each design is
compared, values and gradients in float64, with a reference written out by hand here."""

import pytest
import torch
import torch.nn.functional as functional
from conftest import assert_matches

import tdiag

TOL = 1e-10

HEAD = """
size F = 8, H = 2, D = 3, E = 4
size N
input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 0.3)
param WK[f: F, h: H, d: D] = normal(std = 0.3)
param WV[f: F, h: H, e: E] = normal(std = 0.3)
Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
"""

GATED_WITH_SKIP = (
    "design gated_skip\n"
    + HEAD
    + """param WG[f: F, h: H] = normal(std = 0.3)
G[n h] = -softplus(X[n f] WG[f h])
Y[n h e] = exp(segsum[n, m](G[n h])) Q[n h d] K[m h d] V[m h e] + V[n h e]
output Y
"""
)

MAX_BESIDE_A_VALUE = "design max_value\n" + HEAD + "Y[n h e] = max[m](Q[n h d] K[m h d]) V[n h e]\noutput Y\n"

# RWKV-6 (Peng et al. 2024, "Eagle and Finch", eq. 16-19) with static token-shift mixes: the token
# shift x_{t-1} as a one-tap conv over the key leg, the bonus u on the diagonal, the decay
# Π_{j=s+1}^{t-1} w_j below it as exp(segsum - log w_t) under the strictly causal causal(n, m) - I.
RWKV6 = """design rwkv6
size F = 8, H = 2, D = 3, T = 1
size N
input X[n: N, f: F]
const tap[i: T] = ones
const I[n: N, m: N] = identity
param mur[f: F] = uniform(low = 0, high = 1)
param muk[f: F] = uniform(low = 0, high = 1)
param muv[f: F] = uniform(low = 0, high = 1)
param muw[f: F] = uniform(low = 0, high = 1)
param WR[f: F, h: H, d: D] = normal(std = 0.3)
param WK[f: F, h: H, d: D] = normal(std = 0.3)
param WV[f: F, h: H, e: D] = normal(std = 0.3)
param WW[f: F, h: H, d: D] = normal(std = 0.3)
param w0[h: H, d: D] = normal(std = 0.5)
param U[h: H, d: D] = normal(std = 0.5)
Xp[m f] = conv[m = m - i - 1](X[m f], tap[i])
R[n h d] = (X[n f] + mur[f] (Xp[n f] - X[n f])) WR[f h d]
K[m h d] = (X[m f] + muk[f] (Xp[m f] - X[m f])) WK[f h d]
V[m h e] = (X[m f] + muv[f] (Xp[m f] - X[m f])) WV[f h e]
LW[n h d] = -exp(w0[h d] + (X[n f] + muw[f] (Xp[n f] - X[n f])) WW[f h d])
Y[n h e] = exp(segsum[n, m](LW[n h d]) - LW[n h d]) (causal(n, m) - I[n m]) R[n h d] K[m h d] V[m h e] \\
    + R[n h d] U[h d] K[n h d] V[n h e]
output Y
"""


def project(x, weight):
    return torch.einsum("bnf,fhd->bnhd", x, weight)


def gated_with_skip_reference(x, p):
    """Σ_{m<=n} exp(Σ_{k=m+1..n} g_k) (q_n · k_m) v_m + v_n, per head."""
    q, k, v = project(x, p["WQ"]), project(x, p["WK"]), project(x, p["WV"])
    g = -functional.softplus(torch.einsum("bnf,fh->bnh", x, p["WG"])).cumsum(1)
    n = x.shape[1]
    below = torch.ones(n, n, dtype=torch.bool).tril()
    decay = torch.exp((g[:, :, None, :] - g[:, None, :, :]).masked_fill(~below[None, :, :, None], float("-inf")))
    scores = torch.einsum("bnhd,bmhd->bnmh", q, k) * decay
    return torch.einsum("bnmh,bmhe->bnhe", scores, v) + v


def max_beside_a_value_reference(x, p, causal):
    """max over the keys m (m <= n when causal) of q_n · k_m, times v_n."""
    scores = torch.einsum("bnhd,bmhd->bnmh", project(x, p["WQ"]), project(x, p["WK"]))
    if causal:
        n = x.shape[1]
        hidden = ~torch.ones(n, n, dtype=torch.bool).tril()
        scores = scores.masked_fill(hidden[None, :, :, None], float("-inf"))
    return scores.amax(2)[..., None] * project(x, p["WV"])


def rwkv6_reference(x, p):
    """RWKV-6's recurrence, one position at a time: o_t = r_t (S + diag(u) k_t v_tᵀ), then
    S <- diag(w_t) S + k_t v_tᵀ, from S = 0; the token shift reads x_{t-1} (0 before the first)."""
    shifted = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], 1)

    def mixed(mu):
        return x + mu * (shifted - x)

    r, k, v = project(mixed(p["mur"]), p["WR"]), project(mixed(p["muk"]), p["WK"]), project(mixed(p["muv"]), p["WV"])
    w = torch.exp(-torch.exp(p["w0"] + project(mixed(p["muw"]), p["WW"])))
    state = x.new_zeros(x.shape[0], r.shape[2], r.shape[3], v.shape[3])
    outputs = []
    for t in range(x.shape[1]):
        kv = torch.einsum("bhd,bhe->bhde", k[:, t], v[:, t])
        outputs.append(torch.einsum("bhd,bhde->bhe", r[:, t], state + p["U"][None, :, :, None] * kv))
        state = w[:, t, :, :, None] * state + kv
    return torch.stack(outputs, 1)


@pytest.mark.parametrize("causal", [False, True])
def test_a_key_side_tensor_read_at_the_query_leg_is_a_query_read_and_the_product_is_masked(causal):
    design = tdiag.loads(GATED_WITH_SKIP)
    module = (design.with_causal_mask() if causal else design).module(dtype=torch.float64)
    assert_matches(module, gated_with_skip_reference)


@pytest.mark.parametrize("causal", [False, True])
def test_rwkv6_with_a_one_tap_conv_token_shift_equals_its_recurrence(causal):
    design = tdiag.loads(RWKV6)
    module = (design.with_causal_mask() if causal else design).module(dtype=torch.float64)
    assert_matches(module, rwkv6_reference)


@pytest.mark.parametrize("causal", [False, True])
def test_a_max_over_the_keys_beside_a_value_read_at_the_query_is_masked(causal):
    design = tdiag.loads(MAX_BESIDE_A_VALUE)
    module = (design.with_causal_mask() if causal else design).module(dtype=torch.float64)
    assert_matches(module, lambda x, p: max_beside_a_value_reference(x, p, causal))


def test_a_sum_over_the_keys_of_a_tensor_read_at_the_query_leg_is_still_refused():
    text = "design mixed\n" + HEAD + "Y[h e] = Q[n h d] K[m h d] V[m h e]\noutput Y\n"
    with pytest.raises(tdiag.TdiagError, match=r"<string>:12:10: error: with_causal_mask cannot mask the sum"):
        tdiag.loads(text).with_causal_mask()
