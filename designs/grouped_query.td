# Grouped-query attention.
# Paper: Ainslie et al., "GQA: Training Generalized Multi-Query Transformer Models from Multi-Head
# Checkpoints" (2023), Sec. 2.2, eq. (as MHSA) with the H query heads split into G groups, each group
# sharing one key and one value head.
# Readings:
# - Query head (g r) = g·R + r, R = H / G heads per group; G = 1 is multi-query, G = H is MHSA.
# - Head width D = F / H for queries, keys and values; softmax scale 1/√D.
# family: attention
design grouped_query

size F = 512, H = 8, G = 2, R = H / G, D = F / H
size N

input X[n: N, f: F]
param WQ[f: F, g: G, r: R, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, g: G, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, g: G, e: D] = normal(std = 1 / sqrt(F))
param WO[g: G, r: R, e: D, o: F] = normal(std = 1 / sqrt(F))

Q[n g r d] = X[n f] WQ[f g r d]
K[m g d]   = X[m f] WK[f g d]
V[m g e]   = X[m f] WV[f g e]
A[g r n m] = softmax[m, scale = 1 / sqrt(D)](Q[n g r d] K[m g d])
Y[n o]     = A[g r n m] V[m g e] WO[g r e o]

output Y
