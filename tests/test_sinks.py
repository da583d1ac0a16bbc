"""Attention sinks (issue 24): a softmax box with a logit in each row's denominator,
`softmax[m, sink = s[h]](x)` = exp(α·x_m) / (exp(s) + Σ_m' exp(α·x_m')), as gpt-oss computes
it. The materialized box (the max over the scores and the sink) and the SDPA sink form (the sink
as one more key, one is_causal call) equal the reference evaluator in float64, plain, causal and
padded, with their gradients; a row whose keys are all hidden gives 0."""

import pytest
import sympy
import torch
from conftest import gradcheck_parameters, standalone_module

import tdiag
from tdiag.plan import forms
from tdiag.plan.forms import FORMS

F64 = torch.float64
TOL = 1e-10
N = 6

SINK = """
design sink_attention
size F = 8, H = 2, D = 4
size N
input X[n: N, f: F]
mask pad[m: N]
param WQ[f: F, h: H, d: D] = normal(std = 1)
param WK[f: F, h: H, d: D] = normal(std = 1)
param WV[f: F, h: H, e: D] = normal(std = 1)
param WO[h: H, e: D, g: F] = normal(std = 1)
param S[h: H] = normal(std = 1)
Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
A[h n m] = softmax[m, scale = 1 / sqrt(D), sink = S[h], mask = pad[m]](Q[n h d] K[m h d])
Y[n g] = A[h n m] V[m h e] WO[h e g]
output Y
"""

# grouped-query heads (g r), a sink per query head and per query position (n)
GROUPED = """
design grouped_sink
size F = 8, G = 2, R = 2, D = 2
size N
input X[n: N, f: F]
param WQ[f: F, g: G, r: R, d: D] = normal(std = 1)
param WK[f: F, g: G, d: D] = normal(std = 1)
param WV[f: F, g: G, e: D] = normal(std = 1)
param WS[f: F, g: G, r: R] = normal(std = 1)
Q[n g r d] = X[n f] WQ[f g r d]
K[m g d] = X[m f] WK[f g d]
V[m g e] = X[m f] WV[f g e]
Sink[n g r] = X[n f] WS[f g r]
A[g r n m] = softmax[m, scale = 1 / sqrt(D), sink = Sink[n g r]](Q[n g r d] K[m g d])
Y[n g r e] = A[g r n m] V[m g e]
output Y
"""


def only(*names: str) -> list:
    return [form for form in FORMS if form.name in names or form.name == "materialized"]


def build(text: str, causal: bool, form: str, **options):
    """The module of `text` with the box in `form` (the other fused forms left out)."""
    design = tdiag.loads(text)
    if causal:
        design = design.with_causal_mask()
    saved = forms.FORMS
    forms.FORMS = only(form)
    try:
        module = design.module(dtype=F64, N=N, objective="memory" if form != "materialized" else "time", **options)
    finally:
        forms.FORMS = saved
    assert [c.taken for c in module.tdiag_plan.choices] == [form]
    return module


_CACHE: dict = {}


def modules(text: str, causal: bool, form: str):
    """(compiled module, reference module with its weights), built once per test file."""
    key = (text, causal, form)
    if key not in _CACHE:
        module = build(text, causal, form)
        design = tdiag.loads(text)
        reference = (design.with_causal_mask() if causal else design).module(impl="reference", dtype=F64, N=N)
        reference.load_state_dict(module.state_dict())
        _CACHE[key] = module, reference
    return _CACHE[key]


def x_input(features: int = 8) -> torch.Tensor:
    return torch.randn(2, N, features, dtype=F64, generator=torch.Generator().manual_seed(3))


def pad_mask() -> torch.Tensor:
    pad = torch.ones(2, N, dtype=torch.bool)
    pad[0, 4:] = False
    pad[1, :3] = False  # left padding: causal rows 0..2 of sequence 1 see no key
    return pad


def run(module, x: torch.Tensor, **masks):
    x = x.clone().requires_grad_()
    y = module(x, **masks)
    y.backward(torch.cos(torch.arange(y.numel(), dtype=F64)).reshape(y.shape))
    return y.detach(), x.grad, {k: p.grad for k, p in module.named_parameters()}


