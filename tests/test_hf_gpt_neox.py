"""designs/gpt_neox.td equals Hugging Face transformers' GPTNeoXAttention in float64: the HF module
is built from a small config with random weights (biases too), its fused query_key_value and
dense weights are copied in as the checkpoint stores them (reshaped only: the design projects
once with the fused weight and reads the query, key and value parts, and the rotated and
passed-through parts of each head, in their ranges of the projection), and the outputs and
gradients agree, plain and causal, at two rotary fractions. HF builds its RoPE cos and sin in
float32 even in a float64 module; the test builds them in float64 with the same formula rather
than loosening the tolerance."""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import DESIGNS

import tdiag

transformers = pytest.importorskip("transformers")

F64 = torch.float64
F, H, D = 64, 4, 16
N, BATCH = 11, 2


@functools.cache
def hf_attention(rotary_pct: float) -> torch.nn.Module:
    """GPTNeoXAttention (sdpa) in float64, eval mode, every weight and bias drawn at random."""
    from transformers import GPTNeoXConfig
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXAttention

    config = GPTNeoXConfig(
        hidden_size=F,
        num_attention_heads=H,
        rotary_pct=rotary_pct,
        rotary_emb_base=10000,
        attention_bias=True,
        attn_implementation="sdpa",
    )
    module = GPTNeoXAttention(config, layer_idx=0).to(F64).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(0.3 * torch.randn(parameter.shape, dtype=F64, generator=generator))
    return module


@functools.cache
def compiled(rotary_pct: float, causal: bool) -> torch.nn.Module:
    """The design at the test's sizes with the HF module's weights copied in."""
    design = tdiag.load(DESIGNS / "gpt_neox.td", F=F, H=H, R=int(D * rotary_pct))
    module = (design.with_causal_mask() if causal else design).module(dtype=F64)
    hf = hf_attention(rotary_pct)
    weights = {
        "Wqkv": hf.query_key_value.weight.view(H, 3 * D, F),
        "bqkv": hf.query_key_value.bias.view(H, 3 * D),
        "WO": hf.dense.weight.view(F, H, D),
        "bo": hf.dense.bias,
    }
    assert set(weights) == {name for name, _ in module.named_parameters()}
    with torch.no_grad():
        for name, value in weights.items():
            getattr(module, name).copy_(value)
    return module


def rope_tables(n: int, rotary_ndims: int) -> tuple[torch.Tensor, torch.Tensor]:
    """GPTNeoXRotaryEmbedding's cos and sin ([1, n, rotary_ndims], the frequencies twice for
    rotate_half) with inv_freq = 1 / 10000^(arange(0, R, 2) / R), in float64."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_ndims, 2, dtype=F64) / rotary_ndims))
    freqs = torch.arange(n, dtype=F64)[:, None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)[None]
    return emb.cos(), emb.sin()


def hf_output(x: torch.Tensor, rotary_pct: float, causal: bool) -> torch.Tensor:
    """HF's forward: its sdpa path is causal when given no mask, so the plain case passes an
    all-zero additive mask."""
    n = x.shape[-2]
    mask = None if causal else torch.zeros(1, 1, n, n, dtype=F64)
    tables = rope_tables(n, int(D * rotary_pct))
    return hf_attention(rotary_pct)(x, attention_mask=mask, position_embeddings=tables)[0]


def assert_equal64(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal to 1e-10 relative to the largest entry of `expected`."""
    assert actual.shape == expected.shape
    scale = expected.abs().max()
    assert scale > 0 and (actual - expected).abs().max() <= 1e-10 * scale


CASES = [(pct, causal) for pct in (0.25, 0.5) for causal in (False, True)]
IDS = [f"rotary{pct}-{'causal' if causal else 'plain'}" for pct, causal in CASES]


@pytest.mark.parametrize(("rotary_pct", "causal"), CASES, ids=IDS)
def test_gpt_neox_equals_hf_gpt_neox_attention(rotary_pct: float, causal: bool):
    x = torch.randn(BATCH, N, F, dtype=F64, generator=torch.Generator().manual_seed(1))
    assert_equal64(compiled(rotary_pct, causal)(x), hf_output(x, rotary_pct, causal))


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_gpt_neox_gradients_equal_hf_gradients(causal: bool):
    """The gradient of each range lands in its rows of the one fused weight, as HF's does."""
    module, hf = compiled(0.25, causal), hf_attention(0.25)
    x = torch.randn(BATCH, N, F, dtype=F64, generator=torch.Generator().manual_seed(2))
    weight = torch.randn(BATCH, N, F, dtype=F64, generator=torch.Generator().manual_seed(3))
    ours = torch.autograd.grad((module(x) * weight).sum(), [module.Wqkv, module.bqkv])
    theirs = torch.autograd.grad(
        (hf_output(x, 0.25, causal) * weight).sum(), [hf.query_key_value.weight, hf.query_key_value.bias]
    )
    assert_equal64(ours[0], theirs[0].view(H, 3 * D, F))
    assert_equal64(ours[1], theirs[1].view(H, 3 * D))


def test_gpt_neox_projects_once_and_splits_the_projection_into_its_ranges():
    """One matmul with the fused weight and its bias, as HF's query_key_value (an addmm); Q's rotated and passed parts,
    K's, and V are views of one split, whose backward joins the five gradients in one tensor."""
    source = tdiag.load(DESIGNS / "gpt_neox.td", F=F, H=H).source(N=N, calls=False)  # the plain forward alone
    assert sum("X @ self.Wqkv" in line or "X.flatten(0, -2), self.Wqkv" in line for line in source.splitlines()) == 1
    assert source.count("QKV.split([8, 8, 8, 8, 16], 3)") == 1
