"""designs/olmo2.td equals Hugging Face transformers' Olmo2Attention in float64: its q_norm and
k_norm are RMS norms over the whole projection width (all heads together, before the head split),
which the design writes as a mean over several legs. The HF module is built from a small config with
random weights (the norm weights too), its norms are rebuilt in float64 (HF's run in float32), its
weights copied into the compiled module, and outputs agree to 1e-10 relative, plain and causal."""

from __future__ import annotations

import functools

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from conftest import DESIGNS  # noqa: E402
from hf_support import (  # noqa: E402
    F64,
    Float64RMSNorm,
    assert_equal64,
    compiled64,
    default_rope,
    gqa_weights,
    input_gradients,
    load_into,
    plain_or_causal_mask,
    random_input,
    randomized,
    rope_cos_sin,
    sdpa_config,
)

import tdiag  # noqa: E402

F, H, G, D, THETA = 32, 4, 2, 8, 500000
N, BATCH = 9, 2


@functools.cache
def hf() -> torch.nn.Module:
    from transformers import Olmo2Config
    from transformers.models.olmo2.modeling_olmo2 import Olmo2Attention

    config = sdpa_config(Olmo2Config, F, H, G, rms_norm_eps=1e-6, rope_parameters=default_rope(THETA))
    attn = randomized(Olmo2Attention(config, 0))
    attn.q_norm, attn.k_norm = Float64RMSNorm(attn.q_norm), Float64RMSNorm(attn.k_norm)
    return attn


def weights(attn: torch.nn.Module) -> dict[str, torch.Tensor]:
    """q/k/v/o_proj ([out, in], heads head-major) and the full-width norm weights on the design's
    legs; query head (g r) = g·R + r."""
    r = H // G
    return gqa_weights(attn, F, G, r, D) | {"nq": attn.q_norm.weight.view(G, r, D), "nk": attn.k_norm.weight.view(G, D)}


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_olmo2_equals_hf_olmo2_attention_float64(causal):
    design = tdiag.load(DESIGNS / "olmo2.td", F=F, H=H, G=G)
    module = compiled64(design, causal)
    load_into(module, weights(hf()))
    x = random_input(BATCH, N, F)
    with torch.no_grad():
        assert_equal64(module(x), hf()(x, rope_cos_sin(N, D, THETA), plain_or_causal_mask(N, causal))[0])


def test_olmo2_gradients_equal_hf_olmo2_attention_float64():
    """The gradients in the input and in the full-width norm weights equal HF's (causal)."""
    attn = hf()
    attn.zero_grad()
    module = tdiag.load(DESIGNS / "olmo2.td", F=F, H=H, G=G).with_causal_mask().module(dtype=F64)
    load_into(module, weights(attn))
    ours, theirs = input_gradients(
        module, attn, random_input(BATCH, N, F), rope_cos_sin(N, D, THETA), plain_or_causal_mask(N, True)
    )
    assert_equal64(ours, theirs)
    r = H // G
    assert_equal64(module.nq.grad, attn.q_norm.weight.grad.view(G, r, D))
    assert_equal64(module.nk.grad, attn.k_norm.weight.grad.view(G, D))
