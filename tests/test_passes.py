"""Each planner pass on a small design, read off the lowered program (no code is generated or
run): what it guarantees, when a rewrite applies, and why it is refused when it does not."""

import sympy
import torch

import tdiag
from tdiag.plan import reads
from tdiag.plan.program import Attention, Elementwise, Matmul, PrefixSum, Scale, Softmax
from tdiag.plan.training import eval_steps

HEADER = """
size F = 64, H = 4, D = F / H
size N
input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1)
param WK[f: F, h: H, d: D] = normal(std = 1)
param WV[f: F, h: H, e: D] = normal(std = 1)
param WO[h: H, e: D, g: F] = normal(std = 1)
"""


def plan(body: str, *, causal: bool = False, objective: str = "flops", N: int = 256):
    design = tdiag.loads("design small\n" + HEADER + body)
    return (design.with_causal_mask() if causal else design).plan(N=N, objective=objective)


def ops(plan_, kind):
    return [step.op for step in plan_.steps if isinstance(step.op, kind)]


ATTENTION = """
Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
A[h n m] = softmax[m, scale = 1 / sqrt(D)](Q[n h d] K[m h d])
Y[n g] = A[h n m] V[m h e] WO[h e g]
output Y
"""


# ---- regions and inlining --------------------------------------------------------------------


def test_a_single_use_product_is_inlined_into_its_consumer():
    steps = plan("P[n h d] = X[n f] WQ[f h d]\nY[n g] = P[n h d] WO[h d g]\noutput Y").steps
    assert "P" not in {step.out.var for step in steps}


def test_a_product_used_twice_is_computed_once():
    body = "P[n h d] = X[n f] WQ[f h d]\nS[n m h] = P[n h d] P[m h d]\nY[n g] = S[n m h] WO[h d g] P[m h d]\noutput Y"
    steps = plan(body).steps
    assert [step.out.var for step in steps].count("P") == 1


def test_a_map_of_one_tensor_under_other_leg_names_is_computed_once():
    source = tdiag.load("rope", F=64, H=4).source(calls=False)  # the plain forward alone
    assert source.count("torch.cos(") == 1 and source.count("torch.sin(") == 1


def test_a_map_over_legs_of_different_sizes_is_computed_for_each():
    body = """input Z[m: M, f: F]
Y[n m] = X[n f] Z[m f] (cos(index(n)) + cos(index(m)))
output Y"""
    design = tdiag.loads("design cross\n" + HEADER.replace("size N", "size N, M") + body)
    assert design.source(N=8, M=5).count("torch.cos(") == 2
    x, z = torch.randn(1, 8, 64, dtype=torch.float64), torch.randn(1, 5, 64, dtype=torch.float64)
    waves = torch.cos(torch.arange(8.0, dtype=torch.float64))[:, None] + torch.cos(
        torch.arange(5.0, dtype=torch.float64)
    )
    module = design.module(dtype=torch.float64)
    assert torch.allclose(module(x, z), (x @ z.transpose(1, 2)) * waves, atol=1e-12)


def test_a_position_expression_with_its_legs_swapped_is_not_taken_for_the_same():
    body = """size C = 3, R = 2 * C + 1
param Rel[h: H, r: R] = normal(std = 1)
T[h n m] = exp(Rel[h, r = clamp(m - n, -C, C) + C])
U[h m n] = exp(Rel[h, r = clamp(m - n, -C, C) + C])
Y[n m h] = X[n f] X[m f] (T[h n m] + U[h n m])
output Y"""
    design = tdiag.loads("design swapped\n" + HEADER + body)
    module = design.module(dtype=torch.float64)
    x = torch.randn(1, 6, 64, dtype=torch.float64)
    rel = module.Rel
    n = torch.arange(6)
    ahead = rel[:, (n[None, :] - n[:, None]).clamp(-3, 3) + 3].exp()  # [h, n, m]: m - n
    behind = rel[:, (n[:, None] - n[None, :]).clamp(-3, 3) + 3].exp()  # U[h m n] read at [h n m]: n - m
    gram = x[0] @ x[0].T
    assert torch.allclose(module(x)[0], (gram * (ahead + behind)).permute(1, 2, 0), atol=1e-12)


# ---- constant folding ------------------------------------------------------------------------


def test_an_identity_constant_merges_the_legs_it_joins_and_never_reaches_an_op():
    body = ATTENTION.replace(
        "Y[n g] = A[h n m] V[m h e] WO[h e g]",
        "const I[h: H, k: H] = identity()\nY[n g] = A[h n m] V[m h e] I[h k] WO[k e g]",
    )
    folded = plan(body)
    assert "I" not in {value.var for step in folded.steps for value in reads(step.op)}
    assert folded.lowered == plan(ATTENTION).lowered


def test_a_fill_constant_becomes_a_scale_of_the_smallest_operand():
    body = "const C[h: H] = fill(value = 3)\nY[n g] = X[n f] WQ[f h d] C[h] WO[h d g]\noutput Y"
    (scale,) = ops(plan(body), Scale)
    assert scale.factor == 3 and scale.x.var in ("WQ", "WO")


# ---- contraction order -----------------------------------------------------------------------


def test_the_contraction_order_contracts_the_narrow_leg_first():
    body = "size R = 2\nparam A[f: F, r: R] = normal(std = 1)\nparam Bm[r: R, g: F] = normal(std = 1)\n"
    body += "Y[n g] = X[n f] A[f r] Bm[r g]\noutput Y"
    first = ops(plan(body, N=1024), Matmul)[0]
    assert {first.a.value.var, first.b.value.var} == {"X", "A"}


