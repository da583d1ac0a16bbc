"""The global-head form (tdiag/plan/global_heads.py): one SDPA over the local heads whose key
side holds the global heads side by side and is shared by every local head (fishformer spec §7
T14), values per local head. Each FiSH-family design equals its reference in value and gradient
(plain and causal, train mode with seeded noise and eval mode); the form is taken where it
applies and keeps no heads x N² tensor; each refusal says why."""

import math

import pytest
import sympy
import torch
from conftest import DESIGNS, gradcheck_parameters

import tdiag
from tdiag.measure import saved_for_backward
from tdiag.plan.program import Attention

TOL = 1e-10
B, N = 2, 5
FAMILY = ["fish", "hard_fish", "gfish", "hard_gfish", "mish", "lfish"]

# Hard FiSH (eq. 10) whose values pass through a ReLU: the ordinary SDPA match cannot take the
# input X as the values (the ReLU sits between), so only the global-head form fuses the box.
RELU_VALUES = """
design relu_values
size F = 8, H = 4, M = 2, D = F / H
size N
input X[n: N, f: F]
param WQ[f: F, k: M, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, k: M, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))
param P[k: M, h: H] = uniform(low = -1, high = 1)
Q[n k d] = X[n f] WQ[f k d]
K[m k d] = X[m f] WK[f k d]
V[m h e] = relu(X[m f] WV[f h e])
A[h n m] = softmax[m, scale = {scale}](P[k h] Q[n k d] K[m k d])
Y[n g] = A[h n m] V[m h e] WO[h e g]
output Y
"""


def family(name: str, causal: bool) -> tdiag.Design:
    design = tdiag.load(DESIGNS / f"{name}.td", F=8, H=4, M=2)
    return design.with_causal_mask() if causal else design


def relu_values(write_td, causal: bool, scale: str = "1 / sqrt(D)") -> tdiag.Design:
    design = tdiag.load(write_td(RELU_VALUES.format(scale=scale), "relu_values.td"))
    return design.with_causal_mask() if causal else design


def x_input(n: int = N) -> torch.Tensor:
    return torch.randn(B, n, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(5))


def compiled_and_reference(design: tdiag.Design, objective: str = "time", planned: int = N):
    """The compiled module planned at `planned` (it runs at any N) and the reference."""
    module = design.module(dtype=torch.float64, seed=2, N=planned, objective=objective)
    reference = design.module(impl="reference", dtype=torch.float64, N=N)
    reference.load_state_dict(module.state_dict())
    return module, reference


def value_and_gradients(module, x: torch.Tensor, seed: int) -> list[torch.Tensor]:
    module.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    torch.manual_seed(seed)
    y = module(x)
    (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape)).sum().backward()
    return [y.detach(), x.grad, *(p.grad for p in module.parameters())]


def assert_same(module, reference, x: torch.Tensor) -> None:
    """Equal values and gradients; a parameter eval mode does not reach (a noise scale) has no
    gradient in one and a zero one in the other."""
    got, want = value_and_gradients(module, x, 11), value_and_gradients(reference, x, 11)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a is not None or b is not None
        a, b = (t if t is not None else torch.zeros_like(a if b is None else b) for t in (a, b))
        assert torch.allclose(a, b, atol=TOL, rtol=0)


def global_head_ops(module) -> list[Attention]:
    steps = module.tdiag_plan.steps
    return [s.op for s in steps if isinstance(s.op, Attention) and "global-head form" in s.description]


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("name", FAMILY)
def test_fish_family_equals_its_reference_in_value_and_gradient(name, causal, mode):
    module, reference = compiled_and_reference(family(name, causal))
    module.train(mode == "train")
    reference.train(mode == "train")
    assert_same(module, reference, x_input())


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("name", ["hard_fish", "hard_gfish", "lfish"])
def test_fish_family_gradcheck(name, causal):
    module = family(name, causal).module(dtype=torch.float64, N=3)
    x = torch.randn(1, 3, 8, dtype=torch.float64, requires_grad=True)
    assert gradcheck_parameters(module, (x,))


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_global_head_form_is_taken_where_the_ordinary_match_refuses(write_td, causal):
    plan = relu_values(write_td, causal).plan(N=64, objective="memory")
    assert any("global-head form" in note for note in plan.lowered)


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_global_head_form_equals_the_reference_in_value_and_gradient(write_td, causal):
    module, reference = compiled_and_reference(relu_values(write_td, causal), objective="memory", planned=64)
    (op,) = global_head_ops(module)
    assert op.causal == causal and op.mask is None
    assert_same(module, reference, x_input())


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_global_head_form_gradcheck(write_td, causal):
    module = relu_values(write_td, causal).module(dtype=torch.float64, N=64, objective="memory")  # run at N=3
    assert global_head_ops(module)
    x = torch.randn(1, 3, 8, dtype=torch.float64, requires_grad=True)
    assert gradcheck_parameters(module, (x,))


def test_global_head_form_pads_the_values_to_the_width_of_the_global_keys(write_td):
    module = relu_values(write_td, False).module(N=64, objective="memory")
    (op,) = global_head_ops(module)
    assert (op.pad_value, op.pad_query_key, op.width) == (2, 0, 2)  # M·D = 4 against D = 2


