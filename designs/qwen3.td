# Qwen3's self-attention block: Llama's grouped-query attention with rotate-half RoPE, plus QK-norm.
# Paper: Qwen Team, "Qwen3 Technical Report" (2025), Sec. 2 (architecture: GQA, RoPE, RMSNorm,
# QK-Norm in place of Qwen2's QKV bias), QK-norm after Dehghani et al., "Scaling Vision Transformers
# to 22 Billion Parameters" (2023), Sec. 2 (eq. of the normalized logits); RMSNorm of Zhang and
# Sennrich (2019), eq. (4): x / RMS(x) ⊙ g, RMS(x) = sqrt(mean(x²) + eps).
# Module: Hugging Face transformers' Qwen3Attention (models/qwen3/modeling_qwen3.py): q_norm and
# k_norm (Qwen3RMSNorm over head_dim, one learned weight of D entries shared by the heads) applied
# per head to q_proj(x) and k_proj(x), before apply_rotary_pos_emb; the rest as Llama (llama.td).
# Readings:
# - Extends llama.td: the queries and keys it rotates are the normalized projections
#   Q = nq ⊙ Qp / sqrt(mean_d Qp² + eps) (K with nk likewise); values are not normalized.
# - eps = 1e-6 (Qwen3Config.rms_norm_eps; written in the design, not a size). HF computes the
#   norm in float32 and casts back; here it is computed in the compute dtype.
# - Theta = 1000000 (the released checkpoints' rope_theta; Qwen3Config's default is 10000).
# - Head width D is its own size in Qwen3 (head_dim = 128 whatever F: Qwen3-0.6B is F = 1024,
#   H = 16, G = 8, D = 128): set D; the default here is F / H.
# - No bias (attention_bias = False), no sliding window (use_sliding_window = False, the
#   released models' setting); causal as a decoder: `with_causal_mask()`.
# family: production
design qwen3 extends llama

replace size Theta = 1000000
param nq[d: D] = ones
param nk[d: D] = ones

Qp[n g r d] = X[n f] WQ[f g r d]
Kp[m g d]   = X[m f] WK[f g d]
replace Q[n g r d] = nq[d] Qp[n g r d] (mean[d](Qp[n g r d] ^ 2) + 1e-6) ^ -0.5
replace K[m g d]   = nk[d] Kp[m g d] (mean[d](Kp[m g d] ^ 2) + 1e-6) ^ -0.5
