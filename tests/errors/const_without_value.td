# mistake: a const with no value
design thsa

size F = 512, H = 8, D = F / H, R = H * D   # width, heads, head width, core rank
size N                                      # sequence length

input X[n: N, f: F]
param WQ[f: F, s: R] = normal(std = 1 / sqrt(F))
param WK[f: F, s: R] = normal(std = 1 / sqrt(F))
param WV[f: F, r: R] = normal(std = 1 / sqrt(F))
param WO[r: R, g: F] = normal(std = 1 / sqrt(F))
const C[r: R, s: R]   # the core

Q[n s] = X[n f] WQ[f s]
K[m s] = X[m f] WK[f s]
V[m r] = X[m f] WV[f r]
A[r n m] = softmax[m, scale = 1 / sqrt(R)](C[r s] Q[n s] K[m s])
Y[n g] = A[r n m] V[m r] WO[r g]

output Y