def assert_same(got, expected):
    (y, dx, dp), (y_ref, dx_ref, dp_ref) = got, expected
    assert torch.allclose(y, y_ref, atol=TOL, rtol=0)
    assert torch.allclose(dx, dx_ref, atol=TOL, rtol=0)
    assert dp.keys() == dp_ref.keys()
    for k in dp:  # a parameter the design does not read (the sink a number) has no gradient
        assert (dp[k] is None and dp_ref[k] is None) or torch.allclose(dp[k], dp_ref[k], atol=TOL, rtol=0)


# ---- the construct --------------------------------------------------------------------------


def test_the_sink_is_shown_as_an_option_of_the_box():
    assert "sink S[h]" in tdiag.loads(SINK).show()


def test_the_reference_puts_exp_of_the_sink_in_the_denominator():
    """gpt-oss's eager attention: the scores and the sink concatenated, softmaxed, the sink's
    column dropped."""
    _, reference = modules(SINK, False, "materialized")
    x = x_input()
    p = dict(reference.named_parameters())
    q, k = torch.einsum("bnf,fhd->bhnd", x, p["WQ"]), torch.einsum("bmf,fhd->bhmd", x, p["WK"])
    scores = q @ k.mT / 2
    sinks = p["S"][None, :, None, None].expand(2, 2, N, 1)
    weights = torch.cat([scores, sinks], -1).softmax(-1)[..., :-1]
    v = torch.einsum("bmf,fhe->bhme", x, p["WV"])
    expected = torch.einsum("bhne,heg->bng", weights @ v, p["WO"])
    assert torch.allclose(reference(x), expected, atol=TOL, rtol=0)


def test_a_sink_breaks_shift_invariance_so_a_term_constant_along_the_keys_stays():
    """softmax is shift invariant, a box with a sink is not: the term c[h] must not be dropped."""
    text = SINK.replace("param S[h: H] = normal(std = 1)", "param S[h: H] = normal(std = 1)\nparam c[h: H] = ones")
    text = text.replace("(Q[n h d] K[m h d])", "(Q[n h d] K[m h d] + c[h])")
    module, reference = modules(text, False, "materialized")
    x = x_input()
    assert torch.allclose(module(x), reference(x), atol=TOL, rtol=0)
    with torch.no_grad():
        reference.c.zero_()
    assert not torch.allclose(module(x), reference(x), atol=1e-3)


def test_the_sdpa_sink_form_refuses_a_term_constant_along_the_keys():
    text = SINK.replace("param S[h: H] = normal(std = 1)", "param S[h: H] = normal(std = 1)\nparam c[h: H] = ones")
    text = text.replace("(Q[n h d] K[m h d])", "(Q[n h d] K[m h d] + c[h])")
    (choice,) = tdiag.loads(text).plan(N=64).choices
    refusal = next(c.refusal for c in choice.candidates if c.form == "sdpa_sink")
    assert "a term constant along the keys counts" in refusal


# ---- values and gradients: materialized and SDPA, plain, causal, padded ---------------------


@pytest.mark.parametrize("form", ["materialized", "sdpa_sink"])
@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_values_and_gradients_equal_the_reference(form, causal):
    module, reference = modules(SINK, causal, form)
    x = x_input()
    assert_same(run(module, x), run(reference, x))


@pytest.mark.parametrize("form", ["materialized", "sdpa_sink"])
@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_padded_values_and_gradients_equal_the_reference(form, causal):
    module, reference = modules(SINK, causal, form)
    x, pad = x_input(), pad_mask()
    assert_same(run(module, x, pad=pad), run(reference, x, pad=pad))


@pytest.mark.parametrize("form", ["materialized", "sdpa_sink"])
def test_a_sink_beside_a_sliding_window_equals_the_reference(form):
    """gpt-oss's sliding layers: the sink and a window of 3 keys (N = 6, so the window hides)."""
    windowed = SINK.replace("mask = pad[m]", "mask = pad[m], mask = window(n, m, 3)")
    module, reference = modules(windowed, False, form)
    x, pad = x_input(), pad_mask()
    assert_same(run(module, x), run(reference, x))
    assert_same(run(module, x, pad=pad), run(reference, x, pad=pad))


@pytest.mark.parametrize("form", ["materialized", "sdpa_sink"])
def test_a_row_whose_keys_are_all_hidden_is_zero(form):
    """The sink is always visible: it takes the whole weight of a row with no visible key."""
    module, _ = modules(SINK, False, form)
    pad = torch.zeros(2, N, dtype=torch.bool)
    assert torch.equal(module(x_input(), pad=pad), torch.zeros(2, N, 8, dtype=F64))


