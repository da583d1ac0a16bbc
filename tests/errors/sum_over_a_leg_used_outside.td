# mistake: sum over the key leg m, which the result keeps
design sink

size F = 512, H = 8, D = F / H
size N

input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param sink[h: H] = zeros

Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
S[h n m] = Q[n h d] K[m h d] / sqrt(D)
A[h n m] = exp(S[h n m]) / (exp(sink[h]) + sum[m](exp(S[h n m])))
Y[n f] = A[h n m] X[m f]

output Y
