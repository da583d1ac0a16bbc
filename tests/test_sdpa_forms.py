"""The fast path for the attention forms beyond plain MHSA (issue 13): multi-query and
grouped-query attention with their key heads grouped (enable_gqa), plain and causal; padding masks
and additive biases as SDPA's attn_mask. Each compiled form equals a reference written here from
its paper with plain torch ops, and keeps no heads x N² tensor for backward when SDPA is taken."""

import math

import pytest
import torch
from conftest import DESIGNS, gradcheck_parameters, perturbed, standalone_module

import tdiag
from tdiag.measure import saved_for_backward
from tdiag.plan.footprint import footprint
from tdiag.plan.program import Attention

TOL = 1e-10
B, N = 2, 6

PADDED_MHSA = """
design padded_mhsa
size F = 8, H = 2, D = F / H
size N
input X[n: N, f: F]
mask pad[m: N]
param WQ[f: F, h: H, d: D]
param WK[f: F, h: H, d: D]
param WV[f: F, h: H, e: D]
param WO[h: H, e: D, g: F]
Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
A[h n m] = softmax[m, scale = 1 / sqrt(D), mask = pad[m]](Q[n h d] K[m h d])
Y[n g] = A[h n m] V[m h e] WO[h e g]
output Y
"""

BIASED_MHSA = """
design biased_mhsa
size F = 8, H = 2, D = F / H
size N = 6
input X[n: N, f: F]
{kind} P[{legs}] = {init}
param WQ[f: F, h: H, d: D]
param WK[f: F, h: H, d: D]
param WV[f: F, h: H, e: D]
param WO[h: H, e: D, g: F]
Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
A[h n m] = softmax[m, scale = 1 / sqrt(D)](Q[n h d] K[m h d] + 0.5 * P[{uses}])
Y[n g] = A[h n m] V[m h e] WO[h e g]
output Y
"""

BIASES = {
    "learned-h-n-m": ("param", "h: H, n: N, m: N", "normal(std = 1)", "h n m"),
    "fixed-n-m": ("const", "n: N, m: N", "identity(scale = 3)", "n m"),
}


