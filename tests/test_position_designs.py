"""The position designs of issue 13 (RoPE, partial RoPE, ALiBi, relative and absolute position
bias) and cross-attention, each equal (float64, 1e-10) to its paper's equation written here in
plain torch, plain and causal where causal makes sense; gradcheck at small sizes; the standalone
compiled file equals the in-process module; torch.compile(fullgraph)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import DESIGNS, gradcheck_parameters, perturbed, standalone_module, visible

import tdiag

F64 = torch.float64
WIDTH = 16
SIZES = {"F": WIDTH, "H": 2}
EXTRA = {"absolute_bias": {"L": 12}, "relative_bias": {"C": 2}}
N = 5


def design(name: str, causal: bool = False) -> tdiag.Design:
    loaded = tdiag.load(DESIGNS / f"{name}.td", **SIZES, **EXTRA.get(name, {}))
    return loaded.with_causal_mask() if causal else loaded


def x_input(*batch: int, n: int = N, seed: int = 1) -> torch.Tensor:
    return torch.randn(*batch, n, WIDTH, dtype=F64, generator=torch.Generator().manual_seed(seed))


def attend(logits: torch.Tensor, allowed: torch.Tensor, v: torch.Tensor, wo: torch.Tensor) -> torch.Tensor:
    a = logits.masked_fill(~allowed, -math.inf).softmax(-1)
    return torch.einsum("...hnm,...hme,heg->...ng", a, v, wo)


def project(x, w):
    return torch.einsum("...nf,fhd->...hnd", x, w)


def rotate_interleaved(x: torch.Tensor) -> torch.Tensor:
    """RoFormer eq. (34): pairs (x_{2i}, x_{2i+1}) rotated by angle position · θ_i, θ_i =
    10000^(−2i/d), positions 0 .. n − 1 along the second-to-last axis."""
    n, d = x.shape[-2], x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=F64) / d)
    angle = torch.arange(n, dtype=F64)[:, None] * theta[None, :]  # [n, d/2]
    cos, sin = angle.cos().repeat_interleave(2, -1), angle.sin().repeat_interleave(2, -1)
    swapped = torch.stack([-x[..., 1::2], x[..., 0::2]], -1).reshape(x.shape)  # (−x2, x1, −x4, x3, ...)
    return x * cos + swapped * sin


# ---- each paper's equation, written independently -------------------------------------------


def rope(p, x, allowed):
    q, k, v = project(x, p["WQ"]), project(x, p["WK"]), project(x, p["WV"])
    q, k = rotate_interleaved(q), rotate_interleaved(k)
    return attend(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), allowed, v, p["WO"])


def rope_partial(p, x, allowed):
    """GPT-NeoX rotary_pct: one projection W_q = [W_q,rot | W_q,pass] per head; the first Dr dims rotate."""
    wq = torch.cat([p["WQr"], p["WQp"]], -1)
    wk = torch.cat([p["WKr"], p["WKp"]], -1)
    dr = p["WQr"].shape[-1]
    q, k, v = project(x, wq), project(x, wk), project(x, p["WV"])
    q = torch.cat([rotate_interleaved(q[..., :dr]), q[..., dr:]], -1)
    k = torch.cat([rotate_interleaved(k[..., :dr]), k[..., dr:]], -1)
    return attend(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), allowed, v, p["WO"])


def alibi(p, x, allowed):
    """Press et al. 2022, Sec. 3: q_i Kᵀ + slope · [−(i − 1), ..., −1, 0], slopes 2^(−8h/H)."""
    q, k, v = project(x, p["WQ"]), project(x, p["WK"]), project(x, p["WV"])
    heads, n = q.shape[-3], x.shape[-2]
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / heads) for h in range(heads)], dtype=F64)
    i = torch.arange(n, dtype=F64)
    distance = (i[:, None] - i[None, :]).abs()
    bias = -slopes[:, None, None] * distance
    return attend(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias, allowed, v, p["WO"])


def relative_bias(p, x, allowed):
    """T5 Sec. 2.1 scalar per head and offset, offsets clipped to ±C (Shaw et al. 2018)."""
    q, k, v = project(x, p["WQ"]), project(x, p["WK"]), project(x, p["WV"])
    n, c = x.shape[-2], (p["Rel"].shape[-1] - 1) // 2
    bias = torch.empty(q.shape[-3], n, n, dtype=F64)
    for i in range(n):
        for j in range(n):
            bias[:, i, j] = p["Rel"][:, max(-c, min(c, j - i)) + c]
    return attend(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias, allowed, v, p["WO"])


def absolute_bias(p, x, allowed):
    q, k, v = project(x, p["WQ"]), project(x, p["WK"]), project(x, p["WV"])
    n = x.shape[-2]
    bias = p["Bias"][:, :n, :n]
    return attend(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias, allowed, v, p["WO"])


PAPERS = {
    "rope": rope,
    "rope_partial": rope_partial,
    "alibi": alibi,
    "relative_bias": relative_bias,
    "absolute_bias": absolute_bias,
}


def cross_attention(p, x, z, pad):
    """Vaswani et al. 2017 Sec. 3.2.3: queries from X, keys and values from the memory Z."""
    q, k, v = project(x, p["WQ"]), project(z, p["WK"]), project(z, p["WV"])
    allowed = pad[..., None, None, :]
    return attend(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), allowed, v, p["WO"])


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("name", sorted(PAPERS))
def test_design_equals_its_papers_equation(name, causal):
    module = design(name, causal).module(N=N, dtype=F64)
    params = perturbed(module)
    x = x_input(2)
    torch.testing.assert_close(module(x), PAPERS[name](params, x, visible(N, causal)), rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", sorted(PAPERS))
def test_design_runs_at_other_lengths_than_planned(name):
    module = design(name, True).module(N=N, dtype=F64)
    params = perturbed(module)
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


@pytest.mark.slow
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
    x = torch.randn(2, 11, WIDTH)
    torch.testing.assert_close(compiled(x), module(x), rtol=1e-6, atol=1e-6)


# ---- the position constructs ------------------------------------------------------------------


def test_absolute_bias_longer_than_its_table_is_a_clear_error():
    module = design("absolute_bias").module(N=N, dtype=F64)
    with pytest.raises(ValueError, match="Bias: reads the first N = 13 entries of axis i of L = 12"):
        module(x_input(1, n=13))


def test_rope_stores_no_table_of_positions():
    """Positions over the call's N are made in the forward; the rotation constant R is unrolled
    into the code. Only the frequencies over p, fixed by the head size, are a table made with the
    module, outside the state_dict."""
    module = design("rope").module(N=N, dtype=F64)
    buffers = dict(module.named_buffers())
    assert set(buffers) == {"_tdiag_table_theta"}
    assert buffers["_tdiag_table_theta"].shape == (module.tdiag_plan.sizes["P"],)
    assert not [name for name in module.state_dict() if name not in dict(module.named_parameters())]


def test_rope_rotation_is_a_two_by_two_block_not_a_head_width_matrix():
    """No intermediate is larger than Q itself (N·H·D per sequence): the rotation never forms an
    N·D·D matrix, and SDPA never stores the H·N² scores."""
    n = 64
    plan = design("rope").plan(N=n)

    def entries(legs) -> int:
        return math.prod(int(plan.graph.evaluate(plan.leg_sizes[leg], N=n)) for leg in legs if leg != "#b")

    widest = max(entries(step.out.legs) for step in plan.steps if step.out is not None)
    assert widest <= n * WIDTH


@pytest.mark.parametrize("name", ["alibi", "relative_bias", "absolute_bias"])
def test_position_bias_goes_to_sdpa_as_a_float_attn_mask(name):
    plan = design(name, True).plan(N=64)
    assert any("additive bias as a float attn_mask" in note for note in plan.lowered), plan.lowered


def test_relative_bias_is_a_gather_not_a_one_hot_contraction():
    plan = design("relative_bias").plan(N=64)
    kinds = [step.kind for step in plan.steps]
    assert "gather" in kinds
    assert all(step.flops == 0 for step in plan.steps if step.kind in ("gather", "positions"))


@pytest.mark.parametrize("causal", [False], ids=["plain"])
def test_cross_attention_equals_its_papers_equation(causal):
    module = design("cross_attention").module(N=N, M=7, dtype=F64)
    params = perturbed(module)
    x, z = x_input(2), x_input(2, n=7, seed=3)
    pad = torch.ones(2, 7, dtype=torch.bool)
    pad[0, 5:] = False
    pad[1, 3:] = False
    torch.testing.assert_close(module(x, z, pad=pad), cross_attention(params, x, z, pad), rtol=0, atol=1e-10)


def test_cross_attention_reference_and_standalone_agree(tmp_path):
    loaded = design("cross_attention")
    module = loaded.module(N=N, M=7, dtype=F64, seed=7)
    reference = loaded.module(dtype=F64, seed=7, impl="reference")
    generated = standalone_module(loaded.source(N=N, M=7), "cross_module", tmp_path)
    standalone = generated.CrossAttention(seed=7, dtype=F64)
    x, z = x_input(2), x_input(2, n=6, seed=3)  # a memory length other than the planned M = 7
    pad = torch.tensor([[True] * 4 + [False] * 2, [True] * 6])
    torch.testing.assert_close(reference(x, z, pad=pad), module(x, z, pad=pad), rtol=0, atol=1e-10)
    assert torch.equal(standalone(x, z, pad=pad), module(x, z, pad=pad))


@pytest.mark.slow
def test_cross_attention_gradcheck_and_compile():
    module = design("cross_attention").module(N=3, M=4, dtype=F64)
    perturbed(module)
    x, z = x_input(1, n=3).requires_grad_(), x_input(1, n=4, seed=3).requires_grad_()
    pad = torch.tensor([[True, True, True, False]])
    assert gradcheck_parameters(module, (x, z), {"pad": pad})
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x, z, pad=pad), module(x, z, pad=pad), rtol=0, atol=1e-12)


def test_train_refuses_cross_attention_with_a_positioned_error(capsys):
    from tdiag.cli import main

    code = main(["train", "cross_attention", "--steps", "1"])
    out, err = capsys.readouterr()
    assert code == 1 and "Traceback" not in out + err
    second_input = next(
        i
        for i, line in enumerate((DESIGNS / "cross_attention.td").read_text().splitlines(), 1)
        if line.startswith("input Z")
    )
    assert f"cross_attention.td:{second_input}:7: error: design 'cross_attention' has 2 input(s) (X, Z)" in err


def test_rope_diagram_draws_the_index_nodes_and_the_rotation_constant():
    from tdiag.render import to_dot

    dot = to_dot(design("rope").graph)
    assert 'label="index"' in dot and 'label="R"' in dot


def test_relative_bias_diagram_draws_the_gather_at_its_position():
    from tdiag.render import to_dot

    dot = to_dot(design("relative_bias").graph)
    assert 'label="r = clamp(m - n, -C, C) + C"' in dot and 'label="Rel"' in dot


def test_absolute_bias_diagram_shows_the_slice():
    from tdiag.render import to_dot

    assert 'label="Bias[n: N, m: N]"' in to_dot(design("absolute_bias").graph)


def test_cost_counts_positions_and_gathers_as_elementwise_not_flops():
    report = design("relative_bias").cost(N=64)
    plain = tdiag.load(DESIGNS / "mhsa.td", **SIZES).cost(N=64)
    assert report.at(N=64)["flops"] == plain.at(N=64)["flops"]
    assert report.at(N=64)["elementwise"] > plain.at(N=64)["elementwise"]


# ---- fused weights: slices and offset reads of one stored table, then RoPE ------------------

FALCON = """
# Falcon-7B as its checkpoint stores it: one fused weight [f, (H query heads, K, V), d], one
# key/value head (multi-query), rotate-half RoPE on the first and second halves of the head.
design falcon
size F = 16, H = 2, D = F / H, P = D / 2, J = H + 2
size N
input X[n: N, f: F]
param Wqkv[f: F, j: J, d: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))
const R[s: 2, t: 2] = values(0, -1, 1, 0)
theta[p]      = exp(-2 index(p, P) / D * log(10000))
Ang[n p]      = index(n) theta[p]
Q[n h d]      = X[n f] Wqkv[f, h: H, d]
K[m d]        = X[m f] Wqkv[f, j = H, d]
V[m e]        = X[m f] Wqkv[f, j = H + 1, e]
Qr[n h (s p)] = cos(Ang[n p]) Q[n h (s p)] + sin(Ang[n p]) R[s t] Q[n h (t p)]
Kr[m (s p)]   = cos(Ang[m p]) K[m (s p)] + sin(Ang[m p]) R[s t] K[m (t p)]
A[h n m]      = softmax[m, scale = 1 / sqrt(D)](Qr[n h d] Kr[m d])
Y[n g]        = A[h n m] V[m e] WO[h e g]
output Y
"""

FUSED_LAYOUTS = {
    "falcon": FALCON,
    # Falcon-40B: per key/value group, its Hg query heads then its K and V ([f, g, (Hg + 2), d])
    "grouped": """
