# ReLU² attention.
# Paper: Hua et al., "Transformer Quality in Linear Time" (2022), Sec. 2, eq. A = relu²(Q Kᵀ / n) (the
# gated attention unit's squared-ReLU attention; its relative position bias is left out here).
# Readings:
# - Per head as in MHSA, with the logits scaled by 1/√D before the square and the attention divided
#   by the run-time length N, so A V stays of order one: A = relu(Q Kᵀ / √D)² / N.
# - No normalization over the keys: causal use (with_causal_mask) zeroes the future.
# family: attention
design relu2_attention

size F = 512, H = 8, D = F / H
size N

input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))

Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
A[h n m] = relu(Q[n h d] K[m h d] / sqrt(D)) ^ 2 / N
Y[n g]   = A[h n m] V[m h e] WO[h e g]

output Y
