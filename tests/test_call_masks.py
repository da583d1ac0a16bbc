"""A compiled module called like scaled_dot_product_attention and nn.MultiheadAttention: attn_mask
(bool True = attend, float added after the scale), key_padding_mask (True = ignore) and is_causal
at call time (call_plans.py, graph/call_masks.py, codegen_calls.py), against torch's own modules
on the same weights in float64; every mistake named by its argument."""

from __future__ import annotations

import pytest
import torch

import tdiag

TOL = 1e-10
F, H, N, B = 8, 2, 6, 3


@pytest.fixture(scope="module")
def mhsa() -> torch.nn.Module:
    return tdiag.load("mhsa", F=F, H=H).module(seed=0, dtype=torch.float64)


@pytest.fixture(scope="module")
def mha(mhsa) -> torch.nn.MultiheadAttention:
    """nn.MultiheadAttention with mhsa's weights: in_proj rows are (h d) per projection."""
    module = torch.nn.MultiheadAttention(F, H, bias=False, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        module.in_proj_weight.copy_(torch.cat([w.reshape(F, F).T for w in (mhsa.WQ, mhsa.WK, mhsa.WV)]))
        module.out_proj.weight.copy_(mhsa.WO.reshape(F, F).T)
    return module


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    return torch.randn(B, N, F, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def _sdpa_reference(mhsa, x, attn_mask=None, is_causal=False):
    """mhsa written with scaled_dot_product_attention (its attn_mask and is_causal as given; a
    mask of 3 axes is (batch, queries, keys), as the module takes it, given SDPA as (batch, 1, ...))."""
    if attn_mask is not None and attn_mask.dim() == 3:
        attn_mask = attn_mask[:, None]
    q, k, v = (torch.einsum("bnf,fhd->bhnd", x, w) for w in (mhsa.WQ, mhsa.WK, mhsa.WV))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
    return torch.einsum("bhne,heg->bng", out, mhsa.WO)


def _bool_mask(*shape, seed=2) -> torch.Tensor:
    """A random bool mask with every query seeing its own key (no row all hidden)."""
    mask = torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) > 0.4
    return mask | torch.eye(shape[-2], shape[-1], dtype=torch.bool)


def _float_mask(*shape, seed=3) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


# ---- against nn.MultiheadAttention and SDPA ---------------------------------------------------


def test_plain_call_equals_multihead_attention(mhsa, mha, x):
    expected, _ = mha(x, x, x, need_weights=False)
    assert torch.allclose(mhsa(x), expected, atol=TOL, rtol=0)


def test_is_causal_equals_multihead_attention_with_causal_mask(mhsa, mha, x):
    causal = torch.nn.Transformer.generate_square_subsequent_mask(N, dtype=torch.float64)
    expected, _ = mha(x, x, x, attn_mask=causal, need_weights=False)
    assert torch.allclose(mhsa(x, is_causal=True), expected, atol=TOL, rtol=0)


def test_key_padding_mask_bool_equals_multihead_attention(mhsa, mha, x):
    ignore = torch.zeros(B, N, dtype=torch.bool)
    ignore[0, 4:], ignore[2, 1] = True, True
    expected, _ = mha(x, x, x, key_padding_mask=ignore, need_weights=False)
    assert torch.allclose(mhsa(x, key_padding_mask=ignore), expected, atol=TOL, rtol=0)


def test_key_padding_mask_float_is_added_as_multihead_attention_adds_it(mhsa, mha, x):
    added = _float_mask(B, N)
    expected, _ = mha(x, x, x, key_padding_mask=added, need_weights=False)
    assert torch.allclose(mhsa(x, key_padding_mask=added), expected, atol=TOL, rtol=0)


@pytest.mark.parametrize("shape", [(N, N), (B, N, N), (B, 1, N, N), (1, N, N)], ids=str)
def test_bool_attn_mask_equals_sdpa(mhsa, x, shape):
    mask = _bool_mask(*shape)
    assert torch.allclose(mhsa(x, attn_mask=mask), _sdpa_reference(mhsa, x, mask), atol=TOL, rtol=0)


@pytest.mark.parametrize("shape", [(N, N), (B, N, N), (B, 1, N, N)], ids=str)
def test_float_attn_mask_is_added_after_the_scale_as_sdpa(mhsa, x, shape):
    bias = _float_mask(*shape)
    assert torch.allclose(mhsa(x, attn_mask=bias), _sdpa_reference(mhsa, x, bias), atol=TOL, rtol=0)


def test_attn_mask_with_is_causal_intersects(mhsa, x):
    mask = _bool_mask(N, N)
    causal = torch.ones(N, N, dtype=torch.bool).tril()
    expected = _sdpa_reference(mhsa, x, mask & causal)
    assert torch.allclose(mhsa(x, attn_mask=mask, is_causal=True), expected, atol=TOL, rtol=0)


def test_both_masks_and_is_causal_combine_as_multihead_attention(mhsa, mha, x):
    bias = _float_mask(N, N)
    ignore = torch.zeros(B, N, dtype=torch.bool)
    ignore[1, 3:] = True
    causal = torch.nn.Transformer.generate_square_subsequent_mask(N, dtype=torch.float64)
    expected, _ = mha(x, x, x, attn_mask=bias + causal, key_padding_mask=ignore, need_weights=False)
    got = mhsa(x, attn_mask=bias, key_padding_mask=ignore, is_causal=True)
    assert torch.allclose(got, expected, atol=TOL, rtol=0)


def test_bool_masks_intersect(mhsa, x):
    mask = _bool_mask(B, N, N)
    mask[:, :, 0] = True  # every query sees key 0, which no padding hides
    ignore = torch.zeros(B, N, dtype=torch.bool)
    ignore[:, -1] = True
    expected = _sdpa_reference(mhsa, x, mask & ~ignore[:, None, :])
    assert torch.allclose(mhsa(x, attn_mask=mask, key_padding_mask=ignore), expected, atol=TOL, rtol=0)
