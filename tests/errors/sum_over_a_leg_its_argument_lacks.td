# mistake: sum over a leg its argument does not have (kk for k)
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
A[h n m] = exp(S[h n m]) / (exp(sink[h]) + sum[kk](exp(S[h n k])))
Y[n f] = A[h n m] X[m f]

output Y