@pytest.mark.parametrize("form", ["materialized", "sdpa_sink"])
@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_grouped_heads_with_a_sink_per_query_equal_the_reference(form, causal):
    module, reference = modules(GROUPED, causal, form)
    x = x_input()
    assert_same(run(module, x), run(reference, x))


# an ALiBi-like bias along the queries and the keys: SDPA's float attn_mask beside the sink key
BIASED = SINK.replace(
    "param S[h: H] = normal(std = 1)", "param S[h: H] = normal(std = 1)\nparam B[h: H] = ones"
).replace("(Q[n h d] K[m h d])", "(Q[n h d] K[m h d] - B[h] abs(index(n) - index(m)))")


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_a_bias_along_queries_and_keys_beside_the_sink_equals_the_reference(causal):
    module, reference = modules(BIASED, causal, "sdpa_sink")
    assert "attn_mask=" in module.tdiag_source
    x, pad = x_input(), pad_mask()
    assert_same(run(module, x, pad=pad), run(reference, x, pad=pad))


def test_the_grouped_sink_form_groups_the_query_heads():
    module, _ = modules(GROUPED, True, "sdpa_sink")
    assert "enable_gqa=True" in module.tdiag_source and "is_causal=True" in module.tdiag_source


def test_a_number_as_sink_is_softmax_plus_one():
    """`sink = 0`: exp(x_m) / (1 + Σ exp(x_m')) (the "softmax1" of off-by-one attention)."""
    text = SINK.replace("sink = S[h]", "sink = 0")
    module, reference = modules(text, True, "sdpa_sink")
    x = x_input()
    assert_same(run(module, x), run(reference, x))


def test_the_sdpa_sink_form_passes_gradcheck():
    module = build(SINK.replace("F = 8, H = 2, D = 4", "F = 2, H = 1, D = 2"), True, "sdpa_sink")
    x = torch.randn(1, 3, 2, dtype=F64, generator=torch.Generator().manual_seed(2))
    assert gradcheck_parameters(module, (x,))


@pytest.mark.parametrize("form", ["materialized", "sdpa_sink"])
def test_compiles_under_fullgraph(form):
    module, reference = modules(SINK, True, form)
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    x, pad = x_input(), pad_mask()
    assert torch.allclose(compiled(x, pad=pad), reference(x, pad=pad), atol=TOL, rtol=0)


def test_the_standalone_file_equals_the_module_in_process(tmp_path):
    module, _ = modules(SINK, True, "sdpa_sink")
    standalone = standalone_module(module.tdiag_source, "sink_standalone", tmp_path)
    copy = standalone.SinkAttention(dtype=F64)
    copy.load_state_dict(module.state_dict())
    x, pad = x_input(), pad_mask()
    assert torch.equal(copy(x, pad=pad), module(x, pad=pad))


# ---- plan, cost, causal mask, render --------------------------------------------------------


def test_the_candidate_table_refuses_the_other_sdpa_forms_for_a_sink():
    (choice,) = tdiag.loads(SINK).plan(N=64).choices
    reasons = {c.form: c.refusal for c in choice.candidates}
    assert reasons["sdpa_sink"] is None
    for form in ("sdpa", "sdpa_grouped", "sdpa_repeated", "global_heads"):
        assert reasons[form].startswith("a sink in the denominator")


def test_objective_memory_takes_the_sink_form():
    (choice,) = tdiag.loads(SINK).plan(N=64, objective="memory").choices
    assert choice.taken == "sdpa_sink"


def test_the_materialized_sink_costs_one_exp_per_row():
    design = tdiag.loads(SINK.replace(", mask = pad[m]", ""))
    exps = design.cost().formulas()["exps"]
    assert str(sympy.factor(exps)) == "H*N*(N + 1)"


def test_with_causal_mask_keeps_the_sink():
    (box,) = tdiag.loads(SINK).with_causal_mask().graph.boxes()[0][1:]
    assert box.sink is not None and len(box.masks) == 2


def test_the_sink_is_drawn_in_its_box():
    assert "sink: + exp(·) in the denominator" in tdiag.loads(SINK).dot()
