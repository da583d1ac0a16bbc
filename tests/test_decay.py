"""Decays in causal products (tdiag/plan/decay.py, chunked.py): a factor exp(u[n] + w[m]) beside
causal(n, m) is evaluated in chunks (RetNet eq. 7) and equals the papers' recurrent forms."""

import functools
from unittest import mock

import pytest
import torch
from conftest import DESIGNS, assert_matches, gradcheck_parameters

import tdiag
from tdiag.cost import cost_report
from tdiag.plan import chunked
from tdiag.plan.program import DecayedPrefix
from tdiag.shared_plans import sharing

GATED = """design gated
size F = 16, H = 2, D = 4
size N
input X[n: N, f: F]
param WQ[f: F, h: H, d: D]
param WK[f: F, h: H, d: D]
param WV[f: F, h: H, e: D]
param WA[f: F, h: H]
param WO[h: H, e: D, g: F]
Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
G[l h] = -softplus(X[l f] WA[f h])
C[n h] = causal(n, l) G[l h]
Y[n g] = causal(n, m) exp(C[n h] - C[m h]) Q[n h d] K[m h d] V[m h e] WO[h e g]
output Y
"""


@pytest.fixture
def chunks_of_4(monkeypatch):
    monkeypatch.setattr(chunked, "CHUNK_SIZES", (4,))


_BUILT: dict = {}


def chunked64(source: str, **sizes) -> torch.nn.Module:
    """The float64 module of a bundled design (by name) or a design text, planned for N = 4096
    in chunks of 4, built once per test run (planning a decayed design tries every placement)."""
    key = (source, tuple(sorted(sizes.items())))
    if key not in _BUILT:
        with sharing(False), mock.patch.object(chunked, "CHUNK_SIZES", (4,)):
            design = tdiag.load(DESIGNS / f"{source}.td", **sizes) if "\n" not in source else tdiag.loads(source)
            _BUILT[key] = design.module({"N": 4096}, dtype=torch.float64)
    return _BUILT[key]


def _retnet(**sizes):
    return tdiag.load(DESIGNS / "retnet.td", **({"F": 16, "H": 2} | sizes))


