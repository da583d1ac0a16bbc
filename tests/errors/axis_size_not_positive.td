# mistake: an axis whose own size formula is not a whole positive number
design mhsa

size F = 512, H = 8, D = F / H
size N

input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: 1 - F] = normal(std = 1 / sqrt(F))

Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
A[h n m] = softmax[m, scale = 1 / sqrt(D)](Q[n h d] K[m h d])
Y[n g] = A[h n m] V[m h e] WO[h e g]

output Y
