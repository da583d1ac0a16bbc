# mistake: a quotient by a difference of legs that may be 0
design pos

size F = 64, H = 4, D = F / H, C = 4, R = 2 * C + 1, L = 32
size N

input X[n: N, f: F]
param WQ[f: F, h: H, d: D]
param WK[f: F, h: H, d: D]
param WV[f: F, h: H, e: D]
param WO[h: H, e: D, g: F]
param Rel[h: H, r: R] = zeros
param Bias[h: H, i: L, j: L] = zeros

Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
A[h n m] = softmax[m](Q[n h d] K[m h d] + Rel[h, r = min(floor(C / (m - n)), C) + C])
Y[n g]   = A[h n m] V[m h e] WO[h e g]

output Y
