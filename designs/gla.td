# Gated linear attention (GLA).
# Paper: Yang, Wang, Shen, Panda & Kim, "Gated Linear Attention Transformers with
# Hardware-Efficient Training" (ICML 2024). Recurrent form (Sec. 4.1): S_t = Diag(α_t) S_{t−1}
# + k_tᵀ v_t, o_t = q_t S_t, with a data-dependent gate per key feature
# α_t = σ(x_t W_α1 W_α2 + b_α)^(1/τ), τ = 16 (eq. 4, a low-rank W_α of rank 16); parallel form
# o_t = Σ_{s ≤ t} (q_t ⊙ b_t / b_s) k_sᵀ v_s with b_t = Π_{k ≤ t} α_k (Sec. 4.2); the layer
# (Sec. 4.4): o = (GroupNorm(heads) ⊙ swish(x W_r)) W_O, keys scaled by d_k^(−1/2).
# Readings:
# - The gate's product b_t/b_s is exp(Σ_{k=s+1..t} log α_k) per key feature d: the segment sums
#   of log α (−∞ for s > t), exp(segsum(...)); tdiag takes it in chunks (the paper's chunkwise
#   form, Sec. 4.2: intra-chunk with the relative gates, inter-chunk through the decayed chunk
#   states), never as a ratio of tiny products.
# - GroupNorm per head over its value leg e without an affine transform (absorbed by W_O).
# - Key width D per head, value width E = 2D (the paper's setting); one gate rank R = 16.
# family: scans
design gla

size F = 512, H = 4, D = F / H / 2, E = 2 * D, R = 16
size N

input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: E] = normal(std = 1 / sqrt(F))
param Wa1[f: F, r: R] = normal(std = 1 / sqrt(F))
param Wa2[r: R, h: H, d: D] = normal(std = 1 / sqrt(R))
param ba[h: H, d: D] = zeros
param Wr[f: F, h: H, e: E] = normal(std = 1 / sqrt(F))
param WO[h: H, e: E, g: F] = normal(std = 1 / sqrt(H * E))

La[n h d] = -softplus(-(X[n f] Wa1[f r] Wa2[r h d] + ba[h d])) / 16   # log α = log σ(·) / τ
Q[n h d]  = X[n f] WQ[f h d]
K[m h d]  = X[m f] WK[f h d] / sqrt(D)
V[m h e]  = X[m f] WV[f h e]
O[n h e]  = exp(segsum[n, m](La[n h d])) Q[n h d] K[m h d] V[m h e]
C[n h e]  = O[n h e] - mean[e](O[n h e])
Yn[n h e] = C[n h e] (mean[e](C[n h e] ^ 2) + 1e-5) ^ -0.5
Y[n g]    = silu(X[n f] Wr[f h e]) Yn[n h e] WO[h e g]

output Y
