"""designs/gemma2.td equals Hugging Face's Gemma2Attention (a global layer) in float64: grouped-
query heads, RoPE with default rope parameters, query_pre_attn_scalar scaling and the tanh logit
softcap, plain and causal, with HF's weights copied in; materialized (the CPU default) and through
FlexAttention's score_mod (forward, eager flex). HF computes RoPE's cos and sin and its eager
softmax in float32 even in a float64 module; the test builds both in float64."""

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from conftest import DESIGNS  # noqa: E402
from transformers.models.gemma2 import modeling_gemma2  # noqa: E402
from transformers.models.gemma2.modeling_gemma2 import Gemma2Attention, Gemma2Config, repeat_kv  # noqa: E402

import tdiag  # noqa: E402
from tdiag.plan import forms  # noqa: E402

F64 = torch.float64
F, H, G, D, N = 16, 4, 2, 8, 7
LONG = 21  # two blocks of the banded form's 16 queries
SCALAR, SOFTCAP, THETA = 256, 50.0, 10000.0


def eager_attention_forward_f64(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None, **kwargs
):
    """HF's Gemma 2 eager attention with its softmax in float64 (HF's upcasts to float32)."""
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if softcap is not None:
        attn_weights = torch.tanh(attn_weights / softcap) * softcap
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = attn_weights.softmax(-1)
    return torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous(), attn_weights


