# Llama 3.1's self-attention block: Llama's grouped-query attention with rotary embeddings whose
# frequencies are rescaled piecewise by wavelength ("llama3" rope scaling) for a longer context.
# Paper: Grattafiori et al., "The Llama 3 Herd of Models" (2024), Sec. 3.1 (8 key-value heads,
# RoPE base 500,000) and Sec. 3.4.2 (long-context pre-training to 128K tokens); the rotation of
# Su et al., RoFormer (2021), eq. (34), logits eq. (16); the heads of Ainslie et al., GQA (2023),
# Sec. 2.2.
# Module: Hugging Face transformers' LlamaAttention with rope_parameters of rope_type "llama3"
# (modeling_rope_utils._compute_llama3_parameters, Meta's apply_scaling in llama-models), as it
# computes the inverse frequencies: wavelen = 2π / θ_p; θ_p / factor where wavelen > L / lo;
# θ_p where wavelen < L / hi; otherwise (1 − c) θ_p / factor + c θ_p with
# c = (L / wavelen − lo) / (hi − lo); the rest as llama.td.
# Readings:
# - Extends llama.td, replacing its frequencies theta[p]. The three pieces are one formula:
#   c_p = clamp((L·θ_p / (2π) − lo) / (hi − lo), 0, 1) and θ'_p = θ_p·((1 − c_p) / Factor + c_p):
#   c_p < 0 exactly where wavelen > L / lo (clamped to 0: θ_p / Factor), c_p > 1 exactly where
#   wavelen < L / hi (clamped to 1: θ_p), and between them HF's smoothed value; at either
#   boundary both pieces agree.
# - The sizes are HF's rope_parameters: Factor = factor = 8, Lo = low_freq_factor = 1,
#   Hi = high_freq_factor = 4, L = original_max_position_embeddings = 8192 (Llama 3.1's values;
#   Llama 3.2 sets factor 32), Theta = rope_theta = 500000. HF computes the frequencies and the
#   cos, sin tables in float32; here they are computed in the compute dtype. theta0 is HF's
#   inv_freq = 1 / base ^ (arange(0, D, 2) / D) as written there (docs/language.md, "Frequency
#   arithmetic").
# - attention_factor is 1 for this rope type (cos and sin are not rescaled). Causal as a decoder:
#   `with_causal_mask()`.
# family: production
design llama3 extends llama

replace size Theta = 500000
size Factor = 8, Lo = 1, Hi = 4, L = 8192

theta0[p] = 1 / Theta ^ (2 index(p, P) / D)
c[p]      = clamp((L theta0[p] / (2 * pi) - Lo) / (Hi - Lo), 0, 1)
replace theta[p] = theta0[p] ((1 - c[p]) / Factor + c[p])
