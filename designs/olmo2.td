# OLMo 2's self-attention block: Llama's attention with QK-norm, the RMS norm taken over the whole
# query (all heads' features together) and the whole key before they are split into heads.
# Paper: OLMo Team, "2 OLMo 2 Furious" (2024), Sec. 3.1 (architecture: RMSNorm, "QK-norm":
# normalizing the queries and keys with RMSNorm before the attention, Table 1); RMSNorm of Zhang
# and Sennrich (2019), eq. (4): x / RMS(x) ⊙ g, RMS(x) = sqrt(mean(x²) + eps); the rotation of
# Su et al., RoFormer (2021), eq. (34), logits eq. (16).
# Module: Hugging Face transformers' Olmo2Attention (models/olmo2/modeling_olmo2.py), as it
# computes: q = q_norm(q_proj(x)), k = k_norm(k_proj(x)) with Olmo2RMSNorm over the full
# projection width (H·D for q, G·D for k), v = v_proj(x); then the head split, apply_rotary_pos_emb
# with rotate_half, softmax(q kᵀ · head_dim^−0.5) v with each key-value head repeated (repeat_kv),
# o_proj. No biases (attention_bias = False).
# Readings:
# - Extends llama.td: the queries and keys it rotates are normalized over all their legs but the
#   position: Q[n g r d] = nq[g r d] Qp[n g r d] / sqrt(mean over (g, r, d) of Qp² + eps), a
#   weight of H·D entries (HF's q_norm.weight viewed head-major as (g r d)); K likewise over
#   (g, d) with nk[g d] (G·D entries). This differs from Qwen3's per-head norm (qwen3.td),
#   whose mean is over d alone and whose weight is shared by the heads.
# - eps = 1e-6 (Olmo2Config.rms_norm_eps). HF computes the norm in float32 and casts back; here
#   it is computed in the compute dtype.
# - Theta = 500000 (OLMo-2's released checkpoints' rope_theta; Olmo2Config's default is 10000).
#   OLMo-2-7B: F = 4096, H = 32, G = 32 (no grouping; set G = H), D = 128.
# - Causal as a decoder: `with_causal_mask()`.
# family: production
design olmo2 extends llama

replace size Theta = 500000
param nq[g: G, r: R, d: D] = ones
param nk[g: G, d: D] = ones

Qp[n g r d] = X[n f] WQ[f g r d]
Kp[m g d]   = X[m f] WK[f g d]
replace Q[n g r d] = nq[g r d] Qp[n g r d] (mean[g r d](Qp[n g r d] ^ 2) + 1e-6) ^ -0.5
replace K[m g d]   = nk[g d] Kp[m g d] (mean[g d](Kp[m g d] ^ 2) + 1e-6) ^ -0.5
