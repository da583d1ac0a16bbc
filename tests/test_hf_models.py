"""The production designs (designs/llama.td, qwen3, gpt2, falcon, bloom, bert) equal Hugging Face
transformers' attention modules in float64: each HF module is built from a small config with random
weights, its weights are copied into the compiled module's leg-shaped parameters, and the outputs
agree to 1e-10 relative, plain and, for the decoders, causal (HF's causal mask). Where HF computes a
part in float32 even in a float64 module (its RoPE tables, Qwen3's RMSNorm, BLOOM's softmax), the
test builds that part in float64, as the same formula, rather than loosening the tolerance."""

from __future__ import annotations

import functools
import subprocess
import sys

import pytest
import torch
from conftest import DESIGNS, ROOT

import tdiag

transformers = pytest.importorskip("transformers")

F64 = torch.float64
F, H, G, D = 64, 4, 2, 16
N, BATCH = 12, 2


@functools.cache
def compiled(name: str, causal: bool, **sizes: int) -> torch.nn.Module:
    """The design's compiled float64 module at the test's sizes, built once per file."""
    design = tdiag.load(DESIGNS / f"{name}.td", **sizes)
    return (design.with_causal_mask() if causal else design).module(dtype=F64)


def x_input(n: int = N, seed: int = 1) -> torch.Tensor:
    return torch.randn(BATCH, n, F, dtype=F64, generator=torch.Generator().manual_seed(seed))


