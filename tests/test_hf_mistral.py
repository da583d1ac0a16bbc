"""designs/mistral.td equals Hugging Face transformers' MistralAttention in float64: the HF module is
built from a small config (sliding_window W = 5, shorter than the test length N = 12) with random
weights, its weights are copied into the compiled module's leg-shaped parameters, and it is given
the mask HF's model gives it (masking_utils.sliding_window_causal_mask_function: kv ≤ q and
kv > q − W) and its rotary tables (computed here in float64, where HF's are float32). Outputs and
input gradients agree to 1e-10 relative for each lowering of the window: SDPA with the band as its
boolean attn_mask, the banded form and the materialized box."""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import DESIGNS

import tdiag
from tdiag.plan.forms import only_forms

transformers = pytest.importorskip("transformers")

F64 = torch.float64
F, H, G, W, THETA = 64, 4, 2, 5, 10000
D = F // H
N, BATCH = 12, 2


@functools.cache
def compiled(form: str) -> torch.nn.Module:
    design = tdiag.load(DESIGNS / "mistral.td", F=F, H=H, G=G, W=W, Theta=THETA)
    with only_forms(form):
        module = design.module(N=N, dtype=F64)
    assert [choice.taken for choice in module.tdiag_plan.choices] == [form]
    return module


@functools.cache
def mistral() -> torch.nn.Module:
    from transformers import MistralConfig
    from transformers.models.mistral.modeling_mistral import MistralAttention

    config = MistralConfig(
        hidden_size=F,
        num_attention_heads=H,
        num_key_value_heads=G,
        sliding_window=W,
        rope_parameters={"rope_type": "default", "rope_theta": THETA},
        attn_implementation="sdpa",
    )
    attn = MistralAttention(config, 0).to(F64).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in attn.parameters():
            parameter.copy_(0.3 * torch.randn(parameter.shape, dtype=F64, generator=generator))
    return attn


def hf_inputs(n: int) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """HF's rotary (cos, sin) [1, n, D] in float64, and the sliding-window causal mask [1, 1, n, n]
    as HF's model builds it (additive: 0 where visible, the dtype's lowest elsewhere)."""
    from transformers.masking_utils import sliding_window_causal_mask_function

    inv_freq = 1.0 / (THETA ** (torch.arange(0, D, 2, dtype=F64) / D))
    emb = torch.arange(n, dtype=F64)[:, None] * inv_freq
    emb = torch.cat((emb, emb), dim=-1)[None]
    index = torch.arange(n)
    visible = sliding_window_causal_mask_function(W)(0, 0, index[:, None], index[None, :])
    mask = torch.zeros(n, n, dtype=F64).masked_fill(~visible, torch.finfo(F64).min)[None, None]
    return (emb.cos(), emb.sin()), mask


def weights(attn: torch.nn.Module) -> dict[str, torch.Tensor]:
    """q/k/v/o_proj ([out, in], heads head-major) as WQ[f g r d], WK[f g d], WV[f g e], WO[g r e o]."""
    return {
        "WQ": attn.q_proj.weight.T.reshape(F, G, H // G, D),
        "WK": attn.k_proj.weight.T.reshape(F, G, D),
        "WV": attn.v_proj.weight.T.reshape(F, G, D),
        "WO": attn.o_proj.weight.T.reshape(G, H // G, D, F),
    }


def test_the_window_is_hf_sliding_window_causal_mask():
    _, mask = hf_inputs(N)
    allowed = mask[0, 0] == 0
    n, m = torch.arange(N)[:, None], torch.arange(N)[None, :]
    assert torch.equal(allowed, (m <= n) & (m > n - W))


@pytest.mark.parametrize("form", ["sdpa_grouped", "banded", "materialized"])
def test_mistral_equals_hf_mistral_attention_float64(form):
    attn, module = mistral(), compiled(form)
    with torch.no_grad():
        for name, value in weights(attn).items():
            getattr(module, name).copy_(value)
    x = torch.randn(BATCH, N, F, dtype=F64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    embeddings, mask = hf_inputs(N)
    expected, _ = attn(x, embeddings, mask)
    actual = module(x)
    scale = expected.abs().max()
    assert (actual - expected).abs().max() <= 1e-10 * scale
    (grad_actual,) = torch.autograd.grad(actual.square().sum(), x)
    (grad_expected,) = torch.autograd.grad(expected.square().sum(), x)
    assert (grad_actual - grad_expected).abs().max() <= 1e-10 * grad_expected.abs().max()


def test_mistral_is_causal_as_written():
    design = tdiag.load(DESIGNS / "mistral.td", F=F, H=H, G=G, W=W)
    assert design.with_causal_mask().graph is design.graph
