# mistake: max over a leg k that no factor has, beside a position reading the size C
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
A[h n m] = softmax[m](max[k](Q[n h d] K[m h d] / sqrt(D) + Rel[h, r = clamp(m - n, -C, C) + C]))
Y[n g]   = A[h n m] V[m h e] WO[h e g]
output Y
