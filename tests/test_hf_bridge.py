"""tdiag.hf (issue 25): a Hugging Face causal LM whose attention blocks are compiled designs.
With the model's own attention (designs/llama.td, gpt2.td) and its weights imported, the logits
are the untouched model's in float64 and greedy generation with the cache gives the same tokens;
any other design generates the same with and without the cache. Models are built from small
configs with random weights (no downloads)."""

from __future__ import annotations

import re

import pytest
import torch
from hf_support import Float64RMSNorm, Float64Rotary

transformers = pytest.importorskip("transformers")

import tdiag.hf  # noqa: E402

F64 = torch.float64
VOCAB, PROMPT, NEW = 100, 9, 6


def llama(**changes) -> torch.nn.Module:
    config = transformers.LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=96,
        vocab_size=VOCAB,
        bos_token_id=1,
        eos_token_id=2,
        **changes,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(F64).eval()
    model.model.rotary_emb = Float64Rotary(16, config.rope_parameters["rope_theta"])
    return model


def qwen3() -> torch.nn.Module:
    config = transformers.Qwen3Config(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,
        num_hidden_layers=2,
        intermediate_size=96,
        vocab_size=VOCAB,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config).to(F64).eval()
    model.model.rotary_emb = Float64Rotary(24, config.rope_parameters["rope_theta"])
    with torch.no_grad():
        for layer in model.model.layers:
            for name in ("q_norm", "k_norm"):
                norm = getattr(layer.self_attn, name)
                norm.weight.normal_(1, 0.3)
                setattr(layer.self_attn, name, Float64RMSNorm(norm))
    return model


def gpt2() -> torch.nn.Module:
    config = transformers.GPT2Config(n_embd=64, n_head=4, n_layer=2, vocab_size=VOCAB, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).to(F64).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("attn.bias"):
                parameter.normal_(0, 0.3)
    return model


def prompt() -> torch.Tensor:
    return torch.randint(3, VOCAB, (2, PROMPT), generator=torch.Generator().manual_seed(4))


def greedy(model, ids: torch.Tensor, use_cache: bool = True) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=NEW, do_sample=False, pad_token_id=0, use_cache=use_cache)


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("build", [llama, qwen3, gpt2], ids=["llama", "qwen3", "gpt2"])
def test_the_models_own_attention_with_its_weights_gives_the_same_logits(build):
    model, ids = build(), prompt()
    expected = logits(model, ids)
    tdiag.hf.use_design(model)
    actual = logits(model, ids)
    assert (actual - expected).abs().max() <= 1e-10 * expected.abs().max()


@pytest.mark.parametrize("build", [llama, qwen3, gpt2], ids=["llama", "qwen3", "gpt2"])
def test_greedy_generation_with_the_cache_gives_the_models_tokens(build):
    model, ids = build(), prompt()
    expected = greedy(model, ids)
    tdiag.hf.use_design(model)
    assert torch.equal(greedy(model, ids), expected)


def test_every_attention_block_is_replaced_by_a_compiled_design():
    model = tdiag.hf.use_design(llama())
    assert all(isinstance(layer.self_attn, tdiag.hf.DesignAttention) for layer in model.model.layers)
    assert [layer.self_attn.layer_idx for layer in model.model.layers] == [0, 1]


def test_another_design_generates_the_same_tokens_with_and_without_the_cache():
    model = tdiag.hf.use_design(llama(), "mhsa")
    ids = prompt()
    assert torch.equal(greedy(model, ids), greedy(model, ids, use_cache=False))


def test_another_design_takes_the_models_width_and_head_count():
    model = tdiag.hf.use_design(llama(), "mhsa")
    block = model.model.layers[0].self_attn.block
    assert block.WQ.shape == (64, 4, 16)


def test_a_padded_batch_is_refused_naming_the_attention_mask():
    model = tdiag.hf.use_design(llama())
    ids = prompt()
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with pytest.raises(ValueError, match=r"attention_mask: .* padding"), torch.no_grad():
        model(ids, attention_mask=mask)


def test_a_config_the_design_does_not_model_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="attention_bias = True"):
        tdiag.hf.use_design(llama(attention_bias=True))


def test_an_unknown_family_is_refused_naming_the_known_ones():
    config = transformers.BertConfig(hidden_size=32, num_attention_heads=2, num_hidden_layers=1, vocab_size=50)
    with pytest.raises(
        ValueError,
        match="knows the families gemma2, gemma3_text, gpt2, llama, mistral, olmo2, phi, qwen2, qwen3, starcoder2, "
        "not 'bert'",
    ):
        tdiag.hf.use_design(transformers.BertModel(config))


def test_a_design_of_another_width_is_refused_naming_it(tmp_path):
    design = tdiag.load("mhsa", F=32, H=4)
    with pytest.raises(ValueError, match="design mhsa: does not take the model's hidden states of width 64"):
        tdiag.hf.use_design(llama(), design)


