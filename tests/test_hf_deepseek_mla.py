"""designs/deepseek_mla.td equals Hugging Face's DeepseekV3Attention (multi-head latent attention,
DeepSeek-V2 eq. 9-19) in float64, causal, values and gradients: a small config with random weights
copied in with tdiag.load_linear; HF's float32 RMSNorm and RoPE tables built in float64. The one
RoPE key shared by all heads goes to SDPA as a broadcast part of the concatenated keys."""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import DESIGNS
from hf_support import Float64RMSNorm, rope_angles

import tdiag
from tdiag.plan.program import Attention

transformers = pytest.importorskip("transformers")
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf  # noqa: E402

F64 = torch.float64
F, H, QL, KL, C, E, V = 64, 4, 24, 16, 12, 8, 10
N, BATCH = 9, 2
SIZES = {"F": F, "H": H, "QL": QL, "KL": KL, "C": C, "E": E, "V": V}


@functools.cache
def hf_attention() -> torch.nn.Module:
    config = transformers.DeepseekV3Config(
        hidden_size=F, num_attention_heads=H, num_key_value_heads=H, q_lora_rank=QL, kv_lora_rank=KL,
        qk_rope_head_dim=E, qk_nope_head_dim=C, v_head_dim=V, num_hidden_layers=1, vocab_size=50,
    )  # fmt: skip
    config._attn_implementation = "sdpa"  # its eager softmax runs in float32
    attention = hf.DeepseekV3Attention(config, layer_idx=0).to(F64).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in attention.parameters():
            parameter.copy_(0.3 * torch.randn(parameter.shape, dtype=F64, generator=generator) + 0.2)
    attention.q_a_layernorm = Float64RMSNorm(attention.q_a_layernorm)
    attention.kv_a_layernorm = Float64RMSNorm(attention.kv_a_layernorm)
    return attention


def design() -> tdiag.Design:
    return tdiag.load(DESIGNS / "deepseek_mla.td", **SIZES).with_causal_mask()


@functools.cache
def compiled() -> torch.nn.Module:
    module = design().module(dtype=F64)
    attention = hf_attention()
    q_b = attention.q_b_proj.weight.view(H, C + E, QL)
    kv_b = attention.kv_b_proj.weight.view(H, C + V, KL)
    tdiag.load_linear(module, "Wqa", attention.q_a_proj.weight, cols="f")
    tdiag.load_linear(module, "nqa", attention.q_a_layernorm.weight, cols="")
    tdiag.load_linear(module, "WqN", q_b[:, :C].reshape(H * C, QL), cols="a")
    tdiag.load_linear(module, "WqR", q_b[:, C:].reshape(H * E, QL), cols="a")
    tdiag.load_linear(module, ["Wkva", "WkR"], attention.kv_a_proj_with_mqa.weight, cols="f")
    tdiag.load_linear(module, "nkv", attention.kv_a_layernorm.weight, cols="")
    tdiag.load_linear(module, "WkN", kv_b[:, :C].reshape(H * C, KL), cols="l")
    tdiag.load_linear(module, "WV", kv_b[:, C:].reshape(H * V, KL), cols="l")
    tdiag.load_linear(module, "WO", attention.o_proj.weight, cols="h e")
    return module


def hf_forward(x: torch.Tensor) -> torch.Tensor:
    """HF's module with its RoPE tables (cat(freqs, freqs)) and causal mask built in float64."""
    emb = rope_angles(torch.arange(N), E, 10000)[None]
    mask = torch.full((N, N), torch.finfo(F64).min, dtype=F64).triu(1)[None, None]
    return hf_attention()(x, position_embeddings=(emb.cos(), emb.sin()), attention_mask=mask)[0]


def x_input() -> torch.Tensor:
    return torch.randn(BATCH, N, F, dtype=F64, generator=torch.Generator().manual_seed(1), requires_grad=True)


def assert_equal64(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape
    assert (actual - expected).abs().max() <= 1e-10 * expected.abs().max()


def test_mla_equals_hf_deepseek_v3_attention():
    x = x_input()
    assert_equal64(compiled()(x), hf_forward(x))


def test_mla_gradients_equal_hf():
    x, y = x_input(), x_input()
    (expected,) = torch.autograd.grad((hf_forward(x) * 1.3).sum(), x)
    (actual,) = torch.autograd.grad((compiled()(y) * 1.3).sum(), y)
    assert_equal64(actual, expected)


def test_the_reference_evaluator_equals_hf():
    reference = design().module(dtype=F64, impl="reference")
    reference.load_state_dict(compiled().state_dict())
    x = x_input()
    assert_equal64(reference(x), hf_forward(x))


def test_the_shared_rope_key_goes_to_sdpa_broadcast_over_the_heads():
    plan = compiled().tdiag_plan
    assert [type(step.op) for step in plan.steps].count(Attention) == 1
    assert any(step.kind == "expand" and "k shared by the heads" in step.description for step in plan.steps)
