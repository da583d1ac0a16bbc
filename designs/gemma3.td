# Gemma 3's global-attention layer: grouped-query attention with RoPE and QK-norm, Gemma's (1 + w)
# RMS norm on each head's query and key, scores scaled by query_pre_attn_scalar^−1/2.
# Paper: Gemma Team, "Gemma 3 Technical Report" (2025), Sec. 2 (architecture: GQA, "we replace the
# soft-capping of Gemma 2 with QK-norm", 5 local layers per global layer, local window of 1024
# tokens, RoPE base 1M on global layers and 10k on local ones, positional interpolation by a
# factor 8 on global layers for long context); QK-norm after Dehghani et al., "Scaling Vision
# Transformers to 22 Billion Parameters" (2023), Sec. 2; RMSNorm of Zhang and Sennrich (2019),
# eq. (4): x / RMS(x) ⊙ g, RMS(x) = sqrt(mean(x²) + eps); the rotation of Su et al., RoFormer
# (2021), eq. (34), logits eq. (16).
# Module: Hugging Face transformers' Gemma3Attention (models/gemma3/modeling_gemma3.py) of a
# "full_attention" layer, as it computes: q, k, v = q_proj(x), k_proj(x), v_proj(x) (no bias);
# q = q_norm(q), k = k_norm(k) per head with Gemma3RMSNorm, x / sqrt(mean(x²) + eps) · (1 + w);
# (q, k) = apply_rotary_pos_emb with rotate_half; softmax(q kᵀ · query_pre_attn_scalar^−0.5) v
# with each key-value head repeated (repeat_kv); o_proj (no bias).
# Readings:
# - Query head (g r) = g·R + r reads key-value head g (repeat_kv): H query heads in G groups of
#   R = H / G. Gemma-3-4B: F = 2560, H = 8, G = 4, D = 256; Gemma3TextConfig's defaults are
#   F = 2304, H = 8, G = 4, D = 256 (G = 2 here keeps every even H valid, as llama.td's).
# - The norm's weight is an offset: the gain is 1 + nq[d] (Gemma3RMSNorm initializes its weight to
#   zeros, so the gain starts at 1), one D-entry weight shared by the heads (nq for queries, nk for
#   keys), eps = 1e-6 (rms_norm_eps). HF computes it in float32 and casts back; here it is computed
#   in the compute dtype. Values are not normalized.
# - The scores are q·k / √QS with QS = query_pre_attn_scalar = 256, not the head width. No softcap
#   (attn_logit_softcapping = None, Gemma 3's setting).
# - RoPE of the global layer: base Theta = 1000000 (Gemma3TextConfig's default_theta["global"]),
#   positions divided by Factor (HF's "linear" rope_type: inv_freq / factor; the released 4B, 12B
#   and 27B set factor 8, Gemma3TextConfig's default has no scaling: Factor = 1). Rotate-half
#   layout: the head leg d viewed as (s p), half-major; θ_p = Theta^(−2p/D), angles n·θ_p / Factor,
#   positions from 0.
# - The local layers are designs/gemma3_sliding.td. Causal as a decoder: `with_causal_mask()`
#   (HF's is_causal = not use_bidirectional_attention).
# family: production
design gemma3

size F = 2304, H = 8, G = 2, R = H / G, D = 256, P = D / 2, QS = 256, Theta = 1000000, Factor = 1
size N

input X[n: N, f: F]
param WQ[f: F, g: G, r: R, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, g: G, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, g: G, e: D] = normal(std = 1 / sqrt(F))
param WO[g: G, r: R, e: D, o: F] = normal(std = 1 / sqrt(F))
param nq[d: D] = zeros
param nk[d: D] = zeros
const Rot[s: 2, t: 2] = values(0, -1, 1, 0)

theta[p]        = exp(-2 index(p, P) / D * log(Theta))
Ang[n p]        = index(n) theta[p] / Factor
Qp[n g r d]     = X[n f] WQ[f g r d]
Kp[m g d]       = X[m f] WK[f g d]
Q[n g r d]      = (1 + nq[d]) Qp[n g r d] (mean[d](Qp[n g r d] ^ 2) + 1e-6) ^ -0.5
K[m g d]        = (1 + nk[d]) Kp[m g d] (mean[d](Kp[m g d] ^ 2) + 1e-6) ^ -0.5
V[m g e]        = X[m f] WV[f g e]
Qr[n g r (s p)] = cos(Ang[n p]) Q[n g r (s p)] + sin(Ang[n p]) Rot[s t] Q[n g r (t p)]
Kr[m g (s p)]   = cos(Ang[m p]) K[m g (s p)] + sin(Ang[m p]) Rot[s t] K[m g (t p)]
A[g r n m]      = softmax[m, scale = 1 / sqrt(QS)](Qr[n g r d] Kr[m g d])
Y[n o]          = A[g r n m] V[m g e] WO[g r e o]

output Y
