"""Designs the offline fuzzer (scripts/fuzz.py) found crashing or computing a wrong value, kept as
specifications: each one compiles and equals both the reference evaluation and a value computed
here by hand in float64, forward and backward; or check refuses it with a positioned error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import DESIGNS
from test_fuzz import run_design

import tdiag

IMPLS = ["compiled", "reference"]


def module(text: str, impl: str, **sizes: int) -> torch.nn.Module:
    return tdiag.loads(text).module(sizes, impl=impl, dtype=torch.float64)


@pytest.mark.parametrize("impl", IMPLS)
def test_an_identity_between_a_sum_and_itself_sums_the_diagonal_of_the_sum(impl):
    # δ[n m] (X - T0[m n]) δ[n m] over m is the sum's diagonal; merging m into n twice gave a leaf
    # with a repeated leg, summed as a permute of the wrong length
    text = (
        "design identity_and_sum\nsize N = 3, F = 2\ninput X[f: F]\nconst W[n: N, m: N] = identity\n"
        "T0[m n] = relu(W[n m]) ^ 3\nT[n] = W[n m] (X[f] - T0[m n]) W[n m]\noutput T\n"
    )
    x = torch.randn(2, 2, dtype=torch.float64, requires_grad=True)
    y = module(text, impl)(x)
    torch.testing.assert_close(y, (x.sum(-1) - 1)[:, None].expand(2, 3), rtol=0, atol=1e-12)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((2, 2), 3.0, dtype=torch.float64), rtol=0, atol=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
def test_an_identity_times_a_mask_summed_over_both_legs_inside_a_map_is_the_trace(impl):
    # silu(Σ_nm P[n m] δ[n m]) is silu of P's trace; folding δ renamed m to n and summed P[m m] twice
    text = (
        "design identity_in_map\nsize N = 3, F = 2\ninput X[n: N, f: F]\nmask P[n: N, m: N]\n"
        "const W[n: N, m: N] = identity\nT[f] = silu(P[n m] W[n m]) - X[n f]\noutput T\n"
    )
    x = torch.randn(2, 3, 2, dtype=torch.float64, requires_grad=True)
    p = torch.tensor([[True, False, True], [True, False, False], [False, True, True]])  # trace 2
    y = module(text, impl)(x, P=p)
    torch.testing.assert_close(
        y, torch.nn.functional.silu(torch.tensor(2.0, dtype=torch.float64)) - x.sum(-2), rtol=0, atol=1e-12
    )
    y.sum().backward()
    torch.testing.assert_close(x.grad, -torch.ones_like(x), rtol=0, atol=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_batched_matmul_whose_left_side_keeps_only_the_batch_leg_has_the_result_legs_shape(impl):
    # A[n m] W[n g m] over m is a matmul batched over n with no left leg: its unit axis broadcast
    # a quotient to [n n g]
    text = (
        "design batch_only_left\nsize N = 3, G = 2\ninput X[n: N, g: G]\nparam A[n: N, m: N]\n"
        "param W[n: N, g: G, m: N]\nT[n g] = X[n g] / (A[n m] W[n g m])\noutput T\n"
    )
    model = module(text, impl)
    x = torch.randn(2, 3, 2, dtype=torch.float64, requires_grad=True)
    y = model(x)
    denominator = torch.einsum("nm,ngm->ng", model.A, model.W)
    torch.testing.assert_close(y, x / denominator, rtol=1e-12, atol=1e-12)
    y.sum().backward()
    torch.testing.assert_close(x.grad, (1 / denominator).expand(2, 3, 2), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_quotient_constant_along_a_summed_leg_is_multiplied_by_its_size(impl):
    # W[n g] / (1 + exp(...W[n g]...)) with W all ones varies only with X: summing it over g is G
    # times the value, a factor lost when the leg was only a broadcast leg of the quotient
    text = (
        "design constant_along_g\nsize N = 2, F = 3, G = 2\ninput X[f: F]\nconst W[n: N, g: G] = ones\n"
        "T[n] = W[n g] / (1 + exp(clamp(X[f] / (1 + exp(clamp(W[n g], -3, 3))), -3, 3)))\noutput T\n"
    )
    x = torch.tensor([[0.1, 0.2, 0.3], [4.0, 5.0, 6.0]], dtype=torch.float64, requires_grad=True)
    y = module(text, impl)(x)
    inner = (x.sum(-1) / (1 + torch.e)).clamp(-3, 3)
    expected = 2 / (1 + torch.exp(inner))
    torch.testing.assert_close(y, expected[:, None].expand(2, 2), rtol=1e-12, atol=1e-12)
    y.sum().backward()  # the second row is clamped: no gradient
    slope = -2 * 2 * torch.sigmoid(inner[0]) * torch.sigmoid(-inner[0]) / (1 + torch.e)
    torch.testing.assert_close(x.grad, torch.stack([slope.expand(3), torch.zeros(3)]).detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_computed_tensor_constant_along_a_leg_that_a_later_statement_sums_is_multiplied_by_its_size(impl):
    text = (
        "design summed_later\nsize N = 2, F = 3, G = 2\ninput X[f: F]\nconst W[n: N, g: G] = ones\n"
        "T0[n g] = X[f] / (1 + exp(W[n g]))\nT[n] = T0[n g]\noutput T\n"
    )
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    y = module(text, impl)(x)
    torch.testing.assert_close(y, (2 * x.sum(-1) / (1 + torch.e))[:, None].expand(2, 2), rtol=1e-12, atol=1e-12)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((2, 3), 4 / (1 + torch.e), dtype=torch.float64), rtol=1e-12, atol=0)


@pytest.mark.parametrize("objective", ["flops", "time"])
def test_a_causal_normalize_whose_content_carries_query_and_key_on_one_factor_is_materialized_with_a_note(
    objective,
):
    # Σ_{m ≤ n} of exp(A[n m]) X[m f] is no prefix sum: A has both legs; the chunked rewrite asserted
    text = (
        "design causal_one_factor\nsize N = 3, F = 2\ninput X[n: N, f: F]\nparam A[n: N, m: N]\n"
        "T[n f] = normalize[m, mask = causal(n, m)](exp(A[n m])) X[m f]\noutput T\n"
    )
    model = tdiag.loads(text).module(dtype=torch.float64, objective=objective)
    x = torch.randn(2, 3, 2, dtype=torch.float64, requires_grad=True)
    y = model(x)
    weights = torch.exp(model.A).tril()
    weights = weights / weights.sum(-1, keepdim=True)
    torch.testing.assert_close(y, weights @ x, rtol=1e-12, atol=1e-12)
    y.sum().backward()
    torch.testing.assert_close(x.grad, weights.sum(0)[:, None].expand(2, 3, 2), rtol=1e-12, atol=1e-12)
    assert any("no causal prefix sum: n and m are legs of one factor" in why for why in model.tdiag_plan.refused)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_box_whose_content_is_constant_along_a_masked_leg_masks_each_entry(impl):
    # a constant content is one number broadcast over n and m: the causal mask needs m as an axis
    text = (
        "design box_constant_along_mask\nsize N = 3, F = 2\ninput X[n: N, f: F]\nconst C[n: N, m: N] = fill(0.5)\n"
        "T[m f] = softmax[n, mask = causal(m, n)](C[n m]) X[n f]\noutput T\n"
    )
    x = torch.randn(2, 3, 2, dtype=torch.float64, requires_grad=True)
    y = module(text, impl)(x)
    running_mean = x.cumsum(-2) / torch.arange(1, 4, dtype=torch.float64)[:, None]
    torch.testing.assert_close(y, running_mean, rtol=1e-12, atol=1e-12)
    y.sum().backward()
    weight = (1 / torch.arange(1, 4, dtype=torch.float64)).flip(0).cumsum(0).flip(0)  # Σ_{m ≥ n} 1/(m+1)
    torch.testing.assert_close(x.grad, weight[:, None].expand(2, 3, 2), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("batched_mask", [True, False])
def test_a_box_over_parameters_only_with_a_mask_input_is_masked_per_sequence(impl, batched_mask):
    # W does not vary with the sequence, the mask P does: the masked content carries the batch
    text = (
        "design box_unbatched_padding\nsize N = 3, F = 2\ninput X[n: N, f: F]\nmask P[n: N, m: N]\n"
        "param W[n: N, m: N]\nT[m f] = softmax[n, mask = P[n m]](W[n m]) X[n f]\noutput T\n"
    )
    model = module(text, impl)
    x = torch.randn(2, 3, 2, dtype=torch.float64, requires_grad=True)
    p = torch.rand(2, 3, 3, generator=torch.Generator().manual_seed(0)) < 0.6
    p[:, 0, :] = True  # every column m attends somewhere
    p = p if batched_mask else p[0]
    y = model(x, P=p)
    scores = model.W.masked_fill(~p, float("-inf"))
    weights = scores.softmax(-2)  # over n, for each m
    torch.testing.assert_close(y, weights.transpose(-1, -2) @ x, rtol=1e-12, atol=1e-12)
    y.sum().backward()
    torch.testing.assert_close(x.grad, weights.sum(-1)[..., None].expand(2, 3, 2), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_box_constant_along_a_leg_that_its_region_sums_is_multiplied_by_its_size(impl):
    # softmax[h](0.5 X[f]) is 1/H everywhere, and constant along g: Σ_h Σ_g of it is G
    text = (
        "design box_constant_along_g\nsize F = 3, G = 2, H = 4\ninput X[f: F]\n"
        "const W[g: G, h: H, f: F] = fill(0.5)\nA[f h g] = softmax[h](W[g h f] X[f])\n"
        "T[f] = A[f h g] + X[f]\noutput T\n"
    )
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    y = module(text, impl)(x)
    torch.testing.assert_close(y, x + 2, rtol=1e-12, atol=1e-12)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones_like(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
def test_an_output_that_reads_the_input_keeps_its_batch_dims_where_the_plan_finds_it_constant(impl):
    # softmax over n of X[m f] - C[n] is 1/N whatever X is (a shift along n): the compiled plan
    # drops X, but the output still has one entry per sequence, and its gradient is zero
    text = (
        "design shifted_away\nsize N = 3, F = 2\ninput X[m: N, f: F]\nconst C[n: N] = fill(0.5)\n"
        "T[n m f] = softmax[n](X[m f] - C[n]) + 2\noutput T\n"
    )
    x = torch.randn(4, 3, 2, dtype=torch.float64, requires_grad=True)
    y = module(text, impl)(x)
    torch.testing.assert_close(y, torch.full((4, 3, 3, 2), 1 / 3 + 2, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    if y.requires_grad:
        (gradient,) = torch.autograd.grad(y.sum(), x)
        torch.testing.assert_close(gradient, torch.zeros_like(x), rtol=0, atol=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_term_a_softmax_drops_keeps_its_legs_on_the_box(impl):
    # causal(n, m) I[n m] is constant along f, so softmax over f drops it; its leg n stays a leg of the result
    text = (
        "design dropped_term\nsize N = 3, F = 2\ninput X[m: N, f: F]\nconst I[n: N, m: N] = identity\n"
        "T[f m n] = softmax[f](X[m f] - causal(n, m) I[n m])\noutput T\n"
    )
    x = torch.randn(2, 3, 2, dtype=torch.float64, requires_grad=True)
    y = module(text, impl)(x)
    expected = x.softmax(-1).transpose(-1, -2)[..., None].expand(2, 2, 3, 3)
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)
    (y * torch.arange(36, dtype=torch.float64).reshape(2, 2, 3, 3)).sum().backward()
    (gradient,) = torch.autograd.grad((expected * torch.arange(36.0).reshape(2, 2, 3, 3)).sum(), x)
    torch.testing.assert_close(x.grad, gradient, rtol=1e-12, atol=1e-12)


SYNTHESIZER = """
design synthesizer
size F = 4, H = 2, D = 2, N = 5
input X[n: N, f: F]
param QP[n: N, h: H, d: D] = normal
param KP[m: N, h: H, d: D] = normal
param WV[f: F, h: H, e: D] = normal
V[m h e] = X[m f] WV[f h e]
A[h n m] = softmax[m](QP[n h d] KP[m h d]BIAS)
Y[n h e] = A[h n m] V[m h e]
output Y
"""


def synthesizer_by_hand(p: dict, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    scores = torch.einsum("nhd,mhd->hnm", p["QP"], p["KP"])
    scores = scores + bias[:, None] if bias is not None else scores.expand(x.shape[0], -1, -1, -1)
    v = torch.einsum("bmf,fhe->bmhe", x, p["WV"])
    return torch.einsum("bhnm,bmhe->bnhe", scores.softmax(-1), v)


@pytest.mark.parametrize("impl", IMPLS)
def test_attention_from_parameters_over_values_of_the_input_keeps_the_batch(impl):
    # one attention for every sequence (q and k are parameters) over values that carry the batch:
    # SDPA took the batch for a feature of the values and permuted a 4-D v with 3 axes
    m = module(SYNTHESIZER.replace("BIAS", ""), impl)
    p = {k: v.detach() for k, v in m.named_parameters()}
    x = torch.randn(3, 5, 4, dtype=torch.float64)
    torch.testing.assert_close(m(x), synthesizer_by_hand(p, x), rtol=0, atol=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_batched_bias_on_scores_of_parameters_is_not_an_unbatched_attn_mask(impl):
    # q, k and v parameters, the input only in the bias: SDPA over unbatched heads took the
    # batched bias as its attn_mask
    text = SYNTHESIZER.replace("BIAS", " + X[n f] X[m f]").replace(
        "param WV[f: F, h: H, e: D]", "param VP[m: N, h: H, e: D]"
    )
    text = text.replace("V[m h e] = X[m f] WV[f h e]\n", "").replace("V[m h e]\noutput", "VP[m h e]\noutput")
    m = module(text, impl)
    p = {k: v.detach() for k, v in m.named_parameters()}
    x = torch.randn(3, 5, 4, dtype=torch.float64)
    scores = torch.einsum("nhd,mhd->hnm", p["QP"], p["KP"]) + torch.einsum("bnf,bmf->bnm", x, x)[:, None]
    torch.testing.assert_close(m(x), torch.einsum("bhnm,mhe->bnhe", scores.softmax(-1), p["VP"]), rtol=0, atol=1e-12)
    if impl == "compiled":
        assert any("varies along the batch" in note for note in m.tdiag_plan.refused)


@pytest.mark.parametrize("attention", ["sdpa", "flex"])
def test_a_query_key_product_times_zero_in_a_box_leaves_the_bias_alone(attention):
    # softmax_m(Q·K·0 + b[m]): the zero-weight product was the SDPA match's first side, and every
    # other side was divided by its weight (1/0 reached generated code as a complex infinity)
    text = (
        "design zero_product\nsize N = 4, F = 3\ninput X[n: N, f: F]\nparam b[m: N]\n"
        "A[n m] = softmax[m](X[n f] X[m f] 0 + b[m])\nY[n f] = A[n m] X[m f]\noutput Y\n"
    )
    design = tdiag.loads(text)
    compiled = design.module(dtype=torch.float64, attention=attention)
    x = torch.randn(2, 4, 3, dtype=torch.float64)
    with torch.no_grad():
        expected = (compiled.b.softmax(-1) @ x)[:, None, :].expand(2, 4, 3)
        torch.testing.assert_close(compiled(x), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_constant_inside_a_map_inside_a_scaled_softmax_is_kept(impl):
    # softmax_f(2 log(1 + exp(x))): the softmax's shift invariance reached through the scaling into
    # the map and dropped its 1 (softmax(2 log(exp x)) was computed)
    text = (
        "design softplus_logits\nsize N = 3, F = 4\ninput X[n: N, f: F]\n"
        "A[n f] = softmax[f](2 * log(1 + exp(X[n f])))\noutput A\n"
    )
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    expected = (2 * torch.nn.functional.softplus(x)).softmax(-1)
    torch.testing.assert_close(module(text, impl)(x), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_term_along_the_reduced_leg_of_a_max_inside_a_softmax_is_kept(impl):
    # softmax_m(max_r(x[n m] + X[n r])): X[n r] is constant along m but not along r, so it does not
    # pass through the max unchanged and is no shift the softmax may drop
    text = (
        "design max_bias\nsize N = 3, F = 2\ninput X[n: N, f: F]\n"
        "A[n m] = softmax[m](2 * max[r](X[n f] X[m f] + X[n r]))\noutput A\n"
    )
    x = torch.randn(2, 3, 2, dtype=torch.float64)
    scores = torch.einsum("bnf,bmf->bnm", x, x)
    expected = (2 * (scores[..., None] + x[:, :, None, :]).amax(-1)).softmax(-1)
    torch.testing.assert_close(module(text, impl)(x), expected, rtol=0, atol=1e-12)


def test_a_warning_inside_a_statement_does_not_hide_a_result_leg_no_factor_has():
    # the normalize box's missing-eps warning counted as a mistake inside the statement, which
    # skipped this check; the design then crashed in the planner
    text = (
        "design hidden\nsize N = 2\ninput X[m: N]\nmask P[m: N]\n"
        "T[n m] = normalize[m, mask = P[m]](exp(X[m]))\noutput T\n"
    )
    with pytest.raises(tdiag.TdiagError, match="result leg 'n' of T appears in no factor"):
        tdiag.loads(text)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_max_inside_a_softmax_and_the_same_max_outside_are_each_computed_whole(impl):
    # inside the softmax the query norm may pass through max_g and drop; the memo of computed
    # values must not hand that shortened max to the same expression outside the box
    text = (
        "design max_twice\nsize N = 4, F = 3\ninput X[n: N, f: F]\n"
        "Y[n m] = softmax[m](max[g](X[n g] X[m g] + X[n f] X[n f])) + max[g](X[n g] X[m g] + X[n f] X[n f])\n"
        "output Y\n"
    )
    x = torch.randn(2, 4, 3, dtype=torch.float64)
    inner = (x[:, :, None, :] * x[:, None, :, :] + (x * x).sum(-1)[:, :, None, None]).amax(-1)
    torch.testing.assert_close(module(text, impl)(x), inner.softmax(-1) + inner, rtol=0, atol=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_softmax_around_a_product_keeps_the_constant_term_of_a_factor(impl):
    # causal(n, m)·(x + 3) inlined into a softmax over (m, n): the 3 is not constant along the
    # normalized legs once multiplied by the mask; it was dropped (fuzz seed 40)
    text = (
        "design product_constant\nsize N = 3, F = 2\ninput X[n: N, f: F]\nconst I[n: N, m: N] = identity\n"
        "T[m n] = causal(n, m) (I[n m] + X[n f] + 3)\n"
        "Y[n m] = softmax[m n](sqrt(2) * T[m n])\n"
        "output Y\n"
    )
    x = torch.randn(2, 3, 2, dtype=torch.float64)
    visible = torch.ones(3, 3, dtype=torch.bool).tril()  # [n, m]
    scores = 2**0.5 * visible.double() * (torch.eye(3, dtype=torch.float64) + x.sum(-1)[:, :, None] + 3)  # [b n m]
    expected = scores.flatten(1).softmax(-1).unflatten(1, (3, 3))
    torch.testing.assert_close(module(text, impl)(x), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("objective", ["flops", "time", "memory"])
def test_grouped_query_heads_read_from_a_computed_tensor_are_computed_under_every_objective(objective):
    # Q[n (g r) d] of Q[n h d] lowers Q where it is first read; under "flops" that was inside a trial
    # plan whose steps are dropped, and the real plan then read Q without computing it (NameError)
    text = (
        "design gqa_regrouped\nsize F = 4, H = 4, G = 2, R = H / G, D = 2\nsize N\ninput X[n: N, f: F]\n"
        "param WQ[f: F, h: H, d: D]\nparam WK[f: F, g: G, d: D]\nparam WV[f: F, g: G, e: D]\n"
        "Q[n h d] = X[n f] WQ[f h d]\nK[m g d] = X[m f] WK[f g d]\nV[m g e] = X[m f] WV[f g e]\n"
        "A[g r n m] = softmax[m](Q[n (g r) d] K[m g d])\nY[n g r e] = A[g r n m] V[m g e]\noutput Y\n"
    )
    model = tdiag.loads(text).module(dtype=torch.float64, objective=objective)
    x = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    y = model(x)
    q = torch.einsum("bnf,fhd->bnhd", x, model.WQ).reshape(2, 5, 2, 2, 2)
    k, v = torch.einsum("bmf,fgd->bmgd", x, model.WK), torch.einsum("bmf,fge->bmge", x, model.WV)
    expected = torch.einsum("bgrnm,bmge->bngre", torch.einsum("bngrd,bmgd->bgrnm", q, k).softmax(-1), v)
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)
    weights = torch.randn_like(y)
    (gradient,) = torch.autograd.grad((y * weights).sum(), x)
    (expected_gradient,) = torch.autograd.grad((expected * weights).sum(), x)
    torch.testing.assert_close(gradient, expected_gradient, rtol=1e-12, atol=1e-12)


def test_a_causal_product_whose_key_side_varies_only_through_its_mask_is_not_chunked():
    # causal(n, m) X[f] / (1 + exp(max_m W1[m h n])): no factor but the mask reads m, so the state of
    # a chunk has no chunk leg; the chunked order indexed it anyway (ValueError while planning)
    text = (
        "design key_side_constant\nsize N = 3, F = 3, H = 3\ninput X[f: F]\n"
        "param W1[m: N, h: H, n: N] = normal(std = 0.5)\n"
        "T0[f] = causal(n, m) X[f] / (1 + exp(max[m, mask = causal(n, m)](W1[m h n])))\noutput T0\n"
    )
    design = tdiag.loads(text)
    reference = design.module(impl="reference", dtype=torch.float64)
    m = module(text, "compiled")
    m.load_state_dict(reference.state_dict())
    x = torch.randn(2, 3, dtype=torch.float64)
    torch.testing.assert_close(m(x), reference(x), rtol=0, atol=1e-12)


def test_with_causal_mask_names_the_query_leg_where_a_statement_has_none():
    # Mamba-2's SSD with one key leg renamed (Bm[mclass s]): a statement holding key legs but no
    # query leg; the refusal's message took its query leg from an empty set (ValueError)
    text = (DESIGNS / "mamba2_ssd.td").read_text().replace("Bm[m s] dt[m h]", "Bm[mclass s] dt[m h]")
    assert "mclass" in text
    compile(tdiag.loads(text).source(N=8), "<generated>", "exec")


SEAMS = Path(__file__).resolve().parent.parent / "docs" / "results" / "fuzz" / "seams"
SEAMS_CAUSAL_AS_WRITTEN = {  # the README's "causal as written" column
    "a_key_reads_length",
    "b_layer_norm_step",
    "c_strict_causal",
    "f_strict_as_written",
    "g_decay_statement",
}


def _seam(name: str) -> str:
    return (SEAMS / f"{name}.td").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(p.stem for p in SEAMS.glob("*.td")))
def test_each_seam_the_fuzzer_found_runs_like_the_reference_and_decodes_as_its_causal_forward(name):
    # docs/results/fuzz/seams/README.md: what each did at 4beff5d (a stale cache, an assertion, a
    # float reshape, two wrong refusals); run as the fuzzer runs it, a mismatch or a crash raises
    outcome = run_design(_seam(name), {"N": 4}, decode=True, causal=name in SEAMS_CAUSAL_AS_WRITTEN)
    if name == "d_split":  # a reshape of the positions and no attention: it runs, with nothing to mask
        assert outcome.startswith("no causal form") and "has no attention over leg 'm'" in outcome, outcome
    else:
        assert outcome.startswith("decoded as"), outcome


def test_a_decay_matrix_written_as_its_own_statement_decodes_from_a_state():
    assert run_design(_seam("g_decay_statement"), {"N": 4}, decode=True, causal=True) == "decoded as state"
