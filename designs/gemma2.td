# Gemma 2's global-attention layer: grouped-query attention with RoPE, query_pre_attn_scalar
# scaling and logit softcapping.
# Paper: Gemma Team, "Gemma 2: Improving Open Language Models at a Practical Size" (2024), Sec. 2
# (Table 1: GQA with 8 query and 4 key-value heads of width 256 at 2B; logit soft-capping,
# eq. logits ← soft_cap · tanh(logits / soft_cap) with soft_cap = 50 in the attention layers;
# local sliding-window and global attention alternating); Hugging Face transformers'
# Gemma2Attention and its eager_attention_forward (scale, then tanh softcap, then the mask).
# Readings:
# - Query head (g r) = g·R + r reads key-value head g (HF's repeat_kv): H query heads in G
#   key-value groups of R = H / G; Gemma-2-2B has H = 8, G = 4 (set G = 4: the default G = 2, as
#   llama.td's, keeps every even H valid), head width D = 256, model width F = 2304
#   (gemma-2-2b); no projection biases (attention_bias = False).
# - The scores are q·k / √QS with QS = query_pre_attn_scalar = 256 (not the head width), then
#   softcapped: 50 · tanh(s / 50) (attn_logit_softcapping = 50), inside the softmax box.
# - RoPE as HF's Gemma2RotaryEmbedding (default rope parameters, rope_theta = 10000) with
#   rotate_half: the head leg d viewed as (s p), half-major, pair p = (d_p, d_{p+D/2}) rotated by
#   n·θ_p, θ_p = 10000^(−2p/D): (x₀, x₁) ↦ (x₀ cos − x₁ sin, x₁ cos + x₀ sin), the constant
#   generator R = [[0, −1], [1, 0]]. Positions count from 0.
# - Only the global layers: Gemma 2 alternates them with local sliding-window layers (a window of
#   4096 keys), not written here: they add `mask = window(n, m, W)` to this box, as
#   designs/gpt_oss_sliding.td does to gpt-oss's.
# - Causal: the model is a decoder; use with_causal_mask (or `--causal`), as HF's module is run.
# - HF's eager softmax runs in float32 even in a float64 module; this box runs in the module's
#   dtype (the float64 test builds HF's softmax in float64).
# - Projections normal(std = 1/√F); HF initializes them normal(std = initializer_range).
# - `--attention flex` applies the softcap in FlexAttention's score_mod; by default the box is
#   materialized (SDPA cannot apply a map to its scores).
# family: production
design gemma2

size F = 2304, H = 8, G = 2, R = H / G, D = 256, P = D / 2, QS = 256
size N

input X[n: N, f: F]
param WQ[f: F, g: G, r: R, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, g: G, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, g: G, e: D] = normal(std = 1 / sqrt(F))
param WO[g: G, r: R, e: D, o: F] = normal(std = 1 / sqrt(F))
const Rot[s: 2, t: 2] = values(0, -1, 1, 0)

theta[p]        = exp(-2 index(p, P) / D * log(10000))
Ang[n p]        = index(n) theta[p]
Q[n g r d]      = X[n f] WQ[f g r d]
K[m g d]        = X[m f] WK[f g d]
V[m g e]        = X[m f] WV[f g e]
Qr[n g r (s p)] = cos(Ang[n p]) Q[n g r (s p)] + sin(Ang[n p]) Rot[s t] Q[n g r (t p)]
Kr[m g (s p)]   = cos(Ang[m p]) K[m g (s p)] + sin(Ang[m p]) Rot[s t] K[m g (t p)]
A[g r n m]      = softmax[m](50 tanh(Qr[n g r d] Kr[m g d] / sqrt(QS) / 50))
Y[n o]          = A[g r n m] V[m g e] WO[g r e o]

output Y