design grouped
size F = 16, G = 2, Hg = 2, D = 8, P = D / 2, J = Hg + 2
size N
input X[n: N, f: F]
param Wqkv[f: F, g: G, j: J, d: D] = normal(std = 1 / sqrt(F))
param WO[g: G, i: Hg, e: D, o: F] = normal(std = 1 / sqrt(F))
const R[s: 2, t: 2] = values(0, -1, 1, 0)
theta[p]        = exp(-2 index(p, P) / D * log(10000))
Ang[n p]        = index(n) theta[p]
Q[n g i d]      = X[n f] Wqkv[f, g, i: Hg, d]
K[m g d]        = X[m f] Wqkv[f, g, j = Hg, d]
V[m g e]        = X[m f] Wqkv[f, g, j = Hg + 1, e]
Qr[n g i (s p)] = cos(Ang[n p]) Q[n g i (s p)] + sin(Ang[n p]) R[s t] Q[n g i (t p)]
Kr[m g (s p)]   = cos(Ang[m p]) K[m g (s p)] + sin(Ang[m p]) R[s t] K[m g (t p)]
A[g i n m]      = softmax[m, scale = 1 / sqrt(D)](Qr[n g i d] Kr[m g d])
Y[n o]          = A[g i n m] V[m g e] WO[g i e o]
output Y
""",
    # grouped query heads, then the G key heads read at offset H + g, the G value heads at H + G + g
    "grouped_at_offsets": """
