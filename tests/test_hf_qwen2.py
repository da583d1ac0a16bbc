"""designs/qwen2.td equals Hugging Face transformers' Qwen2Attention in float64: the HF module is
built from a small config with random weights (the q, k, v biases too), its weights are copied into
the compiled module's leg-shaped parameters, and outputs agree to 1e-10 relative, plain and causal
(HF's causal mask), given HF's rotary tables computed in float64 (HF's are float32)."""

from __future__ import annotations

import functools

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from conftest import DESIGNS  # noqa: E402
from hf_support import (  # noqa: E402
    assert_equal64,
    compiled64,
    default_rope,
    gqa_weights,
    load_into,
    plain_or_causal_mask,
    random_input,
    randomized,
    rope_cos_sin,
    sdpa_config,
)

import tdiag  # noqa: E402

F, H, G, D, THETA = 32, 4, 2, 8, 1000000
N, BATCH = 9, 2


@functools.cache
def hf() -> torch.nn.Module:
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention

    config = sdpa_config(Qwen2Config, F, H, G, rope_parameters=default_rope(THETA))
    return randomized(Qwen2Attention(config, 0))


def weights(attn: torch.nn.Module) -> dict[str, torch.Tensor]:
    """q/k/v/o_proj ([out, in], heads head-major) on the design's legs; query head (g r) = g·R + r."""
    return gqa_weights(attn, F, G, H // G, D, biases=True)


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_qwen2_equals_hf_qwen2_attention_float64(causal):
    design = tdiag.load(DESIGNS / "qwen2.td", F=F, H=H, G=G)
    module = compiled64(design, causal)
    load_into(module, weights(hf()))
    x = random_input(BATCH, N, F)
    with torch.no_grad():
        assert_equal64(module(x), hf()(x, rope_cos_sin(N, D, THETA), plain_or_causal_mask(N, causal))[0])
