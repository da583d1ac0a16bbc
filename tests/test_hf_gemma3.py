"""designs/gemma3.td (a global layer) and designs/gemma3_sliding.td (a local layer) equal Hugging
Face transformers' Gemma3Attention in float64: grouped-query heads, QK-norm with Gemma's (1 + w)
RMS norm per head, query_pre_attn_scalar scaling, RoPE with the global layers' base 1e6 and linear
position scaling (factor 8, as the released 4B–27B) and the local layers' base 1e4 over a sliding
window. Each HF layer is built from a small config with random weights (the norm weights too), its
norms rebuilt in float64 and its rotary tables computed in float64 (HF's are float32), its weights
copied into the compiled module; outputs agree to 1e-10 relative, plain and causal."""

from __future__ import annotations

import functools

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from conftest import DESIGNS  # noqa: E402
from hf_support import (  # noqa: E402
    F64,
    Float64GemmaRMSNorm,
    assert_equal64,
    assert_tables_near_float32,
    compiled64,
    gqa_weights,
    input_gradients,
    load_into,
    plain_or_causal_mask,
    random_input,
    randomized,
    rope_angles,
    sliding_window_mask,
)

import tdiag  # noqa: E402

F, H, G, D, QS, W = 32, 4, 2, 8, 24, 5
GLOBAL_THETA, FACTOR, LOCAL_THETA = 1000000, 8, 10000
N, BATCH = 12, 2
LAYERS = {"full_attention": 0, "sliding_attention": 1}


@functools.cache
def config():
    from transformers import Gemma3TextConfig

    config = Gemma3TextConfig(
        hidden_size=F,
        num_attention_heads=H,
        num_key_value_heads=G,
        head_dim=D,
        query_pre_attn_scalar=QS,
        sliding_window=W,
        num_hidden_layers=2,
        layer_types=list(LAYERS),
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": float(FACTOR), "rope_theta": GLOBAL_THETA},
            "sliding_attention": {"rope_type": "default", "rope_theta": LOCAL_THETA},
        },
    )
    config._attn_implementation = "sdpa"
    return config


@functools.cache
def hf(layer_type: str) -> torch.nn.Module:
    from transformers.models.gemma3.modeling_gemma3 import Gemma3Attention

    attn = randomized(Gemma3Attention(config(), LAYERS[layer_type]), seed=LAYERS[layer_type])
    attn.q_norm, attn.k_norm = Float64GemmaRMSNorm(attn.q_norm), Float64GemmaRMSNorm(attn.k_norm)
    return attn


def weights(attn: torch.nn.Module) -> dict[str, torch.Tensor]:
    """q/k/v/o_proj ([out, in], heads head-major) and the per-head norm weights on the design's
    legs; query head (g r) = g·R + r."""
    return gqa_weights(attn, F, G, H // G, D) | {"nq": attn.q_norm.weight, "nk": attn.k_norm.weight}


def rotary(layer_type: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's (cos, sin) [1, N, D] in float64: HF's linear scaling divides the frequencies by
    the factor on the global layer."""
    if layer_type == "full_attention":
        angles = rope_angles(torch.arange(N), D, GLOBAL_THETA) / FACTOR
    else:
        angles = rope_angles(torch.arange(N), D, LOCAL_THETA)
    return angles[None].cos(), angles[None].sin()


def x_input() -> torch.Tensor:
    return random_input(BATCH, N, F)


@pytest.mark.parametrize("layer_type", list(LAYERS))
def test_the_float64_rotary_tables_are_hf_gemma3_rotary_embedding(layer_type):
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

    theirs = Gemma3RotaryEmbedding(config())(x_input(), torch.arange(N)[None], layer_type)
    assert_tables_near_float32(rotary(layer_type), theirs)


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_gemma3_equals_hf_gemma3_global_attention_float64(causal):
    design = tdiag.load(DESIGNS / "gemma3.td", F=F, H=H, G=G, D=D, QS=QS, Factor=FACTOR)
    module = compiled64(design, causal)
    attn = hf("full_attention")
    load_into(module, weights(attn))
    x = x_input()
    with torch.no_grad():
        assert_equal64(module(x), attn(x, rotary("full_attention"), plain_or_causal_mask(N, causal))[0])


def test_gemma3_sliding_equals_hf_gemma3_local_attention_float64():
    design = tdiag.load(DESIGNS / "gemma3_sliding.td", F=F, H=H, G=G, D=D, QS=QS, W=W)
    assert design.with_causal_mask().graph is design.graph
    module = design.module(dtype=F64)
    attn = hf("sliding_attention")
    load_into(module, weights(attn))
    x = x_input()
    with torch.no_grad():
        assert_equal64(module(x), attn(x, rotary("sliding_attention"), sliding_window_mask(N, W))[0])


def test_gemma3_gradients_equal_hf_gemma3_attention_float64():
    """The gradients in the input and in the (1 + w) norm weights equal HF's (global layer, causal)."""
    attn = hf("full_attention")
    attn.zero_grad()
    design = tdiag.load(DESIGNS / "gemma3.td", F=F, H=H, G=G, D=D, QS=QS, Factor=FACTOR)
    module = compiled64(design, causal=True)
    load_into(module, weights(attn))
    ours, theirs = input_gradients(module, attn, x_input(), rotary("full_attention"), plain_or_causal_mask(N, True))
    assert_equal64(ours, theirs)
    assert_equal64(module.nq.grad, attn.q_norm.weight.grad)
    assert_equal64(module.nk.grad, attn.k_norm.weight.grad)
