"""The language constructs of issue 13, each compiled and checked against its own definition
written here in torch (float64, 1e-10) and against the reference evaluator: constants anywhere
(numbers, size formulas and constant tensors in sums, products and maps), the common maps, a
box scale that is a parameter expression, and masks for any attention."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import tdiag
from tdiag import TdiagError

F64 = torch.float64
N = 5

PREFIX = """design t
size F = 4, H = 2, D = 3
size N
input X[n: N, f: F]
"""


def load(body: str, **sizes: int) -> tdiag.Design:
    return tdiag.loads(PREFIX + body, "t.td", **sizes)


def x_input(*batch: int, n: int = N, f: int = 4, seed: int = 1, positive: bool = False) -> torch.Tensor:
    x = torch.randn(*batch, n, f, dtype=F64, generator=torch.Generator().manual_seed(seed))
    return x.abs() + 0.1 if positive else x


def run_both(design: tdiag.Design, *inputs: torch.Tensor, **masks: torch.Tensor):
    """(compiled output, reference output, compiled module) for the same seed."""
    compiled = design.module(N=N, dtype=F64)
    reference = design.module(N=N, dtype=F64, impl="reference")
    return compiled(*inputs, **masks), reference(*inputs, **masks), compiled


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


# ---- constants anywhere -------------------------------------------------------------------


def test_a_box_scale_juxtaposed_and_divided_is_the_per_head_temperature_over_sqrt_d():
    """Issue 39: `scale = s[h] log(N) / sqrt(D)` (a learned per-head temperature times log N, as
    length-scaled attention writes it) inside the box's brackets; the hand-written softmax."""
    design = load(
        "param s[h: H] = normal(std = 1)\n"
        "param WQ[f: F, h: H, d: D] = normal(std = 0.5)\n"
        "param WK[f: F, h: H, d: D] = normal(std = 0.5)\n"
        "Q[n h d] = X[n f] WQ[f h d]\nK[m h d] = X[m f] WK[f h d]\n"
        "A[h n m] = softmax[m, scale = s[h] log(N) / sqrt(D)](Q[n h d] K[m h d])\noutput A"
    )
    x = x_input(2)
    compiled, reference, module = run_both(design, x)
    weights = dict(module.named_parameters())
    q, k = (torch.einsum("bnf,fhd->bhnd", x, weights[w]) for w in ("WQ", "WK"))
    scale = weights["s"][:, None, None] * math.log(N) / math.sqrt(3)
    expected = (scale * q @ k.transpose(-1, -2)).softmax(-1)
    close(compiled, expected)
    close(reference, expected)


def test_a_number_subtracted_from_a_tensor_compiles():
    design = load("Y[n f] = X[n f] - 2\noutput Y")
    x = x_input(2)
    compiled, reference, _ = run_both(design, x)
    close(compiled, x - 2)
    close(reference, x - 2)


def test_one_over_one_plus_exp_is_the_logistic_function():
    design = load("Y[n f] = 1 / (1 + exp(-X[n f]))\noutput Y")
    x = x_input(3)
    compiled, reference, _ = run_both(design, x)
    close(compiled, torch.sigmoid(x))
    close(reference, torch.sigmoid(x))


def test_a_run_time_size_formula_in_a_sum_is_evaluated_at_the_run_time_size():
    design = load("Y[n f] = X[n f] - log(N)\noutput Y")
    for n in (3, 7):
        x = x_input(2, n=n)
        close(design.module(dtype=F64)(x), x - math.log(n))


def test_a_leg_less_parameter_plus_a_number_scales_a_tensor():
    design = load("param lam[] = fill(0.25)\nY[n f] = X[n f] (lam[] + 0.8)\noutput Y")
    x = x_input(2)
    compiled, reference, _ = run_both(design, x)
    close(compiled, x * 1.05)
    close(reference, x * 1.05)


def test_an_rms_norm_with_its_epsilon_compiles():
    design = load("Y[n c] = X[n c] (mean[c](X[n c] ^ 2) + 1e-5) ^ -0.5\noutput Y")
    x = x_input(2)
    expected = x * (x.pow(2).mean(-1, keepdim=True) + 1e-5).rsqrt()
    compiled, reference, _ = run_both(design, x)
    close(compiled, expected)
    close(reference, expected)


def test_an_all_ones_constant_term_is_added_not_dropped():
    design = load("const J[n: N, f: F] = ones\nY[n f] = X[n f] + J[n f]\noutput Y")
    x = x_input(2)
    compiled, reference, _ = run_both(design, x)
    close(compiled, x + 1)
    close(reference, x + 1)


def test_a_leg_only_an_all_ones_constant_carries_is_summed_to_its_size():
    design = load("const J[f: F, g: D] = ones\nY[n f] = X[n f] J[f g]\noutput Y")
    x = x_input(2)
    compiled, reference, _ = run_both(design, x)
    close(compiled, 3 * x)
    close(reference, 3 * x)