design grouped_at_offsets
size F = 16, G = 2, Hg = 2, H = G * Hg, D = 4, P = D / 2, J = H + 2 * G
size N
input X[n: N, f: F]
param Wqkv[f: F, j: J, d: D] = normal(std = 1 / sqrt(F))
param WO[g: G, i: Hg, e: D, o: F] = normal(std = 1 / sqrt(F))
const R[s: 2, t: 2] = values(0, -1, 1, 0)
theta[p]        = exp(-2 index(p, P) / D * log(10000))
Ang[n p]        = index(n) theta[p]
Q[n h d]        = X[n f] Wqkv[f, h: H, d]
K[m g d]        = X[m f] Wqkv[f, j = H + g, d]
V[m g e]        = X[m f] Wqkv[f, j = H + G + g, e]
Qr[n g i (s p)] = cos(Ang[n p]) Q[n (g i) (s p)] + sin(Ang[n p]) R[s t] Q[n (g i) (t p)]
Kr[m g (s p)]   = cos(Ang[m p]) K[m g (s p)] + sin(Ang[m p]) R[s t] K[m g (t p)]
A[g i n m]      = softmax[m, scale = 1 / sqrt(D)](Qr[n g i d] Kr[m g d])
Y[n o]          = A[g i n m] V[m g e] WO[g i e o]
output Y
""",
    # GPT-NeoX: Q, K and V interleaved per head ([f, h, 3, d]), read at offsets 0, 1, 2
    "interleaved": """
