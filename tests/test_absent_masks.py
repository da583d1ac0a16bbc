"""A design's own masks left out at call time (`m(x)` for a design declaring `mask pad[m]`): the
module runs a body planned without them (graph/absent_masks.py, codegen_calls.py), which computes
the same values as an all-True mask without building one, and keeps less for backward."""

from __future__ import annotations

import pytest
import sympy
import torch

import tdiag
from tdiag.graph.absent_masks import without_masks
from tdiag.plan.footprint import footprint

TOL = 1e-10
N, B = 7, 2

FACTOR_MASK = """design factor_mask
size F = 8, H = 2, D = 4
size N
input X[n: N, f: F]
mask pad[m: N]
param WQ[f: F, h: H, d: D]
param WK[f: F, h: H, d: D]
param WV[f: F, h: H, e: D]
A[h n m] = pad[m] softmax[m](X[n f] WQ[f h d] X[m f] WK[f h d])
Y[n h e] = A[h n m] X[m f] WV[f h e]
output Y
"""


@pytest.fixture(scope="module")
def bert() -> tdiag.Design:
    return tdiag.load("bert", F=16, H=2)


@pytest.fixture(scope="module")
def bert_module(bert) -> torch.nn.Module:
    return bert.module(seed=0, dtype=torch.float64)


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    return torch.randn(B, N, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)


def test_a_call_without_the_mask_runs_the_body_planned_without_it(bert_module, x, monkeypatch):
    calls = []
    original = type(bert_module)._tdiag_unmasked
    monkeypatch.setattr(type(bert_module), "_tdiag_unmasked", lambda self, *a: calls.append(a) or original(self, *a))
    bert_module(x)
    assert len(calls) == 1


def test_leaving_the_mask_out_equals_an_all_true_mask(bert_module, x):
    everything = torch.ones(B, N, dtype=torch.bool)
    assert torch.allclose(bert_module(x), bert_module(x, pad=everything), atol=TOL, rtol=0)


def test_leaving_the_mask_out_equals_the_reference_with_gradients(bert, bert_module, x):
    reference = bert.module(seed=0, dtype=torch.float64, impl="reference")
    got, want = bert_module(x), reference(x)
    assert torch.allclose(got, want, atol=TOL, rtol=0)
    weights = torch.randn_like(want)
    (grad_got,) = torch.autograd.grad((got * weights).sum(), x)
    (grad_want,) = torch.autograd.grad((want * weights).sum(), x)
    assert torch.allclose(grad_got, grad_want, atol=TOL, rtol=0)


def test_a_given_mask_still_hides_its_keys(bert_module, x):
    pad = torch.ones(B, N, dtype=torch.bool)
    pad[:, -2:] = False
    assert not torch.allclose(bert_module(x), bert_module(x, pad=pad))
    assert torch.allclose(bert_module(x, pad=pad)[:, :-2], bert_module(x[:, :-2]), atol=TOL, rtol=0)


def test_is_causal_without_the_mask_equals_the_causal_module(bert, bert_module, x):
    causal = bert.with_causal_mask().module(seed=0, dtype=torch.float64)
    assert torch.allclose(bert_module(x, is_causal=True), causal(x), atol=TOL, rtol=0)


def test_the_plan_without_the_mask_builds_no_mask_and_keeps_less(bert):
    masked = bert.plan({"N": 64})
    unmasked = tdiag.Design(without_masks(bert.graph), ()).plan({"N": 64})
    assert any(step.kind == "mask" for step in masked.steps)
    assert not any(step.kind == "mask" for step in unmasked.steps)
    kept = [sympy.sympify(footprint(plan).saved_bytes).subs(sympy.Symbol("B"), 1) for plan in (masked, unmasked)]
    assert kept[1] < kept[0]


def test_a_mask_read_as_a_factor_has_no_unmasked_form(tmp_path):
    path = tmp_path / "factor_mask.td"
    path.write_text(FACTOR_MASK)
    assert without_masks(tdiag.load(str(path)).graph) is None


def test_a_design_without_masks_has_no_unmasked_form():
    assert without_masks(tdiag.load("mhsa").graph) is None


def test_a_scan_masked_by_the_design_equals_it_without_the_mask():
    design = tdiag.load("forgetting_attention", F=8, H=2)
    module = design.module(seed=0, dtype=torch.float64)
    y = torch.randn(B, N, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    assert torch.allclose(module(y), module(y, pad=torch.ones(B, N, dtype=torch.bool)), atol=TOL, rtol=0)


def test_the_memory_kept_without_the_mask_is_the_unmasked_plan_s(bert):
    """What autograd keeps when the mask is left out is what the footprint model says of the plan
    without it, to the byte (the footprint sweep models that plan for the same reason)."""
    from tdiag.measure import saved_for_backward

    unmasked = tdiag.Design(without_masks(bert.graph), ())
    module = bert.module(seed=0, N=64, B=1)
    x = torch.randn(1, 64, 16)
    modelled = unmasked.cost(objective="time", N=64, B=1).saved_bytes_at(B=1, N=64)
    assert saved_for_backward(module, x).total_bytes == modelled
