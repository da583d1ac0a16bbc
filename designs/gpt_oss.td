# gpt-oss's full-attention layer: grouped-query attention with RoPE, biased projections and a
# learned attention sink per head.
# Paper: OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card" (2025), Sec. 2.1 (attention): grouped-query
# attention (64 query heads of width 64, 8 key-value heads), rotary position embedding, and "a
# learned bias in the denominator of the softmax" per head, i.e. eq. A[h n m] = exp(q_n·k_m / √D) /
# (exp(s_h) + Σ_m' exp(q_n·k_m' / √D)); Hugging Face transformers' GptOssAttention and its
# eager_attention_forward (the sink concatenated to the scaled scores, softmaxed, its column dropped).
# Readings:
# - Query head (g r) = g·R + r reads key-value head g (HF's repeat_kv): H query heads in G
#   key-value groups of R = H / G; gpt-oss-20b has H = 64, G = 8 (set G = 8: the default G = 2,
#   as llama.td's, keeps every even H valid), head width D = 64 (not F / H), model width F = 2880.
# - q, k, v and o projections all have biases (HF's attention_bias = True).
# - RoPE as HF's GptOssRotaryEmbedding with default rope parameters and _apply_rotary_emb: the head
#   leg d viewed as (s p), half-major (first half s = 0, second half s = 1), pair p rotated by the
#   angle n·θ_p, θ_p = 150000^(−2p/D) (rope_theta = 150000): (x₀, x₁) ↦ (x₀ cos − x₁ sin,
#   x₁ cos + x₀ sin), the constant generator R = [[0, −1], [1, 0]]. Positions count from 0.
# - YaRN rope scaling (the released checkpoints' rope_type "yarn", factor 32) is not modeled: its
#   interpolated frequencies and its cos/sin scaling factor differ from these for long contexts.
# - The sink S[g r] is a logit beside the scaled scores (not scaled by 1/√D), in every row's
#   denominator, never masked; softmax scale 1/√D.
# - The full-attention layer: gpt-oss alternates it with sliding-window layers (a window of
#   128 keys), designs/gpt_oss_sliding.td.
# - Causal: the model is a decoder; use with_causal_mask (or `--causal`), as HF's module is run.
# - Projections normal(std = 1/√F), biases zeros, sinks normal(std = 0.02) as HF's initializer_range.
# family: production
design gpt_oss

size F = 2880, H = 64, G = 2, R = H / G, D = 64, P = D / 2
size N

input X[n: N, f: F]
param WQ[f: F, g: G, r: R, d: D] = normal(std = 1 / sqrt(F))
param BQ[g: G, r: R, d: D] = zeros
param WK[f: F, g: G, d: D] = normal(std = 1 / sqrt(F))
param BK[g: G, d: D] = zeros
param WV[f: F, g: G, e: D] = normal(std = 1 / sqrt(F))
param BV[g: G, e: D] = zeros
param WO[g: G, r: R, e: D, o: F] = normal(std = 1 / sqrt(F))
param BO[o: F] = zeros
param S[g: G, r: R] = normal(std = 0.02)
const Rot[s: 2, t: 2] = values(0, -1, 1, 0)

theta[p]        = exp(-2 index(p, P) / D * log(150000))
Ang[n p]        = index(n) theta[p]
Q[n g r d]      = X[n f] WQ[f g r d] + BQ[g r d]
K[m g d]        = X[m f] WK[f g d] + BK[g d]
V[m g e]        = X[m f] WV[f g e] + BV[g e]
Qr[n g r (s p)] = cos(Ang[n p]) Q[n g r (s p)] + sin(Ang[n p]) Rot[s t] Q[n g r (t p)]
Kr[m g (s p)]   = cos(Ang[m p]) K[m g (s p)] + sin(Ang[m p]) Rot[s t] K[m g (t p)]
A[g r n m]      = softmax[m, scale = 1 / sqrt(D), sink = S[g r]](Qr[n g r d] Kr[m g d])
Y[n o]          = A[g r n m] V[m g e] WO[g r e o] + BO[o]

output Y
