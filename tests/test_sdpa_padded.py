"""SDPA with one head width (tdiag/plan/forms/sdpa_padded.py, issue 22): where the values are
wider or narrower than the queries and keys, q and k (or v) are zero-padded to one width so that
torch's CPU flash kernel takes the call instead of its math kernel, which stores the box. The
padded call equals the reference evaluator in values and gradients (float64), keeps no heads × N²
tensor, and is one more candidate the chooser weighs on the nominal device."""

import pytest
import torch
from conftest import gradcheck_parameters, perturbed

import tdiag
from tdiag.measure import saved_for_backward
from tdiag.plan.footprint import footprint
from tdiag.plan.forms import Unfit, only_forms
from tdiag.plan.program import Attention

TOL = 1e-10
B, N = 2, 7

# values narrower than the queries and keys (an MLA-like value head), no key bias
NARROW_VALUES = """
design narrow_values
size F = 12, H = 2, D = 6, E = 3
size N
input X[n: N, f: F]
param WQ[f: F, h: H, d: D]
param WK[f: F, h: H, d: D]
param WV[f: F, h: H, e: E]
param WO[h: H, e: E, g: F]
Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
A[h n m] = softmax[m, scale = 1 / sqrt(D)](Q[n h d] K[m h d])
Y[n g] = A[h n m] V[m h e] WO[h e g]
output Y
"""


def design(name: str, causal: bool) -> tdiag.Design:
    loaded = tdiag.loads(NARROW_VALUES) if name == "narrow_values" else tdiag.load(name, F=16, H=2)
    return loaded.with_causal_mask() if causal else loaded


def padded_module(name: str, causal: bool, n: int = N, **options):
    """The design planned with the padded form as its only fused one (a design of its own: a design
    caches its plans)."""
    with only_forms("sdpa_padded", "materialized"):
        module = design(name, causal).module(N=n, **options)
    assert set(c.taken for c in module.tdiag_plan.choices) == {"sdpa_padded"}
    return module


def attention_ops(module) -> list[Attention]:
    return [step.op for step in module.tdiag_plan.steps if isinstance(step.op, Attention)]


def x_input(n: int = N, f: int = 16) -> torch.Tensor:
    return torch.randn(B, n, f, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def test_values_wider_than_the_keys_pad_q_and_k_to_the_value_width():
    (first, second) = attention_ops(padded_module("differential_attention", False))
    assert first.pad_query_key == second.pad_query_key == 4  # D = F / (2 H) = 4, E = 2 D = 8
    assert first.pad_value == 0 and first.width is None


def test_values_narrower_than_the_keys_are_padded_and_the_output_sliced_back():
    (op,) = attention_ops(padded_module("narrow_values", False))
    assert (op.pad_value, op.width, op.pad_query_key) == (3, 3, 0)


@pytest.mark.parametrize("name", ["differential_attention", "narrow_values"])
def test_the_padded_call_runs_on_the_flash_kernel(name):
    module = padded_module(name, True, n=64)
    kernels = [r.kernel for r in footprint(module.tdiag_plan).steps if r.kernel]
    assert kernels and all(kernel == "flash" for kernel in kernels)


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("name", ["differential_attention", "narrow_values"])
def test_the_padded_call_equals_the_reference_evaluator(name, causal):
    module = padded_module(name, causal, dtype=torch.float64)
    perturbed(module)
    reference = design(name, causal).module(impl="reference", dtype=torch.float64, N=N)
    reference.load_state_dict(module.state_dict())
    x = x_input(f=12 if name == "narrow_values" else 16)
    assert torch.allclose(module(x), reference(x), atol=TOL, rtol=0)


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("name", ["differential_attention", "narrow_values"])
def test_the_padded_call_passes_gradcheck(name, causal):
    module = padded_module(name, causal, n=4, dtype=torch.float64)
    perturbed(module)
    x = x_input(4, f=12 if name == "narrow_values" else 16)[:1].requires_grad_()
    assert gradcheck_parameters(module, (x,))


def test_the_padded_call_keeps_less_for_backward_than_the_math_kernel():
    padded = padded_module("differential_attention", False, n=256)
    with only_forms("sdpa", "materialized"):
        unpadded = design("differential_attention", False).module(N=256)
    assert set(c.taken for c in unpadded.tdiag_plan.choices) == {"sdpa"}
    x = torch.randn(1, 256, 16)
    kept = [saved_for_backward(m, x).total_bytes for m in (padded, unpadded)]
    heads_by_n_squared = 2 * 256 * 256 * 4  # float32 bytes
    assert kept[1] >= 2 * heads_by_n_squared  # the math kernel keeps the scores of each box
    assert kept[0] < heads_by_n_squared / 2


def test_the_padded_form_is_refused_where_q_k_and_v_have_one_width():
    (choice,) = tdiag.load("mhsa").plan(N=64).choices
    refusal = next(c.refusal for c in choice.candidates if c.form == "sdpa_padded")
    assert isinstance(refusal, Unfit) and "one head width already" in refusal


def test_the_chooser_takes_the_padded_call_for_causal_differential_attention_at_a_long_sequence():
    plan = tdiag.load("differential_attention", F=256, H=4).with_causal_mask().plan(N=4096)
    assert [c.taken for c in plan.choices] == ["sdpa_padded", "sdpa_padded"]


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("name", ["differential_attention", "narrow_values"])
def test_the_report_keeps_what_autograd_keeps_for_the_padded_call(name, causal):
    n = 64
    with only_forms("sdpa_padded", "materialized"):
        loaded = design(name, causal)
        module = loaded.module(N=n, B=1)
        modelled = loaded.cost(objective="time", N=n, B=1).saved_bytes_at(B=1, N=n)
    assert set(c.taken for c in module.tdiag_plan.choices) == {"sdpa_padded"}
    x = torch.randn(1, n, 12 if name == "narrow_values" else 16)
    assert modelled == saved_for_backward(module, x).total_bytes
