"""Arithmetic on constant tensors as production model code writes it (issue 24): a number or size
raised to a tensor (`Theta ^ (-2 index(p, P) / D)`, HF's 1 / base ^ (arange / dim)), an elementwise
bound `max(x, c)` / `min(x, c)` of a tensor by a number or size (Llama 3's piecewise frequencies),
the number `pi`, `floor` and `ceil` of numbers and sizes (YaRN's correction range, Phi's
int(head_dim · factor)), and `rsqrt(x)` (x ^ -0.5, as HF writes its RMS norms). Each is computed by the
compiled module and by the reference evaluator and compared with the same formula in torch; bad
uses get positioned errors (tests/errors/)."""

from __future__ import annotations

import math

import pytest
import torch

import tdiag
from tdiag import TdiagError
from tdiag.plan.program import Fill, reads

F64 = torch.float64
N = 5

FREQUENCIES = """
design frequencies
size F = 8, P = 4, Theta = 10000
size N
input X[n: N, f: F]
param W[p: P, g: F] = normal(std = 1)
theta[p] = {frequency}
Y[n g]   = X[n g] + index(n) theta[p] W[p g]
output Y
"""

P, F, THETA = 4, 8, 10000
ARANGE = torch.arange(P, dtype=F64)
WRITTEN = {  # the frequency as written: the same in torch
    "size_to_a_tensor": ("Theta ^ (-2 index(p, P) / F)", THETA ** (-2 * ARANGE / F)),
    "number_to_a_tensor_as_a_divisor": ("1 / 10000 ^ (2 index(p, P) / F)", 1 / 10000 ** (2 * ARANGE / F)),
    "max_with_a_number": ("max(index(p, P) - 1.5, 0.25)", (ARANGE - 1.5).clamp(min=0.25)),
    "min_with_a_size_first": ("min(P / 2, index(p, P))", ARANGE.clamp(max=P / 2)),
    "min_of_max": ("min(max(2 index(p, P) - 3, -1), 2)", (2 * ARANGE - 3).clamp(-1, 2)),
    "floor_and_ceil_of_numbers": (
        "clamp((index(p, P) - floor(F * log(2.5))) / (ceil(2.2) - floor(1.5)), 0, 1)",
        ((ARANGE - math.floor(F * math.log(2.5))) / (3 - 1)).clamp(0, 1),
    ),
    "rsqrt": ("rsqrt(index(p, P) + 1)", (ARANGE + 1).rsqrt()),
    "pi": ("2 * pi / (index(p, P) + 1)", 2 * math.pi / (ARANGE + 1)),
}


@pytest.mark.parametrize("impl", ["module", "reference"])
@pytest.mark.parametrize("name", WRITTEN)
def test_frequency_computes_as_written(name: str, impl: str):
    text, theta = WRITTEN[name]
    design = tdiag.loads(FREQUENCIES.format(frequency=text))
    module = design.module(dtype=F64, seed=3, **({} if impl == "module" else {"impl": "reference"}))
    x = torch.randn(2, N, F, dtype=F64, generator=torch.Generator().manual_seed(0))
    expected = x + torch.arange(N, dtype=F64)[:, None] * (theta @ module.W.detach())
    with torch.no_grad():
        torch.testing.assert_close(module(x), expected, rtol=1e-12, atol=1e-12)


def test_a_size_may_be_the_floor_of_a_real_formula():
    """Phi's rotary_ndims = int(head_dim · partial_rotary_factor)."""
    design = tdiag.loads(
        FREQUENCIES.replace("Theta = 10000", "Theta = 10000, Dr = floor(F * 0.4)").format(frequency="Dr index(p, P)")
    )
    assert design.size_values["Dr"] == 3


def test_a_declared_size_named_pi_is_that_size():
    design = tdiag.loads(
        FREQUENCIES.replace("Theta = 10000", "Theta = 10000, pi = 3").format(frequency="pi + 0 index(p, P)")
    )
    module = design.module(dtype=F64, seed=3)
    x = torch.zeros(1, N, F, dtype=F64)
    with torch.no_grad():
        expected = torch.arange(N, dtype=F64)[:, None] * (3 * torch.ones(P, dtype=F64) @ module.W)
        torch.testing.assert_close(module(x)[0], expected, rtol=1e-12, atol=1e-12)


