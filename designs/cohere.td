# Cohere's (Command R) self-attention block: grouped-query attention with interleaved rotary
# embeddings (RoFormer's adjacent pairs, not Llama's rotate-half halves).
# Paper: none describes Command R's block (Cohere's model cards and HF's CohereForCausalLM are the
# reference); the rotation of Su et al., RoFormer (2021), eq. (34) (pairs (x_{2i}, x_{2i+1})
# rotated by n·θ_i), logits eq. (16); the heads of Ainslie et al., GQA (2023), Sec. 2.2.
# Module: Hugging Face transformers' CohereAttention (models/cohere/modeling_cohere.py) with
# use_qk_norm = False (CohereConfig's default; designs/cohere_qk_norm.td sets it), as it computes:
# q, k, v = q_proj(x), k_proj(x), v_proj(x) (attention_bias = False); (q, k) =
# apply_rotary_pos_emb with Cohere's rotate_half (x[..., ::2], x[..., 1::2] stacked as
# (−x_odd, x_even) and flattened: adjacent pairs) and cos, sin repeat_interleave'd (each frequency
# twice, adjacent); softmax(q kᵀ · head_dim^−0.5) v with each key-value head repeated (repeat_kv);
# o_proj (no bias).
# Readings:
# - Interleaved RoPE: the head leg d is viewed as (p s), pair-major, s in {0, 1}: dims 2p and
#   2p + 1 form pair p (as designs/rope.td), rotated by the generator R = [[0, −1], [1, 0]] over s
#   and the angle n·θ_p, θ_p = Theta^(−2p/D) (HF's inv_freq; Theta = rope_theta = 10000, CohereConfig's
#   default). Positions from 0. HF computes the tables and the rotation in float32 even in a
#   float64 module; here they are computed in the compute dtype.
# - H query heads in G key-value groups of R = H / G: query head (g r) = g·R + r reads key-value
#   head g (repeat_kv). CohereConfig's defaults are F = 8192, H = 64 and G = H (no grouping).
# - Head width D = F / H; scale head_dim^−0.5. No attention dropout (eval). Causal as a decoder:
#   `with_causal_mask()`. The model runs attention and MLP in parallel from one layer norm; this
#   design is the attention block alone.
# family: production
design cohere

size F = 512, H = 8, G = 2, R = H / G, D = F / H, P = D / 2, Theta = 10000
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
Qr[n g r (p s)] = cos(Ang[n p]) Q[n g r (p s)] + sin(Ang[n p]) Rot[s t] Q[n g r (p t)]
Kr[m g (p s)]   = cos(Ang[m p]) K[m g (p s)] + sin(Ang[m p]) Rot[s t] K[m g (p t)]
A[g r n m]      = softmax[m, scale = 1 / sqrt(D)](Qr[n g r d] Kr[m g d])
Y[n o]          = A[g r n m] V[m g e] WO[g r e o]

output Y
