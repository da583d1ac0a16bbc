"""designs/starcoder2.td equals Hugging Face transformers' Starcoder2Attention in float64: the HF
module is built from a small config (sliding_window W = 5, shorter than the test length N = 12,
use_bias = True) with random weights and biases, its weights are copied into the compiled module's
leg-shaped parameters, and it is given the mask HF's model gives it
(masking_utils.sliding_window_causal_mask_function) and its rotary tables in float64. Outputs agree
to 1e-10 relative for each lowering of the window (SDPA with the band as its mask, the banded form,
the materialized box)."""

from __future__ import annotations

import functools

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from conftest import DESIGNS  # noqa: E402
from hf_support import (  # noqa: E402
    F64,
    assert_equal64,
    default_rope,
    gqa_weights,
    load_into,
    random_input,
    randomized,
    rope_cos_sin,
    sdpa_config,
    sliding_window_mask,
)

import tdiag  # noqa: E402
from tdiag.plan.forms import only_forms  # noqa: E402

F, H, G, D, W, THETA = 32, 4, 2, 8, 5, 10000
N, BATCH = 12, 2


@functools.cache
def hf() -> torch.nn.Module:
    from transformers import Starcoder2Config
    from transformers.models.starcoder2.modeling_starcoder2 import Starcoder2Attention

    config = sdpa_config(
        Starcoder2Config, F, H, G, sliding_window=W, use_bias=True, rope_parameters=default_rope(THETA)
    )
    return randomized(Starcoder2Attention(config, 0))


def weights(attn: torch.nn.Module) -> dict[str, torch.Tensor]:
    """q/k/v/o_proj ([out, in], heads head-major) and their biases on the design's legs; query head
    (g r) = g·R + r."""
    return gqa_weights(attn, F, G, H // G, D, biases=True) | {"bo": attn.o_proj.bias}


def hf_output(x: torch.Tensor) -> torch.Tensor:
    return hf()(x, rope_cos_sin(N, D, THETA), sliding_window_mask(N, W))[0]


@pytest.mark.parametrize("form", ["sdpa_grouped", "banded", "materialized"])
def test_starcoder2_equals_hf_starcoder2_attention_float64(form):
    design = tdiag.load(DESIGNS / "starcoder2.td", F=F, H=H, G=G, W=W)
    with only_forms(form):
        module = design.module(N=N, dtype=F64)
    assert [choice.taken for choice in module.tdiag_plan.choices] == [form]
    load_into(module, weights(hf()))
    x = random_input(BATCH, N, F)
    with torch.no_grad():
        assert_equal64(module(x), hf_output(x))


def test_starcoder2_is_causal_by_its_window():
    design = tdiag.load(DESIGNS / "starcoder2.td", F=F, H=H, G=G, W=W)
    assert design.with_causal_mask().graph is design.graph