def x_input(n: int = N, f: int = 8) -> torch.Tensor:
    return torch.randn(B, n, f, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def attend(q, k, v, scale, *, causal=False, hidden=None, bias=None):
    """softmax(scale·q·kᵀ + bias) v over (batch, heads, queries, keys), the padded logits set to
    the dtype's lowest number (the box's masked_fill, docs/language.md) and the future to -inf."""
    scores = scale * q @ k.transpose(-1, -2)
    if bias is not None:
        scores = scores + bias
    lowest = torch.finfo(scores.dtype).min
    if hidden is not None:
        scores = scores.masked_fill(hidden, lowest)
    if causal:
        n, m = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(n, m, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


def grouped_query_reference(module, x, groups: int, causal: bool) -> torch.Tensor:
    """Ainslie et al. 2023, Sec. 2.2: query heads in `groups` groups of consecutive heads, each
    group's key and value head copied to its queries (repeat_interleave); G = 1 is Shazeer's MQA."""
    width = x.shape[-1]
    wq = module.WQ.reshape(width, -1, module.WK.shape[-1])  # [f, H, D], heads group-major
    heads, d = wq.shape[1], wq.shape[2]
    wk, wv = (w.reshape(width, groups, d) for w in (module.WK, module.WV))
    q = torch.einsum("bnf,fhd->bhnd", x, wq)
    k, v = (torch.einsum("bmf,fgd->bgmd", x, w).repeat_interleave(heads // groups, dim=1) for w in (wk, wv))
    out = attend(q, k, v, 1 / math.sqrt(d), causal=causal)
    return torch.einsum("bhne,heo->bno", out, module.WO.reshape(heads, d, width))


def multi_head_reference(module, x, *, causal=False, hidden=None, bias=None) -> torch.Tensor:
    q, k, v = (torch.einsum("bnf,fhd->bhnd", x, w) for w in (module.WQ, module.WK, module.WV))
    out = attend(q, k, v, 1 / math.sqrt(q.shape[-1]), causal=causal, hidden=hidden, bias=bias)
    return torch.einsum("bhne,heg->bng", out, module.WO)


def grouped_design(name: str, causal: bool, width: int = 16) -> tdiag.Design:
    design = tdiag.load(
        DESIGNS / f"{name}.td", **({"F": width, "H": 4} | ({"G": 2} if name == "grouped_query" else {}))
    )
    return design.with_causal_mask() if causal else design


def sdpa_ops(module) -> list[Attention]:
    return [step.op for step in module.tdiag_plan.steps if isinstance(step.op, Attention)]


def pad_mask() -> torch.Tensor:
    """Keys 4.. hidden in the first sequence, every key hidden in the second."""
    pad = torch.ones(B, N, dtype=torch.bool)
    pad[0, 4:] = False
    pad[1] = False
    return pad


def padded_design(write_td, causal: bool) -> tdiag.Design:
    design = tdiag.load(write_td(PADDED_MHSA, "padded_mhsa.td"))
    return design.with_causal_mask() if causal else design


def biased_design(write_td, bias: str, causal: bool) -> tdiag.Design:
    kind, legs, init, uses = BIASES[bias]
    text = BIASED_MHSA.format(kind=kind, legs=legs, init=init, uses=uses)
    design = tdiag.load(write_td(text, "biased_mhsa.td"))
    return design.with_causal_mask() if causal else design


def the_bias(module) -> torch.Tensor:
    """The box's scale 1/sqrt(D) multiplies its whole argument, the bias term included."""
    return 0.5 * module.P / math.sqrt(module.WQ.shape[-1])


# ---- multi-query and grouped-query attention ----------------------------------------------


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize(("name", "groups"), [("multi_query", 1), ("grouped_query", 2)])
def test_grouped_query_attention_equals_repeated_key_value_heads(name, groups, causal):
    module = grouped_design(name, causal).module(dtype=torch.float64, seed=3, N=N)
    x = x_input(f=16)
    assert torch.allclose(module(x), grouped_query_reference(module, x, groups, causal), atol=TOL, rtol=0)


@pytest.mark.parametrize("objective", ["flops", "memory", "time"])
@pytest.mark.parametrize("name", ["multi_query", "grouped_query"])
def test_causal_grouped_query_attention_takes_sdpa_with_is_causal_and_enable_gqa(name, objective):
    module = grouped_design(name, True).module(N=64, objective=objective)
    (op,) = sdpa_ops(module)
    assert op.grouped and op.causal and op.mask is None


@pytest.mark.parametrize("name", ["multi_query", "grouped_query"])
def test_plan_says_why_the_folded_query_rows_were_refused(name):
    plan = grouped_design(name, False).plan(N=64)
    assert any("enable_gqa" in note for note in plan.lowered)
    assert any("folded into the query rows refused" in note for note in plan.refused)


@pytest.mark.parametrize("name", ["multi_query", "grouped_query"])
def test_causal_grouped_query_attention_keeps_no_heads_by_n_squared_tensor(name):
    n = 64
    design = grouped_design(name, True)
    module = design.module(N=n)
    heads = design.size_values["H"]
    saved = saved_for_backward(module, torch.randn(B, n, 16))
    assert saved.storages and max(math.prod(s.shape) for s in saved.storages) < heads * n * n


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("name", ["multi_query", "grouped_query"])
def test_grouped_query_attention_gradcheck(name, causal):
    module = grouped_design(name, causal, width=8).module(dtype=torch.float64, N=3)
    x = torch.randn(1, 3, 8, dtype=torch.float64, requires_grad=True)
    assert gradcheck_parameters(module, (x,))


# ---- padding masks ------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_padded_attention_takes_sdpa_with_a_float_attn_mask(write_td, causal):
    module = padded_design(write_td, causal).module(N=64)
    (op,) = sdpa_ops(module)
    assert op.mask is not None and not op.causal


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_padded_attention_equals_the_masked_softmax_even_where_every_key_is_hidden(write_td, causal):
    design = padded_design(write_td, causal)
    module = design.module(dtype=torch.float64, seed=2, N=N)
    x, pad = x_input(), pad_mask()
    expected = multi_head_reference(module, x, causal=causal, hidden=~pad[:, None, None, :])
    assert torch.allclose(module(x, pad=pad), expected, atol=TOL, rtol=0)
    reference = design.module(impl="reference", dtype=torch.float64, N=N)
    reference.load_state_dict(module.state_dict())
    assert torch.allclose(module(x, pad=pad), reference(x, pad=pad), atol=TOL, rtol=0)


def test_a_row_with_every_key_hidden_averages_the_values_as_the_materialized_box(write_td):
    design = padded_design(write_td, False)
    fused = design.module(dtype=torch.float64, seed=2, N=N)
    assert sdpa_ops(fused)
    x, pad = x_input(), pad_mask()
    v = torch.einsum("mf,fhe->hme", x[1], fused.WV)
    average = torch.einsum("he,heg->g", v.mean(1), fused.WO)
    assert torch.allclose(fused(x, pad=pad)[1], average.expand(N, -1), atol=TOL, rtol=0)


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_padded_attention_keeps_no_heads_by_n_squared_tensor(write_td, causal):
    n = 64
    module = padded_design(write_td, causal).module(N=n)
    pad = torch.rand(B, n, generator=torch.Generator().manual_seed(0)) > 0.3
    saved = saved_for_backward(module, torch.randn(B, n, 8), pad=pad)
    assert max(math.prod(s.shape) for s in saved.storages) < B * 2 * n * n  # H = 2 heads


def test_padded_attention_gradcheck(write_td):
    module = padded_design(write_td, True).module(dtype=torch.float64, N=3)
    pad = torch.tensor([[True, False, True]])
    x = torch.randn(1, 3, 8, dtype=torch.float64, requires_grad=True)
    assert gradcheck_parameters(module, (x,), {"pad": pad})


# ---- additive biases ----------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("bias", list(BIASES))
def test_an_additive_bias_along_the_queries_is_sdpa_s_float_attn_mask(write_td, bias, causal):
    module = biased_design(write_td, bias, causal).module(dtype=torch.float64, seed=4, N=N, objective="memory")
    (op,) = sdpa_ops(module)
    assert op.mask is not None
    x = x_input()
    expected = multi_head_reference(module, x, causal=causal, bias=the_bias(module))
    assert torch.allclose(module(x), expected, atol=TOL, rtol=0)


def test_an_additive_bias_gradcheck(write_td):
    module = biased_design(write_td, "learned-h-n-m", True).module(dtype=torch.float64, N=N, objective="memory")
    x = torch.randn(1, N, 8, dtype=torch.float64, requires_grad=True)
    assert gradcheck_parameters(module, (x,))


def test_a_fixed_bias_runs_the_fused_kernel_and_a_learned_one_the_math_kernel(write_td):
    def kernel(bias: str) -> str:
        plan = biased_design(write_td, bias, False).plan(N=N, objective="memory")
        (found,) = [fp.kernel for fp in footprint(plan).steps if fp.kernel]
        return found

    assert kernel("fixed-n-m") == "flash"
    assert kernel("learned-h-n-m").startswith("math: an attn_mask that needs a gradient")


@pytest.mark.parametrize("bias", list(BIASES))
def test_saved_memory_of_a_biased_plan_is_what_the_model_predicts(write_td, bias):
    design = biased_design(write_td, bias, True)
    module = design.module(N=N, B=B, objective="memory")
    measured = saved_for_backward(module, torch.randn(B, N, 8)).total_bytes
    modelled = design.cost(objective="memory", N=N, B=B).saved_bytes_at(N=N, B=B)
    assert measured == modelled


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_saved_memory_of_a_padded_plan_is_what_the_model_predicts(write_td, causal):
    n = 32
    design = padded_design(write_td, causal)
    module = design.module(N=n, B=B)
    measured = saved_for_backward(module, torch.randn(B, n, 8), pad=torch.rand(B, n) > 0.3).total_bytes
    assert measured == design.cost(N=n, B=B).saved_bytes_at(N=n, B=B)


# ---- standalone files and torch.compile ---------------------------------------------------


def standalone(design: tdiag.Design, tmp_path, planned: int):
    generated = standalone_module(design.source(N=planned), f"{design.name}_module", tmp_path)
    return next(v for k, v in vars(generated).items() if isinstance(v, type) and issubclass(v, torch.nn.Module))


@pytest.mark.parametrize("name", ["multi_query", "grouped_query"])
def test_causal_grouped_query_standalone_file_equals_in_process_module(tmp_path, name):
    design = grouped_design(name, True)
    generated = standalone(design, tmp_path, 64)(seed=7, dtype=torch.float64)
    x = x_input(n=37, f=16)
    assert torch.equal(generated(x), design.module(seed=7, dtype=torch.float64, N=64)(x))


def test_padded_standalone_file_equals_in_process_module(tmp_path, write_td):
    design = padded_design(write_td, True)
    generated = standalone(design, tmp_path, 64)(seed=7, dtype=torch.float64)
    x, pad = x_input(), pad_mask()
    assert torch.equal(generated(x, pad=pad), design.module(seed=7, dtype=torch.float64, N=64)(x, pad=pad))


@pytest.mark.parametrize("form", ["multi_query", "grouped_query", "padded", "biased"])
def test_torch_compile_fullgraph_of_the_new_sdpa_forms(write_td, form):
    if form in ("multi_query", "grouped_query"):
        design, kwargs, width = grouped_design(form, True), {}, 16
    elif form == "padded":
        design, kwargs, width = padded_design(write_td, True), {"pad": pad_mask()}, 8
    else:
        design, kwargs, width = biased_design(write_td, "learned-h-n-m", True), {}, 8
    module = design.module(N=N, objective="memory")
    assert sdpa_ops(module)
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    x = torch.randn(B, N, width)
    assert torch.allclose(compiled(x, **kwargs), module(x, **kwargs), atol=1e-6)


# ---- the sign of the scale ----------------------------------------------------------------

SCALED_MHSA = """
design scaled_mhsa
size F = 8, H = 2, D = F / H
size N
input X[n: N, f: F]
param WQ[f: F, h: H, d: D]
param WK[f: F, h: H, d: D]
param WV[f: F, h: H, e: D]
param WO[h: H, e: D, g: F]
Q[n h d] = {query} X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
A[h n m] = softmax[m, scale = {scale}](Q[n h d] K[m h d])
Y[n g] = A[h n m] V[m h e] WO[h e g]
output Y
"""

SCALES = {
    "negated-query": ("-", "1 / sqrt(D)", -0.5),
    "negative-scale": ("", "-2", -2.0),
    "negated-query-negative-scale": ("-", "-1 / sqrt(D)", 0.5),
    "zero-scale": ("", "0", 0.0),
}


def scaled_design(write_td, scale: str, causal: bool) -> tdiag.Design:
    query, written, _ = SCALES[scale]
    design = tdiag.load(write_td(SCALED_MHSA.format(query=query, scale=written), "scaled_mhsa.td"))
    return design.with_causal_mask() if causal else design


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("scale", SCALES)
def test_a_softmax_of_any_scale_sign_equals_its_reference_in_value_and_gradient(write_td, scale, causal):
    module = scaled_design(write_td, scale, causal).module(seed=0).double()
    x = x_input().requires_grad_()
    out = module(x)
    q, k, v = (torch.einsum("bnf,fhd->bhnd", x, w) for w in (module.WQ, module.WK, module.WV))
    expected = torch.einsum("bhne,heg->bng", attend(q, k, v, SCALES[scale][2], causal=causal), module.WO)
    assert torch.isfinite(out).all()
    assert torch.allclose(out, expected, atol=TOL, rtol=0)
    (grad,) = torch.autograd.grad(out.sum(), x)
    (expected_grad,) = torch.autograd.grad(expected.sum(), x)
    assert torch.allclose(grad, expected_grad, atol=TOL, rtol=0)


@pytest.mark.parametrize("attention", ["sdpa", "flex"])
@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("scale", [s for s in SCALES if SCALES[s][2] != 0])
def test_every_fused_attention_call_receives_a_positive_scale(write_td, scale, causal, attention):
    module = scaled_design(write_td, scale, causal).module(seed=0, attention=attention)
    calls = [step.op for step in module.tdiag_plan.steps if hasattr(step.op, "scale")]
    assert calls
    assert all(float(op.scale) > 0 for op in calls)


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_a_zero_scale_is_refused_by_sdpa_with_its_reason(write_td, causal):
    plan = scaled_design(write_td, "zero-scale", causal).plan()
    assert not any(isinstance(step.op, Attention) for step in plan.steps)
    assert any("scale of its query·key product is zero" in note for note in plan.refused)


def test_a_zero_scale_with_a_key_bias_compiles_to_the_uniform_average_of_the_values():
    """MGK's key bias is carried as a feature divided by the SDPA scale: at scale 0 that was
    0 / 0 in the generated code. The box is uniform over (m, r), so Y averages the values."""
    text = (DESIGNS / "mgk.td").read_text().replace("softmax[m r](", "softmax[m r, scale = 0](")
    module = tdiag.loads(text, "mgk_zero.td", F=8, H=2, D=4).module(seed=0).double()
    x = x_input()
    values = torch.einsum("bmf,fhe->bhe", x, module.WV) / x.shape[1]
    expected = torch.einsum("bhe,heg->bg", values, module.WO)[:, None, :].expand(-1, x.shape[1], -1)
    assert torch.allclose(module(x), expected, atol=TOL, rtol=0)


# ---- rows whose keys are all hidden: values and gradients ----------------------------------

PADDED_FORMS = {
    "mhsa": PADDED_MHSA,
    "grouped": PADDED_MHSA.replace("param WK[f: F, h: H, d: D]", "param WK[f: F, d: D]")
    .replace("param WV[f: F, h: H, e: D]", "param WV[f: F, e: D]")
    .replace("K[m h d] = X[m f] WK[f h d]", "K[m d] = X[m f] WK[f d]")
    .replace("V[m h e] = X[m f] WV[f h e]", "V[m e] = X[m f] WV[f e]")
    .replace("Q[n h d] K[m h d]", "Q[n h d] K[m d]")
    .replace("A[h n m] V[m h e]", "A[h n m] V[m e]"),
    "learned-bias": PADDED_MHSA.replace("param WO", "param P[h: H, n: N, m: N] = normal(std = 1)\nparam WO")
    .replace("size N\n", "size N = 6\n")
    .replace("Q[n h d] K[m h d])", "Q[n h d] K[m h d] + P[h n m])"),
    "key-bias": PADDED_MHSA.replace("param WO", "param c[h: H, f: F]\nparam WO").replace(
        "Q[n h d] K[m h d])", "Q[n h d] K[m h d] + c[h f] X[m f])"
    ),
}

PADS = {
    "one-sequence-all-hidden": pad_mask(),
    "all-hidden": torch.zeros(B, N, dtype=torch.bool),
    "first-key-hidden": torch.ones(B, N, dtype=torch.bool).index_fill(1, torch.tensor([0]), False),
}


@pytest.mark.parametrize("pad", PADS)
@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("form", PADDED_FORMS)
def test_padded_attention_gradients_equal_the_reference_where_rows_are_all_hidden(write_td, form, causal, pad):
    """A row whose keys are all hidden averages the values whatever its scores (masked_fill): its
    gradient reaches the values only, as in the materialized box (first-key-hidden with the causal
    mask hides every key of the first query)."""
    design = tdiag.load(write_td(PADDED_FORMS[form], f"padded_{form}.td"))
    design = design.with_causal_mask() if causal else design
    module = design.module(dtype=torch.float64, seed=2, N=N)
    assert sdpa_ops(module)
    parameters = perturbed(module)
    reference = design.module(impl="reference", dtype=torch.float64, N=N)
    reference.load_state_dict(module.state_dict())
    x, mask = x_input(), PADS[pad]
    results = []
    for m in (module, reference):
        inputs = x.clone().requires_grad_()
        out = m(inputs, pad=mask)
        weights = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(3))
        grads = torch.autograd.grad((out * weights).sum(), [inputs, *m.parameters()])
        results.append((out, grads))
    assert parameters
    (out, grads), (expected, expected_grads) = results
    assert torch.allclose(out, expected, atol=TOL, rtol=0)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        assert torch.allclose(grad, expected_grad, atol=1e-9, rtol=0)


def test_padded_attention_gradcheck_with_a_row_whose_keys_are_all_hidden(write_td):
    module = padded_design(write_td, False).module(dtype=torch.float64, N=3)
    pad = torch.tensor([[True, False, True], [False, False, False]])
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    assert gradcheck_parameters(module, (x,), {"pad": pad})


@pytest.mark.parametrize("form", ["sdpa", "flex", "reference"])
def test_a_causal_row_whose_past_is_all_padding_never_sees_the_future(write_td, form):
    """Left padding hides every key a first query may see; its row averages the values it may
    see (its past and itself), so no later token changes it (the future took weight before)."""
    design = padded_design(write_td, True)
    kwargs = {"impl": "reference"} if form == "reference" else {"attention": form}
    module = design.module(dtype=torch.float64, seed=2, N=N, **kwargs)
    pad = torch.ones(B, N, dtype=torch.bool)
    pad[:, :3] = False
    x = x_input()
    later = x.clone()
    later[:, 3:] += 5
    with torch.no_grad():
        assert torch.equal(module(x, pad=pad)[:, :3], module(later, pad=pad)[:, :3])


def test_a_key_bias_folded_into_sdpa_keeps_float32_precision_under_bfloat16_autocast():
    """FoX's key bias −c[m] is a running sum of log-gates: in bfloat16 the fold lost 22%."""
    torch.manual_seed(0)
    design = tdiag.load(DESIGNS / "forgetting_attention.td", F=64, H=4).with_causal_mask()
    module = design.module(N=512)
    assert "key bias as one more feature" in module.tdiag_source
    exact = design.module(N=512, dtype=torch.float64)
    exact.load_state_dict({k: v.double() for k, v in module.state_dict().items()})
    x = torch.randn(2, 512, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = module(x).double()
    truth = exact(x.double())
    assert (y - truth).norm() / truth.norm() < 0.02
