# Sigmoid attention.
# Paper: Ramapuram et al., "Theory, Analysis, and Best Practices for Sigmoid Self-Attention" (2024),
# Sec. 3, eq. SigmoidAttn(X) = σ(Q Kᵀ / √d_qk + b) V, with the bias b = −log(n) (Sec. 3.2).
# Readings:
# - n in the bias is the run-time sequence length N (the number of keys), evaluated at run time.
# - Multi-head as in MHSA: per-head σ, concatenated heads projected by WO; no row normalization.
# - Causal use (with_causal_mask) zeroes the future: the bias stays −log N.
# family: attention
design sigmoid_attention

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
A[h n m] = sigmoid(Q[n h d] K[m h d] / sqrt(D) - log(N))
Y[n g]   = A[h n m] V[m h e] WO[h e g]

output Y
