# Learned relative position bias, clipped distance.
# Paper: Raffel et al., "Exploring the Limits of Transfer Learning with a Unified Text-to-Text
# Transformer" (T5, JMLR 2020), Sec. 2.1: "a scalar [learned per head, by offset] is added to the
# corresponding logit"; the offsets clipped to ±C as in Shaw, Uszkoreit and Vaswani,
# "Self-Attention with Relative Position Representations" (2018), eq. (5)-(6): clip(j − i, k).
# Readings:
# - One learned scalar per head and clipped offset: Rel[h, clamp(m − n, −C, C) + C], a table of
#   2C + 1 entries read by a gather at each (query, key) pair (no N·N·(2K+1) one-hot).
# - Clipping (Shaw et al.) instead of T5's log-spaced buckets; C = 16.
# - Logits Q Kᵀ/√D as in MHSA, plus the bias; zeros initialize the table.
# family: positions
design relative_bias

size F = 512, H = 8, D = F / H, C = 16, R = 2 * C + 1
size N

input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))
param Rel[h: H, r: R] = zeros

Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
A[h n m] = softmax[m](Q[n h d] K[m h d] / sqrt(D) + Rel[h, r = clamp(m - n, -C, C) + C])
Y[n g]   = A[h n m] V[m h e] WO[h e g]

output Y
