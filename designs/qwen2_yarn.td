# Qwen2's self-attention block with YaRN rope scaling (Qwen2.5's long-context setting): the rotary
# frequencies blended between interpolated and original along a linear ramp over the frequency
# index, and the attention logits scaled by the YaRN temperature.
# Paper: Peng et al., "YaRN: Efficient Context Window Extension of Large Language Models" (2023),
# its "NTK-by-parts" interpolation (the ramp function γ over the ratio of the context length to a
# dimension's wavelength) and its attention temperature √(1/t) = 0.1 ln(s) + 1; Qwen Team,
# "Qwen2.5 Technical Report" (2024) (YaRN for contexts past 32K tokens); the rotation of Su et
# al., RoFormer (2021), eq. (34), logits eq. (16).
# Module: Hugging Face transformers' Qwen2Attention with rope_parameters of rope_type "yarn"
# (modeling_rope_utils._compute_yarn_parameters), as it computes: lo = max(floor(d(β_fast)), 0),
# hi = min(ceil(d(β_slow)), D − 1) with d(β) = D ln(L / (2π β)) / (2 ln Theta); ramp_p =
# clamp((p − lo) / (hi − lo), 0, 1); inv_freq_p = θ_p / Factor · ramp_p + θ_p · (1 − ramp_p),
# θ_p = Theta^(−2p/D); cos and sin multiplied by attention_factor = 0.1 ln(Factor) + 1; the rest
# as qwen2.td.
# Readings:
# - Extends qwen2.td, replacing its frequencies and its box. HF multiplies both cos and sin by the
#   attention factor, so each rotated query and key is that factor times the plain one and each
#   logit its square: the box's scale is (0.1 ln(Factor) + 1)² / √D (values are not rotated).
# - The sizes are HF's rope_parameters: Factor = factor = 4, L = original_max_position_embeddings
#   = 32768, BetaFast = beta_fast = 32, BetaSlow = beta_slow = 1 (Qwen2.5's suggested config.json
#   entry; HF's defaults for β); mscale and mscale_all_dim unset, truncate = True (floor and ceil
#   taken). HF's guard for lo = hi (hi + 0.001) is not written: at these sizes lo < hi.
# - HF computes the frequencies and the tables in float32; here they are computed in the
#   compute dtype. Causal as a decoder: `with_causal_mask()`.
# family: production
design qwen2_yarn extends qwen2

size Factor = 4, L = 32768, BetaFast = 32, BetaSlow = 1

lo[]      = max(floor(D * log(L / (BetaFast * 2 * pi)) / (2 * log(Theta))), 0)
hi[]      = min(ceil(D * log(L / (BetaSlow * 2 * pi)) / (2 * log(Theta))), D - 1)
ramp[p]   = clamp((index(p, P) - lo[]) / (hi[] - lo[]), 0, 1)
theta0[p] = 1 / Theta ^ (2 index(p, P) / D)
replace theta[p] = theta0[p] (ramp[p] / Factor + 1 - ramp[p])
replace A[g r n m] = softmax[m, scale = (0.1 * log(Factor) + 1) ^ 2 / sqrt(D)](Qr[n g r d] Kr[m g d])
