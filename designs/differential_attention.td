# Differential attention.
# Paper: Ye et al., "Differential Transformer" (2024), eq. 1 (DiffAttn), eq. 2 (λ), eq. 3 (multi-head).
# eq. 1: DiffAttn(X) = (softmax(Q1 K1ᵀ / √d) − λ softmax(Q2 K2ᵀ / √d)) V
# eq. 2: λ = exp(λq1 · λk1) − exp(λq2 · λk2) + λ_init, λ_init = 0.8 − 0.6 exp(−0.3 (l − 1))
# eq. 3: head_i normalized by RMSNorm over its width, scaled by (1 − λ_init), concatenated, × W^O
# Readings:
# - Head width d = F / (2H) for Q1, Q2, K1, K2; the value head width is 2d (the paper's choice).
# - λ is shared by the heads of the layer; L is the layer index l (1 by default).
# - The per-head RMSNorm has ε = 1e-5 and no learned gain (the paper's GroupNorm without affine).
# family: attention
design differential_attention

size F = 512, H = 8, D = F / (2 * H), E = 2 * D, L = 1
size N

input X[n: N, f: F]
param WQ1[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WQ2[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK1[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK2[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: E] = normal(std = 1 / sqrt(F))
param WO[h: H, e: E, g: F] = normal(std = 1 / sqrt(F))
param lq1[c: D] = normal(std = 0.1)
param lk1[c: D] = normal(std = 0.1)
param lq2[c: D] = normal(std = 0.1)
param lk2[c: D] = normal(std = 0.1)

linit[] = 0.8 - 0.6 * exp(-0.3 * (L - 1))                   # λ_init, eq. 2
lam[] = exp(lq1[c] lk1[c]) - exp(lq2[c] lk2[c]) + linit[]    # eq. 2
Q1[n h d] = X[n f] WQ1[f h d]
Q2[n h d] = X[n f] WQ2[f h d]
K1[m h d] = X[m f] WK1[f h d]
K2[m h d] = X[m f] WK2[f h d]
V[m h e] = X[m f] WV[f h e]
A1[h n m] = softmax[m, scale = 1 / sqrt(D)](Q1[n h d] K1[m h d])     # eq. 1
A2[h n m] = softmax[m, scale = 1 / sqrt(D)](Q2[n h d] K2[m h d])
O[n h e] = (A1[h n m] - lam[] A2[h n m]) V[m h e]
Y[n g] = (1 - linit[]) O[n h e] (mean[e](O[n h e] ^ 2) + 1e-5) ^ -0.5 WO[h e g]   # eq. 3

output Y
