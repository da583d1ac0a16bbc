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
from hf_support import F64, additive_mask, assert_equal64, load_into, randomized, rope_cos_sin  # noqa: E402

import tdiag  # noqa: E402

F, H, G, D, THETA = 32, 4, 2, 8, 1000000
N, BATCH = 9, 2


@functools.cache
def hf() -> torch.nn.Module:
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention

    config = Qwen2Config(
        hidden_size=F,
        num_attention_heads=H,
        num_key_value_heads=G,
        rope_parameters={"rope_type": "default", "rope_theta": THETA},
        attn_implementation="sdpa",
    )
    return randomized(Qwen2Attention(config, 0))


def weights(attn: torch.nn.Module) -> dict[str, torch.Tensor]:
    """q/k/v/o_proj ([out, in], heads head-major) on the design's legs; query head (g r) = g·R + r."""
    r = H // G
    return {
        "WQ": attn.q_proj.weight.T.reshape(F, G, r, D),
        "WK": attn.k_proj.weight.T.reshape(F, G, D),
        "WV": attn.v_proj.weight.T.reshape(F, G, D),
        "WO": attn.o_proj.weight.T.reshape(G, r, D, F),
        "bq": attn.q_proj.bias.view(G, r, D),
        "bk": attn.k_proj.bias.view(G, D),
        "bv": attn.v_proj.bias.view(G, D),
    }


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_qwen2_equals_hf_qwen2_attention_float64(causal):
    design = tdiag.load(DESIGNS / "qwen2.td", F=F, H=H, G=G)
    module = (design.with_causal_mask() if causal else design).module(dtype=F64)
    load_into(module, weights(hf()))
    x = torch.randn(BATCH, N, F, dtype=F64, generator=torch.Generator().manual_seed(1))
    visible = torch.ones(N, N, dtype=torch.bool)
    mask = additive_mask(visible.tril() if causal else visible)
    with torch.no_grad():
        assert_equal64(module(x), hf()(x, rope_cos_sin(N, D, THETA), mask)[0])
