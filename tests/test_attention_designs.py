"""The attention designs of issue 13 (and Performer) in designs/, each equal (float64, 1e-10) to its paper's
equation written here in plain torch, plain and causal where causal makes sense; gradcheck at
small sizes; the standalone compiled file equals the in-process module; torch.compile(fullgraph)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import DESIGNS, gradcheck_parameters, perturbed, standalone_module, visible

import tdiag

F64 = torch.float64
SIZES = {"F": 8, "H": 2}
N = 5


def design(name: str, causal: bool = False) -> tdiag.Design:
    loaded = tdiag.load(DESIGNS / f"{name}.td", **SIZES)
    return loaded.with_causal_mask() if causal else loaded


def x_input(*batch: int, n: int = N) -> torch.Tensor:
    return torch.randn(*batch, n, 8, dtype=F64, generator=torch.Generator().manual_seed(1))


def softmax(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    return logits.masked_fill(~allowed, -math.inf).softmax(-1)


def project(x, w, pattern="...nf,fhd->...hnd"):
    return torch.einsum(pattern, x, w)


# ---- each paper's equation, written independently -------------------------------------------


def sigmoid_attention(p, x, allowed):
    """σ(Q Kᵀ/√d − log n) V per head, W^O (Ramapuram et al. 2024, Sec. 3)."""
    q, k, v = project(x, p["WQ"]), project(x, p["WK"]), project(x, p["WV"])
    n, d = x.shape[-2], q.shape[-1]
    a = torch.sigmoid(q @ k.transpose(-1, -2) / math.sqrt(d) - math.log(n)) * allowed
    return torch.einsum("...hnm,...hme,heg->...ng", a, v, p["WO"])


def relu2_attention(p, x, allowed):
    """relu(Q Kᵀ/√d)² / n (Hua et al. 2022, Sec. 2)."""
    q, k, v = project(x, p["WQ"]), project(x, p["WK"]), project(x, p["WV"])
    n, d = x.shape[-2], q.shape[-1]
    a = torch.relu(q @ k.transpose(-1, -2) / math.sqrt(d)) ** 2 / n * allowed
    return torch.einsum("...hnm,...hme,heg->...ng", a, v, p["WO"])


def differential_attention(p, x, allowed):
    """(softmax(Q1K1ᵀ/√d) − λ softmax(Q2K2ᵀ/√d)) V, RMSNorm per head, × (1 − λ_init), W^O
    (Ye et al. 2024, eq. 1-3), layer l = 1."""
    lam_init = 0.8 - 0.6 * math.exp(-0.3 * 0)
    lam = torch.exp(p["lq1"] @ p["lk1"]) - torch.exp(p["lq2"] @ p["lk2"]) + lam_init
    q1, q2, k1, k2 = (project(x, p[w]) for w in ("WQ1", "WQ2", "WK1", "WK2"))
    v = project(x, p["WV"])
    d = q1.shape[-1]
    a1 = softmax(q1 @ k1.transpose(-1, -2) / math.sqrt(d), allowed)
    a2 = softmax(q2 @ k2.transpose(-1, -2) / math.sqrt(d), allowed)
    heads = (a1 - lam * a2) @ v
    normed = heads / torch.sqrt(heads.pow(2).mean(-1, keepdim=True) + 1e-5)
    return (1 - lam_init) * torch.einsum("...hne,heg->...ng", normed, p["WO"])


def cosine_attention(p, x, allowed):
    """softmax(cos(q, k) / τ) V with 1/τ = exp(min(s, log 100)) per head (Swin V2, Sec. 3.2)."""
    q, k, v = project(x, p["WQ"]), project(x, p["WK"]), project(x, p["WV"])
    q = q / q.norm(dim=-1, keepdim=True)
    k = k / k.norm(dim=-1, keepdim=True)
    inverse_tau = torch.exp(torch.clamp(p["s"], -20, math.log(100)))[:, None, None]
    a = softmax(inverse_tau * (q @ k.transpose(-1, -2)), allowed)
    return torch.einsum("...hnm,...hme,heg->...ng", a, v, p["WO"])


def multi_query(p, x, allowed):
    """One key and one value head shared by all query heads (Shazeer 2019, Sec. 3)."""
    q = project(x, p["WQ"])
    k, v = x @ p["WK"], x @ p["WV"]
    a = softmax(q @ k.transpose(-1, -2)[..., None, :, :] / math.sqrt(q.shape[-1]), allowed)
    return torch.einsum("...hnm,...me,heg->...ng", a, v, p["WO"])


def grouped_query(p, x, allowed):
    """Query heads in G groups, each sharing one key and value head (Ainslie et al. 2023)."""
    q = torch.einsum("...nf,fgrd->...grnd", x, p["WQ"])
    k, v = project(x, p["WK"], "...mf,fgd->...gmd"), project(x, p["WV"], "...mf,fge->...gme")
    a = softmax(q @ k.transpose(-1, -2)[..., None, :, :] / math.sqrt(q.shape[-1]), allowed)
    return torch.einsum("...grnm,...gme,greo->...no", a, v, p["WO"])


def talking_heads(p, x, allowed):
    """J = QKᵀ, J' = J P_l, W = softmax(J'), W' = W P_w, O = W'V (Shazeer et al. 2020, Sec. 4)."""
    q, k, v = project(x, p["WQ"]), project(x, p["WK"]), project(x, p["WV"])
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    weights = softmax(torch.einsum("...hnm,hk->...knm", logits, p["PL"]), allowed)
    mixed = torch.einsum("...knm,kl->...lnm", weights, p["PW"])
    return torch.einsum("...lnm,...lme,leg->...ng", mixed, v, p["WO"])


def performer(p, x, allowed):
    """D⁻¹ (Q' K'ᵀ) V with positive random features φ(x) = exp(w·x − |x|²/2)/√R of x scaled by
    d^(−1/4) (Choromanski et al. 2021, Lemma 1, eq. 5); causal: the prefix sums of Sec. 2.4."""
    d = p["WQ"].shape[-1]
    q, k, v = project(x, p["WQ"]) / d**0.25, project(x, p["WK"]) / d**0.25, project(x, p["WV"])

    def features(z):
        return torch.exp(z @ p["W"] - (z * z).sum(-1, keepdim=True) / 2) / math.sqrt(p["W"].shape[-1])

    kernel = (features(q) @ features(k).transpose(-1, -2)) * allowed
    a = kernel / kernel.sum(-1, keepdim=True)
    return torch.einsum("...hnm,...hme,heg->...ng", a, v, p["WO"])


PAPERS = {
    "sigmoid_attention": sigmoid_attention,
    "relu2_attention": relu2_attention,
    "differential_attention": differential_attention,
    "cosine_attention": cosine_attention,
    "multi_query": multi_query,
    "grouped_query": grouped_query,
    "talking_heads": talking_heads,
    "performer": performer,
}


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("name", sorted(PAPERS))
def test_design_equals_its_papers_equation(name, causal):
    module = design(name, causal).module(N=N, dtype=F64)
    params = perturbed(module) | dict(module.named_buffers())  # Performer's fixed random features
    x = x_input(2)
    torch.testing.assert_close(module(x), PAPERS[name](params, x, visible(N, causal)), rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", sorted(PAPERS))
def test_design_runs_at_other_lengths_than_planned(name):
    module = design(name, True).module(N=N, dtype=F64)
    params = perturbed(module) | dict(module.named_buffers())
    x = x_input(3, n=9)
    torch.testing.assert_close(module(x), PAPERS[name](params, x, visible(9, True)), rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", sorted(PAPERS))
def test_reference_evaluator_equals_the_compiled_module(name):
    loaded = design(name, True)
    module = loaded.module(N=N, dtype=F64)
    perturbed(module)
    reference = loaded.module(N=N, dtype=F64, impl="reference")
    reference.load_state_dict(module.state_dict(), strict=False)
    x = x_input(2)
    torch.testing.assert_close(reference(x), module(x), rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", sorted(PAPERS))
def test_gradcheck(name):
    module = design(name, True).module(N=3, dtype=F64)
    perturbed(module)
    x = x_input(1, n=3).requires_grad_()
    assert gradcheck_parameters(module, (x,))


@pytest.mark.parametrize("name", sorted(PAPERS))
def test_standalone_file_equals_in_process_module(name, tmp_path):
    loaded = design(name, True)
    generated = standalone_module(loaded.source(N=N), f"{name}_module", tmp_path)
    class_name = "".join(part.capitalize() for part in name.split("_"))
    standalone = getattr(generated, class_name)(seed=7, dtype=F64)
    in_process = loaded.module(seed=7, dtype=F64, N=N)
    x = x_input(2, n=7)
    assert torch.equal(standalone(x), in_process(x))


@pytest.mark.parametrize("name", sorted(PAPERS))
def test_torch_compile_fullgraph(name):
    module = design(name, True).module(N=N)
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    x = torch.randn(2, 11, 8)
    torch.testing.assert_close(compiled(x), module(x), rtol=1e-6, atol=1e-6)


# ---- exp features far from 1: the normalize box's shifts --------------------------------------


def performer_in_the_log_domain(p, x):
    """Performer's eq. 5 at any scale: Σ_r exp(z_q[n r] + z_k[m r]) normalized over (m, r) is a
    softmax over the pairs (m, r), summed over r; computed with logsumexp, it never overflows."""
    d = p["WQ"].shape[-1]
    q, k, v = project(x, p["WQ"]) / d**0.25, project(x, p["WK"]) / d**0.25, project(x, p["WV"])
    zq = q @ p["W"] - (q * q).sum(-1, keepdim=True) / 2
    zk = k @ p["W"] - (k * k).sum(-1, keepdim=True) / 2
    pairs = zq.unsqueeze(-2) + zk.unsqueeze(-3)  # [..., h, n, m, r]
    a = pairs.flatten(-2).softmax(-1).unflatten(-1, pairs.shape[-2:]).sum(-1)
    return torch.einsum("...hnm,...hme,heg->...ng", a, v, p["WO"])


@pytest.mark.parametrize("planned", [N, 512], ids=["materialized", "linear_order"])
def test_performer_at_inputs_times_1e4_equals_its_equation_in_the_log_domain(planned):
    """Without the shifts the features exp(w·x − |x|²/2) overflow (inf / inf); the float64
    paper formula overflows too."""
    module = design("performer").module(N=planned, dtype=F64)
    params = perturbed(module) | dict(module.named_buffers())
    x = 1e4 * x_input(2)
    torch.testing.assert_close(module(x), performer_in_the_log_domain(params, x), rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("planned", [N, 512], ids=["materialized", "chunked"])
def test_causal_performer_far_from_1_has_no_finite_wrong_row(planned):
    """A causal box is not shifted (a max over the keys would come from future keys and make an
    early query's visible terms underflow): in float32 at inputs x10 a row is right or not finite
    (0 / 0, as the paper's formula in float32), never finite and wrong."""
    module = design("performer", causal=True).module(N=planned)
    params = perturbed(module) | dict(module.named_buffers())
    x = 10 * x_input(2)
    with torch.no_grad():
        out = module(x.float()).double()
    masked = {name: value.double() for name, value in params.items()}
    causal_logits = performer_in_the_log_domain_causal(masked, x)
    finite = torch.isfinite(out).all(-1)
    assert torch.allclose(out[finite], causal_logits[finite], rtol=1e-3, atol=1e-4)


def performer_in_the_log_domain_causal(p, x):
    """performer_in_the_log_domain with key m visible from query n only where m <= n."""
    d = p["WQ"].shape[-1]
    q, k, v = project(x, p["WQ"]) / d**0.25, project(x, p["WK"]) / d**0.25, project(x, p["WV"])
    zq = q @ p["W"] - (q * q).sum(-1, keepdim=True) / 2
    zk = k @ p["W"] - (k * k).sum(-1, keepdim=True) / 2
    pairs = torch.logsumexp(zq.unsqueeze(-2) + zk.unsqueeze(-3), -1)  # [..., h, n, m]
    n = pairs.shape[-1]
    a = pairs.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    return torch.einsum("...hnm,...hme,heg->...ng", a, v, p["WO"])


EXP_FEATURES = """
design exp_features
size F = 8, H = 2, D = F / H
size N
input X[n: N, f: F]
param WQ[f: F, h: H, d: D]
param WK[f: F, h: H, d: D]
param WV[f: F, h: H, e: D]
param WO[h: H, e: D, g: F]
A[h n m] = normalize[m](exp(X[n f] WQ[f h d]) exp(X[m f] WK[f h d]))
Y[n g]   = A[h n m] X[m f] WV[f h e] WO[h e g]
output Y
"""


EXP_STATEMENTS = EXP_FEATURES.replace(
    "A[h n m] = normalize[m](exp(X[n f] WQ[f h d]) exp(X[m f] WK[f h d]))",
    "P[n h d]  = exp(X[n f] WQ[f h d])\nPk[m h d] = exp(X[m f] WK[f h d])\nA[h n m] = normalize[m](P[n h d] Pk[m h d])",
)


@pytest.mark.parametrize("text", [EXP_FEATURES, EXP_STATEMENTS], ids=["inline", "statements"])
def test_a_users_exp_feature_attention_is_stabilized_and_exact(text, write_td):
    assert text.count("exp(") == 2
    loaded = tdiag.load(write_td(text))
    module = loaded.module(N=N, dtype=F64)
    perturbed(module)
    reference = loaded.module(dtype=F64, impl="reference")
    reference.load_state_dict(module.state_dict())
    x = x_input(2)
    torch.testing.assert_close(module(x), reference(x), rtol=0, atol=1e-10)
    assert torch.isfinite(module(1e4 * x)).all() and not torch.isfinite(reference(1e4 * x)).all()


def test_exp_factors_of_a_normalize_box_with_eps_are_not_shifted(write_td):
    """num / (den + eps): a shift would change the result, so none is taken."""
    text = EXP_FEATURES.replace("normalize[m]", "normalize[m, eps = 1e-6]")
    assert "shifted by its max" not in tdiag.load(write_td(text)).source(N=N)