def gemma2_attention(layer_type: str, seed: int, **extra) -> Gemma2Attention:
    """One Gemma2Attention layer of `layer_type` in float64, its weights normal(0, 2): scores of
    tens, which the softcap bends."""
    config = Gemma2Config(
        hidden_size=F,
        num_attention_heads=H,
        num_key_value_heads=G,
        head_dim=D,
        num_hidden_layers=1,
        layer_types=[layer_type],
        query_pre_attn_scalar=SCALAR,
        attn_logit_softcapping=SOFTCAP,
        rope_parameters={"rope_type": "default", "rope_theta": THETA},
        **extra,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    module = Gemma2Attention(config, layer_idx=0).to(F64).eval()
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.normal_(0.0, 2.0)
    return module


@pytest.fixture(scope="module")
def hf():
    return gemma2_attention("full_attention", seed=0)


def weights(hf) -> dict[str, torch.Tensor]:
    """HF's projections laid out on the design's legs: query head (g r) = g·R + r."""
    R = H // G
    return {
        "WQ": hf.q_proj.weight.T.reshape(F, G, R, D),
        "WK": hf.k_proj.weight.T.reshape(F, G, D),
        "WV": hf.v_proj.weight.T.reshape(F, G, D),
        "WO": hf.o_proj.weight.T.reshape(G, R, D, F),
    }


def rotary(length: int = N) -> tuple[torch.Tensor, torch.Tensor]:
    """Gemma2RotaryEmbedding's cos and sin (default rope), in float64."""
    inv_freq = 1.0 / (THETA ** (torch.arange(0, D, 2, dtype=F64) / D))
    angles = torch.arange(length, dtype=F64)[:, None] * inv_freq
    emb = torch.cat([angles, angles], -1)
    return emb.cos()[None], emb.sin()[None]


def hf_output(hf, x: torch.Tensor, causal: bool, monkeypatch) -> torch.Tensor:
    monkeypatch.setattr(modeling_gemma2, "eager_attention_forward", eager_attention_forward_f64)
    mask = None
    if causal:
        future = torch.ones(N, N, dtype=torch.bool).triu(1)
        mask = torch.zeros(N, N, dtype=F64).masked_fill(future, torch.finfo(F64).min)[None, None]
    with torch.no_grad():
        return hf(x, position_embeddings=rotary(), attention_mask=mask)[0]


def design(causal: bool, text: str | None = None) -> tdiag.Design:
    sizes = {"F": F, "G": G, "R": H // G, "H": H, "D": D, "QS": SCALAR}
    loaded = tdiag.loads(text, **sizes) if text else tdiag.load(DESIGNS / "gemma2.td", **sizes)
    return loaded.with_causal_mask() if causal else loaded


def x_input() -> torch.Tensor:
    return torch.randn(2, N, F, dtype=F64, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("attention", ["sdpa", "flex"], ids=["materialized", "flex"])
@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_gemma2_equals_hf_gemma2_attention(hf, causal, attention, monkeypatch):
    module = design(causal).module(dtype=F64, N=N, attention=attention)
    assert [c.taken for c in module.tdiag_plan.choices] == ["materialized" if attention == "sdpa" else "flex"]
    module.load_state_dict({k: v.detach() for k, v in weights(hf).items()})
    x = x_input()
    with torch.no_grad():
        assert torch.allclose(module(x), hf_output(hf, x, causal, monkeypatch), atol=1e-10, rtol=0)


def test_the_softcap_changes_the_output_at_these_scales(hf, monkeypatch):
    """Without its softcap the design differs from HF's module: the test's scores are bent."""
    text = (DESIGNS / "gemma2.td").read_text()
    uncapped = text.replace("50 tanh(Qr[n g r d] Kr[m g d] / sqrt(QS) / 50)", "Qr[n g r d] Kr[m g d] / sqrt(QS)")
    assert uncapped != text
    module = design(False, uncapped).module(dtype=F64, N=N)
    module.load_state_dict({k: v.detach() for k, v in weights(hf).items()})
    x = x_input()
    with torch.no_grad():
        assert not torch.allclose(module(x), hf_output(hf, x, False, monkeypatch), atol=1e-3)


@pytest.fixture(scope="module")
def hf_sliding():
    """A local sliding-window layer (window 3, shorter than N = 7)."""
    return gemma2_attention("sliding_attention", seed=2, sliding_window=3)


def sliding_design() -> tdiag.Design:
    sizes = {"F": F, "G": G, "R": H // G, "H": H, "D": D, "QS": SCALAR, "W": 3}
    return tdiag.load(DESIGNS / "gemma2_sliding.td", **sizes)


@pytest.mark.parametrize("form", ["materialized", "banded", "flex"])
def test_gemma2_sliding_equals_hf_with_its_sliding_window_mask(hf_sliding, form, monkeypatch):
    """Each form that takes the softcapped windowed box: materialized, banded (N = 21 is two
    blocks of 16 queries) and FlexAttention."""
    monkeypatch.setattr(modeling_gemma2, "eager_attention_forward", eager_attention_forward_f64)
    monkeypatch.setattr(forms, "FORMS", [f for f in forms.FORMS if f.name == form])
    module = sliding_design().module(dtype=F64, N=LONG, attention="flex" if form == "flex" else "sdpa")
    assert [c.taken for c in module.tdiag_plan.choices] == [form]
    module.load_state_dict({k: v.detach() for k, v in weights(hf_sliding).items()})
    n, m = torch.arange(LONG)[:, None], torch.arange(LONG)[None, :]
    hidden = (m > n) | (m <= n - 3)  # HF's sliding_window_causal_mask_function(3), inverted
    mask = torch.zeros(LONG, LONG, dtype=F64).masked_fill(hidden, torch.finfo(F64).min)[None, None]
    x = torch.randn(2, LONG, F, dtype=F64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf_sliding(x, position_embeddings=rotary(LONG), attention_mask=mask)[0]
        assert torch.allclose(module(x), expected, atol=1e-10, rtol=0)


def test_gemma2_sliding_takes_the_banded_form_at_long_lengths():
    """The window hides most keys at N = 4096, W = 256: blocks of the band beat the N² box."""
    plan = tdiag.load(DESIGNS / "gemma2_sliding.td", W=256).plan(N=4096)
    assert [c.taken for c in plan.choices] == ["banded"]


def test_gemma2_sliding_is_causal_by_its_window():
    design = sliding_design()
    assert design.with_causal_mask().source(N=N) == design.source(N=N)


def test_gemma2_sliding_differs_from_the_global_layer_beyond_its_window(hf_sliding):
    """The window hides keys: with the same weights the global layer's causal output differs."""
    x = x_input()
    outputs = []
    for loaded in (sliding_design(), design(True)):
        module = loaded.module(dtype=F64, N=N)
        module.load_state_dict({k: v.detach() for k, v in weights(hf_sliding).items()})
        with torch.no_grad():
            outputs.append(module(x))
    assert torch.allclose(outputs[0][:, :3], outputs[1][:, :3], atol=1e-10)
    assert not torch.allclose(outputs[0][:, 3:], outputs[1][:, 3:], atol=1e-3)