QK_NORM = """
design qk_norm
size F = 8, H = 2, D = F / H
size N
input X[n: N, f: F]
param W[f: F, h: H, d: D] = normal(std = 1)
Q[n h d] = X[n f] W[f h d]
R[n h d] = {norm}
A[h n m] = softmax[m](R[n h d] R[m h d])
Y[n f]   = A[h n m] Q[m h d] W[f h d]
output Y
"""


@pytest.mark.parametrize("n", [3, 9])
def test_a_bound_of_sizes_is_a_number_at_the_run_time_length(n: int):
    """Dynamic NTK's base grows with the length past a trained one: Theta · max(N / 6, 1) here."""
    design = tdiag.loads(FREQUENCIES.format(frequency="(Theta max(N / 6, 1)) ^ (-2 index(p, P) / F)"))
    module = design.module(dtype=F64, seed=3)
    x = torch.zeros(1, n, F, dtype=F64)
    theta = (THETA * max(n / 6, 1)) ** (-2 * ARANGE / F)
    with torch.no_grad():
        expected = torch.arange(n, dtype=F64)[:, None] * (theta @ module.W)
        torch.testing.assert_close(module(x)[0], expected, rtol=1e-12, atol=1e-12)


def test_an_rms_norm_with_rsqrt_is_the_power_minus_a_half():
    norms = ("Q[n h d] rsqrt(mean[d](Q[n h d] ^ 2) + 1e-6)", "Q[n h d] (mean[d](Q[n h d] ^ 2) + 1e-6) ^ -0.5")
    modules = [tdiag.loads(QK_NORM.format(norm=norm)).module(dtype=F64, seed=3) for norm in norms]
    x = torch.randn(2, N, F, dtype=F64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(modules[0](x), modules[1](x))


def test_a_bound_is_shown_as_written():
    design = tdiag.loads(FREQUENCIES.format(frequency="min(max(index(p, P), 1), 2)"))
    assert "min(max(" in design.show()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("max(W[p g], W[p g])", "max(a, b) takes a tensor and a number or size, got two tensors"),
        ("0 ^ index(p, P)", "the base of a power with a tensor exponent must be positive, got 0"),
    ],
)
def test_bad_frequency_arithmetic_is_refused_at_its_position(text: str, message: str):
    with pytest.raises(TdiagError) as error:
        tdiag.loads(FREQUENCIES.format(frequency=text))
    assert message in str(error.value) and ":7:12:" in str(error.value)


SCALARS = """
design scalars
size F = 8, P = 4, Lo = 1
size N
input X[n: N, f: F]
param W[p: P, g: F] = normal(std = 1)
lo[]     = floor(2.5)
hi[]     = ceil(4.5)
theta[p] = clamp((index(p, P) - lo[]) / (hi[] - lo[]), 0, 1) - Lo + (1 - index(p, P))
Y[n g]   = X[n g] + index(n) theta[p] W[p g]
output Y
"""


def test_a_scalar_statement_folded_into_its_uses_leaves_no_step():
    """`hi[]` is read only inside `hi[] - lo[]`, a number: no step computes it unread."""
    plan = tdiag.loads(SCALARS).plan()
    read = {value.var for step in plan.steps for value in reads(step.op)} | {v.var for _, v in plan.outputs}
    assert all(step.out.var in read for step in plan.steps if step.out is not None)


def test_one_constant_step_per_number_whatever_it_is_written_as():
    """The size Lo = 1 and the number 1 are one constant."""
    fills = [step for step in tdiag.loads(SCALARS).plan().steps if isinstance(step.op, Fill)]
    values = [step.op.value for step in fills]
    assert len(values) == len(set(values))


def test_scalar_statements_compute_as_written():
    design = tdiag.loads(SCALARS)
    module = design.module(dtype=F64, seed=3)
    x = torch.zeros(1, N, F, dtype=F64)
    theta = ((ARANGE - 2) / (5 - 2)).clamp(0, 1) - 1 + (1 - ARANGE)
    with torch.no_grad():
        expected = torch.arange(N, dtype=F64)[:, None] * (theta @ module.W)
        torch.testing.assert_close(module(x)[0], expected, rtol=1e-12, atol=1e-12)
