"""designs/phi.td equals Hugging Face transformers' PhiAttention in float64: biases on every
projection and rotate-half RoPE on the first rotary_ndims features of each head (the rest passed
through), written with ranges of the head leg. The HF module is built from a small config with
random weights (partial_rotary_factor 0.5, grouped heads), its weights copied into the compiled
module's leg-shaped parameters; given HF's rotary tables over the rotated dims in float64 (HF's are
float32), outputs agree to 1e-10 relative, plain and causal."""

from __future__ import annotations

import functools

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from conftest import DESIGNS  # noqa: E402
from hf_support import F64, additive_mask, assert_equal64, load_into, randomized, rope_cos_sin  # noqa: E402

import tdiag  # noqa: E402

F, H, G, D, DR, THETA = 32, 4, 2, 8, 4, 10000
N, BATCH = 9, 2


@functools.cache
def hf() -> torch.nn.Module:
    from transformers import PhiConfig
    from transformers.models.phi.modeling_phi import PhiAttention

    config = PhiConfig(
        hidden_size=F,
        num_attention_heads=H,
        num_key_value_heads=G,
        rope_parameters={"rope_type": "default", "rope_theta": THETA, "partial_rotary_factor": DR / D},
        attn_implementation="sdpa",
    )
    attn = randomized(PhiAttention(config, 0))
    assert attn.rotary_ndims == DR
    return attn


def weights(attn: torch.nn.Module) -> dict[str, torch.Tensor]:
    """q/k/v_proj and dense ([out, in], heads head-major) and their biases on the design's legs."""
    r = H // G
    return {
        "WQ": attn.q_proj.weight.T.reshape(F, G, r, D),
        "WK": attn.k_proj.weight.T.reshape(F, G, D),
        "WV": attn.v_proj.weight.T.reshape(F, G, D),
        "WO": attn.dense.weight.T.reshape(G, r, D, F),
        "bq": attn.q_proj.bias.view(G, r, D),
        "bk": attn.k_proj.bias.view(G, D),
        "bv": attn.v_proj.bias.view(G, D),
        "bo": attn.dense.bias,
    }


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_phi_equals_hf_phi_attention_float64(causal):
    design = tdiag.load(DESIGNS / "phi.td", F=F, H=H, G=G, Dr=DR)
    module = (design.with_causal_mask() if causal else design).module(dtype=F64)
    load_into(module, weights(hf()))
    x = torch.randn(BATCH, N, F, dtype=F64, generator=torch.Generator().manual_seed(1))
    visible = torch.ones(N, N, dtype=torch.bool)
    mask = additive_mask(visible.tril() if causal else visible)
    with torch.no_grad():
        assert_equal64(module(x), hf()(x, rope_cos_sin(N, DR, THETA), mask)[0])