def test_a_statement_of_parameters_only_is_a_parameter_derived_scalar():
    """Differential attention's λ = exp(λq1·λk1) − exp(λq2·λk2) + λ_init (Ye et al. 2024, eq. 2)."""
    design = load(
        "param a[d: D]\nparam b[d: D]\nlam[] = exp(a[d] b[d]) - exp(b[d] b[d]) + 0.8\nY[n f] = lam[] X[n f]\noutput Y"
    )
    x = x_input(2)
    compiled, reference, module = run_both(design, x)
    a, b = module.a.detach(), module.b.detach()
    lam = torch.exp(a @ b) - torch.exp(b @ b) + 0.8
    close(compiled, lam * x)
    close(reference, lam * x)
    compiled.sum().backward()
    assert module.a.grad is not None and module.b.grad is not None


def test_a_statement_of_numbers_and_sizes_only_compiles():
    design = load("c[] = 2 + log(N)\nY[n f] = c[] X[n f] - c[]\noutput Y")
    x = x_input(2)
    c = 2 + math.log(N)
    compiled, reference, _ = run_both(design, x)
    close(compiled, c * x - c)
    close(reference, c * x - c)


def test_the_standalone_file_computes_a_size_formula_with_the_standard_library(tmp_path):
    design = load("Y[n f] = X[n f] - log(N)\noutput Y")
    namespace: dict = {}
    exec(compile(design.source(N=N), "generated.py", "exec"), namespace)
    module = namespace["T"](dtype=F64)
    x = x_input(2, n=6)
    close(module(x), x - math.log(6))


# ---- the common maps ----------------------------------------------------------------------

MAPS = {
    "sigmoid": lambda x: 1 / (1 + torch.exp(-x)),
    "tanh": lambda x: (torch.exp(x) - torch.exp(-x)) / (torch.exp(x) + torch.exp(-x)),
    "softplus": lambda x: torch.log1p(torch.exp(x)),
    "silu": lambda x: x / (1 + torch.exp(-x)),
    "gelu": lambda x: x / 2 * (1 + torch.erf(x / math.sqrt(2))),
    "sin": torch.sin,
    "cos": torch.cos,
    "sqrt": lambda x: x**0.5,
    "abs": lambda x: torch.where(x < 0, -x, x),
}


@pytest.mark.parametrize("name", sorted(MAPS))
def test_a_map_compiles_to_its_definition(name):
    design = load(f"Y[n f] = {name}(X[n f])\noutput Y")
    x = x_input(2, positive=name == "sqrt")
    compiled, reference, _ = run_both(design, x)
    close(compiled, MAPS[name](x))
    close(reference, MAPS[name](x))


@pytest.mark.parametrize("name", sorted(MAPS))
def test_a_map_of_a_number_is_folded_into_a_number(name):
    design = load(f"Y[n f] = X[n f] {name}(0.5)\noutput Y")
    x = x_input(2)
    compiled, _, _ = run_both(design, x)
    close(compiled, x * MAPS[name](torch.tensor(0.5, dtype=F64)))


@pytest.mark.parametrize("name", sorted(MAPS))
def test_a_map_counts_one_elementwise_operation_per_element_and_no_flops(name):
    cost = load(f"Y[n f] = {name}(X[n f])\noutput Y").cost(N=N)
    assert cost.flops == 0
    assert cost.at()["elementwise"] == N * 4


def test_sqrt_of_a_tensor_equals_its_power_one_half():
    x = x_input(2, positive=True)
    root, _, _ = run_both(load("Y[n f] = sqrt(X[n f])\noutput Y"), x)
    power, _, _ = run_both(load("Y[n f] = X[n f] ^ 0.5\noutput Y"), x)
    close(root, power)


def test_a_map_is_drawn_with_its_name():
    assert "GELU" in load("Y[n f] = gelu(X[n f])\noutput Y").dot()


# ---- a box scale that is a parameter expression -------------------------------------------

ATTENTION = """size E = 6
param WQ[f: F, h: H, d: D]
param WK[f: F, h: H, d: D]
param WV[f: F, h: H, e: D]
param WO[h: H, e: D, g: F]
Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
"""


def heads(module, x):
    """q, k, v per head [..., h, n, d] from the module's own projections."""
    q = torch.einsum("...nf,fhd->...hnd", x, module.WQ)
    k = torch.einsum("...mf,fhd->...hmd", x, module.WK)
    v = torch.einsum("...mf,fhe->...hme", x, module.WV)
    return q, k, v


def out(module, a, v):
    return torch.einsum("...hnm,...hme,heg->...ng", a, v, module.WO)


