# Grouped-query attention, GQA: H query heads in G groups; the R = H / G query heads of a group
# share one key head and one value head.
# Paper: Ainslie et al., "GQA: Training Generalized Multi-Query Transformer Models from
# Multi-Head Checkpoints" (EMNLP 2023), Sec. 2.2 and Fig. 2; G = 1 is multi-query attention
# (Shazeer 2019, mqa.td), G = H is multi-head attention (mhsa.td). Each head's attention is
# Tuformer eq. 1b (the paper writes no equation of its own).
# Readings:
# - Query head (g, r) is head g·R + r of H (head-major): consecutive query heads share a key and
#   value head, as the paper's grouping of heads.
# - K and V carry the group leg g only (G key and value heads of width D); scale 1/sqrt(D).
# - No biases, masks or dropout; projections initialized normal(std = 1/sqrt(F)) as mhsa.td.
# family: attention
design gqa

size F = 512, H = 8, G = 2, R = H / G, D = F / H   # width, query heads, groups, heads per group, head width
size N                                             # sequence length: bound by the input at run time

input X[n: N, f: F]
param WQ[f: F, g: G, r: R, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, g: G, d: D] = normal(std = 1 / sqrt(F))   # one key head per group
param WV[f: F, g: G, e: D] = normal(std = 1 / sqrt(F))   # one value head per group
param WO[g: G, r: R, e: D, o: F] = normal(std = 1 / sqrt(F))

Q[n g r d] = X[n f] WQ[f g r d]
K[m g d]   = X[m f] WK[f g d]
V[m g e]   = X[m f] WV[f g e]
A[g r n m] = softmax[m, scale = 1 / sqrt(D)](Q[n g r d] K[m g d])
Y[n o]     = A[g r n m] V[m g e] WO[g r e o]

output Y
