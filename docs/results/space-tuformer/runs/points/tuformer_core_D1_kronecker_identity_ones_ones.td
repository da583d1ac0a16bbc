# Point of the design space 'tuformer_core' (tuformer.tds), base design 'thsa'.
# Choices: D=1 core=kronecker C1=identity C2=ones C3=ones
design tuformer_core_D1_kronecker_identity_ones_ones

size F = 512
size H = 8
size D = 1
size R = H * D
size N
input X[n: N, f: F]
param WQ[f: F, s: R] = normal(std = 1 / sqrt(F))
param WK[f: F, s: R] = normal(std = 1 / sqrt(F))
param WV[f: F, r: R] = normal(std = 1 / sqrt(F))
param WO[r: R, g: F] = normal(std = 1 / sqrt(F))
C[(h d) (k e)] = C1[h k] C2[d] C3[e]
Q[n s] = X[n f] WQ[f s]
K[m s] = X[m f] WK[f s]
V[m r] = X[m f] WV[f r]
A[r n m] = softmax[m, scale = 1 / sqrt(R)](C[r s] Q[n s] K[m s])
Y[n g] = A[r n m] V[m r] WO[r g]
output Y
const C1[h: H, k: H] = identity
const C2[d: D] = ones
const C3[e: D] = ones
