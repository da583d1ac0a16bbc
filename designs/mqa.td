# Multi-query attention, MQA: H query heads share one key head and one value head.
# Paper: Shazeer, "Fast Transformer Decoding: One Write-Head is All You Need" (2019), Sec. 3
# (multi-query attention: "the different heads share a single set of keys and values"); each
# head's attention is Tuformer eq. 1b (the paper writes it as einsum code, not a numbered eq.).
# Readings:
# - K and V have no head leg: one key and one value projection of width D, shared by every query
#   head h; queries, the output projection and the scale 1/sqrt(D) are those of MHSA.
# - The grouped-query form with G = 1 group (Ainslie et al. 2023, Sec. 2.2).
# - No biases, masks or dropout; projections initialized normal(std = 1/sqrt(F)) as mhsa.td.
# family: attention
design mqa

size F = 512, H = 8, D = F / H   # model width, query heads, head width
size N                           # sequence length: bound by the input at run time

input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, d: D] = normal(std = 1 / sqrt(F))        # one key head, shared
param WV[f: F, e: D] = normal(std = 1 / sqrt(F))        # one value head, shared
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))

Q[n h d] = X[n f] WQ[f h d]
K[m d]   = X[m f] WK[f d]
V[m e]   = X[m f] WV[f e]
A[h n m] = softmax[m, scale = 1 / sqrt(D)](Q[n h d] K[m d])
Y[n g]   = A[h n m] V[m e] WO[h e g]

output Y
