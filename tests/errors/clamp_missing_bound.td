# mistake: clamp given only a lower bound
design mgk

size F = 512, H = 4, M = 2, D = 64   # width, heads, keys per position, head width
size N                               # sequence length

input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, r: M, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))
param pi[h: H, r: M] = fill(1 / M)

Q[n h d] = X[n f] WQ[f h d]
K[m h r d] = X[m f] WK[f h r d]
V[m h e] = X[m f] WV[f h e]
A[h n m r] = softmax[m r](log(clamp(pi[h r], 1e-6))
                          - sqdist[d](Q[n h d], K[m h r d]) / (2 * sqrt(D)))
Y[n g] = A[h n m r] V[m h e] WO[h e g]

output Y
