"""designs/qwen2_yarn.td equals Hugging Face transformers' Qwen2Attention with "yarn" rope scaling
in float64: the frequencies blended along YaRN's ramp between the correction range's floor and
ceil, and cos and sin scaled by the attention factor (the design's box scale). The HF module is
built from a small config with random weights; its rotary tables are computed by the formula of
HF's _compute_yarn_parameters in float64 (checked against HF's float32 ones). At head width 8,
base 10000 and original context 4096 the ramp is [0, 0, 1/2, 1]: every piece of the blend is
exercised. Outputs agree to 1e-10 relative, plain and causal."""

from __future__ import annotations

import functools
import math

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from conftest import DESIGNS  # noqa: E402
from hf_support import F64, additive_mask, assert_equal64, load_into, randomized  # noqa: E402

import tdiag  # noqa: E402

F, H, G, D, THETA = 32, 4, 2, 8, 10000
FACTOR, OLD_CONTEXT = 4, 4096
N, BATCH = 9, 2


@functools.cache
def hf() -> torch.nn.Module:
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention

    config = Qwen2Config(
        hidden_size=F,
        num_attention_heads=H,
        num_key_value_heads=G,
        max_position_embeddings=FACTOR * OLD_CONTEXT,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": THETA,
            "factor": float(FACTOR),
            "original_max_position_embeddings": OLD_CONTEXT,
        },
        attn_implementation="sdpa",
    )
    return randomized(Qwen2Attention(config, 0))


def weights(attn: torch.nn.Module) -> dict[str, torch.Tensor]:
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


def ramp() -> torch.Tensor:
    """HF's linear_ramp_factor over find_correction_range(32, 1, ...) (truncated), in float64."""

    def correction(rotations: float) -> float:
        return D * math.log(OLD_CONTEXT / (rotations * 2 * math.pi)) / (2 * math.log(THETA))

    low, high = max(math.floor(correction(32)), 0), min(math.ceil(correction(1)), D - 1)
    return ((torch.arange(D // 2, dtype=F64) - low) / (high - low)).clamp(0, 1)


def yarn_tables(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen2RotaryEmbedding's (cos, sin) [1, n, D] with yarn in float64: inv_freq interpolated by
    1 − ramp, the tables times attention_factor = 0.1 ln(factor) + 1."""
    extrapolation = 1.0 / THETA ** (torch.arange(0, D, 2, dtype=F64) / D)
    keep = 1 - ramp()
    inv_freq = extrapolation / FACTOR * (1 - keep) + extrapolation * keep
    freqs = torch.arange(n, dtype=F64)[:, None] * inv_freq
    angles = torch.cat((freqs, freqs), dim=-1)[None]
    factor = 0.1 * math.log(FACTOR) + 1
    return angles.cos() * factor, angles.sin() * factor


def test_the_ramp_has_every_piece():
    assert torch.equal(ramp(), torch.tensor([0, 0, 0.5, 1], dtype=F64))


def test_the_float64_tables_are_hf_yarn_rotary_embedding():
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

    x = torch.zeros(1, N, F, dtype=F64)
    theirs = Qwen2RotaryEmbedding(hf().config)(x, torch.arange(N)[None])
    for ours, table in zip(yarn_tables(N), theirs, strict=True):
        assert (ours - table).abs().max() < 1e-5


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_qwen2_yarn_equals_hf_qwen2_attention_with_yarn_float64(causal):
    design = tdiag.load(DESIGNS / "qwen2_yarn.td", F=F, H=H, G=G, Theta=THETA, Factor=FACTOR, L=OLD_CONTEXT)
    module = (design.with_causal_mask() if causal else design).module(dtype=F64)
    load_into(module, weights(hf()))
    x = torch.randn(BATCH, N, F, dtype=F64, generator=torch.Generator().manual_seed(1))
    visible = torch.ones(N, N, dtype=torch.bool)
    mask = additive_mask(visible.tril() if causal else visible)
    with torch.no_grad():
        assert_equal64(module(x), hf()(x, yarn_tables(N), mask)[0])
