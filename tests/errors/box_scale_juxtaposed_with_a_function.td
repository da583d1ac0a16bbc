# mistake: a scale juxtaposed with a function inside a box's brackets (a space separates items there)
design mhsa

size F = 512, H = 8, D = F / H   # model width, heads, head width
size N                           # sequence length

input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))

Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
A[h n m] = softmax[m, scale = 2 sqrt(D)](Q[n h d] K[m h d])
Y[n g]   = A[h n m] V[m h e] WO[h e g]

output Y
