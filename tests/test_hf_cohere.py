"""designs/cohere.td and designs/cohere_qk_norm.td equal Hugging Face transformers' CohereAttention
in float64 (use_qk_norm off and on): interleaved RoPE (Cohere's rotate_half over adjacent pairs, its
cos and sin repeat_interleave'd) and, with QK-norm, a bias-free layer norm over each head's features
with a weight per head. The HF module is built from a small config with random weights (the norm
weights too); HF computes its rotary tables, the rotation and the norms in float32 even in a float64
module, so the test gives it float64 tables and runs its apply_rotary_pos_emb and CohereLayerNorm's
formula in float64. Outputs agree to 1e-10 relative, plain and causal."""

from __future__ import annotations

import functools
from unittest import mock

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from conftest import DESIGNS  # noqa: E402
from hf_support import F64, additive_mask, assert_equal64, load_into, randomized  # noqa: E402
from transformers.models.cohere import modeling_cohere  # noqa: E402

import tdiag  # noqa: E402

F, H, G, D, THETA = 32, 4, 2, 8, 10000
N, BATCH = 9, 2


class Float64CohereLayerNorm(torch.nn.Module):
    """CohereLayerNorm's formula, weight · (x − μ) / √(mean((x − μ)²) + eps) over head_dim, without
    its float32 upcast; holds the HF norm's own weight [heads, head_dim]."""

    def __init__(self, norm: torch.nn.Module) -> None:
        super().__init__()
        self.weight, self.eps = norm.weight, norm.variance_epsilon

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centred = x - x.mean(-1, keepdim=True)
        return self.weight * centred * (centred.pow(2).mean(-1, keepdim=True) + self.eps).rsqrt()


def rotary_in_input_dtype(q, k, cos, sin, unsqueeze_dim=1):
    """Cohere's apply_rotary_pos_emb without its float32 upcast."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    rotate = modeling_cohere.rotate_half
    return q * cos + rotate(q) * sin, k * cos + rotate(k) * sin


@functools.cache
def hf(qk_norm: bool) -> torch.nn.Module:
    config = modeling_cohere.CohereConfig(
        hidden_size=F,
        num_attention_heads=H,
        num_key_value_heads=G,
        use_qk_norm=qk_norm,
        rope_parameters={"rope_type": "default", "rope_theta": THETA},
        attn_implementation="sdpa",
    )
    attn = randomized(modeling_cohere.CohereAttention(config, 0))
    if qk_norm:
        attn.q_norm, attn.k_norm = Float64CohereLayerNorm(attn.q_norm), Float64CohereLayerNorm(attn.k_norm)
    return attn


def weights(attn: torch.nn.Module) -> dict[str, torch.Tensor]:
    """q/k/v/o_proj ([out, in], heads head-major) and the per-head norm weights on the design's
    legs; query head (g r) = g·R + r."""
    r = H // G
    tensors = {
        "WQ": attn.q_proj.weight.T.reshape(F, G, r, D),
        "WK": attn.k_proj.weight.T.reshape(F, G, D),
        "WV": attn.v_proj.weight.T.reshape(F, G, D),
        "WO": attn.o_proj.weight.T.reshape(G, r, D, F),
    }
    if attn.use_qk_norm:
        tensors |= {"nq": attn.q_norm.weight.view(G, r, D), "nk": attn.k_norm.weight.view(G, D)}
    return tensors


def interleaved_tables(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """CohereRotaryEmbedding's (cos, sin) [1, n, D] in float64: each frequency repeated twice,
    adjacent (repeat_interleave, where Llama concatenates)."""
    inv_freq = 1.0 / (THETA ** (torch.arange(0, D, 2, dtype=F64) / D))
    angles = torch.repeat_interleave(torch.arange(n, dtype=F64)[:, None] * inv_freq, 2, dim=-1)[None]
    return angles.cos(), angles.sin()


def test_the_float64_tables_are_hf_cohere_rotary_embedding():
    x = torch.zeros(1, N, F, dtype=F64)
    theirs = modeling_cohere.CohereRotaryEmbedding(hf(False).config)(x, torch.arange(N)[None])
    for ours, table in zip(interleaved_tables(N), theirs, strict=True):
        assert (ours - table).abs().max() < 1e-5


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("name", ["cohere", "cohere_qk_norm"])
def test_cohere_equals_hf_cohere_attention_float64(name, causal):
    attn = hf(name == "cohere_qk_norm")
    design = tdiag.load(DESIGNS / f"{name}.td", F=F, H=H, G=G)
    module = (design.with_causal_mask() if causal else design).module(dtype=F64)
    load_into(module, weights(attn))
    x = torch.randn(BATCH, N, F, dtype=F64, generator=torch.Generator().manual_seed(1))
    visible = torch.ones(N, N, dtype=torch.bool)
    mask = additive_mask(visible.tril() if causal else visible)
    with torch.no_grad(), mock.patch.object(modeling_cohere, "apply_rotary_pos_emb", rotary_in_input_dtype):
        expected = attn(x, interleaved_tables(N), mask)[0]
        assert_equal64(module(x), expected)
