"""Reductions under masks (docs/language.md, "Reductions"): max, logsumexp and mean over a masked
leg see only the visible entries, whether the mask is written on the reduction or added by
with_causal_mask; max and logsumexp see a hidden entry as the dtype's lowest number (as a softmax
box does), mean averages the visible entries (0 where none is). Each compiled module equals a
reference written here with plain torch ops, in value and gradient, in float64."""

import pytest
import torch

import tdiag

TOL = 1e-10
B, N, F = 2, 5, 4

REDUCED = """
design reduced
size F = 4
size N
input X[n: N, f: F]
mask pad[m: N]
param W[f: F, g: F]
S[n m] = X[n f] W[f g] X[m g]
Y[n] = {name}[m{mask}](S[n m])
output Y
"""

SINK = """
design sink
size F = 8, H = 2, D = F / H
size N
input X[n: N, f: F]
param WQ[f: F, h: H, d: D]
param WK[f: F, h: H, d: D]
param WV[f: F, h: H, e: D]
param WO[h: H, e: D, g: F]
param sink[h: H] = normal(std = 1)
Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
S[h n m] = Q[n h d] K[m h d] / sqrt(D)
A[h n m] = softmax[m](S[h n m]) * sigmoid(logsumexp[m](S[h n m]) - sink[h])
Y[n g] = A[h n m] V[m h e] WO[h e g]
output Y
"""


