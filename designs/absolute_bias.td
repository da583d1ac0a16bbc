# Learned absolute position bias over a maximum length, read at the run-time length.
# Paper: Vaswani et al., "Attention Is All You Need" (2017), Sec. 3.5 (learned positional
# parameters in place of sinusoids) with the logits of eq. (1); the bias per (query, key)
# position pair as in Raffel et al. (T5, 2020), Sec. 2.1, but indexed by absolute positions.
# Readings:
# - One learned scalar per head and (query position, key position) pair, declared over the
#   maximum length L and read at its first N × N entries (Bias[h, n: N, m: N]); N > L is an error
#   when the module runs.
# - Logits Q Kᵀ/√D as in MHSA plus the bias; zeros initialize the table.
# family: positions
design absolute_bias

size F = 512, H = 8, D = F / H, L = 1024
size N

input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))
param Bias[h: H, i: L, j: L] = zeros

Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
A[h n m] = softmax[m](Q[n h d] K[m h d] / sqrt(D) + Bias[h, n: N, m: N])
Y[n g]   = A[h n m] V[m h e] WO[h e g]

output Y
