"""designs/t5.td (the encoder: bidirectional buckets) and designs/t5_decoder.td (causal, one-sided
buckets) equal transformers' T5Attention(config, has_relative_attention_bias=True) in float64: the
HF module is built from a small config with random weights, its weights copied into the compiled
module's leg-shaped parameters, and outputs and gradients agree to 1e-10 relative. The lengths
reach past max_distance, so every bucket is read, the log-spaced ones and the last one too; at
T5's own 32 buckets and max_distance 128 as well as at a small config. T5's buckets take their
log in float32 even in a float64 module, and so do the designs' (the language computes the real
part of a position in float32), so the buckets equal HF's exactly."""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import DESIGNS
from hf_support import F64, assert_equal64, load_into, plain_or_causal_mask, random_input, randomized

import tdiag

transformers = pytest.importorskip("transformers")

F, H, D, BATCH = 16, 2, 4, 2
CONFIGS = {"small": (8, 12, 20), "t5": (32, 128, 150)}  # name: (buckets, max_distance, test length)


@functools.cache
def hf(decoder: bool, config: str) -> torch.nn.Module:
    """HF's T5Attention in float64, eval mode, every weight drawn at random."""
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention

    buckets, distance, _ = CONFIGS[config]
    cfg = T5Config(
        d_model=F,
        d_kv=D,
        num_heads=H,
        relative_attention_num_buckets=buckets,
        relative_attention_max_distance=distance,
        dropout_rate=0.0,
        is_decoder=decoder,
        attn_implementation="eager",
    )
    return randomized(T5Attention(cfg, has_relative_attention_bias=True, layer_idx=0), seed=7, std=0.5)


@functools.cache
def compiled(decoder: bool, config: str) -> torch.nn.Module:
    """The design at the config's sizes, HF's weights copied in as WQ[f h d], ..., Rel[r h]."""
    buckets, distance, _ = CONFIGS[config]
    design = tdiag.load(DESIGNS / f"{'t5_decoder' if decoder else 't5'}.td", F=F, H=H, D=D, R=buckets, MD=distance)
    module = design.module(dtype=F64)
    attn = hf(decoder, config)
    load_into(
        module,
        {
            "WQ": attn.q.weight.T.reshape(F, H, D),
            "WK": attn.k.weight.T.reshape(F, H, D),
            "WV": attn.v.weight.T.reshape(F, H, D),
            "WO": attn.o.weight.T.reshape(H, D, F),
            "Rel": attn.relative_attention_bias.weight,
        },
    )
    return module


def hf_forward(attn: torch.nn.Module, x: torch.Tensor, decoder: bool) -> torch.Tensor:
    """The encoder unmasked; the decoder with HF's additive causal mask (0 on and below the
    diagonal, the dtype's lowest above)."""
    return attn(x, mask=plain_or_causal_mask(x.shape[-2], True) if decoder else None)[0]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("decoder", [False, True], ids=["encoder", "decoder"])
def test_t5_attention_and_its_gradients_equal_hf(decoder: bool, config: str):
    n = CONFIGS[config][2]
    x = random_input(BATCH, n, F)
    ours, theirs = compiled(decoder, config), hf(decoder, config)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = ours(xa), hf_forward(theirs, xb, decoder)
    assert_equal64(ya, yb)
    weight = torch.randn(ya.shape, dtype=F64, generator=torch.Generator().manual_seed(2))
    (ya * weight).sum().backward()
    (yb * weight).sum().backward()
    assert_equal64(xa.grad, xb.grad)
    assert_equal64(ours.Rel.grad, theirs.relative_attention_bias.weight.grad)
    ours.zero_grad(), theirs.zero_grad()


def test_t5_decoder_hides_later_keys():
    """A change to the last position leaves every earlier output of the decoder as it was."""
    module = compiled(True, "small")
    x = random_input(1, 10, F, seed=3)
    changed = x.clone()
    changed[:, -1] += 1.0
    with torch.no_grad():
        assert torch.equal(module(x)[:, :-1], module(changed)[:, :-1])
