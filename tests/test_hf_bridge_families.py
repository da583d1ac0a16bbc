"""tdiag.hf for the families beyond Llama, Qwen3 and GPT-2 (issue 36): Mistral (with and without
its sliding window), Qwen2, OLMo 2, StarCoder2 (with and without biases), Phi, Gemma 2 and Gemma 3
(their sliding and global layers by layer type).
With the model's own attention and its weights imported, the logits are the untouched model's in
float64 (its RoPE tables, Gemma 3's QK-norm and Gemma 2's eager softmax computed in float64, as
the designs compute them)
and greedy generation with the cache gives the same tokens; the windows (4) are shorter than the
prompt, so that they hide keys. Models are built from small configs with random weights."""

from __future__ import annotations

import pytest
import torch
from hf_support import Float64GemmaRMSNorm, Float64RMSNorm, Float64Rotary

transformers = pytest.importorskip("transformers")

from test_hf_gemma2 import eager_attention_forward_f64  # noqa: E402

import tdiag.hf  # noqa: E402

F64 = torch.float64
VOCAB, PROMPT, NEW, WINDOW = 100, 9, 6, 4
COMMON = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "intermediate_size": 96,
    "vocab_size": VOCAB,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
GEMMA = {**COMMON, "head_dim": 16, "query_pre_attn_scalar": 12, "sliding_window": WINDOW}
GEMMA_LAYERS = ["sliding_attention", "full_attention"]


@pytest.fixture(autouse=True)
def gemma2_softmax_in_float64(monkeypatch):
    """Gemma 2 runs HF's eager attention (its logit softcap), whose softmax is in float32."""
    from transformers.models.gemma2 import modeling_gemma2

    monkeypatch.setattr(modeling_gemma2, "eager_attention_forward", eager_attention_forward_f64)


def built(model_class: type, config: object) -> torch.nn.Module:
    torch.manual_seed(0)
    return model_class(config).to(F64).eval()


def mistral(window: int | None = WINDOW) -> torch.nn.Module:
    model = built(transformers.MistralForCausalLM, transformers.MistralConfig(**COMMON, sliding_window=window))
    model.model.rotary_emb = Float64Rotary(16, 10000)
    return model


def mistral_without_window() -> torch.nn.Module:
    return mistral(None)


def qwen2() -> torch.nn.Module:
    config = transformers.Qwen2Config(**COMMON, rope_parameters={"rope_type": "default", "rope_theta": 1000000})
    model = built(transformers.Qwen2ForCausalLM, config)
    model.model.rotary_emb = Float64Rotary(16, 1000000)
    with torch.no_grad():
        for layer in model.model.layers:
            for projection in ("q_proj", "k_proj", "v_proj"):
                getattr(layer.self_attn, projection).bias.normal_(0, 0.3)
    return model


def gemma2() -> torch.nn.Module:
    config = transformers.Gemma2Config(**GEMMA, layer_types=GEMMA_LAYERS)
    model = built(transformers.Gemma2ForCausalLM, config)
    model.model.rotary_emb = Float64Rotary(16, 10000)
    return model


def gemma3_config(**changes) -> object:
    rope = {
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000},
    }
    return transformers.Gemma3TextConfig(**{**GEMMA, "layer_types": GEMMA_LAYERS, "rope_parameters": rope, **changes})


def gemma3() -> torch.nn.Module:
    model = built(transformers.Gemma3ForCausalLM, gemma3_config())
    tables = {"full_attention": (16, 1000000, 2.0), "sliding_attention": (16, 10000, 1.0)}
    model.model.rotary_emb = Float64Rotary(per_layer_type=tables)
    with torch.no_grad():
        for layer in model.model.layers:
            for name in ("q_norm", "k_norm"):
                norm = getattr(layer.self_attn, name)
                norm.weight.normal_(0, 0.3)
                setattr(layer.self_attn, name, Float64GemmaRMSNorm(norm))
    return model


def random_biases(model: torch.nn.Module, projections: tuple[str, ...]) -> None:
    with torch.no_grad():
        for layer in model.model.layers:
            for projection in projections:
                getattr(layer.self_attn, projection).bias.normal_(0, 0.3)


def olmo2() -> torch.nn.Module:
    model = built(transformers.Olmo2ForCausalLM, transformers.Olmo2Config(**COMMON, rms_norm_eps=1e-6))
    model.model.rotary_emb = Float64Rotary(16, model.config.rope_parameters["rope_theta"])
    with torch.no_grad():
        for layer in model.model.layers:
            for name in ("q_norm", "k_norm"):
                norm = getattr(layer.self_attn, name)
                norm.weight.normal_(1, 0.3)
                setattr(layer.self_attn, name, Float64RMSNorm(norm))
    return model


def starcoder2(use_bias: bool = True) -> torch.nn.Module:
    config = transformers.Starcoder2Config(**COMMON, sliding_window=WINDOW, use_bias=use_bias)
    model = built(transformers.Starcoder2ForCausalLM, config)
    model.model.rotary_emb = Float64Rotary(16, config.rope_parameters["rope_theta"])
    if use_bias:
        random_biases(model, ("q_proj", "k_proj", "v_proj", "o_proj"))
    return model


def starcoder2_without_biases() -> torch.nn.Module:
    return starcoder2(use_bias=False)


def phi() -> torch.nn.Module:
    """Phi with half of each head rotated (partial_rotary_factor 0.5: 8 of 16)."""
    model = built(transformers.PhiForCausalLM, transformers.PhiConfig(**COMMON))
    model.model.rotary_emb = Float64Rotary(8, model.config.rope_parameters["rope_theta"])
    random_biases(model, ("q_proj", "k_proj", "v_proj", "dense"))
    return model


