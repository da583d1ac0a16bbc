"""designs/gpt_oss.td equals Hugging Face's GptOssAttention (a full-attention layer) in float64:
grouped-query heads, RoPE with default rope parameters, biased q/k/v/o projections and a learned
sink per head, plain and causal, with HF's weights copied in. HF computes RoPE's cos and sin in
float32 even in a float64 module; the test builds them in float64 as GptOssRotaryEmbedding does."""

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from conftest import DESIGNS  # noqa: E402
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention, GptOssConfig  # noqa: E402

import tdiag  # noqa: E402
from tdiag.plan import forms  # noqa: E402

F64 = torch.float64
F, H, G, D, N = 16, 4, 2, 8, 7
THETA = 150000.0


def gpt_oss_attention(**layer) -> GptOssAttention:
    """GptOssAttention of one layer (its type and window given) in float64, random weights."""
    config = GptOssConfig(
        hidden_size=F,
        num_attention_heads=H,
        num_key_value_heads=G,
        head_dim=D,
        num_hidden_layers=1,
        attention_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": THETA},
        **layer,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    module = GptOssAttention(config, layer_idx=0).to(F64).eval()
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.normal_(0.0, 0.5)
    return module


@pytest.fixture(scope="module")
def hf():
    return gpt_oss_attention(layer_types=["full_attention"])


def weights(hf) -> dict[str, torch.Tensor]:
    """HF's parameters laid out on the design's legs: query head (g r) = g·R + r."""
    R = H // G
    return {
        "WQ": hf.q_proj.weight.T.reshape(F, G, R, D),
        "BQ": hf.q_proj.bias.reshape(G, R, D),
        "WK": hf.k_proj.weight.T.reshape(F, G, D),
        "BK": hf.k_proj.bias.reshape(G, D),
        "WV": hf.v_proj.weight.T.reshape(F, G, D),
        "BV": hf.v_proj.bias.reshape(G, D),
        "WO": hf.o_proj.weight.T.reshape(G, R, D, F),
        "BO": hf.o_proj.bias,
        "S": hf.sinks.reshape(G, R),
    }


def rotary() -> tuple[torch.Tensor, torch.Tensor]:
    """GptOssRotaryEmbedding's cos and sin (default rope: attention_scaling 1), in float64."""
    inv_freq = 1.0 / (THETA ** (torch.arange(0, D, 2, dtype=F64) / D))
    angles = torch.arange(N, dtype=F64)[:, None] * inv_freq
    return angles.cos()[None], angles.sin()[None]


def hf_output(hf, x: torch.Tensor, causal: bool) -> torch.Tensor:
    mask = None
    if causal:
        future = torch.ones(N, N, dtype=torch.bool).triu(1)
        mask = torch.zeros(N, N, dtype=F64).masked_fill(future, torch.finfo(F64).min)[None, None]
    with torch.no_grad():
        return hf(x, position_embeddings=rotary(), attention_mask=mask)[0]


@pytest.mark.parametrize("form", ["sdpa_sink", "materialized"])
@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_gpt_oss_equals_hf_gpt_oss_attention(hf, causal, form, monkeypatch):
    monkeypatch.setattr(forms, "FORMS", [f for f in forms.FORMS if f.name in (form, "materialized")])
    design = tdiag.load(DESIGNS / "gpt_oss.td", F=F, G=G, R=H // G, H=H, D=D)
    if causal:
        design = design.with_causal_mask()
    module = design.module(dtype=F64, N=N, objective="memory" if form == "sdpa_sink" else "time")
    assert [c.taken for c in module.tdiag_plan.choices] == [form]
    module.load_state_dict({k: v.detach() for k, v in weights(hf).items()})
    x = torch.randn(2, N, F, dtype=F64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(module(x), hf_output(hf, x, causal), atol=1e-10, rtol=0)


@pytest.fixture(scope="module")
def hf_sliding():
    """A sliding-window layer (window 3, shorter than N = 7)."""
    return gpt_oss_attention(layer_types=["sliding_attention"], sliding_window=3)


@pytest.mark.parametrize("form", ["sdpa_sink", "materialized"])
def test_gpt_oss_sliding_equals_hf_with_its_sliding_window_mask(hf_sliding, form, monkeypatch):
    monkeypatch.setattr(forms, "FORMS", [f for f in forms.FORMS if f.name in (form, "materialized")])
    design = tdiag.load(DESIGNS / "gpt_oss_sliding.td", F=F, G=G, R=H // G, H=H, D=D, W=3)
    module = design.module(dtype=F64, N=N, objective="memory" if form == "sdpa_sink" else "time")
    assert [c.taken for c in module.tdiag_plan.choices] == [form]
    module.load_state_dict({k: v.detach() for k, v in weights(hf_sliding).items()})
    n, m = torch.arange(N)[:, None], torch.arange(N)[None, :]
    hidden = (m > n) | (m <= n - 3)  # HF's sliding_window_causal_mask_function(3), inverted
    mask = torch.zeros(N, N, dtype=F64).masked_fill(hidden, torch.finfo(F64).min)[None, None]
    x = torch.randn(2, N, F, dtype=F64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf_sliding(x, position_embeddings=rotary(), attention_mask=mask)[0]
        assert torch.allclose(module(x), expected, atol=1e-10, rtol=0)


def test_gpt_oss_sliding_is_causal_by_its_window():
    design = tdiag.load(DESIGNS / "gpt_oss_sliding.td", F=F, G=G, R=H // G, H=H, D=D, W=3)
    assert design.with_causal_mask().source(N=N) == design.source(N=N)