design interleaved
size F = 16, H = 2, D = F / H, P = D / 2
size N
input X[n: N, f: F]
param Wqkv[f: F, h: H, t: 3, d: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))
const R[s: 2, u: 2] = values(0, -1, 1, 0)
theta[p]      = exp(-2 index(p, P) / D * log(10000))
Ang[n p]      = index(n) theta[p]
Q[n h d]      = X[n f] Wqkv[f, h, t = 0, d]
K[m h d]      = X[m f] Wqkv[f, h, t = 1, d]
V[m h e]      = X[m f] Wqkv[f, h, t = 2, e]
Qr[n h (s p)] = cos(Ang[n p]) Q[n h (s p)] + sin(Ang[n p]) R[s u] Q[n h (u p)]
Kr[m h (s p)] = cos(Ang[m p]) K[m h (s p)] + sin(Ang[m p]) R[s u] K[m h (u p)]
A[h n m]      = softmax[m, scale = 1 / sqrt(D)](Qr[n h d] Kr[m h d])
Y[n g]        = A[h n m] V[m h e] WO[h e g]
output Y
""",
    # partial rotary on a slice: the first Dr dims of each head rotate (q·k over all dims, minus
    # the unrotated first Dr, plus the rotated ones); the sliced axis itself is split into (s p)
    "partial_on_slice": """
