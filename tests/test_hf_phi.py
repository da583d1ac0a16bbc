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
from hf_support import (  # noqa: E402
    assert_equal64,
    compiled64,
    default_rope,
    gqa_weights,
    load_into,
    plain_or_causal_mask,
    random_input,
    randomized,
    rope_cos_sin,
    sdpa_config,
)

import tdiag  # noqa: E402

F, H, G, D, DR, THETA = 32, 4, 2, 8, 4, 10000
N, BATCH = 9, 2


@functools.cache
def hf() -> torch.nn.Module:
    from transformers import PhiConfig
    from transformers.models.phi.modeling_phi import PhiAttention

    config = sdpa_config(PhiConfig, F, H, G, rope_parameters=default_rope(THETA, partial_rotary_factor=DR / D))
    attn = randomized(PhiAttention(config, 0))
    assert attn.rotary_ndims == DR
    return attn


def weights(attn: torch.nn.Module) -> dict[str, torch.Tensor]:
    """q/k/v_proj and dense ([out, in], heads head-major) and their biases on the design's legs."""
    return gqa_weights(attn, F, G, H // G, D, output="dense", biases=True) | {"bo": attn.dense.bias}


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_phi_equals_hf_phi_attention_float64(causal):
    design = tdiag.load(DESIGNS / "phi.td", F=F, H=H, G=G, Dr=DR)
    module = compiled64(design, causal)
    load_into(module, weights(hf()))
    x = random_input(BATCH, N, F)
    with torch.no_grad():
        assert_equal64(module(x), hf()(x, rope_cos_sin(N, DR, THETA), plain_or_causal_mask(N, causal))[0])