MODELS = [mistral, mistral_without_window, qwen2, olmo2, starcoder2, starcoder2_without_biases, phi, gemma2, gemma3]
NAMES = [
    "mistral",
    "mistral without window",
    "qwen2",
    "olmo2",
    "starcoder2",
    "starcoder2 without biases",
    "phi",
    "gemma2",
    "gemma3",
]


def prompt() -> torch.Tensor:
    return torch.randint(3, VOCAB, (2, PROMPT), generator=torch.Generator().manual_seed(4))


def greedy(model, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens greedy generation gives and the logits of each step, [steps, batch, vocab]."""
    with torch.no_grad():
        out = model.generate(
            ids, max_new_tokens=NEW, do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True
        )
    return out.sequences, torch.stack(out.logits)


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("build", MODELS, ids=NAMES)
def test_the_models_own_attention_with_its_weights_gives_the_same_logits_float64(build):
    model, ids = build(), prompt()
    expected = logits(model, ids)
    tdiag.hf.use_design(model)
    assert (logits(model, ids) - expected).abs().max() <= 1e-10 * expected.abs().max()


@pytest.mark.parametrize("build", MODELS, ids=NAMES)
def test_greedy_generation_with_the_cache_gives_the_models_tokens_and_step_logits(build):
    model, ids = build(), prompt()
    tokens, steps = greedy(model, ids)
    tdiag.hf.use_design(model)
    our_tokens, our_steps = greedy(model, ids)
    assert torch.equal(our_tokens, tokens)
    assert (our_steps - steps).abs().max() <= 1e-10 * steps.abs().max()


@pytest.mark.parametrize(
    ("build", "designs"),
    [
        (mistral, [("mistral", WINDOW), ("mistral", WINDOW)]),
        (mistral_without_window, [("llama", None), ("llama", None)]),
        (starcoder2_without_biases, [("mistral", WINDOW), ("mistral", WINDOW)]),
        (gemma2, [("gemma2_sliding", WINDOW), ("gemma2", None)]),
        (gemma3, [("gemma3_sliding", WINDOW), ("gemma3", None)]),
    ],
    ids=["mistral", "mistral without window", "starcoder2 without biases", "gemma2", "gemma3"],
)
def test_each_layer_takes_the_design_of_its_layer_type_and_its_window(build, designs):
    model = tdiag.hf.use_design(build())
    attentions = [layer.self_attn for layer in model.model.layers]
    assert [(attention.block.tdiag_plan.graph.name, attention.window) for attention in attentions] == designs


def test_the_window_hides_keys_at_these_lengths():
    """The windowed layers' logits differ from the same weights attending to every earlier key."""
    windowed, full = mistral(), mistral_without_window()
    assert not torch.allclose(logits(windowed, prompt()), logits(full, prompt()))


def test_a_sliding_layer_of_the_cache_keeps_every_position_of_the_designs_rows():
    """HF's cache keeps a sliding layer's last W − 1 positions; the design's rows are kept whole."""
    model = tdiag.hf.use_design(mistral())
    with torch.no_grad():
        past = model(prompt(), use_cache=True).past_key_values
    assert [layer.keys.shape[-2] for layer in past.layers] == [PROMPT, PROMPT]


def test_a_qwen2_config_with_sliding_layers_is_refused_with_the_reason():
    config = transformers.Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=4, max_window_layers=1)
    with pytest.raises(ValueError, match=r"designs/qwen2.td computes: sliding-window layers"):
        tdiag.hf.use_design(transformers.Qwen2ForCausalLM(config))


def test_a_gemma2_config_with_another_logit_softcap_is_refused_with_the_reason():
    config = transformers.Gemma2Config(**GEMMA, attn_logit_softcapping=30.0)
    with pytest.raises(ValueError, match=r"attn_logit_softcapping = 30.0 \(designs/gemma2.td caps the logits at 50\)"):
        tdiag.hf.use_design(transformers.Gemma2ForCausalLM(config))


def test_a_gemma3_config_with_another_rope_scaling_is_refused_with_the_reason():
    rope = {
        "full_attention": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1000000},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000},
    }
    with pytest.raises(ValueError, match=r"rope_type 'dynamic' \(designs/gemma3.td computes the default or linear"):
        tdiag.hf.use_design(transformers.Gemma3ForCausalLM(gemma3_config(rope_parameters=rope)))


def test_another_design_in_a_windowed_model_is_refused_where_the_models_mask_hides_keys():
    """mhsa attends to every earlier key; HF gives the layer its sliding-window mask."""
    model = tdiag.hf.use_design(mistral(), "mhsa")
    with pytest.raises(ValueError, match=r"attention_mask: tdiag\.hf runs a design with its causal mask only"):
        logits(model, prompt())


def test_a_starcoder2_config_without_a_window_is_refused_with_the_reason():
    config = transformers.Starcoder2Config(**COMMON, sliding_window=None)
    with pytest.raises(ValueError, match=r"sliding_window = None \(designs/starcoder2.td attends within a window\)"):
        tdiag.hf.use_design(transformers.Starcoder2ForCausalLM(config))


def test_a_phi_config_with_qk_layernorm_is_refused_with_the_reason():
    config = transformers.PhiConfig(**COMMON, qk_layernorm=True)
    with pytest.raises(ValueError, match=r"qk_layernorm = True \(designs/phi.td"):
        tdiag.hf.use_design(transformers.PhiForCausalLM(config))