def test_a_per_head_temperature_scales_each_heads_logits():
    design = load(
        ATTENTION
        + "param t[h: H] = uniform(low = 1, high = 3)\n"
        + "A[h n m] = softmax[m, scale = t[h]](Q[n h d] K[m h d])\nY[n g] = A[h n m] V[m h e] WO[h e g]\noutput Y"
    )
    x = x_input(2)
    compiled, reference, module = run_both(design, x)
    q, k, v = heads(module, x)
    a = (module.t[:, None, None] * q @ k.transpose(-1, -2)).softmax(-1)
    close(compiled, out(module, a, v))
    close(reference, out(module, a, v))


def test_a_scale_over_a_leg_the_box_lacks_is_an_error_at_its_position():
    with pytest.raises(TdiagError) as error:
        load(ATTENTION + "param t[k: H]\nA[h n m] = softmax[m, scale = t[k]](Q[n h d] K[m h d])\noutput A")
    text = str(error.value)
    assert "t.td:14:" in text and "scale leg 'k' is not a leg of the softmax box" in text


# ---- masks for any attention --------------------------------------------------------------


def causal(n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril()


def test_a_causal_mask_on_a_relu_map_zeroes_the_future():
    design = load(
        ATTENTION
        + "A[h n m] = relu[m, mask = causal(n, m)](Q[n h d] K[m h d])\nY[n g] = A[h n m] V[m h e] WO[h e g]\noutput Y"
    )
    x = x_input(2)
    compiled, reference, module = run_both(design, x)
    q, k, v = heads(module, x)
    a = torch.relu(q @ k.transpose(-1, -2)) * causal(N)
    close(compiled, out(module, a, v))
    close(reference, out(module, a, v))


def test_a_padding_mask_on_a_map_zeroes_the_padded_keys():
    design = load(
        ATTENTION
        + "mask pad[m: N]\nA[h n m] = sigmoid[m, mask = pad[m]](Q[n h d] K[m h d])\n"
        + "Y[n g] = A[h n m] V[m h e] WO[h e g]\noutput Y"
    )
    x = x_input(2)
    pad = torch.tensor([[True, True, True, False, False], [True, True, True, True, True]])
    compiled, reference, module = run_both(design, x, pad=pad)
    q, k, v = heads(module, x)
    a = torch.sigmoid(q @ k.transpose(-1, -2)) * pad[:, None, None, :]
    close(compiled, out(module, a, v))
    close(reference, out(module, a, v))


def test_a_mask_input_used_as_a_factor_zeroes_what_it_hides():
    design = load(ATTENTION + "mask P[n: N, m: N]\nY[n g] = P[n m] Q[n h d] K[m h d] V[m h e] WO[h e g]\noutput Y")
    x = x_input(2)
    hidden = torch.rand(2, N, N, generator=torch.Generator().manual_seed(3)) > 0.4
    compiled, reference, module = run_both(design, x, P=hidden)
    q, k, v = heads(module, x)
    a = (q @ k.transpose(-1, -2)) * hidden[:, None]
    close(compiled, out(module, a, v))
    close(reference, out(module, a, v))


def test_causal_as_a_factor_is_one_on_and_below_the_diagonal():
    design = load(ATTENTION + "Y[n g] = causal(n, m) Q[n h d] K[m h d] V[m h e] WO[h e g]\noutput Y")
    x = x_input(2)
    compiled, reference, module = run_both(design, x)
    q, k, v = heads(module, x)
    a = (q @ k.transpose(-1, -2)) * causal(N)
    close(compiled, out(module, a, v))
    close(reference, out(module, a, v))


UNNORMALIZED = {
    "sigmoid": (
        "A[h n m] = sigmoid(Q[n h d] K[m h d])\nY[n g] = A[h n m] V[m h e] WO[h e g]",
        lambda q, k: torch.sigmoid(q @ k.transpose(-1, -2)),
    ),
    "linear": (
        "Y[n g] = relu(Q[n h d]) relu(K[m h d]) V[m h e] WO[h e g]",
        lambda q, k: torch.relu(q) @ torch.relu(k).transpose(-1, -2),
    ),
    "relu2": (
        "A[h n m] = relu(Q[n h d] K[m h d]) ^ 2\nY[n g] = A[h n m] V[m h e] WO[h e g]",
        lambda q, k: torch.relu(q @ k.transpose(-1, -2)) ** 2,
    ),
}


@pytest.mark.parametrize("name", sorted(UNNORMALIZED))
def test_with_causal_mask_zeroes_the_future_of_an_unnormalized_attention(name):
    text, scores = UNNORMALIZED[name]
    masked = load(ATTENTION + text + "\noutput Y").with_causal_mask()
    x = x_input(2)
    compiled, reference, module = run_both(masked, x)
    q, k, v = heads(module, x)
    expected = out(module, scores(q, k) * causal(N), v)
    close(compiled, expected)
    close(reference, expected)


def test_with_causal_mask_does_not_mask_twice_behind_a_masked_box():
    design = load(
        ATTENTION + "A[h n m] = softmax[m](Q[n h d] K[m h d])\nY[n g] = A[h n m] V[m h e] WO[h e g]\noutput Y"
    )
    text = design.with_causal_mask().show()
    assert text.count("causal(n, m)") == 1
    assert "masks causal(n, m)" in text


def test_with_causal_mask_masks_a_sum_over_a_key_axis_named_by_another_leg():
    written_out = "S[h n m] = exp(Q[n h d] K[m h d])\nA[h n m] = S[h n m] / S[h n k]\n"
    design = load(ATTENTION + written_out + "Y[n g] = A[h n m] V[m h e] WO[h e g]\noutput Y").with_causal_mask()
    x = x_input(2)
    compiled, reference, module = run_both(design, x)
    q, k, v = heads(module, x)
    expected = out(module, (q @ k.transpose(-1, -2)).masked_fill(~causal(N), -math.inf).softmax(-1), v)
    close(compiled, expected)
    close(reference, expected)


def test_a_sliding_window_written_as_a_bias_equals_a_banded_mask():
    # docs/language.md: keys more than W back pushed to exp(-10^4) = 0 beside the causal mask
    window = 2
    body = (
        f"size W = {window}\n"
        "A[h n m] = softmax[m, mask = causal(n, m)](Q[n h d] K[m h d] - 10000 relu(index(n) - index(m) - W))\n"
        "Y[n g] = A[h n m] V[m h e] WO[h e g]\noutput Y"
    )
    x = x_input(2)
    compiled, reference, module = run_both(load(ATTENTION + body), x)
    q, k, v = heads(module, x)
    band = causal(N) & ~torch.ones(N, N, dtype=torch.bool).tril(-window - 1)
    expected = out(module, (q @ k.transpose(-1, -2)).masked_fill(~band, -math.inf).softmax(-1), v)
    close(compiled, expected)
    close(reference, expected)


def test_with_causal_mask_on_a_causal_design_returns_it_unchanged():
    causal_once = load(
        ATTENTION + "A[h n m] = softmax[m](Q[n h d] K[m h d])\nY[n g] = A[h n m] V[m h e] WO[h e g]\noutput Y"
    ).with_causal_mask()
    assert causal_once.with_causal_mask().source() == causal_once.source()


def test_with_causal_mask_refuses_a_factored_linear_attention_at_its_sum_over_keys():
    # Σ_m K[m] V[m] without the query leg: no causal factor can go there, every query sees every key
    design = load(ATTENTION + "KV[h d e] = K[m h d] V[m h e]\nY[n g] = Q[n h d] KV[h d e] WO[h e g]\noutput Y")
    with pytest.raises(TdiagError, match="cannot mask the sum over key leg 'm': it has no query leg 'n'") as error:
        design.with_causal_mask()
    assert "t.td:13:13" in str(error.value)


def test_with_causal_mask_refuses_a_mean_over_keys_beside_an_attention_it_would_mask():
    # the softmax box is masked, but the mean of the values over every key would reach each query
    body = (
        "A[h n m] = softmax[m](Q[n h d] K[m h d])\nVm[h e] = mean[m](V[m h e])\n"
        "Y[n g] = (A[h n m] V[m h e] - Vm[h e]) WO[h e g]\noutput Y"
    )
    with pytest.raises(TdiagError, match="cannot mask the mean over key leg 'm'") as error:
        load(ATTENTION + body).with_causal_mask()
    assert "t.td:14:11" in str(error.value)


def test_with_causal_mask_refuses_a_box_normalized_over_the_query_leg():
    body = "A[h n m] = softmax[n](Q[n h d] K[m h d])\nY[n g] = A[h n m] V[m h e] WO[h e g]\noutput Y"
    with pytest.raises(TdiagError, match="box normalized over query leg 'n': each query would see the later"):
        load(ATTENTION + body).with_causal_mask()


def test_with_causal_mask_masks_a_sum_over_another_position_leg_beside_the_query():
    # Z[n f] = Σ_l X[n c] X[l c] X[l f] is an un-normalized attention over positions l, named
    # neither m nor after a key axis: it was left unmasked, and each query saw every later token
    body = (
        "Z[n f] = X[n c] X[l c] X[l f]\nA[h n m] = softmax[m](Q[n h d] K[m h d])\n"
        "Y[n g] = A[h n m] V[m h e] WO[h e g] + Z[n g]\noutput Y"
    )
    design = load(ATTENTION + body).with_causal_mask()
    x = x_input(2)
    compiled, reference, module = run_both(design, x)
    q, k, v = heads(module, x)
    attention = out(module, (q @ k.transpose(-1, -2)).masked_fill(~causal(N), -math.inf).softmax(-1), v)
    expected = attention + ((x @ x.transpose(-1, -2)) * causal(N)) @ x
    close(compiled, expected)
    close(reference, expected)


def test_with_causal_mask_refuses_a_sum_over_another_position_leg_without_the_query():
    body = (
        "V2[m h e] = V[m h e] + X[l f] WV[f h e] / N\nA[h n m] = softmax[m](Q[n h d] K[m h d])\n"
        "Y[n g] = A[h n m] V2[m h e] WO[h e g]\noutput Y"
    )
    with pytest.raises(TdiagError, match="cannot mask the sum over key leg 'l': it has no query leg 'n'"):
        load(ATTENTION + body).with_causal_mask()


def test_with_causal_mask_refuses_a_mean_over_the_query_leg_that_drops_it():
    # a bias from the mean query reaches every query from the later ones; it was left as written
    body = (
        "qm[h d] = mean[n](Q[n h d])\nA[h n m] = softmax[m](Q[n h d] K[m h d] + qm[h d] K[m h d])\n"
        "Y[n g] = A[h n m] V[m h e] WO[h e g]\noutput Y"
    )
    with pytest.raises(TdiagError, match="cannot mask the mean over query leg 'n': each query would see the later"):
        load(ATTENTION + body).with_causal_mask()


def test_with_causal_mask_keeps_a_sum_over_key_positions_that_reads_no_input():
    # Σ_m index(m) mixes no later token: the attention beside it is masked as usual
    body = (
        "c[] = index(m) / N\nA[h n m] = softmax[m](Q[n h d] K[m h d] + c[])\n"
        "Y[n g] = A[h n m] V[m h e] WO[h e g]\noutput Y"
    )
    design = load(ATTENTION + body).with_causal_mask()
    x = x_input(2)
    compiled, reference, module = run_both(design, x)
    q, k, v = heads(module, x)
    expected = out(module, (q @ k.transpose(-1, -2)).masked_fill(~causal(N), -math.inf).softmax(-1), v)
    close(compiled, expected)
    close(reference, expected)


def test_with_causal_mask_without_an_attention_over_the_key_leg_is_an_error():
    with pytest.raises(TdiagError, match="no attention over leg 'm'"):
        load("Y[n f] = exp(X[n f])\noutput Y").with_causal_mask()


def test_a_second_input_without_batch_dims_broadcasts_over_the_batch():
    design = load(
        "input Bias[n: N, m: N]\nA[n m] = softmax[m](X[n f] X[m f] + Bias[n m])\nY[n f] = A[n m] X[m f]\noutput Y"
    )
    x, bias = x_input(3), torch.randn(N, N, dtype=F64)
    compiled, reference, _ = run_both(design, x, bias)
    expected = ((x @ x.transpose(-1, -2)) + bias).softmax(-1) @ x
    close(compiled, expected)
    close(reference, expected)


def test_a_padding_mask_on_a_normalize_box_without_eps_warns_of_empty_rows():
    body = "mask P[m: N]\nA[n m] = normalize[m, mask = P[m]](exp(X[n f] X[m f]))\nY[n f] = A[n m] X[m f]\noutput Y"
    (warning,) = load(body).warnings
    assert "0 / 0 (NaN)" in warning.message and "eps" in warning.hint
    assert not load(body.replace("mask = P[m]]", "mask = P[m], eps = 1e-6]")).warnings


def test_a_mask_without_batch_dims_broadcasts_over_the_batch():
    design = load(
        "mask P[n: N, m: N]\nA[n m] = softmax[m, mask = P[n m]](X[n f] X[m f])\nY[n f] = A[n m] X[m f]\noutput Y"
    )
    x, hidden = x_input(3), causal(N)
    compiled, reference, _ = run_both(design, x, P=hidden)
    expected = (x @ x.transpose(-1, -2)).masked_fill(~hidden, -math.inf).softmax(-1) @ x
    close(compiled, expected)
    close(reference, expected)


@pytest.mark.parametrize("objective", ["time", "flops", "memory"])
def test_a_mask_with_batch_dims_of_its_own_broadcasts_the_input_over_them(objective):
    # one sequence X[n f], a padding mask per batch element: the compiled module expanded the mask
    # to the input's batch dims (a RuntimeError) where the reference broadcast them together
    design = load("mask pad[m: N]\nA[n m] = softmax[m, mask = pad[m]](X[n f] X[m f])\nY[n f] = A[n m] X[m f]\noutput Y")
    x, pad = x_input(1), torch.tensor([[True, False, True, True, False], [False] * 5, [True] * 5])
    compiled = design.module(N=N, dtype=F64, objective=objective)(x, pad=pad[None])
    reference = design.module(N=N, dtype=F64, impl="reference")(x, pad=pad[None])
    lowest = torch.finfo(F64).min
    expected = (x @ x.transpose(-1, -2)).masked_fill(~pad[:, None, :], lowest).softmax(-1) @ x
    assert compiled.shape == (1, 3, N, 4)
    close(compiled, expected[None])
    close(reference, expected[None])


# ---- a leg summed inside a map that one factor alone carries ---------------------------------

SINK = (
    "param sink[h: H] = zeros\nS[h n m] = X[n f] X[m f] + sink[h]\n"
    "A[h n m] = exp(S[h n m]) / (exp(sink[h]) + exp(S[h n k]))\nY[n f] = A[h n m] X[m f]\noutput Y"
)


def map_sum_warnings(design: tdiag.Design) -> list:
    return [w for w in design.warnings if "inside" in w.message and "it computes" in w.message]


def test_a_leg_one_factor_carries_summed_inside_a_map_warns_with_both_readings():
    (warning,) = map_sum_warnings(load(SINK))
    assert warning.message == "exp(S[h n k]) sums k inside exp: it computes exp(Σ_k S[h n k])"
    assert warning.hint == (
        "to sum the values instead, Σ_k exp(S[h n k]), write sum[k](exp(S[h n k])); "
        "if the sum inside exp is meant, write it out: exp(sum[k](S[h n k]))"
    )
    (span,) = warning.spans
    assert (span.line, span.column, span.end_column) == (7, 54, 55)


def test_a_map_sum_warning_does_not_stop_the_design_from_compiling_as_the_rule_says():
    design = load(SINK)
    x = x_input(2)
    compiled, reference, _ = run_both(design, x)
    s = x @ x.transpose(-1, -2)
    a = s.exp() / (1 + s.sum(-1, keepdim=True).exp())  # exp(Σ_k S): the leg rule, as warned
    close(compiled, torch.einsum("bnm,bmf->bnf", 2 * a, x))
    close(reference, compiled)


def test_summing_a_map_s_values_as_the_warning_suggests_computes_the_attention_sink():
    design = load(SINK.replace("exp(S[h n k]))", "sum[k](exp(S[h n k])))"))
    assert not [w for w in design.warnings if "'k'" in w.message or " k " in w.message]
    x = x_input(2)
    compiled, reference, _ = run_both(design, x)
    s = x @ x.transpose(-1, -2)
    a = s.exp() / (1 + s.exp().sum(-1, keepdim=True))
    close(compiled, torch.einsum("bnm,bmf->bnf", 2 * a, x))
    close(reference, compiled)


@pytest.mark.parametrize(
    ("statement", "computes"),
    [
        ("Z[n] = X[n f] ^ 2", "(Σ_f X[n f]) ^ 2"),
        ("Z[n] = clamp(X[n f], -1, 1)", "clamp(Σ_f X[n f], -1, 1)"),
        ("Z[n] = relu(2 X[n f] + 1)", "relu(Σ_f (2 X[n f]) + 1)"),
        ("Z[n] = exp(P[n m] X[m f] X[n f] W[f])", "exp(Σ_m (P[n m] X[m f] X[n f] W[f]))"),
        ("Z[n] = mean[m](X[m f] X[n f] X[n g])", "mean[m](Σ_g (X[m f] X[n f] X[n g]))"),
    ],
)
def test_every_map_power_and_reduction_warns_of_a_lone_sum_saying_what_it_computes(statement, computes):
    body = f"mask P[n: N, m: N]\nparam W[f: F]\n{statement}\nY[n f] = Z[n] X[n f]\noutput Y"
    (warning,) = map_sum_warnings(load(body))
    assert warning.message.endswith(f"it computes {computes}")


@pytest.mark.parametrize(
    "statement",
    [
        "Z[n m] = elu1(X[n f] X[m f])",  # a contraction between factors: d summed inside the map
        "Z[n] = sqrt(X[n f] X[n f])",  # a norm
        "Z[n m] = exp(X[n f] X[m f])",  # nothing summed alone
        "Z[n] = exp(X[n f]) X[n f]",  # f leaves the map
        "Z[n] = relu[m, mask = causal(n, m)](X[n f] X[m f])",  # the map's key leg is summed outside it
        "Z[n] = exp(mean[f](X[n f]))",  # the reduction is written out
    ],
)
def test_a_map_whose_argument_sums_no_leg_of_a_single_factor_does_not_warn(statement):
    body = f"{statement}\nY[n f] = {'Z[n m] X[m f]' if 'Z[n m]' in statement else 'Z[n] X[n f]'}\noutput Y"
    assert not map_sum_warnings(load(body))


@pytest.mark.parametrize(
    ("statement", "values", "inside"),
    [
        (
            "Z[n] = max[m](X[m f] X[n f] X[n g])",
            "sum[g](max[m](X[m f] X[n f] X[n g]))",
            "max[m](sum[g](X[m f] X[n f] X[n g]))",
        ),
        (
            "Z[n m] = relu[m, mask = causal(n, m)](X[m g] X[n f] X[m f])",
            "sum[g](relu[m, mask = causal(n, m)](X[m g] X[n f] X[m f]))",
            "relu[m, mask = causal(n, m)](sum[g](X[m g] X[n f] X[m f]))",
        ),
        ("Z[n] = relu(2 X[n f] + 1)", "sum[f](relu(2 X[n f] + 1))", "relu(sum[f](2 X[n f]) + 1)"),
        ("Z[n] = (X[n f] + 1) ^ 2", "sum[f]((X[n f] + 1) ^ 2)", "(sum[f](X[n f]) + 1) ^ 2"),
    ],
)
def test_a_lone_sum_warning_writes_both_readings_with_sum_and_each_compiles_without_warning(statement, values, inside):
    use = "Z[n m] X[m f]" if "Z[n m]" in statement else "Z[n] X[n f]"
    (warning,) = map_sum_warnings(load(f"{statement}\nY[n f] = {use}\noutput Y"))
    assert f"write {values}; if the sum inside" in warning.hint
    assert warning.hint.endswith(f"write it out: {inside}")
    for written in (values, inside):
        design = load(f"{statement.split('=')[0]}= {written}\nY[n f] = {use}\noutput Y")
        assert design.warnings == []
        compiled, reference, _ = run_both(design, x_input(2))
        close(compiled, reference)


def test_softpick_written_with_a_sum_of_its_map_computes_softpick():
    design = load(
        "S[n m] = X[n f] X[m f]\n"
        "A[n m] = relu(exp(S[n m]) - 1) / (sum[k](abs(exp(S[n k]) - 1)) + 1e-6)\nY[n f] = A[n m] X[m f]\noutput Y"
    )
    assert design.warnings == []
    x = x_input(2)
    compiled, reference, _ = run_both(design, x)
    s = (x @ x.transpose(-1, -2)).exp() - 1
    close(compiled, (s.relu() / (s.abs().sum(-1, keepdim=True) + 1e-6)) @ x)
    close(reference, compiled)


# ---- a leg in one factor of a product: a typo, or a sum said with sum[...] ---------------------

GROUPED = """param WQ[f: F, g: H, r: H, d: D]
param WK[f: F, g: H, d: D]
param WV[f: F, g: H, e: D]
param WO[g: H, r: H, e: D, o: F]
Q[n g r d] = X[n f] WQ[f g r d]
K[m g d] = X[m f] WK[f g d]
V[m g e] = X[m f] WV[f g e]
A[g r n m] = softmax[m](Q[n g r d] K[m g d])
Y[n o] = A[g r n m] V[m g ee] WO[g r e o]
output Y"""


def lone_leg_warnings(design: tdiag.Design) -> list:
    return [w for w in design.warnings if "is summed away" in w.message]


def test_a_leg_typo_is_warned_at_each_lone_leg_guessing_the_lone_leg_of_the_other_factor():
    ee, e = lone_leg_warnings(load(GROUPED))
    assert ee.message == "leg 'ee' occurs only in V and is summed away; did you mean 'e'?"
    assert e.message == "leg 'e' occurs only in WO and is summed away; did you mean 'ee'?"
    assert [(w.spans[0].line, w.spans[0].column, w.spans[0].end_column) for w in (ee, e)] == [
        (13, 27, 29),
        (13, 38, 39),
    ]
    assert ee.severity == "warning" and ee.hint.endswith("if that is meant, write sum[ee](V[m g ee])")


def test_the_guess_prefers_a_leg_lone_in_another_factor_to_a_name_as_close_elsewhere():
    body = "param W[e2: F, e1: F]\nS[n m] = X[n f] X[m f]\nY[n e1] = S[n m] X[m e] W[e2 e1]\noutput Y"
    e, e2 = lone_leg_warnings(load(body))
    assert e.message.endswith("did you mean 'e2'?") and e2.message.endswith("did you mean 'e'?")


def test_two_lone_legs_inside_a_softmax_box_are_guessed_as_each_other_whatever_their_names():
    d, c = lone_leg_warnings(load("A[n m] = softmax[m](X[n d] X[m c])\nY[n f] = A[n m] X[m f]\noutput Y"))
    assert d.message == "leg 'd' occurs only in X and is summed away; did you mean 'c'?"
    assert c.message == "leg 'c' occurs only in X and is summed away; did you mean 'd'?"
    assert (d.spans[0].line, d.spans[0].column) == (5, 25)


def test_a_lone_sum_inside_a_map_is_warned_once_by_the_map_s_warning():
    (warning,) = load("Z[n] = exp(X[n f])\nY[n f] = Z[n] X[n f]\noutput Y").warnings
    assert warning.message == "exp(X[n f]) sums f inside exp: it computes exp(Σ_f X[n f])"


@pytest.mark.parametrize(
    "statement",
    [
        "Y[n f] = causal(n, l) X[l f]",  # a prefix sum: l joins the triangle to X
        "Y[n f] = X[n g] X[n g] X[n f]",  # a squared norm: g in two factors
        "Y[n f] = sum[g](X[n g]) X[n f]",  # the sum said
        "Y[n f] = sum[m](X[m g] X[n g] X[m f])",  # a sum over a leg two factors share, said anyway
    ],
)
def test_a_leg_that_joins_two_factors_or_a_said_sum_is_not_a_lone_leg(statement):
    assert load(f"{statement}\noutput Y").warnings == []


def test_sum_says_a_lone_sum_is_meant_and_computes_what_the_leg_rule_computes():
    said = load("Z[n] = sum[f](X[n f])\nY[n f] = Z[n] X[n f]\noutput Y")
    unsaid = load("Z[n] = X[n f]\nY[n f] = Z[n] X[n f]\noutput Y")
    assert said.warnings == [] and [w.message for w in unsaid.warnings] == [
        "leg 'f' occurs only in X and is summed away"
    ]
    x = x_input(2).requires_grad_()
    compiled, reference, _ = run_both(said, x)
    expected = x.sum(-1, keepdim=True) * x
    close(compiled, expected)
    close(reference, expected)
    (grad,) = torch.autograd.grad(compiled.square().sum(), x)
    (expected_grad,) = torch.autograd.grad(expected.square().sum(), x)
    close(grad, expected_grad)


def test_sum_of_a_map_sums_the_map_s_values_and_its_gradient_is_the_reference_s():
    design = load("Z[n] = sum[m](exp(X[n f] X[m f] / 4))\nY[n f] = X[n f] / Z[n]\noutput Y")
    assert design.warnings == []
    x = x_input(2, seed=3).requires_grad_()
    compiled, reference, _ = run_both(design, x)
    expected = x / (x @ x.transpose(-1, -2) / 4).exp().sum(-1, keepdim=True)
    close(compiled, expected)
    close(reference, expected)
    for output in (compiled, reference):
        (grad,) = torch.autograd.grad(output.sin().sum(), x)
        (expected_grad,) = torch.autograd.grad(expected.sin().sum(), x, retain_graph=True)
        close(grad, expected_grad)


def test_sum_around_a_whole_product_compiles_to_the_product_as_written():
    """designs/mgk.td says its sum over the Gaussian keys r (eq. 10) with sum[r](...): the same
    module as the bare product, which warns of r."""
    text = (Path(__file__).parent.parent / "designs" / "mgk.td").read_text(encoding="utf-8")
    said = "sum[r](A[h n m r] V[m h e] WO[h e g])"
    assert said in text
    bare = tdiag.loads(text.replace(said, "A[h n m r] V[m h e] WO[h e g]"), "mgk.td", F=8, H=2, D=4)
    annotated = tdiag.loads(text, "mgk.td", F=8, H=2, D=4)
    assert annotated.warnings == []
    assert [w.message for w in bare.warnings] == ["leg 'r' occurs only in A and is summed away"]
    # the same code; the record each file carries of its design (its .td text, for decoding) differs
    bare.origin = annotated.origin
    assert annotated.source() == bare.source()


# ---- a leg sized only by a declaration nothing uses ----------------------------------------


def test_a_leg_sized_only_by_an_unused_declaration_is_warned_at_its_use_and_the_declaration():
    design = load("const Blk[j: 2] = ones\nY[c j f] = X[(c j) f]\noutput Y")
    (warning,) = [w for w in design.warnings if "takes its size" in w.message]
    assert warning.message == "leg 'j' of Y takes its size (2) only from the unused const 'Blk'"
    use, declaration = warning.spans
    assert (use.line, use.column, declaration.line, declaration.column) == (6, 17, 5, 11)
    assert "const 'Blk' is never used" in [w.message for w in design.warnings]


@pytest.mark.parametrize(
    "body",
    [
        "param Blk[j: F] = zeros\nY[n j] = X[n j]\noutput Y",  # X's axis sizes j as well
        "const Blk[j: 2] = ones\nY[c j f] = Blk[j] X[(c j) f]\noutput Y",  # Blk is used
        "const Blk[j: 2] = ones\nZ[c j f] = X[(c j) f]\nY[n f] = X[n f]\noutput Y",  # Z is unused too
    ],
)
def test_a_leg_that_a_used_tensor_sizes_or_only_an_unused_statement_writes_is_not_warned(body):
    assert not [w for w in load(body).warnings if "takes its size" in w.message]


def test_a_product_of_many_lone_legs_is_warned_of_each_without_a_guess():
    factors = " ".join(f"X[n a{i}]" for i in range(10))
    warnings = lone_leg_warnings(load(f"Z[n] = {factors}\nY[n f] = Z[n] X[n f]\noutput Y"))
    assert len(warnings) == 10 and not any("did you mean" in w.message for w in warnings)
