# mistake: swish is not one of the maps
design thsa_elu

size F = 512, H = 8, D = F / H, R = H * D   # width, heads, head width, core rank
size N                                      # sequence length

input X[n: N, f: F]
param WQ[f: F, s: R] = normal(std = 1 / sqrt(F))
param WK[f: F, s: R] = normal(std = 1 / sqrt(F))
param WV[f: F, r: R] = normal(std = 1 / sqrt(F))
param WO[r: R, g: F] = normal(std = 1 / sqrt(F))
param C[r: R, s: R] = uniform(low = 0, high = 2 / sqrt(R))

Q[n s] = X[n f] WQ[f s]
K[m s] = X[m f] WK[f s]
V[m r] = X[m f] WV[f r]
A[r n m] = normalize[m, eps = 1e-6](C[r s] swish(Q[n s]) swish(K[m s]))
Y[n g] = A[r n m] V[m r] WO[r g]

output Y