# ---- SDPA: applicability and refusals ---------------------------------------------------------


def test_per_head_softmax_attention_becomes_one_sdpa():
    lowered = plan(ATTENTION)
    assert len(ops(lowered, Attention)) == 1 and not ops(lowered, Softmax)


def test_a_causal_mask_is_passed_to_sdpa_as_is_causal():
    (attention,) = ops(plan(ATTENTION, causal=True), Attention)
    assert attention.causal and attention.mask is None


def test_a_padding_mask_is_passed_to_sdpa_as_a_float_attn_mask():
    body = "mask pad[m: N]\n" + ATTENTION.replace("scale = 1 / sqrt(D)]", "scale = 1 / sqrt(D), mask = pad[m]]")
    lowered = plan(body)
    (attention,) = ops(lowered, Attention)
    assert attention.mask is not None and not attention.causal
    assert any("padding mask as attn_mask" in note for note in lowered.lowered)


def test_sdpa_is_refused_when_a_score_term_varies_along_the_queries():
    body = "param WT[f: F, h: H] = normal(std = 1)\n" + ATTENTION.replace(
        "(Q[n h d] K[m h d])", "(Q[n h d] K[m h d] + X[n f] WT[f h])"
    )
    lowered = plan(body)
    assert not ops(lowered, Attention)
    assert lowered.refused


# ---- the linear-time order of normalize boxes -------------------------------------------------


LINEAR = ATTENTION.replace(
    "softmax[m, scale = 1 / sqrt(D)](Q[n h d] K[m h d])", "normalize[m](elu1(Q[n h d]) elu1(K[m h d]))"
)


def test_a_multilinear_normalize_box_is_evaluated_in_the_linear_time_order():
    lowered = plan(LINEAR, N=1024)
    n = sympy.Symbol("N", positive=True, integer=True)
    assert any("linear-time order" in note for note in lowered.lowered)
    assert all(sympy.expand(step.flops).coeff(n, 2) == 0 for step in lowered.steps)


def test_a_normalize_box_of_an_exponential_keeps_its_box_and_says_why():
    body = LINEAR.replace("elu1(Q[n h d]) elu1(K[m h d])", "exp(Q[n h d] K[m h d])")
    lowered = plan(body)
    assert "linear-time order refused: costs more FLOPs than the materialized box" in " ".join(lowered.refused)


def test_a_normalize_box_of_a_sum_of_maps_over_both_legs_is_refused_the_linear_time_order_by_cost():
    """A sum is taken term by term (tests/test_linear_sums.py); a map of a query·key product is
    one factor over (n, m), so each term keeps its N² entries and the order saves nothing."""
    body = LINEAR.replace("elu1(Q[n h d]) elu1(K[m h d])", "relu(Q[n h d] K[m h d]) + relu(K[n h d] K[m h d])")
    lowered = plan(body)
    assert "linear-time order refused: costs more FLOPs than the materialized box" in " ".join(lowered.refused)


def test_a_causal_linear_box_takes_chunked_prefix_sums_at_length():
    lowered = plan(LINEAR, causal=True, N=4096)
    assert ops(lowered, PrefixSum) and any("causal prefix sums" in note for note in lowered.lowered)


# ---- train-mode noise ------------------------------------------------------------------------

NOISY = ATTENTION.replace(
    "A[h n m] = softmax[m, scale = 1 / sqrt(D)](Q[n h d] K[m h d])",
    "param sigma[h: H] = fill(0.1)\nrandom eps[h: H, n: N, m: N] = normal(mode = train)\n"
    "A[h n m] = softmax[m, scale = 1 / sqrt(D)](Q[n h d] K[m h d] + sigma[h] eps[h n m])",
)


def _reads_var(steps, var):
    return [step for step in steps if var in {v.var for v in reads(step.op)}]


def test_train_mode_noise_and_its_products_are_not_in_the_eval_program():
    lowered = plan(NOISY)
    eps = lowered.names["eps"]
    evaluated = eval_steps(lowered)
    assert _reads_var(lowered.steps, eps)  # the training program draws and scales it
    assert not _reads_var(evaluated, eps) and not _reads_var(evaluated, "sigma")
    assert eps in lowered.training_noise
    assert len(evaluated) < len(lowered.steps)


def test_a_sum_with_a_noise_term_keeps_its_other_terms_in_eval_mode():
    lowered = plan(NOISY)
    (total,) = [s for s in lowered.steps if isinstance(s.op, Elementwise)]
    assert total.eval_op is not None and not total.training_only
    kept = {v.var for v in reads(total.eval_op)}
    assert kept and not kept & {s.out.var for s in lowered.steps if s.training_only}


def test_noise_an_eval_op_reads_whole_is_still_zeros_there():
    body = NOISY.replace("sigma[h] eps[h n m]", "exp(eps[h n m])")
    lowered = plan(body)
    assert not lowered.training_noise and not any(s.training_only for s in lowered.steps)


def test_always_on_noise_runs_in_eval_mode_too():
    lowered = plan(NOISY.replace("mode = train", "mode = always"))
    assert eval_steps(lowered) == lowered.steps and not lowered.training_noise


def test_plan_table_names_the_steps_that_run_in_training_only():
    table = str(plan(NOISY))
    assert "training only" in table and "eval mode drops its noise terms" in table
