# Multi-query attention.
# Paper: Shazeer, "Fast Transformer Decoding: One Write-Head is All You Need" (2019), Sec. 3,
# eq. (multi-query): O = Σ_h softmax(Q_h Kᵀ / √D) V W^O_h with one K and one V shared by all heads.
# Readings:
# - Query heads H of width D = F / H; the single key and value heads have width D.
# - Softmax scale 1/√D over the keys, as in MHSA.
# family: attention
design multi_query

size F = 512, H = 8, D = F / H
size N

input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, e: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))

Q[n h d] = X[n f] WQ[f h d]
K[m d]   = X[m f] WK[f d]
V[m e]   = X[m f] WV[f e]
A[h n m] = softmax[m, scale = 1 / sqrt(D)](Q[n h d] K[m d])
Y[n g]   = A[h n m] V[m e] WO[h e g]

output Y
