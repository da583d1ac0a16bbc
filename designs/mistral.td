# Mistral's self-attention block: grouped-query attention, rotate-half rotary embeddings and a
# sliding window over the keys.
# Paper: Jiang et al., "Mistral 7B" (2023), Sec. 2 (Sliding Window Attention: the hidden state at
# position i of layer k attends to positions i − W .. i of layer k − 1; grouped-query attention,
# 8 key-value heads, W = 4096), Table 1; the rotation of Su et al., RoFormer (2021), eq. (34),
# logits eq. (16); the heads of Ainslie et al., GQA (2023), Sec. 2.2.
# Module: Hugging Face transformers' MistralAttention (models/mistral/modeling_mistral.py), as it
# computes: q, k, v = q_proj(x), k_proj(x), v_proj(x) (no bias); (q, k) = apply_rotary_pos_emb with
# rotate_half; softmax(q kᵀ · head_dim^−0.5 + mask) v with each key-value head repeated (repeat_kv);
# o_proj (no bias); the mask is the model's create_sliding_window_causal_mask.
# Readings:
# - The window: HF's sliding_window_causal_mask_function(W) keeps key kv from query q where
#   kv ≤ q (causal_mask_function) and kv > q − W (sliding_window_overlay): the query and the W − 1
#   keys before it, `window(n, m, W)`. The paper's "i − W .. i" counts W + 1 positions; the
#   module's W positions are taken (Mistral-7B v0.1: sliding_window = 4096).
# - H query heads in G key-value groups of R = H / G: query head (g r) = g·R + r uses key-value
#   head g (repeat_kv repeats each key-value head R times, adjacent). Mistral-7B: F = 4096,
#   H = 32, G = 8, D = 128, Theta = 10000 (MistralConfig's defaults).
# - Rotate-half RoPE (HF's layout, GPT-NeoX's, not RoFormer's interleaved pairs): the head leg
#   d is viewed as (s p), half-major, s in {0, 1}; dims p and p + D/2 form pair p, and
#   rotate_half(x) = (−x_2, x_1) is the generator R = [[0, −1], [1, 0]] over s.
# - Frequencies θ_p = Theta^(−2p/D), p = 0 .. D/2 − 1 (HF's inv_freq), angles n·θ_p with
#   positions from 0 at the first token; HF builds cos and sin in float32 and casts them to the
#   compute dtype, here they are computed in the compute dtype.
# - Head width D = F / H (HF's head_dim default); scale head_dim^−0.5. No attention dropout
#   (eval). The window makes the design causal: `with_causal_mask()` returns it unchanged.
# family: production
design mistral

size F = 512, H = 8, G = 2, R = H / G, D = F / H, P = D / 2, Theta = 10000, W = 256
size N

input X[n: N, f: F]
param WQ[f: F, g: G, r: R, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, g: G, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, g: G, e: D] = normal(std = 1 / sqrt(F))
param WO[g: G, r: R, e: D, o: F] = normal(std = 1 / sqrt(F))
const Rot[s: 2, t: 2] = values(0, -1, 1, 0)

theta[p]        = exp(-2 index(p, P) / D * log(Theta))
Ang[n p]        = index(n) theta[p]
Q[n g r d]      = X[n f] WQ[f g r d]
K[m g d]        = X[m f] WK[f g d]
V[m g e]        = X[m f] WV[f g e]
Qr[n g r (s p)] = cos(Ang[n p]) Q[n g r (s p)] + sin(Ang[n p]) Rot[s t] Q[n g r (t p)]
Kr[m g (s p)]   = cos(Ang[m p]) K[m g (s p)] + sin(Ang[m p]) Rot[s t] K[m g (t p)]
A[g r n m]      = softmax[m, scale = 1 / sqrt(D), mask = window(n, m, W)](Qr[n g r d] Kr[m g d])
Y[n o]          = A[g r n m] V[m g e] WO[g r e o]

output Y