design partial_on_slice
size F = 16, H = 2, D = F / H, Dr = D / 2, P = Dr / 2
size N
input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))
const R[s: 2, t: 2] = values(0, -1, 1, 0)
theta[p]      = exp(-2 index(p, P) / Dr * log(10000))
Ang[n p]      = index(n) theta[p]
Qc[n h c]     = X[n f] WQ[f, h, c: Dr]
Kc[m h c]     = X[m f] WK[f, h, c: Dr]
Qr[n h (s p)] = cos(Ang[n p]) Qc[n h (s p)] + sin(Ang[n p]) R[s t] Qc[n h (t p)]
Kr[m h (s p)] = cos(Ang[m p]) Kc[m h (s p)] + sin(Ang[m p]) R[s t] Kc[m h (t p)]
A[h n m]      = softmax[m, scale = 1 / sqrt(D)](X[n f] WQ[f h d] X[m f2] WK[f2 h d]
                                                - Qc[n h c] Kc[m h c] + Qr[n h c] Kr[m h c])
Y[n g]        = A[h n m] X[m f] WV[f h e] WO[h e g]
output Y
""",
}


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """GPT-NeoX / Falcon RoPE: dims i and i + d/2 form a pair rotated by position · θ_i, θ_i =
    10000^(−2i/d): x · cos + (−x₂, x₁) · sin with x₁, x₂ the two halves."""
    n, d = x.shape[-2], x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=F64) / d)
    angle = torch.arange(n, dtype=F64)[:, None] * theta[None, :]
    cos, sin = angle.cos().repeat(1, 2), angle.sin().repeat(1, 2)
    first, second = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-second, first], -1) * sin


def falcon(p, x, allowed):
    """Falcon-7B's attention from its fused query_key_value weight: one matmul, split into H
    query heads, one key and one value head; rotate-half RoPE on queries and keys."""
    w = p["Wqkv"]
    heads, width = w.shape[1] - 2, w.shape[2]
    qkv = (x @ w.reshape(w.shape[0], -1)).unflatten(-1, (heads + 2, width))
    q, k, v = qkv[..., :heads, :].transpose(-2, -3), qkv[..., heads, :], qkv[..., heads + 1, :]
    q, k = rotate_half(q), rotate_half(k)
    logits = q @ k.transpose(-1, -2).unsqueeze(-3) / math.sqrt(width)
    return attend(logits, allowed, v.unsqueeze(-3).expand_as(q), p["WO"])


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_falcon_fused_qkv_with_rotate_half_rope_equals_torch_values_and_gradients(causal, write_td):
    loaded = tdiag.load(write_td(FALCON, "falcon.td"))
    module = (loaded.with_causal_mask() if causal else loaded).module(N=N, dtype=F64)
    params = {name: value.clone().requires_grad_() for name, value in perturbed(module).items()}
    x = x_input(2).requires_grad_()
    got, want = module(x), falcon(params, x, visible(N, causal))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    weight = torch.randn(got.shape, dtype=F64, generator=torch.Generator().manual_seed(2))
    got_grads = torch.autograd.grad((got * weight).sum(), [x, module.Wqkv, module.WO])
    want_grads = torch.autograd.grad((want * weight).sum(), [x, params["Wqkv"], params["WO"]])
    for got_grad, want_grad in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=1e-10)


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("layout", sorted(FUSED_LAYOUTS))
def test_fused_weight_layout_with_rope_equals_the_reference_evaluator(layout, causal, write_td):
    loaded = tdiag.load(write_td(FUSED_LAYOUTS[layout], f"{layout}.td"))
    loaded = loaded.with_causal_mask() if causal else loaded
    module = loaded.module(N=N, dtype=F64)
    perturbed(module)
    reference = loaded.module(dtype=F64, impl="reference")
    reference.load_state_dict(module.state_dict(), strict=False)
    x = x_input(2, n=7)  # a length other than the planned N
    torch.testing.assert_close(module(x), reference(x), rtol=0, atol=1e-10)