def randomized(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """The HF module in float64, eval mode, every parameter drawn at random (norm weights and
    biases too, so that each one matters)."""
    module = module.to(F64).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(0.3 * torch.randn(parameter.shape, dtype=F64, generator=generator))
    return module


def load_into(module: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Copy leg-shaped tensors into the compiled module's parameters of those names (every one)."""
    assert set(tensors) == {name for name, _ in module.named_parameters()}
    with torch.no_grad():
        for name, value in tensors.items():
            getattr(module, name).copy_(value)


def assert_equal64(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal to 1e-10 relative to the largest entry of `expected`."""
    assert actual.shape == expected.shape
    scale = expected.abs().max()
    assert scale > 0 and (actual - expected).abs().max() <= 1e-10 * scale


def rope_tables(n: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's default RoPE cos and sin ([1, n, head_dim], rotate-half layout: the frequencies twice)
    as LlamaRotaryEmbedding computes them, in float64 instead of its float32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=F64) / head_dim))
    freqs = torch.arange(n, dtype=F64)[:, None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)[None]
    return emb.cos(), emb.sin()


def set_causal(module: torch.nn.Module, causal: bool) -> torch.nn.Module:
    """HF decoders mask causally by `is_causal` when no attention mask is given; False gives the
    same module's bidirectional (plain) attention."""
    module.is_causal = causal
    return module


def test_import_tdiag_does_not_import_transformers():
    code = "import sys, tdiag; assert 'transformers' not in sys.modules, 'transformers imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# Llama ----------------------------------------------------------------------------------------------


def llama_config(**more):
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=F,
        num_attention_heads=H,
        num_key_value_heads=G,
        attention_bias=False,
        attn_implementation="sdpa",
        **more,
    )


PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


def gqa_weights(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, d: int = D
) -> dict[str, torch.Tensor]:
    """HF's q/k/v/o_proj weights ([out, in] nn.Linear weights, heads head-major) as the designs'
    leg-shaped WQ[f g r d], WK[f g d], WV[f g e], WO[g r e o], at head width d."""
    r = H // G
    return {
        "WQ": q.T.reshape(F, G, r, d),
        "WK": k.T.reshape(F, G, d),
        "WV": v.T.reshape(F, G, d),
        "WO": o.T.reshape(G, r, d, F),
    }


def projections(attn: torch.nn.Module, grad: bool = False) -> list[torch.Tensor]:
    """The four projection weights of a Llama-style HF module (or their gradients)."""
    weights = [getattr(attn, name).weight for name in PROJECTIONS]
    return [w.grad for w in weights] if grad else weights


@functools.cache
def llama(theta: int = 10000):
    from transformers.models.llama.modeling_llama import LlamaAttention

    return randomized(LlamaAttention(llama_config(rope_parameters={"rope_type": "default", "rope_theta": theta}), 0))


def hf_rope_attention(attn: torch.nn.Module, x: torch.Tensor, theta: float, d: int = D) -> torch.Tensor:
    return attn(x, position_embeddings=rope_tables(x.shape[-2], d, theta), attention_mask=None)[0]


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_llama_equals_hf_llama_attention(causal):
    attn = set_causal(llama(), causal)
    module = compiled("llama", causal, F=F, H=H, G=G)
    load_into(module, gqa_weights(*projections(attn)))
    x = x_input()
    assert_equal64(module(x), hf_rope_attention(attn, x, 10000))


def test_llama_rope_base_is_the_theta_size():
    """Llama 3's rope_theta = 500000 is the size Theta."""
    attn = set_causal(llama(500000), True)
    module = compiled("llama", True, F=F, H=H, G=G, Theta=500000)
    load_into(module, gqa_weights(*projections(attn)))
    x = x_input(n=40)
    assert_equal64(module(x), hf_rope_attention(attn, x, 500000))


def test_llama_gradients_equal_hf():
    """The gradients in the input and in every weight equal HF's (causal)."""
    attn = set_causal(llama(), True)
    module = compiled("llama", True, F=F, H=H, G=G)
    load_into(module, gqa_weights(*projections(attn)))
    attn.zero_grad()
    module.zero_grad()
    x = x_input().requires_grad_()
    x_hf = x.detach().clone().requires_grad_()
    weight = torch.randn(BATCH, N, F, dtype=F64, generator=torch.Generator().manual_seed(3))
    (module(x) * weight).sum().backward()
    (hf_rope_attention(attn, x_hf, 10000) * weight).sum().backward()
    assert_equal64(x.grad, x_hf.grad)
    grads = {name: p.grad for name, p in module.named_parameters()}
    for name, value in gqa_weights(*projections(attn, grad=True)).items():
        assert_equal64(grads[name], value)


# Qwen3 ----------------------------------------------------------------------------------------------

QWEN3_D = 24  # Qwen3's head_dim is its own size (not F / H)


class RMSNorm64(torch.nn.Module):
    """Qwen3RMSNorm's formula, weight · x · rsqrt(mean(x²) + eps) over the last axis, without its
    float32 upcast; holds the HF norm's own weight."""

    def __init__(self, norm: torch.nn.Module):
        super().__init__()
        self.weight, self.eps = norm.weight, norm.variance_epsilon

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


@functools.cache
def qwen3():
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention

    config = Qwen3Config(
        hidden_size=F,
        num_attention_heads=H,
        num_key_value_heads=G,
        head_dim=QWEN3_D,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000},
        attn_implementation="sdpa",
    )
    attn = randomized(Qwen3Attention(config, 0))
    attn.q_norm, attn.k_norm = RMSNorm64(attn.q_norm), RMSNorm64(attn.k_norm)
    return attn


def qwen3_weights(attn: torch.nn.Module) -> dict[str, torch.Tensor]:
    norms = {"nq": attn.q_norm.weight, "nk": attn.k_norm.weight}
    return {**gqa_weights(*projections(attn), d=QWEN3_D), **norms}


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_qwen3_equals_hf_qwen3_attention(causal):
    attn = set_causal(qwen3(), causal)
    module = compiled("qwen3", causal, F=F, H=H, G=G, D=QWEN3_D)
    load_into(module, qwen3_weights(attn))
    x = x_input()
    assert_equal64(module(x), hf_rope_attention(attn, x, 1000000, d=QWEN3_D))


# GPT-2 ----------------------------------------------------------------------------------------------


@functools.cache
def gpt2():
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    config = GPT2Config(n_embd=F, n_head=H, attn_implementation="sdpa")
    return randomized(GPT2Attention(config, layer_idx=0))


def gpt2_weights(attn: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Conv1D weights are stored [in, out]: c_attn [F, 3F] is viewed as Wattn[f t h d] as it is."""
    return {
        "Wattn": attn.c_attn.weight.view(F, 3, H, D),
        "battn": attn.c_attn.bias.view(3, H, D),
        "WO": attn.c_proj.weight.view(H, D, F),
        "bo": attn.c_proj.bias,
    }


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_gpt2_equals_hf_gpt2_attention(causal):
    attn = set_causal(gpt2(), causal)
    module = compiled("gpt2", causal, F=F, H=H)
    load_into(module, gpt2_weights(attn))
    x = x_input()
    assert_equal64(module(x), attn(x)[0])
