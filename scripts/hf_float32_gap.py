"""How far the bridged logits are from the untouched model's when HF's float32 parts (its RoPE
tables, QK-norms, eager softmax) are left as they are: a float64 model of each bridged family
(small random configs, seed 0), its logits before and after `tdiag.hf.use_design`, printed as the
largest |difference| over the largest |logit|. The README's "within 1e-8 to 3e-7" is this.

    python scripts/hf_float32_gap.py
"""

import torch
import transformers

import tdiag.hf

F64 = torch.float64
VOCAB = 100
COMMON = dict(
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=2,
    intermediate_size=96,
    vocab_size=VOCAB,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
GEMMA = dict(
    COMMON, head_dim=16, query_pre_attn_scalar=12, sliding_window=4, layer_types=["sliding_attention", "full_attention"]
)
CASES = {
    "llama": (transformers.LlamaForCausalLM, lambda: transformers.LlamaConfig(**COMMON)),
    "qwen3": (transformers.Qwen3ForCausalLM, lambda: transformers.Qwen3Config(**COMMON, head_dim=24)),
    "mistral": (transformers.MistralForCausalLM, lambda: transformers.MistralConfig(**COMMON, sliding_window=4)),
    "qwen2": (transformers.Qwen2ForCausalLM, lambda: transformers.Qwen2Config(**COMMON)),
    "gemma2": (transformers.Gemma2ForCausalLM, lambda: transformers.Gemma2Config(**GEMMA)),
    "gemma3": (transformers.Gemma3ForCausalLM, lambda: transformers.Gemma3TextConfig(**GEMMA)),
    "gpt2": (
        transformers.GPT2LMHeadModel,
        lambda: transformers.GPT2Config(
            n_embd=64, n_head=4, n_layer=2, vocab_size=VOCAB, bos_token_id=1, eos_token_id=2
        ),
    ),
}


def gap(model_class, config) -> float:
    """max |bridged - untouched| / max |untouched| over the logits of one batch."""
    torch.manual_seed(0)
    model = model_class(config).to(F64).eval()
    layers = getattr(getattr(model, "model", None), "layers", [])
    if layers and hasattr(layers[0].self_attn, "q_norm"):
        with torch.no_grad():  # QK-norm weights away from 1, so that their float32 rounding shows
            for layer in layers:
                layer.self_attn.q_norm.weight.normal_(1, 0.3)
                layer.self_attn.k_norm.weight.normal_(1, 0.3)
    ids = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = model(ids).logits
        tdiag.hf.use_design(model)
        actual = model(ids).logits
    return float((actual - expected).abs().max() / expected.abs().max())


if __name__ == "__main__":
    for name, (model_class, config) in CASES.items():
        print(f"{name:8s} {gap(model_class, config()):.1e}")