def x_input() -> torch.Tensor:
    return torch.randn(B, N, F, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


def pad_mask() -> torch.Tensor:
    """Keys 3.. hidden in the first sequence, every key hidden in the second."""
    pad = torch.ones(B, N, dtype=torch.bool)
    pad[0, 3:] = False
    pad[1] = False
    return pad


def masked_reduction(name: str, scores: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """The reduction over the last axis of the visible scores, written out."""
    visible = visible.expand(scores.shape)
    if name == "mean":
        return (scores * visible).sum(-1) / visible.sum(-1).clamp(min=1)
    filled = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
    return filled.amax(-1) if name == "max" else filled.logsumexp(-1)


def reduced_design(write_td, name: str, mask: str) -> tdiag.Design:
    written = {"causal": ", mask = causal(n, m)", "pad": ", mask = pad[m]", "added": ""}[mask]
    design = tdiag.load(write_td(REDUCED.format(name=name, mask=written), f"reduced_{name}.td"))
    return design.with_causal_mask() if mask == "added" else design


@pytest.mark.parametrize("mask", ["causal", "pad", "added"])
@pytest.mark.parametrize("name", ["max", "logsumexp", "mean"])
def test_a_reduction_over_a_masked_leg_sees_only_the_visible_entries(write_td, name, mask):
    design = reduced_design(write_td, name, mask)
    x, pad = x_input(), pad_mask()
    visible = pad[:, None, :] if mask == "pad" else torch.ones(N, N, dtype=torch.bool).tril()
    kwargs = {"pad": pad} if mask == "pad" else {}
    for impl in ("compiled", "reference"):
        module = design.module(seed=0, impl=impl, dtype=torch.float64)
        inputs = x.clone().requires_grad_()
        out = module(inputs, **kwargs)
        scores = torch.einsum("bnf,fg,bmg->bnm", inputs, module.W, inputs)
        expected = masked_reduction(name, scores, visible)
        assert torch.allclose(out, expected, atol=TOL, rtol=0), impl
        (grad,) = torch.autograd.grad(out.sum(), inputs)
        (expected_grad,) = torch.autograd.grad(expected.sum(), inputs)
        assert torch.allclose(grad, expected_grad, atol=TOL, rtol=0), impl


def test_a_masked_mean_of_a_row_with_every_entry_hidden_is_zero(write_td):
    module = reduced_design(write_td, "mean", "pad").module(seed=0, dtype=torch.float64)
    assert torch.equal(module(x_input(), pad=pad_mask())[1], torch.zeros(N, dtype=torch.float64))


def test_with_causal_mask_masks_a_reduction_over_the_key_leg(write_td):
    design = reduced_design(write_td, "logsumexp", "added")
    assert "logsumexp[m, mask = causal(n, m)]" in design.show()


def test_a_reduction_takes_only_masks_as_options(write_td):
    text = REDUCED.format(name="max", mask=", scale = 2")
    with pytest.raises(tdiag.TdiagError, match="unknown max option 'scale'"):
        tdiag.load(write_td(text, "bad.td"))


def test_a_reduction_mask_over_a_leg_its_argument_lacks_is_refused(write_td):
    text = REDUCED.format(name="max", mask=", mask = causal(f, m)")
    with pytest.raises(tdiag.TdiagError, match="causal mask leg 'f' is not a leg of the max reduction"):
        tdiag.load(write_td(text, "bad.td"))


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_sink_attention_written_with_logsumexp_equals_a_softmax_with_a_sink_logit(write_td, causal):
    """gpt-oss's attention sinks: softmax over the keys and one learned logit per head that takes
    weight but has no value; softmax(S)·σ(lse(S) − sink) is the same, causal or not."""
    design = tdiag.load(write_td(SINK, "sink.td"))
    design = design.with_causal_mask() if causal else design
    x = x_input().repeat(1, 1, 2).requires_grad_()
    for impl in ("compiled", "reference"):
        module = design.module(seed=0, impl=impl, dtype=torch.float64)
        out = module(x)
        q, k, v = (torch.einsum("bnf,fhd->bhnd", x, w) for w in (module.WQ, module.WK, module.WV))
        scores = q @ k.transpose(-1, -2) / 2
        if causal:
            scores = scores.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf"))
        sinks = module.sink[None, :, None, None].expand(B, -1, N, 1)
        weights = torch.cat([scores, sinks], -1).softmax(-1)[..., :-1]
        expected = torch.einsum("bhnm,bhme,heg->bng", weights, v, module.WO)
        assert torch.allclose(out, expected, atol=TOL, rtol=0), impl
        grads = torch.autograd.grad(out.sum(), (x, module.sink))
        expected_grads = torch.autograd.grad(expected.sum(), (x, module.sink))
        for grad, expected_grad in zip(grads, expected_grads, strict=True):
            assert torch.allclose(grad, expected_grad, atol=TOL, rtol=0), impl


def test_a_padding_mask_on_a_reduction_of_a_parameter_gives_one_result_per_sequence(write_td):
    """The parameter is the same for every sequence, the mask input is not (found by fuzzing)."""
    text = """
design reduced_parameter
size N = 3, F = 2
input X[n: N, f: F]
mask pad[m: N]
param W[m: N, f: F] = normal(std = 1)
T[f] = logsumexp[m, mask = pad[m]](W[m f])
Y[n f] = T[f] + X[n f]
output Y
"""
    design = tdiag.load(write_td(text, "reduced_parameter.td"))
    module = design.module(seed=0, dtype=torch.float64)
    x = torch.zeros(2, 3, 2, dtype=torch.float64)
    pad = torch.tensor([[True, False, True], [False, True, False]])
    out = module(x, pad=pad)
    for b in range(2):
        expected = module.W[pad[b]].logsumexp(0)
        assert torch.allclose(out[b], expected.expand(3, -1), atol=TOL, rtol=0)


def test_a_masked_mean_reads_its_mask_in_the_layout_the_planner_gives_its_input(write_td):
    """The layout pass reorders the mean's input (n f m) to (m n f); the mask follows (found by
    fuzzing: the mask was read in the old order)."""
    text = """
design moved_mean
size N = 3, F = 2
input X[n: N, f: F]
param W[n: N, f: F, m: N] = normal(std = 1)
T[n m] = causal(n, m) mean[f, mask = causal(n, m)](W[n f m] - X[n f])
Y[m] = T[n m]
output Y
"""
    design = tdiag.load(write_td(text, "moved_mean.td"))
    module = design.module(seed=0, dtype=torch.float64)
    reference = design.module(seed=0, impl="reference", dtype=torch.float64)
    x = torch.randn(2, 3, 2, dtype=torch.float64)
    assert torch.allclose(module(x), reference(x), atol=TOL, rtol=0)


HIDDEN_EVERYWHERE = """
design hidden_everywhere
size N = 3, F = 2, H = 2
input X[n: N, f: F]
param W[f: F, h: H]
S[h n m] = X[n f] W[f h] X[m g] W[g h]
Y[n m] = {name}[h, mask = causal(n, m)](S[h n m])
output Y
"""


@pytest.mark.parametrize("name", ["max", "logsumexp"])
def test_a_reduction_whose_causal_mask_hides_every_entry_gives_the_dtypes_lowest_number(name):
    # a reduction over h masked along (n, m) sees no entry where m > n: the lowest number, as the
    # docs and the reference say (compiled code filled the future with -inf, as a box does)
    design = tdiag.loads(HIDDEN_EVERYWHERE.format(name=name))
    x = torch.randn(B, 3, 2, dtype=torch.float64)
    y = design.module(dtype=torch.float64)(x)
    lowest = torch.finfo(torch.float64).min
    assert (y[:, torch.triu(torch.ones(3, 3, dtype=torch.bool), 1)] == lowest).all()
    torch.testing.assert_close(y, design.module(dtype=torch.float64, impl="reference")(x), rtol=0, atol=TOL)
