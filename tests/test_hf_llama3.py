"""designs/llama3.td equals Hugging Face transformers' LlamaAttention with "llama3" rope scaling in
float64: the inverse frequencies rescaled piecewise by wavelength (kept, divided by the factor, or
smoothed between) are written in the design as one clamped blend. The HF module is built from a
small config with random weights and given the rotary tables of its own rope function's formula in
float64 (HF's are float32, checked against it); outputs agree to 1e-10 relative, plain and causal.
At head width 16 and base 500000 the eight frequencies fall in all three pieces."""

from __future__ import annotations

import functools
import math

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from conftest import DESIGNS  # noqa: E402
from hf_support import (  # noqa: E402
    F64,
    assert_equal64,
    compiled64,
    gqa_weights,
    load_into,
    plain_or_causal_mask,
    random_input,
    randomized,
    rotary_tables,
    sdpa_config,
)

import tdiag  # noqa: E402

F, H, G, D, THETA = 64, 4, 2, 16, 500000
FACTOR, LOW, HIGH, OLD_CONTEXT = 8.0, 1.0, 4.0, 8192
N, BATCH = 12, 2
ROPE = {
    "rope_type": "llama3",
    "rope_theta": THETA,
    "factor": FACTOR,
    "low_freq_factor": LOW,
    "high_freq_factor": HIGH,
    "original_max_position_embeddings": OLD_CONTEXT,
}


@functools.cache
def hf() -> torch.nn.Module:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention

    config = sdpa_config(LlamaConfig, F, H, G, max_position_embeddings=4 * OLD_CONTEXT, rope_parameters=ROPE)
    return randomized(LlamaAttention(config, 0))


def weights(attn: torch.nn.Module) -> dict[str, torch.Tensor]:
    return gqa_weights(attn, F, G, H // G, D)


def llama3_inv_freq() -> torch.Tensor:
    """_compute_llama3_parameters' three pieces, as HF writes them, in float64."""
    inv_freq = 1.0 / (THETA ** (torch.arange(0, D, 2, dtype=F64) / D))
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > OLD_CONTEXT / LOW, inv_freq / FACTOR, inv_freq)
    smooth = (OLD_CONTEXT / wavelen - LOW) / (HIGH - LOW)
    smoothed = (1 - smooth) * scaled / FACTOR + smooth * scaled
    medium = ~(wavelen < OLD_CONTEXT / HIGH) * ~(wavelen > OLD_CONTEXT / LOW)
    return torch.where(medium, smoothed, scaled)


def rotary(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """LlamaRotaryEmbedding's (cos, sin) [1, n, D] (rotate-half layout) in float64."""
    return rotary_tables(llama3_inv_freq(), n)


def test_the_frequencies_fall_in_all_three_pieces():
    wavelen = 2 * math.pi * (THETA ** (torch.arange(0, D, 2, dtype=F64) / D))
    high, low = wavelen < OLD_CONTEXT / HIGH, wavelen > OLD_CONTEXT / LOW
    assert high.any() and low.any() and (~high & ~low).any()


def test_the_float64_frequencies_are_hf_llama3_rope_in_float32():
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    theirs = LlamaRotaryEmbedding(hf().config).inv_freq
    assert theirs.dtype == torch.float32
    assert torch.allclose(llama3_inv_freq(), theirs.to(F64), rtol=1e-6, atol=0)


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_llama3_equals_hf_llama_attention_with_llama3_rope_float64(causal):
    design = tdiag.load(DESIGNS / "llama3.td", F=F, H=H, G=G)
    module = compiled64(design, causal)
    load_into(module, weights(hf()))
    x = random_input(BATCH, N, F)
    with torch.no_grad():
        assert_equal64(module(x), hf()(x, rotary(N), plain_or_causal_mask(N, causal))[0])
