# Point of the design space 'tuformer_core' (tuformer.tds), base design 'thsa'.
# Choices: D=F / H core=full
design tuformer_core_DF_H_full

size F = 512
size H = 8
size D = F / H
size R = H * D
size N
input X[n: N, f: F]
param WQ[f: F, s: R] = normal(std = 1 / sqrt(F))
param WK[f: F, s: R] = normal(std = 1 / sqrt(F))
param WV[f: F, r: R] = normal(std = 1 / sqrt(F))
param WO[r: R, g: F] = normal(std = 1 / sqrt(F))
param C[r: R, s: R] = uniform(low = -1 / sqrt(R), high = 1 / sqrt(R))
Q[n s] = X[n f] WQ[f s]
K[m s] = X[m f] WK[f s]
V[m r] = X[m f] WV[f r]
A[r n m] = softmax[m, scale = 1 / sqrt(R)](C[r s] Q[n s] K[m s])
Y[n g] = A[r n m] V[m r] WO[r g]
output Y