def test_a_qwen3_config_with_another_norm_epsilon_is_refused_with_the_reason():
    config = transformers.Qwen3Config(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=1,
        vocab_size=VOCAB,
        rms_norm_eps=1e-5,
    )
    with pytest.raises(ValueError, match=r"rms_norm_eps = 1e-05 \(designs/qwen3.td"):
        tdiag.hf.use_design(transformers.Qwen3ForCausalLM(config))


def test_the_cache_holds_the_designs_key_value_rows_not_the_layer_inputs():
    model = tdiag.hf.use_design(llama())
    with torch.no_grad():
        past = model(prompt(), use_cache=True).past_key_values
    # llama.td's cached rows per position: rotated keys Kr[m g d] and values V[m g e], G = 2 key-value heads of 16
    assert past.layers[0].keys.shape == (2, 1, PROMPT, 2 * 2 * 16)
    assert past.get_seq_length() == PROMPT


def test_beam_search_with_the_key_value_rows_gives_the_tokens_without_the_cache():
    model = tdiag.hf.use_design(llama(), "mhsa")
    ids = prompt()
    with torch.no_grad():
        beams = [
            model.generate(ids, max_new_tokens=NEW, num_beams=3, do_sample=False, pad_token_id=0, use_cache=use)
            for use in (True, False)
        ]
    assert torch.equal(*beams)


def test_a_design_without_key_value_rows_generates_by_re_running_the_prefix():
    model = tdiag.hf.use_design(llama(), "forgetting_attention")
    ids = prompt()
    assert tdiag.DecodeCache(model.model.layers[0].self_attn.block).kind == "prefix"
    assert torch.equal(greedy(model, ids), greedy(model, ids, use_cache=False))


def hidden(n: int = PROMPT) -> torch.Tensor:
    return torch.randn(2, n, 64, dtype=F64, generator=torch.Generator().manual_seed(5))


def test_the_cache_under_another_keyword_is_refused_naming_it():
    """transformers 5.23 passes the cache as past_key_values=: swallowed, each decoding step would
    attend to its new tokens alone."""
    attention = tdiag.hf.use_design(llama()).model.layers[0].self_attn
    cache = transformers.DynamicCache()
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'past_key_values'.*cache="), torch.no_grad():
        attention(hidden(), past_key_values=cache)


def test_a_keyword_the_bridge_ignores_by_design_is_taken():
    attention = tdiag.hf.use_design(llama()).model.layers[0].self_attn
    with torch.no_grad():
        output, weights = attention(hidden(), use_cache=False, output_hidden_states=True, num_items_in_batch=3)
    assert output.shape == (2, PROMPT, 64) and weights is None


@pytest.mark.parametrize(
    ("keyword", "value", "reason"),
    [
        ("is_causal", False, "compiled causal"),
        ("output_attentions", True, "no attention weights"),
        ("cu_seq_lens_q", torch.tensor([0, 4, 9]), "packed sequences"),
    ],
    ids=["bidirectional", "attention weights", "packed"],
)
def test_a_keyword_at_a_value_the_design_does_not_compute_is_refused(keyword, value, reason):
    attention = tdiag.hf.use_design(llama()).model.layers[0].self_attn
    with pytest.raises(ValueError, match=f"{keyword}=.*{reason}"), torch.no_grad():
        attention(hidden(), **{keyword: value})


def test_position_ids_other_than_the_cache_length_onwards_are_refused():
    attention = tdiag.hf.use_design(llama()).model.layers[0].self_attn
    shifted = torch.arange(3, 3 + PROMPT)[None]
    with pytest.raises(ValueError, match=r"position_ids: .* positions 0 \.\. 8"), torch.no_grad():
        attention(hidden(), position_ids=shifted)


def test_output_attentions_through_the_model_is_refused():
    model = tdiag.hf.use_design(llama())
    with pytest.raises(ValueError, match="output_attentions=True"), torch.no_grad():
        model(prompt(), output_attentions=True)


@pytest.mark.parametrize("version", ["5.23.0", "6.0.0", "4.57.1"])
def test_a_transformers_outside_the_supported_range_is_refused_at_replacement(monkeypatch, version):
    model = llama()
    monkeypatch.setattr(transformers, "__version__", version)
    message = rf"tdiag.hf supports transformers >= 5.24, < 6.0, not the installed {re.escape(version)}$"
    with pytest.raises(RuntimeError, match=message):
        tdiag.hf.use_design(model)
    assert not isinstance(model.model.layers[0].self_attn, tdiag.hf.DesignAttention)


def test_a_model_class_derived_from_a_transformers_one_is_bridged():
    """The version is transformers', not that of the module the model's class is defined in."""

    class MyLlama(transformers.LlamaForCausalLM):
        pass

    model, ids = llama(), prompt()
    expected = logits(model, ids)
    model.__class__ = MyLlama
    tdiag.hf.use_design(model)
    assert (logits(model, ids) - expected).abs().max() <= 1e-10 * expected.abs().max()
