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
    additive_mask,
    assert_equal64,
    load_into,
    randomized,
    rope_cos_sin,
)

import tdiag  # noqa: E402

F, H, G, D, THETA = 32, 4, 2, 8, 500000
N, BATCH = 9, 2


@functools.cache
def hf() -> torch.nn.Module:
    from transformers import Olmo2Config
    from transformers.models.olmo2.modeling_olmo2 import Olmo2Attention

    config = Olmo2Config(
        hidden_size=F,
        num_attention_heads=H,
        num_key_value_heads=G,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": THETA},
        attn_implementation="sdpa",
    )
    attn = randomized(Olmo2Attention(config, 0))
    attn.q_norm, attn.k_norm = Float64RMSNorm(attn.q_norm), Float64RMSNorm(attn.k_norm)
    return attn


def weights(attn: torch.nn.Module) -> dict[str, torch.Tensor]:
    """q/k/v/o_proj ([out, in], heads head-major) and the full-width norm weights on the design's
    legs; query head (g r) = g·R + r."""
    r = H // G
    return {
        "WQ": attn.q_proj.weight.T.reshape(F, G, r, D),
        "WK": attn.k_proj.weight.T.reshape(F, G, D),
        "WV": attn.v_proj.weight.T.reshape(F, G, D),
        "WO": attn.o_proj.weight.T.reshape(G, r, D, F),
        "nq": attn.q_norm.weight.view(G, r, D),
        "nk": attn.k_norm.weight.view(G, D),
    }


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_olmo2_equals_hf_olmo2_attention_float64(causal):
    design = tdiag.load(DESIGNS / "olmo2.td", F=F, H=H, G=G)
    module = (design.with_causal_mask() if causal else design).module(dtype=F64)
    load_into(module, weights(hf()))
    x = torch.randn(BATCH, N, F, dtype=F64, generator=torch.Generator().manual_seed(1))
    visible = torch.ones(N, N, dtype=torch.bool)
    mask = additive_mask(visible.tril() if causal else visible)
    with torch.no_grad():
        assert_equal64(module(x), hf()(x, rope_cos_sin(N, D, THETA), mask)[0])


def test_olmo2_gradients_equal_hf_olmo2_attention_float64():
    """The gradients in the input and in the full-width norm weights equal HF's (causal)."""
    attn = hf()
    attn.zero_grad()
    module = tdiag.load(DESIGNS / "olmo2.td", F=F, H=H, G=G).with_causal_mask().module(dtype=F64)
    load_into(module, weights(attn))
    x = torch.randn(BATCH, N, F, dtype=F64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    x_hf = x.detach().clone().requires_grad_()
    weight = torch.randn(BATCH, N, F, dtype=F64, generator=torch.Generator().manual_seed(3))
    (module(x) * weight).sum().backward()
    mask = additive_mask(torch.ones(N, N, dtype=torch.bool).tril())
    (attn(x_hf, rope_cos_sin(N, D, THETA), mask)[0] * weight).sum().backward()
    assert_equal64(x.grad, x_hf.grad)
    r = H // G
    assert_equal64(module.nq.grad, attn.q_norm.weight.grad.view(G, r, D))
    assert_equal64(module.nk.grad, attn.k_norm.weight.grad.view(G, D))
