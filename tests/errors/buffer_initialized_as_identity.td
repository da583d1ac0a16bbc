# mistake: a buffer given an identity initializer (identity is for params and consts)
design mgk_softe

size F = 512, H = 4, M = 2, D = 64, N = 256

input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, r: M, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))
buffer pi[h: H, m: N, r: M] = identity

Q[n h d] = X[n f] WQ[f h d]
K[m h r d] = X[m f] WK[f h r d]
V[m h e] = X[m f] WV[f h e]
L[h n m r] = log(clamp(pi[h m r], 1e-6, 1)) - sqdist[d](Q[n h d], K[m h r d]) / (2 * sqrt(D))
A[h n m r] = softmax[m r](L[h n m r])
gamma[h n m r] = softmax[r](L[h n m r])
Y[n g] = A[h n m r] V[m h e] WO[h e g]

update pi[h m r] = mean[n](gamma[h n m r])

output Y
