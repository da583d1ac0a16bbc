# mistake: the noise scale given to the random node
design fish

size F = 512, H = 8, M = 2, D = F / H   # width, local heads, global heads, head width
size N                                  # sequence length

input X[n: N, f: F]
param WQ[f: F, k: M, d: D] = normal(std = 1 / sqrt(F))   # M global query heads
param WK[f: F, k: M, d: D] = normal(std = 1 / sqrt(F))   # M global key heads
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))   # H local value heads
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))
param P[k: M, h: H] = uniform(low = -1 / sqrt(M), high = 1 / sqrt(M))   # mixing p_kj
param sigma[k: M] = fill(0.1)
random eps[k: M, n: N, m: N] = normal(std = 0.1)

Q[n k d] = X[n f] WQ[f k d]
K[m k d] = X[m f] WK[f k d]
V[m h e] = X[m f] WV[f h e]
A[h n m] = softmax[m, scale = 1 / sqrt(D)](P[k h] * (Q[n k d] K[m k d] + sigma[k] eps[k n m]))
Y[n g] = A[h n m] V[m h e] WO[h e g]

output Y
