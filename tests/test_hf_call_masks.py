"""The compiled llama design called with Hugging Face's own masks (docs/module.md): HF's 4-D float
attention_mask [batch, 1, queries, keys] (0 = attend, the dtype's lowest = hidden; causal and
padding in one) given as attn_mask equals LlamaAttention given that mask, in float64; a bool
key_padding_mask with is_causal gives the same; and a mask per head [batch, heads, queries, keys]
(grouped-query attention's heads g r) equals LlamaAttention given it."""

from __future__ import annotations

import pytest
import torch

import tdiag

transformers = pytest.importorskip("transformers")

from hf_support import assert_equal64, load_into, plain_or_causal_mask, rope_cos_sin  # noqa: E402
from test_hf_models import (  # noqa: E402
    BATCH,
    F64,
    D,
    N,
    compiled,
    llama,
    projections,
    set_causal,
    x_input,
)

SIZES = (("F", 64), ("H", 4), ("G", 2))


def _padded_causal_mask() -> tuple[torch.Tensor, torch.Tensor]:
    """HF's float mask [batch, 1, N, N] of a causal model whose second sequence's last 4 tokens are
    padding (hidden as keys; their own rows computed, as HF computes them), and that padding as
    nn.MultiheadAttention's key_padding_mask (True = ignore)."""
    ignore = torch.zeros(BATCH, N, dtype=torch.bool)
    ignore[1, -4:] = True
    lowest = torch.finfo(F64).min
    mask = plain_or_causal_mask(N, True).expand(BATCH, 1, N, N).masked_fill(ignore[:, None, None, :], lowest)
    return mask, ignore


@pytest.fixture(scope="module")
def loaded() -> tuple[torch.nn.Module, torch.nn.Module]:
    attn = llama()
    module = compiled("llama", False, SIZES)
    load_into(module, projections(attn))
    return attn, module


def test_llama_with_hf_float_attention_mask_equals_llama_attention(loaded):
    attn, module = loaded
    x, (mask, _) = x_input(), _padded_causal_mask()
    expected = set_causal(attn, False)(x, position_embeddings=rope_cos_sin(N, D, 10000), attention_mask=mask)[0]
    with torch.no_grad():
        assert_equal64(module(x, attn_mask=mask), expected)


def test_llama_with_key_padding_mask_and_is_causal_equals_hf_with_that_mask(loaded):
    attn, module = loaded
    x, (mask, ignore) = x_input(), _padded_causal_mask()
    expected = set_causal(attn, False)(x, position_embeddings=rope_cos_sin(N, D, 10000), attention_mask=mask)[0]
    with torch.no_grad():
        assert_equal64(module(x, key_padding_mask=ignore, is_causal=True), expected)


def test_llama_with_a_mask_per_head_equals_llama_attention(loaded):
    """HF numbers the query heads kv-head-major (head g·R + r), as the box's legs g r are read."""
    attn, module = loaded
    x = x_input()
    bias = torch.randn(BATCH, 4, N, N, dtype=F64, generator=torch.Generator().manual_seed(7))
    expected = set_causal(attn, False)(x, position_embeddings=rope_cos_sin(N, D, 10000), attention_mask=bias)[0]
    with torch.no_grad():
        assert_equal64(module(x, attn_mask=bias), expected)


@pytest.mark.parametrize("per_head", [False, True], ids=["one mask", "per head"])
def test_mistral_with_a_float_attn_mask_equals_mistral_attention_given_window_and_mask(per_head):
    """A window (mistral.td is causal as written, a sliding window) and a float mask together: the
    mask adds to the scores inside the band, as HF's attention adds its mask."""
    from test_hf_mistral import BATCH as MB
    from test_hf_mistral import THETA, W, hf_inputs, mistral, weights
    from test_hf_mistral import F as MF
    from test_hf_mistral import G as MG
    from test_hf_mistral import H as MH
    from test_hf_mistral import N as MN

    attn = mistral()
    module = tdiag.load("mistral", F=MF, H=MH, G=MG, W=W, Theta=THETA).module(N=MN, dtype=F64)
    load_into(module, weights(attn))
    x = torch.randn(MB, MN, MF, dtype=F64, generator=torch.Generator().manual_seed(1))
    shape = (MB, MH, MN, MN) if per_head else (MB, 1, MN, MN)
    bias = torch.randn(*shape, dtype=F64, generator=torch.Generator().manual_seed(8))
    embeddings, window = hf_inputs(MN)
    expected, _ = attn(x, embeddings, window + bias)
    with torch.no_grad():
        assert_equal64(module(x, attn_mask=bias), expected)