def _retnet_recurrent(m, x: torch.Tensor) -> torch.Tensor:
    """Multi-scale retention by its recurrent form (Sun et al. 2023 eq. 6 and 8), step by step."""
    h_count, d = m.WQ.shape[1], m.WQ.shape[2]
    gamma = 1 - 2.0 ** (-5 - torch.arange(h_count, dtype=x.dtype))
    theta = 10000.0 ** (-2 * torch.arange(d // 2, dtype=x.dtype) / d)

    def rotate(v, n):  # RoFormer eq. 34 on interleaved pairs
        pairs = v.unflatten(-1, (d // 2, 2))
        cos, sin = torch.cos(n * theta)[:, None], torch.sin(n * theta)[:, None]
        turned = torch.stack([-pairs[..., 1], pairs[..., 0]], -1)
        return (pairs * cos + turned * sin).flatten(-2)

    state = torch.zeros(x.shape[0], h_count, d, m.WV.shape[2], dtype=x.dtype)
    outputs = []
    for n in range(x.shape[1]):
        q = rotate(torch.einsum("bf,fhd->bhd", x[:, n], m.WQ), n)
        k = rotate(torch.einsum("bf,fhd->bhd", x[:, n], m.WK), n)
        v = torch.einsum("bf,fhe->bhe", x[:, n], m.WV)
        state = gamma[:, None, None] * state + torch.einsum("bhd,bhe->bhde", k, v)
        o = torch.einsum("bhd,bhde->bhe", q, state)
        centred = o - o.mean(-1, keepdim=True)
        normed = centred / torch.sqrt((centred**2).mean(-1, keepdim=True) + 1e-5)
        gate = torch.nn.functional.silu(torch.einsum("bf,fhe->bhe", x[:, n], m.WG))
        outputs.append(torch.einsum("bhe,heg->bg", gate * normed, m.WO))
    return torch.stack(outputs, 1)


def test_a_decay_beside_a_causal_factor_is_evaluated_in_chunks_without_an_n_by_n_tensor():
    plan = _retnet().plan(N=4096, objective="time")
    assert any(isinstance(step.op, DecayedPrefix) for step in plan.steps)
    n, m = "n", "m"
    assert not any(step.out and {n, m} <= set(step.out.legs) for step in plan.steps)
    assert "causal product over m as prefix sums in chunks" in plan.lowered


@pytest.mark.parametrize("n", [1, 3, 4, 9, 16])
def test_retnet_equals_its_recurrent_form_on_and_off_the_chunk_size(chunks_of_4, n):
    module = chunked64("retnet", F=16, H=2)
    assert "_decayed_earlier" in module.tdiag_source
    x = torch.randn(2, n, 16, dtype=torch.float64)
    assert torch.allclose(module(x), _retnet_recurrent(module, x), atol=1e-10, rtol=0)


def test_retnet_gradients_equal_those_of_its_recurrent_form(chunks_of_4):
    module = chunked64("retnet", F=16, H=2)
    x = torch.randn(2, 11, 16, dtype=torch.float64, requires_grad=True)
    chunkwise = torch.autograd.grad(module(x).square().sum(), [x, *module.parameters()])
    recurrent = torch.autograd.grad(_retnet_recurrent(module, x).square().sum(), [x, *module.parameters()])
    for a, b in zip(chunkwise, recurrent, strict=True):
        assert torch.allclose(a, b, atol=1e-9, rtol=0)


def test_retnet_in_chunks_passes_gradcheck(chunks_of_4):
    module = chunked64("retnet", F=8, H=2)
    x = torch.randn(1, 6, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(module, (x,))


def test_the_cost_of_chunked_retention_is_linear_in_the_length():
    report = cost_report(_retnet().plan(N=4096, objective="time"))
    flops = [report.at(N=n)["flops"] for n in (4096, 8192, 16384)]
    assert flops[2] - flops[1] == 2 * (flops[1] - flops[0])


def _gated_recurrent(m, x: torch.Tensor) -> torch.Tensor:
    """The gated linear attention's recurrence: S_n = f_n S_{n−1} + k_n v_nᵀ, y_n = q_n S_n W_O."""
    state = torch.zeros(x.shape[0], m.WQ.shape[1], m.WQ.shape[2], m.WV.shape[2], dtype=x.dtype)
    outputs = []
    for n in range(x.shape[1]):
        forget = torch.exp(-torch.nn.functional.softplus(torch.einsum("bf,fh->bh", x[:, n], m.WA)))
        k, v = torch.einsum("bf,fhd->bhd", x[:, n], m.WK), torch.einsum("bf,fhe->bhe", x[:, n], m.WV)
        state = forget[:, :, None, None] * state + torch.einsum("bhd,bhe->bhde", k, v)
        q = torch.einsum("bf,fhd->bhd", x[:, n], m.WQ)
        outputs.append(torch.einsum("bhd,bhde,heg->bg", q, state, m.WO))
    return torch.stack(outputs, 1)


@pytest.mark.parametrize("n", [1, 5, 13])
def test_a_data_dependent_gate_equals_its_recurrence(chunks_of_4, n):
    module = chunked64(GATED)
    assert "_decayed_earlier" in module.tdiag_source
    x = torch.randn(2, n, 16, dtype=torch.float64)
    assert torch.allclose(module(x), _gated_recurrent(module, x), atol=1e-10, rtol=0)


def test_a_strong_decay_in_float32_takes_no_exp_of_a_growth(chunks_of_4):
    torch.manual_seed(0)
    module = tdiag.loads(GATED).module({"N": 4096})
    with torch.no_grad():
        module.WA.mul_(30.0)  # forget gates down to e^-50 and below: Σ log f reaches thousands
    x = torch.randn(2, 37, 16)
    y = module(x)
    y.square().sum().backward()
    assert torch.isfinite(y).all() and all(torch.isfinite(p.grad).all() for p in module.parameters())
    reference = _gated_recurrent(module.double(), x.double())
    assert (y.double() - reference).norm() / reference.norm() < 1e-4  # float32's precision


def test_a_factor_that_mixes_the_query_and_the_key_inside_one_term_is_refused_the_chunks():
    design = tdiag.loads(GATED.replace("exp(C[n h] - C[m h])", "exp(C[n h] C[m h])"))
    plan = design.plan(N=4096)
    assert not any(isinstance(step.op, DecayedPrefix) for step in plan.steps)
    assert any(
        note.startswith("causal product over m: chunked refused: n and m are legs of one factor")
        for note in plan.refused
    )


def test_the_masked_form_of_a_strong_decay_takes_no_exp_of_the_future():
    module = tdiag.loads(GATED).module({"N": 8})
    assert "_decayed_earlier" not in module.tdiag_source
    with torch.no_grad():
        module.WA.mul_(30.0)
    x = torch.randn(2, 37, 16)
    y = module(x)
    y.square().sum().backward()
    assert torch.isfinite(y).all() and all(torch.isfinite(p.grad).all() for p in module.parameters())


def _mamba2_recurrent(m, x: torch.Tensor) -> torch.Tensor:
    """Mamba-2's SSD recurrence (Dao & Gu 2024, Sec. 3 with a scalar A_t = a_t I):
    h_t = a_t h_{t−1} + Δ_t B_t x_tᵀ, y_t = C_tᵀ h_t + D x_t, with a_t = exp(Δ_t A_h)."""
    a_param = -torch.exp(m.Alog)
    state = torch.zeros(x.shape[0], m.Wx.shape[1], m.WB.shape[1], m.Wx.shape[2], dtype=x.dtype)  # [b h s p]
    outputs = []
    for t in range(x.shape[1]):
        dt = torch.nn.functional.softplus(x[:, t] @ m.Wdt + m.bdt)  # [b h]
        xs = torch.einsum("bf,fhp->bhp", x[:, t], m.Wx)
        b_t, c_t = x[:, t] @ m.WB, x[:, t] @ m.WC  # [b s]
        state = torch.exp(dt * a_param)[:, :, None, None] * state + torch.einsum("bh,bs,bhp->bhsp", dt, b_t, xs)
        y = torch.einsum("bs,bhsp->bhp", c_t, state) + m.Dskip[:, None] * xs
        outputs.append(torch.einsum("bhp,hpg->bg", y, m.WO))
    return torch.stack(outputs, 1)


@pytest.mark.parametrize("n", [1, 6, 13])
def test_mamba2_ssd_equals_its_recurrence(chunks_of_4, n):
    module = chunked64("mamba2_ssd", F=16, H=2, S=4)
    assert "_decayed_earlier" in module.tdiag_source and ".cumsum(" in module.tdiag_source
    x = torch.randn(2, n, 16, dtype=torch.float64)
    assert torch.allclose(module(x), _mamba2_recurrent(module, x), atol=1e-10, rtol=0)


def _gla_recurrent(m, x: torch.Tensor) -> torch.Tensor:
    """GLA's recurrence (Yang et al. 2024, Sec. 4.1): S_t = Diag(α_t) S_{t−1} + k_tᵀ v_t,
    o_t = q_t S_t, α_t = σ(x_t W_α1 W_α2 + b_α)^(1/16); GroupNorm per head, swish output gate."""
    d = m.WQ.shape[2]
    state = torch.zeros(x.shape[0], m.WQ.shape[1], d, m.WV.shape[2], dtype=x.dtype)
    outputs = []
    for t in range(x.shape[1]):
        alpha = torch.sigmoid(torch.einsum("bf,fr,rhd->bhd", x[:, t], m.Wa1, m.Wa2) + m.ba) ** (1 / 16)
        k = torch.einsum("bf,fhd->bhd", x[:, t], m.WK) / d**0.5
        v = torch.einsum("bf,fhe->bhe", x[:, t], m.WV)
        state = alpha[..., None] * state + torch.einsum("bhd,bhe->bhde", k, v)
        o = torch.einsum("bhd,bhde->bhe", torch.einsum("bf,fhd->bhd", x[:, t], m.WQ), state)
        centred = o - o.mean(-1, keepdim=True)
        normed = centred / torch.sqrt((centred**2).mean(-1, keepdim=True) + 1e-5)
        gate = torch.nn.functional.silu(torch.einsum("bf,fhe->bhe", x[:, t], m.Wr))
        outputs.append(torch.einsum("bhe,heg->bg", gate * normed, m.WO))
    return torch.stack(outputs, 1)


@pytest.mark.parametrize("n", [1, 6, 13])
def test_gla_equals_its_recurrence(chunks_of_4, n):
    module = chunked64("gla", F=16, H=2)
    assert "_decayed_earlier" in module.tdiag_source
    x = torch.randn(2, n, 16, dtype=torch.float64)
    assert torch.allclose(module(x), _gla_recurrent(module, x), atol=1e-10, rtol=0)


@pytest.mark.parametrize("name", ["retnet", "mamba2_ssd", "gla", "lightning", "mlstm"])
def test_the_flops_of_a_chunkwise_design_grow_linearly_in_the_length(name):
    report = cost_report(tdiag.load(DESIGNS / f"{name}.td", F=64, H=4).plan(N=4096, objective="time"))
    flops = [report.at(N=n)["flops"] for n in (4096, 8192, 16384)]
    assert flops[2] - flops[1] == 2 * (flops[1] - flops[0])


def test_a_chunkwise_design_compiles_with_fullgraph(chunks_of_4):
    module = _retnet().module({"N": 4096})
    x = torch.randn(2, 9, 16)
    compiled = torch.compile(module, backend="eager", fullgraph=True)
    assert torch.allclose(compiled(x), module(x), atol=1e-6)


def test_a_chunkwise_design_written_standalone_equals_the_in_process_module(chunks_of_4, tmp_path):
    design = _retnet()
    module = design.module({"N": 4096}, dtype=torch.float64)
    path = tmp_path / "retnet_module.py"
    path.write_text(design.source(N=4096))
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)  # the file tdiag compile writes
    standalone = namespace[type(module).__name__](dtype=torch.float64)
    standalone.load_state_dict(module.state_dict())
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    assert torch.equal(standalone(x), module(x))


@pytest.mark.parametrize("name", ["retnet", "mamba2_ssd", "gla", "lightning", "mlstm"])
def test_the_masked_and_the_chunked_forms_of_a_decayed_design_agree(name):
    design = tdiag.load(DESIGNS / f"{name}.td", F=16, H=2)
    chunked_module = design.module({"N": 4096}, dtype=torch.float64)
    masked_module = design.module({"N": 8}, dtype=torch.float64)
    assert "_decayed_earlier" in chunked_module.tdiag_source
    assert "_decayed_earlier" not in masked_module.tdiag_source
    masked_module.load_state_dict(chunked_module.state_dict())
    x = torch.randn(2, 70, 16, dtype=torch.float64)
    assert torch.allclose(chunked_module(x), masked_module(x), atol=1e-10, rtol=0)


def test_a_segment_sum_decay_is_causal_by_itself_and_taken_in_chunks():
    plan = tdiag.load(DESIGNS / "mamba2_ssd.td", F=64, H=4).plan(N=4096, objective="time")
    assert any(isinstance(step.op, DecayedPrefix) for step in plan.steps)
    assert not any(step.kind == "segsum" for step in plan.steps)


def _lightning_recurrent(m, x: torch.Tensor) -> torch.Tensor:
    """Lightning attention's recurrence (Qin et al. 2023, Sec. 3): kv_t = λ kv_{t−1} + k_tᵀ v_t,
    o_t = q_t kv_t, λ_h = exp(−8h/H); SRMSNorm per head, the linear gate U, W_O."""
    heads = m.WQ.shape[1]
    lam = torch.exp(-8 * torch.arange(heads, dtype=x.dtype) / heads)
    state = torch.zeros(x.shape[0], heads, m.WQ.shape[2], m.WV.shape[2], dtype=x.dtype)
    outputs = []
    for t in range(x.shape[1]):
        q = torch.nn.functional.silu(torch.einsum("bf,fhd->bhd", x[:, t], m.WQ))
        k = torch.nn.functional.silu(torch.einsum("bf,fhd->bhd", x[:, t], m.WK))
        v = torch.einsum("bf,fhe->bhe", x[:, t], m.WV)
        state = lam[:, None, None] * state + torch.einsum("bhd,bhe->bhde", k, v)
        o = torch.einsum("bhd,bhde->bhe", q, state)
        normed = o / torch.sqrt((o**2).mean(-1, keepdim=True) + 1e-6)
        gate = torch.einsum("bf,fhe->bhe", x[:, t], m.WU)
        outputs.append(torch.einsum("bhe,heg->bg", normed * gate, m.WO))
    return torch.stack(outputs, 1)


@pytest.mark.parametrize("n", [1, 6, 13])
def test_lightning_attention_equals_its_recurrence(chunks_of_4, n):
    module = chunked64("lightning", F=16, H=2)
    assert "_decayed_earlier" in module.tdiag_source
    x = torch.randn(2, n, 16, dtype=torch.float64)
    assert torch.allclose(module(x), _lightning_recurrent(module, x), atol=1e-10, rtol=0)


@pytest.mark.parametrize("name", ["mamba2_ssd", "gla", "lightning", "mlstm"])
def test_a_chunkwise_design_passes_gradcheck(chunks_of_4, name):
    sizes = {"F": 8, "H": 2} | ({"S": 2} if name == "mamba2_ssd" else {})
    module = chunked64(name, **sizes)
    assert "_decayed_earlier" in module.tdiag_source
    x = torch.randn(1, 6, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(module, (x,))


def test_the_plan_lists_both_forms_of_a_causal_product_with_their_costs():
    plan = _retnet().plan(N=4096, objective="time")
    (choice,) = [c for c in plan.choices if c.site == "causal product over m"]
    assert choice.taken == "chunked"
    assert {c.form: c.cost is not None for c in choice.candidates} == {"masked": True, "chunked": True}
    masked, chunked_cost = (next(c.cost for c in choice.candidates if c.form == f) for f in ("masked", "chunked"))
    assert chunked_cost.time < masked.time and chunked_cost.flops < masked.flops


def _mlstm_recurrent(m, x: torch.Tensor) -> torch.Tensor:
    """xLSTM's mLSTM recurrence (Beck et al. 2024, Sec. 2.3), unstabilized: C_t = f C + i v kᵀ,
    n_t = f n + i k, h̃ = C q / max(|nᵀq|, 1), h = σ(W_o x) ⊙ h̃, then W_O."""
    d = m.WQ.shape[2]
    memory = torch.zeros(x.shape[0], m.WQ.shape[1], m.WV.shape[2], d, dtype=x.dtype)
    normalizer = torch.zeros(x.shape[0], m.WQ.shape[1], d, dtype=x.dtype)
    outputs = []
    for t in range(x.shape[1]):
        i = torch.exp(x[:, t] @ m.Wi + m.bi)[..., None]
        f = torch.sigmoid(x[:, t] @ m.Wf + m.bf)[..., None]
        q = torch.einsum("bf,fhd->bhd", x[:, t], m.WQ)
        k = torch.einsum("bf,fhd->bhd", x[:, t], m.WK) / d**0.5
        v = torch.einsum("bf,fhe->bhe", x[:, t], m.WV)
        memory = f[..., None] * memory + i[..., None] * torch.einsum("bhe,bhd->bhed", v, k)
        normalizer = f * normalizer + i * k
        bound = torch.clamp(torch.einsum("bhd,bhd->bh", normalizer, q).abs(), min=1)[..., None]
        hidden = torch.einsum("bhed,bhd->bhe", memory, q) / bound
        gate = torch.sigmoid(torch.einsum("bf,fhe->bhe", x[:, t], m.Wo))
        outputs.append(torch.einsum("bhe,heg->bg", gate * hidden, m.WO))
    return torch.stack(outputs, 1)


@pytest.mark.parametrize("n", [1, 6, 13])
def test_mlstm_equals_its_recurrence(chunks_of_4, n):
    module = chunked64("mlstm", F=16, H=2)
    assert module.tdiag_source.count("= _decayed_earlier(") == 2  # numerator and denominator
    x = torch.randn(2, n, 16, dtype=torch.float64)
    assert torch.allclose(module(x), _mlstm_recurrent(module, x), atol=1e-10, rtol=0)


NORMALIZED = """design normalized_decay
size F = 16, H = 2, D = F / H
size N
input X[n: N, f: F]
param WQ[f: F, h: H, d: D]
param WK[f: F, h: H, d: D]
param WV[f: F, h: H, e: D]
param WO[h: H, e: D, g: F]
lg[h] = -0.1 (index(h) + 1)
Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
A[h n m] = normalize[m, mask = causal(n, m), eps = 1e-6](exp(lg[h] (index(n) - index(m))) elu1(Q[n h d]) elu1(K[m h d]))
Y[n g] = A[h n m] X[m f] WV[f h e] WO[h e g]
output Y
"""


@pytest.mark.parametrize("n", [1, 5, 13])
def test_a_decay_inside_a_causal_normalize_box_takes_the_chunks_and_equals_its_recurrence(chunks_of_4, n):
    module = chunked64(NORMALIZED)
    assert "_decayed_earlier" in module.tdiag_source
    x = torch.randn(2, n, 16, dtype=torch.float64)
    gamma = torch.exp(-0.1 * torch.arange(1, 3, dtype=torch.float64))[:, None, None]
    state, total, outputs = torch.zeros(2, 2, 8, 8, dtype=x.dtype), torch.zeros(2, 2, 8, 1, dtype=x.dtype), []
    for t in range(n):
        q = torch.nn.functional.elu(torch.einsum("bf,fhd->bhd", x[:, t], module.WQ)) + 1
        k = torch.nn.functional.elu(torch.einsum("bf,fhd->bhd", x[:, t], module.WK)) + 1
        v = torch.einsum("bf,fhe->bhe", x[:, t], module.WV)
        state = gamma * state + torch.einsum("bhd,bhe->bhde", k, v)
        total = gamma * total + k[..., None]
        o = torch.einsum("bhd,bhde->bhe", q, state) / (torch.einsum("bhd,bhdo->bho", q, total) + 1e-6)
        outputs.append(torch.einsum("bhe,heg->bg", o, module.WO))
    assert torch.allclose(module(x), torch.stack(outputs, 1), atol=1e-10, rtol=0)


def test_mlstm_bounds_its_normalizer_by_one_from_below_only(chunks_of_4):
    """h̃ = C q / max(|nᵀq|, 1) however large |nᵀq| is: input gates of e^40 make it about 1e17
    (was: clamp(|nᵀq|, 1, 1e15), which divided by 1e15 there)."""
    module = chunked64("mlstm", F=16, H=2)
    x = torch.randn(2, 9, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        saved = module.bi.clone()
        module.bi.fill_(40.0)
        try:
            out, expected = module(x), _mlstm_recurrent(module, x)
        finally:
            module.bi.copy_(saved)
    assert torch.allclose(out, expected, rtol=1e-9, atol=1e-9)


SHIFTED_HEAD = """size F = 8, H = 2, D = F / H
size N
input X[n: N, f: F]
param WQ[f: F, h: H, d: D]
param WK[f: F, h: H, d: D]
param WV[f: F, h: H, e: D]
param Wi[f: F, h: H]
param WO[h: H, e: D, g: F]
Li[n h] = X[n f] Wi[f h]
Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
"""
# mLSTM with its numerator and denominator inline in one statement
INLINE_MLSTM = (
    "design inline_mlstm\n"
    + SHIFTED_HEAD
    + "param Wf[f: F, h: H]\nLf[n h] = -softplus(-(X[n f] Wf[f h]))\n"
    + "Hc[n h e] = sum[m d](exp(segsum[n, m](Lf[n h]) + Li[m h]) Q[n h d] K[m h d] V[m h e])"
    + " / max(abs(sum[m d](exp(segsum[n, m](Lf[n h]) + Li[m h]) Q[n h d] K[m h d])), 1)\n"
    + "Y[n g] = Hc[n h e] WO[h e g]\noutput Y\n"
)
# a linear attention with a fixed decay per head and a key-side input gate exp(ĩ_m), its
# normalizer bounded by 2 from below; its keys read with another leg name than the queries'
GATED_INPUT = (
    "design gated_input\n"
    + SHIFTED_HEAD
    + """lg[h] = -0.1 (index(h) + 1)
Num[n h e] = causal(n, m) exp(lg[h] (index(n) - index(m)) + Li[m h]) Q[n h d] K[m h d] V[m h e]
Den[t h] = causal(t, j) exp(lg[h] (index(t) - index(j)) + Li[j h]) Q[t h d] K[j h d]
Hc[n h e] = Num[n h e] / max(abs(Den[n h]), 2)
Y[n g] = Hc[n h e] WO[h e g]
output Y
"""
)
# the same without a bound: Num / Den
GATED_RATIO = GATED_INPUT.replace("max(abs(Den[n h]), 2)", "Den[n h]").replace("gated_input", "gated_ratio")
# a per-feature gate (GLA's): the row max would vary along d, which the products sum
PER_FEATURE = (
    "design per_feature\n"
    + SHIFTED_HEAD
    + """param Wg[f: F, h: H, d: D]
Lg[n h d] = -softplus(-(X[n f] Wg[f h d]))
Num[n h e] = exp(segsum[n, m](Lg[n h d]) + Li[m h]) Q[n h d] K[m h d] V[m h e]
Den[n h] = exp(segsum[n, m](Lg[n h d]) + Li[m h]) Q[n h d] K[m h d]
Hc[n h e] = Num[n h e] / max(abs(Den[n h]), 1)
Y[n g] = Hc[n h e] WO[h e g]
output Y
"""
)
SHIFT_NOTE = "shifted by its running row max"


def _shifted(source: str, form: str) -> tuple[tdiag.Design, torch.nn.Module]:
    """A design (bundled by name, or a text) and its float64 module in `form`: the masked (n, m)
    product at N = 16, or prefix sums in chunks of 4 planned for N = 4096."""
    if form == "chunked":
        module = chunked64(source, **({"F": 8, "H": 2} if "\n" not in source else {}))
    else:
        module = _design(source).module({"N": 16}, dtype=torch.float64)
    assert ("_decayed_earlier" in module.tdiag_source) == (form == "chunked")
    return _design(source), module


def _design(source: str) -> tdiag.Design:
    return tdiag.load(DESIGNS / f"{source}.td", F=8, H=2) if "\n" not in source else tdiag.loads(source)


def _as_written(design: tdiag.Design):
    """The design as written (the reference evaluator), called as assert_matches calls it."""
    reference = design.module(impl="reference", dtype=torch.float64)
    return lambda x, parameters: torch.func.functional_call(reference, parameters, (x,))


@pytest.mark.parametrize("form", ["masked", "chunked"])
@pytest.mark.parametrize(
    "source", ["mlstm", INLINE_MLSTM, GATED_INPUT, GATED_RATIO], ids=lambda s: s.split()[1] if "\n" in s else s
)
def test_a_quotient_of_causal_products_sharing_a_decay_is_shifted_keeping_values_and_gradients(source, form):
    """The rule reads the quotient, not the design's name: mLSTM as bundled, written inline, and
    a gated linear attention with a causal factor, a key-side input gate and a bound of 2 (or
    none). Its values and every gradient equal the design as written (float64)."""
    design, module = _shifted(source, form)
    assert any(SHIFT_NOTE in note for note in design.plan(N=16).lowered)
    assert_matches(module, _as_written(design), n=13)


@pytest.mark.parametrize("source", ["mlstm", INLINE_MLSTM, GATED_INPUT], ids=["mlstm", "inline", "gated_input"])
def test_a_shifted_quotient_is_finite_at_inputs_times_1e4_where_the_design_as_written_overflows(source):
    design = _design(source)
    module = design.module({"N": 16})
    x = 1e4 * torch.randn(2, 13, 8, generator=torch.Generator().manual_seed(6), requires_grad=True)
    y = module(x)
    (gradient,) = torch.autograd.grad(y.square().sum(), x)
    assert torch.isfinite(y).all() and torch.isfinite(gradient).all()
    assert not torch.isfinite(design.module(impl="reference")(x.detach())).all()


def test_the_masked_shifted_mlstm_passes_gradcheck():
    module = _design("mlstm").module({"N": 16}, dtype=torch.float64)
    x = torch.randn(1, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    assert gradcheck_parameters(module, (x.requires_grad_(),))


def test_a_decay_that_varies_along_a_summed_leg_is_not_shifted_and_stays_exact():
    """GLA's per-feature gate: a row max over (n, h, d) would not factor out of the sum over d."""
    design = _design(PER_FEATURE)
    assert not any(SHIFT_NOTE in note for note in design.plan(N=16).lowered)
    assert_matches(design.module({"N": 16}, dtype=torch.float64), _as_written(design), n=9)


def test_a_quotient_whose_products_a_window_also_masks_is_not_shifted():
    """The row max over every earlier key could be a key the window hides, against which each
    visible term might underflow to 0: such a quotient is computed as written."""
    windowed = {"causal(n, m)": "causal(n, m) window(n, m, 3)", "causal(t, j)": "causal(t, j) window(t, j, 3)"}
    design = _design(functools.reduce(lambda text, pair: text.replace(*pair), windowed.items(), GATED_INPUT))
    assert not any(SHIFT_NOTE in note for note in design.plan(N=16).lowered)
    assert_matches(design.module({"N": 16}, dtype=torch.float64), _as_written(design), n=9)
