# Phi's self-attention block (Phi-1.5, Phi-2): multi-head attention with biases on every
# projection and rotate-half rotary embeddings on the first part of each head only.
# Paper: Li et al., "Textbooks Are All You Need II: phi-1.5 technical report" (2023), Sec. 2.1
# (the architecture: 24 layers, 32 heads of width 64, "rotary embedding with rotary dimension
# 32"); Gunasekar et al., "Textbooks Are All You Need" (2023), Sec. 2.3 (phi-1, the same block);
# the rotation of Su et al., RoFormer (2021), eq. (34), logits eq. (16).
# Module: Hugging Face transformers' PhiAttention (models/phi/modeling_phi.py) with qk_layernorm =
# False (PhiConfig's default), as it computes: q, k, v = q_proj(x), k_proj(x), v_proj(x) (bias =
# True); the first rotary_ndims = int(head_dim · partial_rotary_factor) features of each q and k
# head rotated by apply_rotary_pos_emb (rotate_half within them), the rest passed through and
# concatenated after; softmax(q kᵀ · head_dim^−0.5) v with each key-value head repeated
# (repeat_kv); dense (bias = True).
# Readings:
# - The rotated part is Dr = int(D · partial_rotary_factor) features, an even number (HF rotates
#   halves of it). PhiConfig's defaults, taken here: F = 2048, H = 32, D = 64, factor 0.5, so
#   Dr = D / 2; Phi-2 is F = 2560, H = 32, D = 80, factor 0.4: set F = 2560, Dr = 32. Within it
#   the rotation is rotate-half: the rotated leg j viewed as (s p), half-major,
#   θ_p = Theta^(−2p/Dr) (HF's inv_freq over the rotary dims), positions from 0.
# - The score of each head is the rotated parts' product plus the passed parts' product, the
#   concatenation's dot product split by ranges of d: Q[n, g, r, c: Dr..D] K[m, g, c: Dr..D].
# - H query heads in G key-value groups of R = H / G (query head (g r) = g·R + r, repeat_kv);
#   Phi-1.5 and Phi-2 have G = H (num_key_value_heads = None; the default here). Biases
#   bq[g r d], bk[g d], bv[g e] (HF's q_proj.bias viewed head-major), bo[o] (dense.bias).
# - Head width D = F / H; scale head_dim^−0.5. Causal as a decoder: `with_causal_mask()`.
# family: production
design phi

size F = 2048, H = 32, G = H, R = H / G, D = F / H, Dr = D / 2, P = Dr / 2, Theta = 10000
size N

input X[n: N, f: F]
param WQ[f: F, g: G, r: R, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, g: G, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, g: G, e: D] = normal(std = 1 / sqrt(F))
param WO[g: G, r: R, e: D, o: F] = normal(std = 1 / sqrt(F))
param bq[g: G, r: R, d: D] = zeros
param bk[g: G, d: D] = zeros
param bv[g: G, e: D] = zeros
param bo[o: F] = zeros
const Rot[s: 2, t: 2] = values(0, -1, 1, 0)

theta[p]         = 1 / Theta ^ (2 index(p, P) / Dr)
Ang[n p]         = index(n) theta[p]
Q[n g r d]       = X[n f] WQ[f g r d] + bq[g r d]
K[m g d]         = X[m f] WK[f g d] + bk[g d]
V[m g e]         = X[m f] WV[f g e] + bv[g e]
Qc[n g r j]      = Q[n, g, r, j: 0..Dr]
Kc[m g j]        = K[m, g, j: 0..Dr]
Qr[n g r (s p)]  = cos(Ang[n p]) Qc[n g r (s p)] + sin(Ang[n p]) Rot[s t] Qc[n g r (t p)]
Kr[m g (s p)]    = cos(Ang[m p]) Kc[m g (s p)] + sin(Ang[m p]) Rot[s t] Kc[m g (t p)]
A[g r n m]       = softmax[m, scale = 1 / sqrt(D)](Qr[n g r j] Kr[m g j] + Q[n, g, r, c: Dr..D] K[m, g, c: Dr..D])
Y[n o]           = A[g r n m] V[m g e] WO[g r e o] + bo[o]

output Y
