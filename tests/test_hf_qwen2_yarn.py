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
from hf_support import (  # noqa: E402
    F64,
    assert_equal64,
    assert_tables_near_float32,
    compiled64,
    gqa_weights,
    load_into,
    plain_or_causal_mask,
    random_input,
    randomized,
    rotary_tables,
    sdpa_config,
)

import tdiag  # noqa: E402

F, H, G, D, THETA = 32, 4, 2, 8, 10000
FACTOR, OLD_CONTEXT = 4, 4096
N, BATCH = 9, 2


@functools.cache
def hf() -> torch.nn.Module:
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention

    config = sdpa_config(
        Qwen2Config,
        F,
        H,
        G,
        max_position_embeddings=FACTOR * OLD_CONTEXT,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": THETA,
            "factor": float(FACTOR),
            "original_max_position_embeddings": OLD_CONTEXT,
        },
    )
    return randomized(Qwen2Attention(config, 0))


def weights(attn: torch.nn.Module) -> dict[str, torch.Tensor]:
    return gqa_weights(attn, F, G, H // G, D, biases=True)


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
    cos, sin = rotary_tables(inv_freq, n)
    factor = 0.1 * math.log(FACTOR) + 1
    return cos * factor, sin * factor


def test_the_ramp_has_every_piece():
    assert torch.equal(ramp(), torch.tensor([0, 0, 0.5, 1], dtype=F64))


def test_the_float64_tables_are_hf_yarn_rotary_embedding():
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

    x = torch.zeros(1, N, F, dtype=F64)
    theirs = Qwen2RotaryEmbedding(hf().config)(x, torch.arange(N)[None])
    assert_tables_near_float32(yarn_tables(N), theirs)


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_qwen2_yarn_equals_hf_qwen2_attention_with_yarn_float64(causal):
    design = tdiag.load(DESIGNS / "qwen2_yarn.td", F=F, H=H, G=G, Theta=THETA, Factor=FACTOR, L=OLD_CONTEXT)
    module = compiled64(design, causal)
    load_into(module, weights(hf()))
    x = random_input(BATCH, N, F)
    with torch.no_grad():
        assert_equal64(module(x), hf()(x, yarn_tables(N), plain_or_causal_mask(N, causal))[0])