def test_global_head_form_with_a_negative_scale_moves_the_sign_into_q(write_td):
    design = relu_values(write_td, True, scale="-1 / sqrt(D)")
    module, reference = compiled_and_reference(design, objective="memory", planned=64)
    (op,) = global_head_ops(module)
    assert op.scale > 0
    assert_same(module, reference, x_input())


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_global_head_form_keeps_no_heads_by_n_squared_tensor(write_td, causal):
    n = 64
    module = relu_values(write_td, causal).module(N=n, objective="memory")
    assert global_head_ops(module)
    saved = saved_for_backward(module, torch.randn(B, n, 8))
    assert saved.storages and max(math.prod(s.shape) for s in saved.storages) < 4 * n * n


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("fish", "random eps[k n m] on the scores"),
        ("gfish", "random eps[k n m] on the scores"),
        ("mish", "random eps[h n m] on the scores"),
        ("hard_gfish", "the scores are not one query·key product"),
        ("lfish", "no local heads: the key side carries every head"),
    ],
)
def test_plan_says_why_the_global_head_form_is_refused(name, reason):
    design = tdiag.load(DESIGNS / f"{name}.td", F=8, H=4, M=2)
    plan = design.plan(N=64, objective="flops")
    refusals = [c.refusal for choice in plan.choices for c in choice.candidates if c.form == "global_heads"]
    assert any(refusal is not None and refusal.startswith(reason) for refusal in refusals)


def test_a_padding_mask_is_refused_to_the_ordinary_match(write_td):
    text = RELU_VALUES.format(scale="1 / sqrt(D)").replace("input X[n: N, f: F]", "input X[n: N, f: F]\nmask pad[m: N]")
    text = text.replace("scale = 1 / sqrt(D)]", "scale = 1 / sqrt(D), mask = pad[m]]")
    plan = tdiag.load(write_td(text, "relu_values_padded.td")).plan(N=64, objective="memory")
    assert any("global-head form refused: a padding mask" in note for note in plan.refused)


def test_a_costlier_global_head_form_is_refused_with_the_objective(write_td):
    plan = relu_values(write_td, False).plan(N=64, objective="flops")
    assert any("global-head form refused: costs more FLOPs than the materialized box" in n for n in plan.refused)


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_hard_fish_under_memory_takes_the_global_head_form_over_the_math_kernel_fold(causal):
    plan = family("hard_fish", causal).plan(N=64, objective="memory")
    assert any("global-head form" in note for note in plan.lowered)
    if not causal:
        assert any("refused: keeps more for backward than SDPA in the global-head form" in n for n in plan.refused)


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_hard_fish_in_the_global_head_form_equals_its_reference(causal):
    module, reference = compiled_and_reference(family("hard_fish", causal), objective="memory", planned=64)
    assert global_head_ops(module)
    assert_same(module, reference, x_input())


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_hard_fish_in_the_global_head_form_keeps_what_the_footprint_predicts(causal):
    n = 64
    design = family("hard_fish", causal)
    module = design.module(N=n, B=B, objective="memory")
    assert global_head_ops(module)
    measured = saved_for_backward(module, torch.randn(B, n, 8)).total_bytes
    assert measured == design.cost(objective="memory", N=n, B=B).saved_bytes_at(N=n, B=B)


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_talking_heads_in_the_global_head_form_equals_its_reference(causal):
    """Talking heads (Shazeer et al. 2020): its softmax heads k are the local heads, the key side
    holds every key head h side by side, its values carry the weights mixing k into l."""
    design = tdiag.load(DESIGNS / "talking_heads.td", F=8, H=4)
    module, reference = compiled_and_reference(design.with_causal_mask() if causal else design, "memory", 64)
    assert global_head_ops(module)
    assert_same(module, reference, x_input())


@pytest.mark.parametrize(
    ("name", "causal"), [("kronecker", True), ("trainable_heads_only", False), ("trainable_heads_only", True)]
)
def test_other_bundled_designs_in_the_global_head_form_equal_their_reference(name, causal):
    """The designs beyond the FiSH family that take the form under memory, at their own sizes."""
    design = tdiag.load(DESIGNS / f"{name}.td")
    design = design.with_causal_mask() if causal else design
    module = design.module(dtype=torch.float64, seed=2, objective="memory")
    reference = design.module(impl="reference", dtype=torch.float64, N=N)
    reference.load_state_dict(module.state_dict())
    assert global_head_ops(module)
    width = int(design.graph.evaluate(design.graph.inputs[0].axes[-1].size))
    x = torch.randn(B, N, width, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    assert_same(module, reference, x)


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_the_global_head_form_is_credited_with_the_blocks_a_causal_kernel_skips(causal):
    plan = family("hard_fish", causal).plan(N=1024, objective="memory")
    step = next(s for s in plan.steps if "global-head form" in s.description)
    assert (step.kernel_flops is not None) == causal
    if causal:
        dense, skipping = (plan.graph.evaluate(f, **plan.sizes) for f in (step.flops, step.kernel_flops))
        assert skipping == dense * sympy.Rational(1536, 2048)
